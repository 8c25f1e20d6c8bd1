// The units' forward and backward over the kernel table. [Backward accumulates] (see
// device/kernels.h): a gradient a non-linear kernel adds into is cleared first; a linear's
// input gradient is written (dx_accumulate = false), so it needs no clear.
#include "model/compose.h"

#include "core/error.h"

namespace tandem {

namespace {

// One unit's view of the buffers: parameter pointers by id, in the compute dtype.
struct UnitView {
  const UnitLayout& unit;
  const char* params;  // compute dtype
  float* grads;
  size_t cb;  // bytes of a compute element

  const void* p(ParamId id) const { return params + unit.at(id) * static_cast<int64_t>(cb); }
  // The parameter, or null where the unit has none (biases of a model without biases).
  const void* pn(ParamId id) const { return unit.has(id) ? p(id) : nullptr; }
  float* g(ParamId id) const { return grads == nullptr ? nullptr : grads + unit.at(id); }
  float* gn(ParamId id) const { return unit.has(id) ? g(id) : nullptr; }
};

UnitView view(const Kernels& k, const ModelLayout& model, int u, const UnitParams& params,
              const UnitGrads* grads) {
  const size_t i = static_cast<size_t>(u);
  return UnitView{model.unit(u), static_cast<const char*>(params.at(i)),
                  grads == nullptr ? nullptr : grads->at(i), k.compute_bytes()};
}

size_t act_bytes(const Kernels& k, int64_t n) {
  return static_cast<size_t>(n) * k.compute_bytes();
}

void norm_forward(Kernels& k, const ModelConfig& c, void* out, float* mean, float* rstd,
                  const void* x, const UnitView& v, ParamId w, ParamId b, int N) {
  if (c.norm == NormKind::layernorm)
    k.layernorm_forward(out, mean, rstd, x, v.p(w), v.pn(b), N, c.d_model, c.norm_eps);
  else
    k.rmsnorm_forward(out, rstd, x, v.p(w), N, c.d_model, c.norm_eps);
}

// Adds the norm's input gradient into dx.
void norm_backward(Kernels& k, const ModelConfig& c, void* dx, const void* dout, const void* x,
                   const float* mean, const float* rstd, const UnitView& v, ParamId w, ParamId b,
                   int N) {
  if (c.norm == NormKind::layernorm)
    k.layernorm_backward(dx, v.g(w), v.gn(b), dout, x, v.p(w), mean, rstd, N, c.d_model);
  else
    k.rmsnorm_backward(dx, v.g(w), dout, x, v.p(w), rstd, N, c.d_model);
}

GeluKind gelu_kind(MlpKind m) {
  return m == MlpKind::gelu_erf ? GeluKind::erf : GeluKind::tanh;
}

void block_forward(Kernels& k, const ModelConfig& c, const UnitView& v, Workspace& ws) {
  const int N = ws.N, C = c.d_model, F = c.d_ff, Q = c.qkv_dim(), D = c.head_dim(),
            A = c.attn_dim(), rot = c.rotary_dim();
  Workspace::Block& b = ws.blocks[static_cast<size_t>(v.unit.layer)];
  const void* x = ws.residual[static_cast<size_t>(v.unit.layer)];
  void* out = ws.residual[static_cast<size_t>(v.unit.layer) + 1];
  // A decode step saves nothing for a backward, so the norms fuse into the products after
  // them, and SwiGLU into the product after it.
  const bool decode = ws.traits.use == WorkspaceUse::decode;
  const bool rms = c.norm == NormKind::rmsnorm;
  // Attention branch: xmid = x + proj(attention(rope(qkv(norm1(x))))).
  if (decode) {
    k.norm_linear_forward(b.qkv, x, v.p(ParamId::norm1_w), v.pn(ParamId::norm1_b), rms, c.norm_eps,
                          v.p(ParamId::qkv_w), v.pn(ParamId::qkv_b), N, C, Q);
  } else {
    norm_forward(k, c, b.norm1, b.norm1_mean, b.norm1_rstd, x, v, ParamId::norm1_w,
                 ParamId::norm1_b, N);
    k.linear_forward(b.qkv, b.norm1, v.p(ParamId::qkv_w), v.pn(ParamId::qkv_b), N, C, Q);
  }
  if (ws.cache != nullptr) {
    // Cached inference: rotate at each row's position and append k and v to the cache; a
    // prefill's prompts start at position 0, so its causal attention over the rows is the
    // attention over the cache, and a decode row attends to the cache itself.
    const KvCache& kv = *ws.cache;
    const size_t l = static_cast<size_t>(v.unit.layer);
    k.rope_kv_append(b.qkv, kv.k[l], kv.v[l], ws.slots, ws.positions, N, c.n_head, c.n_kv_head, D,
                     rot, c.rope_theta, kv.positions);
    if (decode)
      k.attention_decode(b.atty, b.qkv, kv.k[l], kv.v[l], ws.slots, ws.positions, N, c.n_head,
                         c.n_kv_head, D, kv.positions);
    else
      k.attention_forward(b.atty, b.att, b.qkv, ws.B, ws.T, c.n_head, c.n_kv_head, D);
  } else {
    if (rot > 0)
      k.rope_forward(b.qkv, ws.B, ws.T, c.n_head + c.n_kv_head, D, rot, Q, c.rope_theta, 0);
    k.attention_forward(b.atty, b.att, b.qkv, ws.B, ws.T, c.n_head, c.n_kv_head, D);
  }
  k.linear_residual_forward(b.xmid, b.atty, v.p(ParamId::proj_w), v.pn(ParamId::proj_b), x, N, A,
                            C);
  // MLP branch, reading xmid (sequential) or the block input (parallel); out = xmid + mlp.
  const void* mlp_in = c.residual == ResidualKind::parallel ? x : b.xmid;
  if (decode && c.mlp == MlpKind::swiglu) {
    k.norm_linear_forward(b.fch, mlp_in, v.p(ParamId::norm2_w), v.pn(ParamId::norm2_b), rms,
                          c.norm_eps, v.p(ParamId::fc_w), v.pn(ParamId::fc_b), N, C, 2 * F);
    k.swiglu_linear_residual_forward(out, b.fch, v.p(ParamId::fc2_w), v.pn(ParamId::fc2_b), b.xmid,
                                     N, F, C);
    return;
  }
  norm_forward(k, c, b.norm2, b.norm2_mean, b.norm2_rstd, mlp_in, v, ParamId::norm2_w,
               ParamId::norm2_b, N);
  if (c.mlp == MlpKind::swiglu) {
    k.linear_forward(b.fch, b.norm2, v.p(ParamId::fc_w), v.pn(ParamId::fc_b), N, C, 2 * F);
    k.swiglu_forward(b.act, b.fch, N, F);
  } else {
    k.linear_gelu_forward(b.act, b.fch, b.norm2, v.p(ParamId::fc_w), v.pn(ParamId::fc_b), N, C, F,
                          gelu_kind(c.mlp));
  }
  k.linear_residual_forward(out, b.act, v.p(ParamId::fc2_w), v.pn(ParamId::fc2_b), b.xmid, N, F, C);
}

// The MLP branch backward from dout = ws.dres: parameter gradients, and its input gradient
// added into ws.dres.
void mlp_backward(Kernels& k, const ModelConfig& c, const UnitView& v, Workspace& ws,
                  const Workspace::Block& b, const void* mlp_in) {
  const int N = ws.N, C = c.d_model, F = c.d_ff, M = c.mlp_in_dim();
  k.linear_backward(ws.dact, v.g(ParamId::fc2_w), v.gn(ParamId::fc2_b), ws.dres, b.act,
                    v.p(ParamId::fc2_w), N, F, C, false);
  k.zero(ws.dfch, act_bytes(k, int64_t{N} * M));
  if (c.mlp == MlpKind::swiglu)
    k.swiglu_backward(ws.dfch, ws.dact, b.fch, N, F);
  else
    k.gelu_backward(ws.dfch, ws.dact, b.fch, int64_t{N} * F, gelu_kind(c.mlp));
  k.linear_backward(ws.dnorm, v.g(ParamId::fc_w), v.gn(ParamId::fc_b), ws.dfch, b.norm2,
                    v.p(ParamId::fc_w), N, C, M, false);
  norm_backward(k, c, ws.dres, ws.dnorm, mlp_in, b.norm2_mean, b.norm2_rstd, v, ParamId::norm2_w,
                ParamId::norm2_b, N);
}

void block_backward(Kernels& k, const ModelConfig& c, const UnitView& v, Workspace& ws) {
  const int N = ws.N, C = c.d_model, Q = c.qkv_dim(), D = c.head_dim(), A = c.attn_dim(),
            rot = c.rotary_dim();
  const Workspace::Block& b = ws.blocks[static_cast<size_t>(v.unit.layer)];
  const void* x = ws.residual[static_cast<size_t>(v.unit.layer)];
  const bool parallel = c.residual == ResidualKind::parallel;
  auto proj_backward = [&] {
    k.linear_backward(ws.datty, v.g(ParamId::proj_w), v.gn(ParamId::proj_b), ws.dres, b.atty,
                      v.p(ParamId::proj_w), N, A, C, false);
  };
  // Sequential: the attention branch's output gradient is d(xmid) = dout + the MLP's input
  // gradient, so the MLP goes first. Parallel: both branches read dout itself, so the
  // projection's backward reads ws.dres before the MLP adds into it.
  if (parallel) {
    proj_backward();
    mlp_backward(k, c, v, ws, b, x);
  } else {
    mlp_backward(k, c, v, ws, b, b.xmid);
    proj_backward();
  }
  k.zero(ws.dqkv, act_bytes(k, int64_t{N} * Q));
  k.attention_backward(ws.dqkv, ws.datty, b.qkv, b.atty, b.att, ws.B, ws.T, c.n_head, c.n_kv_head,
                       D);
  if (rot > 0)
    k.rope_backward(ws.dqkv, ws.B, ws.T, c.n_head + c.n_kv_head, D, rot, Q, c.rope_theta, 0);
  k.linear_backward(ws.dnorm, v.g(ParamId::qkv_w), v.gn(ParamId::qkv_b), ws.dqkv, b.norm1,
                    v.p(ParamId::qkv_w), N, C, Q, false);
  norm_backward(k, c, ws.dres, ws.dnorm, x, b.norm1_mean, b.norm1_rstd, v, ParamId::norm1_w,
                ParamId::norm1_b, N);
}

}  // namespace

void unit_forward(Kernels& k, const ModelLayout& model, int u, const UnitParams& params,
                  Workspace& ws) {
  const ModelConfig& c = model.config();
  const UnitView v = view(k, model, u, params, nullptr);
  const int N = ws.N, C = c.d_model;
  switch (v.unit.kind) {
    case UnitKind::embedding:
      if (ws.traits.use == WorkspaceUse::decode)
        k.embedding_at(ws.residual[0], ws.tokens, ws.positions, v.p(ParamId::wte),
                       v.pn(ParamId::wpe), N, C, c.vocab);
      else
        k.embedding_forward(ws.residual[0], ws.tokens, v.p(ParamId::wte), v.pn(ParamId::wpe), ws.B,
                            ws.T, C, c.vocab);
      return;
    case UnitKind::block:
      block_forward(k, c, v, ws);
      return;
    case UnitKind::head: {
      norm_forward(k, c, ws.normf, ws.normf_mean, ws.normf_rstd, ws.residual.back(), v,
                   ParamId::normf_w, ParamId::normf_b, N);
      const void* w =
          c.tied_head ? view(k, model, 0, params, nullptr).p(ParamId::wte) : v.p(ParamId::head_w);
      k.linear_forward(ws.logits, ws.normf, w, nullptr, N, C, c.vocab_padded);
      return;
    }
  }
}

void unit_backward(Kernels& k, const ModelLayout& model, int u, const UnitParams& params,
                   const UnitGrads& grads, Workspace& ws, float dloss) {
  const ModelConfig& c = model.config();
  const UnitView v = view(k, model, u, params, &grads);
  const int N = ws.N, C = c.d_model, Vp = c.vocab_padded;
  switch (v.unit.kind) {
    case UnitKind::head: {
      k.crossentropy_fused_backward(ws.logits, ws.losses, ws.targets, N, c.vocab, Vp, dloss);
      const void* w;
      float* dw;
      if (c.tied_head) {
        const UnitView e = view(k, model, 0, params, &grads);
        w = e.p(ParamId::wte);
        dw = e.g(ParamId::wte);
      } else {
        w = v.p(ParamId::head_w);
        dw = v.g(ParamId::head_w);
      }
      k.linear_backward(ws.dnorm, dw, nullptr, ws.logits, ws.normf, w, N, C, Vp, false);
      k.zero(ws.dres, act_bytes(k, int64_t{N} * C));
      norm_backward(k, c, ws.dres, ws.dnorm, ws.residual.back(), ws.normf_mean, ws.normf_rstd, v,
                    ParamId::normf_w, ParamId::normf_b, N);
      return;
    }
    case UnitKind::block:
      block_backward(k, c, v, ws);
      return;
    case UnitKind::embedding:
      k.embedding_backward(v.g(ParamId::wte), v.gn(ParamId::wpe), ws.dres, ws.tokens, ws.B, ws.T, C,
                           c.vocab);
      return;
  }
}

void model_forward(Kernels& k, const ModelLayout& model, const UnitParams& params, Workspace& ws) {
  for (int u = 0; u < model.num_units(); ++u) unit_forward(k, model, u, params, ws);
}

void model_backward(Kernels& k, const ModelLayout& model, const UnitParams& params,
                    const UnitGrads& grads, Workspace& ws, float dloss) {
  for (int u = model.num_units() - 1; u >= 0; --u)
    unit_backward(k, model, u, params, grads, ws, dloss);
}

void check_token_ids(const int32_t* ids, size_t n, int vocab, const char* what) {
  for (size_t i = 0; i < n; ++i)
    TD_CHECK(ids[i] >= 0 && ids[i] < vocab, "{} {} at position {} is outside the vocabulary of {}",
             what, ids[i], i, vocab);
}

}  // namespace tandem
