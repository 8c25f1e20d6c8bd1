// The units' forward and backward over the kernel table. [Backward accumulates] (see
// device/kernels.h): the residual stream's gradient ws.dres is cleared once and summed
// into; the other input gradients are written ([Written input gradients]: a linear's with
// dx_accumulate = false, GELU's, SwiGLU's and attention's), so they need no clear.
#include "model/compose.h"

#include <algorithm>

#include "core/error.h"

namespace tandem {

namespace {

// One unit's view of the buffers: parameter pointers by id, in the compute dtype.
struct UnitView {
  const UnitLayout& unit;
  const char* params;  // compute dtype
  float* grads;
  size_t cb;           // bytes of a compute element
  bool fresh = false;  // [Fresh gradients] this backward is the first writer of grads

  // How a backward that covers every element of this unit's gradient puts it there.
  GradMode mode() const { return fresh ? GradMode::write : GradMode::add; }

  const void* p(ParamId id) const { return params + unit.at(id) * static_cast<int64_t>(cb); }
  // The parameter, or null where the unit has none (biases of a model without biases).
  const void* pn(ParamId id) const { return unit.has(id) ? p(id) : nullptr; }
  float* g(ParamId id) const { return grads == nullptr ? nullptr : grads + unit.at(id); }
  float* gn(ParamId id) const { return unit.has(id) ? g(id) : nullptr; }
};

UnitView view(const Kernels& k, const ModelLayout& model, int u, const UnitParams& params,
              const UnitGrads* grads, const std::vector<bool>* fresh = nullptr) {
  const size_t i = static_cast<size_t>(u);
  float* g = grads == nullptr ? nullptr : grads->at(i);
  return UnitView{model.unit(u), static_cast<const char*>(params.at(i)), g, k.compute_bytes(),
                  g != nullptr && fresh != nullptr && i < fresh->size() && (*fresh)[i]};
}

// [Fresh gradients] Clears the elements of v's gradient outside parameter `keep` (which the
// caller writes).
void clear_except(Kernels& k, const UnitView& v, ParamId keep) {
  const int64_t begin = v.unit.at(keep), end = begin + v.unit.param(keep).numel;
  if (begin > 0) k.zero(v.grads, static_cast<size_t>(begin) * sizeof(float));
  if (end < v.unit.numel)
    k.zero(v.grads + end, static_cast<size_t>(v.unit.numel - end) * sizeof(float));
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
    k.layernorm_backward(dx, v.g(w), v.gn(b), dout, x, v.p(w), mean, rstd, N, c.d_model, v.mode());
  else
    k.rmsnorm_backward(dx, v.g(w), dout, x, v.p(w), rstd, N, c.d_model, v.mode());
}

GeluKind gelu_kind(MlpKind m) {
  return m == MlpKind::gelu_erf ? GeluKind::erf : GeluKind::tanh;
}

// The attention half of a block: xmid = x + proj(attention(rope(qkv(norm1(x))))). A
// tensor-parallel rank other than the lead leaves out x and the projection's bias: its
// xmid is its heads' share of the projection alone.
void block_attention_forward(Kernels& k, const ModelConfig& c, const UnitView& v, Workspace& ws) {
  const int N = ws.N, C = c.d_model, Q = c.qkv_dim(), D = c.head_dim(), A = c.attn_dim(),
            rot = c.rotary_dim();
  Workspace::Block& b = ws.blocks[static_cast<size_t>(v.unit.layer)];
  const void* x = ws.residual[static_cast<size_t>(v.unit.layer)];
  // A decode step saves nothing for a backward, so the norms fuse into the products after
  // them, and SwiGLU into the product after it.
  const bool decode = ws.traits.use == WorkspaceUse::decode;
  const bool rms = c.norm == NormKind::rmsnorm;
  const bool lead = c.tp_lead();
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
    if (decode) {
      k.rope_append_attention_decode(b.atty, b.qkv, kv.k[l], kv.v[l], ws.slots, ws.positions, N,
                                     c.n_head, c.n_kv_head, D, rot, c.rope_theta, kv.positions);
    } else {
      k.rope_kv_append(b.qkv, kv.k[l], kv.v[l], ws.slots, ws.positions, N, c.n_head, c.n_kv_head, D,
                       rot, c.rope_theta, kv.positions);
      k.attention_forward(b.atty, b.att, b.qkv, ws.B, ws.T, c.n_head, c.n_kv_head, D);
    }
  } else {
    if (rot > 0)
      k.rope_forward(b.qkv, ws.B, ws.T, c.n_head + c.n_kv_head, D, rot, Q, c.rope_theta, 0);
    k.attention_forward(b.atty, b.att, b.qkv, ws.B, ws.T, c.n_head, c.n_kv_head, D);
  }
  k.linear_residual_forward(b.xmid, b.atty, v.p(ParamId::proj_w),
                            lead ? v.pn(ParamId::proj_b) : nullptr, lead ? x : nullptr, N, A, C);
}

// The MLP half: out = xmid + fc2(mlp(norm2(xmid or x))). The MLP reads xmid (sequential)
// or the block input (parallel). A tensor-parallel rank other than the lead leaves out the
// output bias, and in a sequential block xmid too (all ranks hold the reduced xmid, which
// the lead adds); in a parallel block its xmid is its attention partial sum, which it adds.
void block_mlp_forward(Kernels& k, const ModelConfig& c, const UnitView& v, Workspace& ws) {
  const int N = ws.N, C = c.d_model, F = c.d_ff;
  Workspace::Block& b = ws.blocks[static_cast<size_t>(v.unit.layer)];
  const void* x = ws.residual[static_cast<size_t>(v.unit.layer)];
  void* out = ws.residual[static_cast<size_t>(v.unit.layer) + 1];
  const bool decode = ws.traits.use == WorkspaceUse::decode;
  const bool rms = c.norm == NormKind::rmsnorm;
  const bool lead = c.tp_lead(), parallel = c.residual == ResidualKind::parallel;
  const void* mlp_in = parallel ? x : b.xmid;
  const void* residual = lead || parallel ? b.xmid : nullptr;
  const void* bias = lead ? v.pn(ParamId::fc2_b) : nullptr;
  if (decode && c.mlp == MlpKind::swiglu) {
    k.norm_linear_forward(b.fch, mlp_in, v.p(ParamId::norm2_w), v.pn(ParamId::norm2_b), rms,
                          c.norm_eps, v.p(ParamId::fc_w), v.pn(ParamId::fc_b), N, C, 2 * F);
    k.swiglu_linear_residual_forward(out, b.fch, v.p(ParamId::fc2_w), bias, residual, N, F, C);
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
  k.linear_residual_forward(out, b.act, v.p(ParamId::fc2_w), bias, residual, N, F, C);
}

// [Chunked loss] Whether the training head's backward makes the logits, chunk by chunk,
// instead of its forward making every row's.
bool loss_in_chunks(const Workspace& ws) {
  return ws.traits.use == WorkspaceUse::train && ws.traits.loss_chunk > 0;
}

// The head: logits [N, head_rows] = normf(x) W[head_begin, head_begin + head_rows)^T, W the
// untied head (a rank's head_w holds just its rows) or the tied token matrix. A tied head's
// rows past vocab_padded do not exist in wte (the last ranks' share may run past it): those
// logits are zero, the rows that exist are computed one token row at a time.
void head_forward(Kernels& k, const ModelLayout& model, const UnitView& v, const UnitParams& params,
                  Workspace& ws) {
  const ModelConfig& c = model.config();
  const int N = ws.N, C = c.d_model, rows = c.head_rows();
  norm_forward(k, c, ws.normf, ws.normf_mean, ws.normf_rstd, ws.residual.back(), v,
               ParamId::normf_w, ParamId::normf_b, N);
  // With a chunked loss the backward makes the logits ([Chunked loss]).
  if (loss_in_chunks(ws)) return;
  if (!c.tied_head) {
    k.linear_forward(ws.logits, ws.normf, v.p(ParamId::head_w), nullptr, N, C, rows);
    return;
  }
  const int begin = c.head_begin();
  const int real = std::clamp(c.vocab_padded - begin, 0, rows);
  const char* w = static_cast<const char*>(view(k, model, 0, params, nullptr).p(ParamId::wte)) +
                  static_cast<size_t>(begin) * static_cast<size_t>(C) * k.compute_bytes();
  if (real == rows) {
    k.linear_forward(ws.logits, ws.normf, w, nullptr, N, C, rows);
    return;
  }
  k.zero(ws.logits, act_bytes(k, int64_t{N} * rows));
  for (int n = 0; n < N && real > 0; ++n)
    k.linear_forward(static_cast<char*>(ws.logits) + act_bytes(k, int64_t{n} * rows),
                     static_cast<const char*>(ws.normf) + act_bytes(k, int64_t{n} * C), w, nullptr,
                     1, C, real);
}

// The MLP branch backward from dout = ws.dres: parameter gradients, and its input gradient
// added into ws.dres.
void mlp_backward(Kernels& k, const ModelConfig& c, const UnitView& v, Workspace& ws,
                  const Workspace::Block& b, const void* mlp_in) {
  const int N = ws.N, C = c.d_model, F = c.d_ff, M = c.mlp_in_dim();
  if (c.mlp == MlpKind::swiglu) {
    k.linear_backward(ws.dact, v.g(ParamId::fc2_w), v.gn(ParamId::fc2_b), ws.dres, b.act,
                      v.p(ParamId::fc2_w), N, F, C, false, v.mode());
    k.swiglu_backward(ws.dfch, ws.dact, b.fch, N, F);
  } else {  // the GELU gradient straight into dfch (in the product's epilogue on CUDA)
    k.linear_gelu_backward(ws.dfch, v.g(ParamId::fc2_w), v.gn(ParamId::fc2_b), ws.dres, b.act,
                           b.fch, v.p(ParamId::fc2_w), N, F, C, gelu_kind(c.mlp), v.mode());
  }
  k.linear_backward(ws.dnorm, v.g(ParamId::fc_w), v.gn(ParamId::fc_b), ws.dfch, b.norm2,
                    v.p(ParamId::fc_w), N, C, M, false, v.mode());
  norm_backward(k, c, ws.dres, ws.dnorm, mlp_in, b.norm2_mean, b.norm2_rstd, v, ParamId::norm2_w,
                ParamId::norm2_b, N);
}

// [Activation recompute] What the block's backward reads and the workspace did not keep:
// the whole block's tensors (its forward again, from its saved input; it rewrites the
// block's output, which no later backward reads), or attention's state and output from the
// saved, rotated qkv.
void block_recompute(Kernels& k, const ModelConfig& c, const UnitView& v, Workspace& ws) {
  switch (recompute_at(ws.traits.recompute, ws.traits.recompute_blocks, v.unit.layer)) {
    case Recompute::none:
      return;
    case Recompute::unit:
      block_attention_forward(k, c, v, ws);
      block_mlp_forward(k, c, v, ws);
      return;
    case Recompute::attention: {
      const Workspace::Block& b = ws.blocks[static_cast<size_t>(v.unit.layer)];
      k.attention_forward(b.atty, b.att, b.qkv, ws.B, ws.T, c.n_head, c.n_kv_head, c.head_dim());
      return;
    }
  }
}

void block_backward(Kernels& k, const ModelConfig& c, const UnitView& v, Workspace& ws) {
  const int N = ws.N, C = c.d_model, Q = c.qkv_dim(), D = c.head_dim(), A = c.attn_dim(),
            rot = c.rotary_dim();
  const Workspace::Block& b = ws.blocks[static_cast<size_t>(v.unit.layer)];
  const void* x = ws.residual[static_cast<size_t>(v.unit.layer)];
  const bool parallel = c.residual == ResidualKind::parallel;
  auto proj_backward = [&] {
    k.linear_backward(ws.datty, v.g(ParamId::proj_w), v.gn(ParamId::proj_b), ws.dres, b.atty,
                      v.p(ParamId::proj_w), N, A, C, false, v.mode());
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
  k.attention_backward(ws.dqkv, ws.datty, b.qkv, b.atty, b.att, ws.B, ws.T, c.n_head, c.n_kv_head,
                       D);
  if (rot > 0)
    k.rope_backward(ws.dqkv, ws.B, ws.T, c.n_head + c.n_kv_head, D, rot, Q, c.rope_theta, 0);
  k.linear_backward(ws.dnorm, v.g(ParamId::qkv_w), v.gn(ParamId::qkv_b), ws.dqkv, b.norm1,
                    v.p(ParamId::qkv_w), N, C, Q, false, v.mode());
  norm_backward(k, c, ws.dres, ws.dnorm, x, b.norm1_mean, b.norm1_rstd, v, ParamId::norm1_w,
                ParamId::norm1_b, N);
}

}  // namespace

void unit_forward(Kernels& k, const ModelLayout& model, int u, const UnitParams& params,
                  Workspace& ws) {
  unit_forward_part(k, model, u, params, ws, BlockPart::whole);
}

void unit_forward_part(Kernels& k, const ModelLayout& model, int u, const UnitParams& params,
                       Workspace& ws, BlockPart part) {
  const ModelConfig& c = model.config();
  const UnitView v = view(k, model, u, params, nullptr);
  const int N = ws.N, C = c.d_model;
  TD_CHECK(part == BlockPart::whole || v.unit.kind == UnitKind::block,
           "unit {} runs whole, not in parts", v.unit.name);
  // A sequential block of a tensor-parallel rank needs xmid reduced before its MLP.
  TD_CHECK(part != BlockPart::whole || c.tp.ways == 1 || v.unit.kind != UnitKind::block ||
               c.residual == ResidualKind::parallel,
           "{} of tensor-parallel rank {} of {} runs in two parts, with xmid reduced between them",
           v.unit.name, c.tp.rank, c.tp.ways);
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
      if (part != BlockPart::mlp) block_attention_forward(k, c, v, ws);
      if (part != BlockPart::attention) block_mlp_forward(k, c, v, ws);
      return;
    case UnitKind::head:
      head_forward(k, model, v, params, ws);
      return;
  }
}

TpReduce tp_reduce_after(const ModelLayout& model, int u, BlockPart part, Workspace& ws) {
  const ModelConfig& c = model.config();
  const UnitLayout& unit = model.unit(u);
  if (c.tp.ways == 1 || unit.kind != UnitKind::block) return {};
  const size_t l = static_cast<size_t>(unit.layer);
  const int64_t n = int64_t{ws.N} * c.d_model;
  if (part == BlockPart::attention)
    return c.residual == ResidualKind::sequential ? TpReduce{ws.blocks[l].xmid, n} : TpReduce{};
  return {ws.residual[l + 1], n};
}

void unit_backward(Kernels& k, const ModelLayout& model, int u, const UnitParams& params,
                   const UnitGrads& grads, Workspace& ws, float dloss,
                   const std::vector<bool>& fresh) {
  const ModelConfig& c = model.config();
  TD_CHECK(c.tp.ways == 1, "the backward of tensor-parallel rank {} of {} is not implemented",
           c.tp.rank, c.tp.ways);
  const UnitView v = view(k, model, u, params, &grads, &fresh);
  const int N = ws.N, C = c.d_model, Vp = c.vocab_padded;
  switch (v.unit.kind) {
    case UnitKind::head: {
      const void* w;
      float* dw;
      GradMode gm;  // the first chunk's; the later chunks add
      if (c.tied_head) {
        const UnitView e = view(k, model, 0, params, &grads, &fresh);
        w = e.p(ParamId::wte);
        dw = e.g(ParamId::wte);
        gm = e.mode();
        // The head writes the embedding's wte first: the embedding's backward, which adds,
        // finds the rest of its buffer cleared.
        if (e.fresh) clear_except(k, e, ParamId::wte);
      } else {
        w = v.p(ParamId::head_w);
        dw = v.g(ParamId::head_w);
        gm = v.mode();
      }
      // [Chunked loss] Without chunks the forward left the logits of every row; with them the
      // logits of `rows` rows at a time are made here, turned into their loss and gradient
      // in place, and consumed by the product's backward before the next chunk.
      const bool chunks = loss_in_chunks(ws);
      const int rows = chunks ? std::min(ws.traits.loss_chunk, N) : N;
      for (int r0 = 0; r0 < N; r0 += rows) {
        const int n = std::min(rows, N - r0);
        const size_t at = static_cast<size_t>(r0);
        const void* normf = static_cast<const char*>(ws.normf) + act_bytes(k, int64_t{r0} * C);
        void* dnorm = static_cast<char*>(ws.dnorm) + act_bytes(k, int64_t{r0} * C);
        if (chunks) k.linear_forward(ws.logits, normf, w, nullptr, n, C, Vp);
        k.crossentropy_fused_backward(ws.logits, ws.losses + at, ws.targets + at, n, c.vocab, Vp,
                                      dloss);
        k.linear_backward(dnorm, dw, nullptr, ws.logits, normf, w, n, C, Vp, false,
                          r0 == 0 ? gm : GradMode::add);
      }
      k.zero(ws.dres, act_bytes(k, int64_t{N} * C));
      norm_backward(k, c, ws.dres, ws.dnorm, ws.residual.back(), ws.normf_mean, ws.normf_rstd, v,
                    ParamId::normf_w, ParamId::normf_b, N);
      return;
    }
    case UnitKind::block:
      block_recompute(k, c, v, ws);
      block_backward(k, c, v, ws);
      return;
    case UnitKind::embedding:
      // The token rows are scattered and added (a token may repeat), so a fresh buffer is
      // cleared first.
      if (v.fresh) k.zero(v.grads, static_cast<size_t>(v.unit.numel) * sizeof(float));
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
