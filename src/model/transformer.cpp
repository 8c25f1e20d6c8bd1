// The units' forward and backward on CPU. See [Backward accumulates] in
// device/cpu/kernels.h: every gradient buffer written here is zeroed first or is meant to
// accumulate (parameter gradients, the residual-stream gradient).
#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "device/cpu/kernels.h"

namespace tandem {

namespace {

void zero(float* p, int64_t n) {
  std::memset(p, 0, static_cast<size_t>(n) * sizeof(float));
}

// Resolves parameter pointers of a unit by name.
struct Params {
  const UnitLayout& unit;
  float* base;
  float* operator[](const char* name) const { return base + unit.param(name).offset; }
};

}  // namespace

namespace {

// Floats of one workspace; the order of take() calls in the constructor follows it.
int64_t workspace_floats(const ModelConfig& c, int64_t B, int64_t T) {
  const int64_t n = B * T, C = c.d_model, F = c.d_ff, Q = c.qkv_dim(), H = c.n_head,
                A = c.n_head * c.head_dim(), Vp = c.vocab_padded, L = c.n_layer;
  const bool ln = c.family == Family::gpt2;
  const int64_t fch = ln ? F : 2 * F;
  const int64_t per_block =
      n * C * 3 + (ln ? 4 : 2) * n + n * Q + B * H * T * T + n * A + n * fch + n * F;
  return (L + 1) * n * C + L * per_block + n * C + 3 * n + n * Vp +
         (n * C * 2 + n * 2 * F + n * F + n * A + n * Q);
}

}  // namespace

size_t Workspace::bytes_needed(const ModelConfig& c, int B, int T) {
  return static_cast<size_t>(workspace_floats(c, B, T)) * sizeof(float);
}

Workspace::Workspace(const ModelConfig& c, int B_, int T_, float* storage)
    : B(B_), T(T_), N(B_ * T_) {
  TD_CHECK(B > 0 && T > 0, "workspace of batch {} and sequence {}", B, T);
  TD_CHECK(T <= c.context, "sequence length {} exceeds the model's context of {}", T, c.context);
  const int64_t n = N, C = c.d_model, F = c.d_ff, Q = c.qkv_dim(), H = c.n_head,
                A = c.n_head * c.head_dim(), Vp = c.vocab_padded, L = c.n_layer;
  const bool ln = c.family == Family::gpt2;
  const int64_t fch = ln ? F : 2 * F;
  const int64_t total = workspace_floats(c, B, T);
  floats_ = static_cast<size_t>(total);
  if (storage == nullptr) {
    owned_.assign(floats_, 0.0f);
    storage = owned_.data();
  }
  float* p = storage;
  auto take = [&](int64_t count) {
    float* r = p;
    p += count;
    return r;
  };
  for (int64_t l = 0; l <= L; ++l) residual.push_back(take(n * C));
  for (int64_t l = 0; l < L; ++l) {
    Block b{};
    b.norm1 = take(n * C);
    b.norm1_mean = ln ? take(n) : nullptr;
    b.norm1_rstd = take(n);
    b.qkv = take(n * Q);
    b.att = take(B * H * T * T);
    b.atty = take(n * A);
    b.xmid = take(n * C);
    b.norm2 = take(n * C);
    b.norm2_mean = ln ? take(n) : nullptr;
    b.norm2_rstd = take(n);
    b.fch = take(n * fch);
    b.act = take(n * F);
    blocks.push_back(b);
  }
  normf = take(n * C);
  normf_mean = take(n);
  normf_rstd = take(n);
  logits = take(n * Vp);
  losses = take(n);
  dres = take(n * C);
  dnorm = take(n * C);
  dfch = take(n * 2 * F);
  dact = take(n * F);
  datty = take(n * A);
  dqkv = take(n * Q);
  TD_CHECK(p == storage + total, "workspace layout mismatch");
  tokens.assign(static_cast<size_t>(n), 0);
  targets.assign(static_cast<size_t>(n), 0);
}

void unit_forward(const ModelLayout& model, int u, const UnitBuffers& params, Workspace& ws) {
  const ModelConfig& c = model.config();
  const UnitLayout& unit = model.unit(u);
  const int N = ws.N, C = c.d_model, F = c.d_ff, Q = c.qkv_dim(), D = c.head_dim(),
            A = c.n_head * D;
  const bool gpt2 = c.family == Family::gpt2;
  Params p{unit, params[static_cast<size_t>(u)]};
  switch (unit.kind) {
    case UnitKind::embedding:
      for (int i = 0; i < N; ++i)
        TD_CHECK(ws.tokens[i] >= 0 && ws.tokens[i] < c.vocab,
                 "token {} at position {} is outside the vocabulary of {}", ws.tokens[i], i,
                 c.vocab);
      cpu::embedding_forward(ws.residual[0], ws.tokens.data(), p["wte"], gpt2 ? p["wpe"] : nullptr,
                             ws.B, ws.T, C);
      return;
    case UnitKind::block: {
      const int l = unit.layer;
      Workspace::Block& b = ws.blocks[static_cast<size_t>(l)];
      const float* x = ws.residual[static_cast<size_t>(l)];
      float* out = ws.residual[static_cast<size_t>(l) + 1];
      if (gpt2) {
        cpu::layernorm_forward(b.norm1, b.norm1_mean, b.norm1_rstd, x, p["ln1_w"], p["ln1_b"], N, C,
                               c.norm_eps);
      } else {
        cpu::rmsnorm_forward(b.norm1, b.norm1_rstd, x, p["norm1_w"], N, C, c.norm_eps);
      }
      cpu::matmul_forward(b.qkv, b.norm1, p["qkv_w"], gpt2 ? p["qkv_b"] : nullptr, N, C, Q);
      if (!gpt2)
        cpu::rope_forward(b.qkv, ws.B, ws.T, c.n_head + c.n_kv_head, D, Q, c.rope_theta, 0);
      cpu::attention_forward(b.atty, b.att, b.qkv, ws.B, ws.T, c.n_head, c.n_kv_head, D);
      cpu::matmul_forward(b.xmid, b.atty, p["proj_w"], gpt2 ? p["proj_b"] : nullptr, N, A, C);
      cpu::add_forward(b.xmid, b.xmid, x, int64_t{N} * C);
      if (gpt2) {
        cpu::layernorm_forward(b.norm2, b.norm2_mean, b.norm2_rstd, b.xmid, p["ln2_w"], p["ln2_b"],
                               N, C, c.norm_eps);
        cpu::matmul_forward(b.fch, b.norm2, p["fc_w"], p["fc_b"], N, C, F);
        cpu::gelu_forward(b.act, b.fch, int64_t{N} * F);
        cpu::matmul_forward(out, b.act, p["fc2_w"], p["fc2_b"], N, F, C);
      } else {
        cpu::rmsnorm_forward(b.norm2, b.norm2_rstd, b.xmid, p["norm2_w"], N, C, c.norm_eps);
        cpu::matmul_forward(b.fch, b.norm2, p["w13"], nullptr, N, C, 2 * F);
        cpu::swiglu_forward(b.act, b.fch, N, F);
        cpu::matmul_forward(out, b.act, p["w2"], nullptr, N, F, C);
      }
      cpu::add_forward(out, out, b.xmid, int64_t{N} * C);
      return;
    }
    case UnitKind::head: {
      const float* x = ws.residual.back();
      const float* w;
      if (gpt2) {
        cpu::layernorm_forward(ws.normf, ws.normf_mean, ws.normf_rstd, x, p["lnf_w"], p["lnf_b"], N,
                               C, c.norm_eps);
        w = Params{model.unit(0), params[0]}["wte"];
      } else {
        cpu::rmsnorm_forward(ws.normf, ws.normf_rstd, x, p["norm_w"], N, C, c.norm_eps);
        w = p["head_w"];
      }
      cpu::matmul_forward(ws.logits, ws.normf, w, nullptr, N, C, c.vocab_padded);
      return;
    }
  }
}

void unit_backward(const ModelLayout& model, int u, const UnitBuffers& params,
                   const UnitBuffers& grads, Workspace& ws, float dloss) {
  const ModelConfig& c = model.config();
  const UnitLayout& unit = model.unit(u);
  const int N = ws.N, C = c.d_model, F = c.d_ff, Q = c.qkv_dim(), D = c.head_dim(),
            A = c.n_head * D, Vp = c.vocab_padded;
  const bool gpt2 = c.family == Family::gpt2;
  Params p{unit, params[static_cast<size_t>(u)]};
  Params g{unit, grads[static_cast<size_t>(u)]};
  switch (unit.kind) {
    case UnitKind::head: {
      for (int i = 0; i < N; ++i)
        TD_CHECK(ws.targets[i] >= 0 && ws.targets[i] < c.vocab,
                 "target {} at position {} is outside the vocabulary of {}", ws.targets[i], i,
                 c.vocab);
      cpu::crossentropy_fused_backward(ws.logits, ws.losses, ws.targets.data(), N, c.vocab, Vp,
                                       dloss);
      const float* w;
      float* dw;
      if (gpt2) {
        w = Params{model.unit(0), params[0]}["wte"];
        dw = Params{model.unit(0), grads[0]}["wte"];
      } else {
        w = p["head_w"];
        dw = g["head_w"];
      }
      zero(ws.dnorm, int64_t{N} * C);
      cpu::matmul_backward(ws.dnorm, dw, nullptr, ws.logits, ws.normf, w, N, C, Vp);
      zero(ws.dres, int64_t{N} * C);
      const float* x = ws.residual.back();
      if (gpt2) {
        cpu::layernorm_backward(ws.dres, g["lnf_w"], g["lnf_b"], ws.dnorm, x, p["lnf_w"],
                                ws.normf_mean, ws.normf_rstd, N, C);
      } else {
        cpu::rmsnorm_backward(ws.dres, g["norm_w"], ws.dnorm, x, p["norm_w"], ws.normf_rstd, N, C);
      }
      return;
    }
    case UnitKind::block: {
      // On entry ws.dres holds d(block output); on exit d(block input). The residual
      // connections make both updates additions into the same buffer.
      const int l = unit.layer;
      Workspace::Block& b = ws.blocks[static_cast<size_t>(l)];
      const float* x = ws.residual[static_cast<size_t>(l)];
      zero(ws.dact, int64_t{N} * F);
      zero(ws.dfch, int64_t{N} * 2 * F);
      zero(ws.dnorm, int64_t{N} * C);
      if (gpt2) {
        cpu::matmul_backward(ws.dact, g["fc2_w"], g["fc2_b"], ws.dres, b.act, p["fc2_w"], N, F, C);
        cpu::gelu_backward(ws.dfch, ws.dact, b.fch, int64_t{N} * F);
        cpu::matmul_backward(ws.dnorm, g["fc_w"], g["fc_b"], ws.dfch, b.norm2, p["fc_w"], N, C, F);
        cpu::layernorm_backward(ws.dres, g["ln2_w"], g["ln2_b"], ws.dnorm, b.xmid, p["ln2_w"],
                                b.norm2_mean, b.norm2_rstd, N, C);
      } else {
        cpu::matmul_backward(ws.dact, g["w2"], nullptr, ws.dres, b.act, p["w2"], N, F, C);
        cpu::swiglu_backward(ws.dfch, ws.dact, b.fch, N, F);
        cpu::matmul_backward(ws.dnorm, g["w13"], nullptr, ws.dfch, b.norm2, p["w13"], N, C, 2 * F);
        cpu::rmsnorm_backward(ws.dres, g["norm2_w"], ws.dnorm, b.xmid, p["norm2_w"], b.norm2_rstd,
                              N, C);
      }
      zero(ws.datty, int64_t{N} * A);
      zero(ws.dqkv, int64_t{N} * Q);
      zero(ws.dnorm, int64_t{N} * C);
      cpu::matmul_backward(ws.datty, g["proj_w"], gpt2 ? g["proj_b"] : nullptr, ws.dres, b.atty,
                           p["proj_w"], N, A, C);
      cpu::attention_backward(ws.dqkv, ws.datty, b.qkv, b.att, ws.B, ws.T, c.n_head, c.n_kv_head,
                              D);
      if (!gpt2)
        cpu::rope_backward(ws.dqkv, ws.B, ws.T, c.n_head + c.n_kv_head, D, Q, c.rope_theta, 0);
      cpu::matmul_backward(ws.dnorm, g["qkv_w"], gpt2 ? g["qkv_b"] : nullptr, ws.dqkv, b.norm1,
                           p["qkv_w"], N, C, Q);
      if (gpt2) {
        cpu::layernorm_backward(ws.dres, g["ln1_w"], g["ln1_b"], ws.dnorm, x, p["ln1_w"],
                                b.norm1_mean, b.norm1_rstd, N, C);
      } else {
        cpu::rmsnorm_backward(ws.dres, g["norm1_w"], ws.dnorm, x, p["norm1_w"], b.norm1_rstd, N, C);
      }
      return;
    }
    case UnitKind::embedding:
      cpu::embedding_backward(g["wte"], gpt2 ? g["wpe"] : nullptr, ws.dres, ws.tokens.data(), ws.B,
                              ws.T, C);
      return;
  }
}

void model_forward(const ModelLayout& model, const UnitBuffers& params, Workspace& ws) {
  for (int u = 0; u < model.num_units(); ++u) unit_forward(model, u, params, ws);
}

void model_backward(const ModelLayout& model, const UnitBuffers& params, const UnitBuffers& grads,
                    Workspace& ws, float dloss) {
  for (int u = model.num_units() - 1; u >= 0; --u)
    unit_backward(model, u, params, grads, ws, dloss);
}

double model_loss(const ModelLayout& model, Workspace& ws) {
  const ModelConfig& c = model.config();
  cpu::crossentropy_forward(ws.losses, ws.logits, ws.targets.data(), ws.N, c.vocab, c.vocab_padded);
  double sum = 0;
  for (int i = 0; i < ws.N; ++i) sum += ws.losses[i];
  return sum / ws.N;
}

}  // namespace tandem
