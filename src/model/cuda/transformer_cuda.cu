// The units' forward and backward on CUDA. [Backward accumulates] holds as on CPU; the
// differences from model/transformer.cpp: gradient buffers that would be cleared only to be
// overwritten by a GEMM are instead written with beta = 0 (matmul_backward's dx_accumulate),
// and buffers that a non-GEMM kernel adds into are cleared with cudaMemsetAsync.
#include "model/cuda/transformer_cuda.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "device/cuda/cuda_check.h"

namespace tandem::cuda {

namespace {

size_t align256(size_t n) {
  return (n + 255) / 256 * 256;
}

struct Params {
  const UnitLayout& unit;
  const bf16* base;
  const bf16* operator[](const char* name) const { return base + unit.param(name).offset; }
};

struct Grads {
  const UnitLayout& unit;
  float* base;
  float* operator[](const char* name) const {
    return base == nullptr ? nullptr : base + unit.param(name).offset;
  }
};

// Flash attention (kernels_flash.cu) where the head dim allows it, unless the environment says
// TANDEM_ATTENTION=gemm (read once): then the GEMM attention, which saves [B,H,T,T] probabilities.
bool use_flash(const ModelConfig& c) {
  static const bool gemm = [] {
    const char* v = std::getenv("TANDEM_ATTENTION");
    return v != nullptr && std::strcmp(v, "gemm") == 0;
  }();
  return !gemm && flash_attention_supported(c.head_dim());
}

void clear(void* p, size_t bytes, cudaStream_t stream) {
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
}

size_t scratch_needed(const ModelConfig& c, int B, int T) {
  const int N = B * T, C = c.d_model, F = c.d_ff, Q = c.qkv_dim();
  size_t s = use_flash(c) ? flash_attention_scratch_bytes(B, T, c.n_head, c.n_kv_head, c.head_dim())
                          : attention_scratch_bytes(B, T, c.n_head, c.n_kv_head, c.head_dim());
  s = std::max(s, layernorm_backward_scratch_bytes(N, C));
  s = std::max(s, rmsnorm_backward_scratch_bytes(N, C));
  for (int oc : {Q, C, F, 2 * F, c.vocab_padded})
    s = std::max(s, matmul_backward_scratch_bytes(N, oc));
  s = std::max(s, embedding_backward_scratch_bytes(B, T, c.vocab));
  return s;
}

}  // namespace

size_t CudaWorkspace::carve(const ModelConfig& c, char* base) {
  const int64_t n = N, C = c.d_model, F = c.d_ff, Q = c.qkv_dim(), H = c.n_head,
                A = int64_t(c.n_head) * c.head_dim(), Vp = c.vocab_padded, L = c.n_layer;
  const bool ln = c.family == Family::gpt2;
  const int64_t fch = ln ? F : 2 * F;
  const bool flash = use_flash(c);
  size_t off = 0;
  auto take = [&](size_t bytes) -> void* {
    void* p = base == nullptr ? nullptr : base + off;
    off += align256(bytes);
    return p;
  };
  auto h = [&](int64_t count) { return static_cast<bf16*>(take(size_t(count) * sizeof(bf16))); };
  auto f = [&](int64_t count) { return static_cast<float*>(take(size_t(count) * sizeof(float))); };
  residual.clear();
  blocks.clear();
  for (int64_t l = 0; l <= L; ++l) residual.push_back(h(n * C));
  for (int64_t l = 0; l < L; ++l) {
    Block b{};
    b.norm1 = h(n * C);
    b.norm1_mean = ln ? f(n) : nullptr;
    b.norm1_rstd = f(n);
    b.qkv = h(n * Q);
    if (flash) {
      b.lse = f(int64_t(B) * H * T);
    } else {
      b.att = h(int64_t(B) * H * T * T);
    }
    b.atty = h(n * A);
    b.xmid = h(n * C);
    b.norm2 = h(n * C);
    b.norm2_mean = ln ? f(n) : nullptr;
    b.norm2_rstd = f(n);
    b.fch = h(n * fch);
    b.act = h(n * F);
    blocks.push_back(b);
  }
  normf = h(n * C);
  normf_mean = f(n);
  normf_rstd = f(n);
  logits = h(n * Vp);
  losses = f(n);
  dres = h(n * C);
  dnorm = h(n * C);
  dfch = h(n * 2 * F);
  dact = h(n * F);
  datty = h(n * A);
  dqkv = h(n * Q);
  tokens = static_cast<int32_t*>(take(size_t(n) * sizeof(int32_t)));
  targets = static_cast<int32_t*>(take(size_t(n) * sizeof(int32_t)));
  scratch_bytes = scratch_needed(c, B, T);
  scratch = take(scratch_bytes);
  return off;
}

size_t CudaWorkspace::bytes_needed(const ModelConfig& c, int B, int T) {
  TD_CHECK(B > 0 && T > 0, "workspace of batch {} and sequence {}", B, T);
  CudaWorkspace counter(c, B, T, nullptr);
  return counter.carve(c, nullptr);
}

CudaWorkspace::CudaWorkspace(const ModelConfig& c, int B_, int T_, void* storage)
    : B(B_), T(T_), N(B_ * T_) {
  TD_CHECK(B > 0 && T > 0, "workspace of batch {} and sequence {}", B, T);
  TD_CHECK(T <= c.context, "sequence length {} exceeds the model's context of {}", T, c.context);
  TD_CHECK(int64_t(B) * T < (int64_t(1) << 31), "batch x sequence {} x {} is too large", B, T);
  if (storage != nullptr) carve(c, static_cast<char*>(storage));
}

void unit_forward(MatmulContext& ctx, const ModelLayout& model, int u,
                  const std::vector<const bf16*>& params, CudaWorkspace& ws, cudaStream_t stream) {
  const ModelConfig& c = model.config();
  const UnitLayout& unit = model.unit(u);
  const int N = ws.N, C = c.d_model, F = c.d_ff, Q = c.qkv_dim(), D = c.head_dim(),
            A = c.n_head * D;
  const bool gpt2 = c.family == Family::gpt2;
  const Params p{unit, params.at(size_t(u))};
  switch (unit.kind) {
    case UnitKind::embedding:
      embedding_forward(ws.residual[0], ws.tokens, p["wte"], gpt2 ? p["wpe"] : nullptr, ws.B, ws.T,
                        C, c.vocab, stream);
      return;
    case UnitKind::block: {
      const size_t l = size_t(unit.layer);
      CudaWorkspace::Block& b = ws.blocks[l];
      const bf16* x = ws.residual[l];
      bf16* out = ws.residual[l + 1];
      if (gpt2) {
        layernorm_forward(b.norm1, b.norm1_mean, b.norm1_rstd, x, p["ln1_w"], p["ln1_b"], N, C,
                          c.norm_eps, stream);
      } else {
        rmsnorm_forward(b.norm1, b.norm1_rstd, x, p["norm1_w"], N, C, c.norm_eps, stream);
      }
      matmul_forward(ctx, b.qkv, nullptr, b.norm1, p["qkv_w"], gpt2 ? p["qkv_b"] : nullptr, N, C, Q,
                     stream);
      if (!gpt2)
        rope_forward(b.qkv, ws.B, ws.T, c.n_head + c.n_kv_head, D, Q, c.rope_theta, 0, stream);
      if (b.lse != nullptr) {
        flash_attention_forward(b.atty, b.lse, b.qkv, ws.B, ws.T, c.n_head, c.n_kv_head, D,
                                ws.scratch, ws.scratch_bytes, stream);
      } else {
        attention_forward(ctx, b.atty, b.att, b.qkv, ws.B, ws.T, c.n_head, c.n_kv_head, D,
                          ws.scratch, ws.scratch_bytes, stream);
      }
      matmul_forward(ctx, b.xmid, nullptr, b.atty, p["proj_w"], gpt2 ? p["proj_b"] : nullptr, N, A,
                     C, stream);
      add_forward(b.xmid, b.xmid, x, int64_t(N) * C, stream);
      if (gpt2) {
        layernorm_forward(b.norm2, b.norm2_mean, b.norm2_rstd, b.xmid, p["ln2_w"], p["ln2_b"], N, C,
                          c.norm_eps, stream);
        matmul_forward(ctx, b.act, b.fch, b.norm2, p["fc_w"], p["fc_b"], N, C, F, stream);
        matmul_forward(ctx, out, nullptr, b.act, p["fc2_w"], p["fc2_b"], N, F, C, stream);
      } else {
        rmsnorm_forward(b.norm2, b.norm2_rstd, b.xmid, p["norm2_w"], N, C, c.norm_eps, stream);
        matmul_forward(ctx, b.fch, nullptr, b.norm2, p["w13"], nullptr, N, C, 2 * F, stream);
        swiglu_forward(b.act, b.fch, N, F, stream);
        matmul_forward(ctx, out, nullptr, b.act, p["w2"], nullptr, N, F, C, stream);
      }
      add_forward(out, out, b.xmid, int64_t(N) * C, stream);
      return;
    }
    case UnitKind::head: {
      const bf16* x = ws.residual.back();
      const bf16* w;
      if (gpt2) {
        layernorm_forward(ws.normf, ws.normf_mean, ws.normf_rstd, x, p["lnf_w"], p["lnf_b"], N, C,
                          c.norm_eps, stream);
        w = Params{model.unit(0), params.at(0)}["wte"];
      } else {
        rmsnorm_forward(ws.normf, ws.normf_rstd, x, p["norm_w"], N, C, c.norm_eps, stream);
        w = p["head_w"];
      }
      matmul_forward(ctx, ws.logits, nullptr, ws.normf, w, nullptr, N, C, c.vocab_padded, stream);
      return;
    }
  }
}

void unit_backward(MatmulContext& ctx, const ModelLayout& model, int u,
                   const std::vector<const bf16*>& params, const std::vector<float*>& grads,
                   CudaWorkspace& ws, float dloss, cudaStream_t stream) {
  const ModelConfig& c = model.config();
  const UnitLayout& unit = model.unit(u);
  const int N = ws.N, C = c.d_model, F = c.d_ff, Q = c.qkv_dim(), D = c.head_dim(),
            A = c.n_head * D, Vp = c.vocab_padded;
  const bool gpt2 = c.family == Family::gpt2;
  const Params p{unit, params.at(size_t(u))};
  const Grads g{unit, grads.at(size_t(u))};
  void* s = ws.scratch;
  const size_t sb = ws.scratch_bytes;
  const size_t nc = size_t(N) * C * sizeof(bf16);
  switch (unit.kind) {
    case UnitKind::head: {
      crossentropy_fused_backward(ws.logits, ws.losses, ws.targets, N, c.vocab, Vp, dloss, stream);
      const bf16* w;
      float* dw;
      if (gpt2) {
        w = Params{model.unit(0), params.at(0)}["wte"];
        dw = Grads{model.unit(0), grads.at(0)}["wte"];
      } else {
        w = p["head_w"];
        dw = g["head_w"];
      }
      matmul_backward(ctx, ws.dnorm, dw, nullptr, ws.logits, ws.normf, w, N, C, Vp, s, sb, stream,
                      false);
      clear(ws.dres, nc, stream);
      const bf16* x = ws.residual.back();
      if (gpt2) {
        layernorm_backward(ws.dres, g["lnf_w"], g["lnf_b"], ws.dnorm, x, p["lnf_w"], ws.normf_mean,
                           ws.normf_rstd, N, C, s, sb, stream);
      } else {
        rmsnorm_backward(ws.dres, g["norm_w"], ws.dnorm, x, p["norm_w"], ws.normf_rstd, N, C, s, sb,
                         stream);
      }
      return;
    }
    case UnitKind::block: {
      // On entry ws.dres holds d(block output); on exit d(block input).
      const size_t l = size_t(unit.layer);
      CudaWorkspace::Block& b = ws.blocks[l];
      const bf16* x = ws.residual[l];
      if (gpt2) {
        matmul_backward(ctx, ws.dact, g["fc2_w"], g["fc2_b"], ws.dres, b.act, p["fc2_w"], N, F, C,
                        s, sb, stream, false);
        clear(ws.dfch, size_t(N) * F * sizeof(bf16), stream);
        gelu_backward(ws.dfch, ws.dact, b.fch, int64_t(N) * F, stream);
        matmul_backward(ctx, ws.dnorm, g["fc_w"], g["fc_b"], ws.dfch, b.norm2, p["fc_w"], N, C, F,
                        s, sb, stream, false);
        layernorm_backward(ws.dres, g["ln2_w"], g["ln2_b"], ws.dnorm, b.xmid, p["ln2_w"],
                           b.norm2_mean, b.norm2_rstd, N, C, s, sb, stream);
      } else {
        matmul_backward(ctx, ws.dact, g["w2"], nullptr, ws.dres, b.act, p["w2"], N, F, C, s, sb,
                        stream, false);
        clear(ws.dfch, size_t(N) * 2 * F * sizeof(bf16), stream);
        swiglu_backward(ws.dfch, ws.dact, b.fch, N, F, stream);
        matmul_backward(ctx, ws.dnorm, g["w13"], nullptr, ws.dfch, b.norm2, p["w13"], N, C, 2 * F,
                        s, sb, stream, false);
        rmsnorm_backward(ws.dres, g["norm2_w"], ws.dnorm, b.xmid, p["norm2_w"], b.norm2_rstd, N, C,
                         s, sb, stream);
      }
      matmul_backward(ctx, ws.datty, g["proj_w"], gpt2 ? g["proj_b"] : nullptr, ws.dres, b.atty,
                      p["proj_w"], N, A, C, s, sb, stream, false);
      clear(ws.dqkv, size_t(N) * Q * sizeof(bf16), stream);
      if (b.lse != nullptr) {  // b.atty is the forward's attention output o
        flash_attention_backward(ws.dqkv, ws.datty, b.qkv, b.atty, b.lse, ws.B, ws.T, c.n_head,
                                 c.n_kv_head, D, s, sb, stream);
      } else {
        attention_backward(ctx, ws.dqkv, ws.datty, b.qkv, b.att, ws.B, ws.T, c.n_head, c.n_kv_head,
                           D, s, sb, stream);
      }
      if (!gpt2)
        rope_backward(ws.dqkv, ws.B, ws.T, c.n_head + c.n_kv_head, D, Q, c.rope_theta, 0, stream);
      matmul_backward(ctx, ws.dnorm, g["qkv_w"], gpt2 ? g["qkv_b"] : nullptr, ws.dqkv, b.norm1,
                      p["qkv_w"], N, C, Q, s, sb, stream, false);
      if (gpt2) {
        layernorm_backward(ws.dres, g["ln1_w"], g["ln1_b"], ws.dnorm, x, p["ln1_w"], b.norm1_mean,
                           b.norm1_rstd, N, C, s, sb, stream);
      } else {
        rmsnorm_backward(ws.dres, g["norm1_w"], ws.dnorm, x, p["norm1_w"], b.norm1_rstd, N, C, s,
                         sb, stream);
      }
      return;
    }
    case UnitKind::embedding:
      embedding_backward(g["wte"], gpt2 ? g["wpe"] : nullptr, ws.dres, ws.tokens, ws.B, ws.T, C,
                         c.vocab, s, sb, stream);
      return;
  }
}

}  // namespace tandem::cuda
