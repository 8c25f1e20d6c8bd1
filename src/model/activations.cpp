// The activation table and the workspace carved from it.
#include "model/activations.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace tandem {

namespace {

const char* act_name(ActId id) {
  switch (id) {
    case ActId::residual:
      return "residual";
    case ActId::norm1:
      return "norm1";
    case ActId::norm1_mean:
      return "norm1_mean";
    case ActId::norm1_rstd:
      return "norm1_rstd";
    case ActId::qkv:
      return "qkv";
    case ActId::att:
      return "att";
    case ActId::atty:
      return "atty";
    case ActId::xmid:
      return "xmid";
    case ActId::norm2:
      return "norm2";
    case ActId::norm2_mean:
      return "norm2_mean";
    case ActId::norm2_rstd:
      return "norm2_rstd";
    case ActId::fch:
      return "fch";
    case ActId::act:
      return "act";
    case ActId::normf:
      return "normf";
    case ActId::normf_mean:
      return "normf_mean";
    case ActId::normf_rstd:
      return "normf_rstd";
    case ActId::logits:
      return "logits";
    case ActId::losses:
      return "losses";
    case ActId::dres:
      return "dres";
    case ActId::dnorm:
      return "dnorm";
    case ActId::dfch:
      return "dfch";
    case ActId::dact:
      return "dact";
    case ActId::datty:
      return "datty";
    case ActId::dqkv:
      return "dqkv";
    case ActId::tokens:
      return "tokens";
    case ActId::targets:
      return "targets";
    case ActId::scratch:
      return "scratch";
    case ActId::positions:
      return "positions";
    case ActId::slots:
      return "slots";
    case ActId::drawn:
      return "drawn";
  }
  return "?";
}

size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

}  // namespace

Recompute recompute_parse(const std::string& name) {
  if (name == "none") return Recompute::none;
  if (name == "attention") return Recompute::attention;
  if (name == "unit") return Recompute::unit;
  TD_THROW("--recompute must be none, attention or unit, got '{}'", name);
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none:
      return "none";
    case Recompute::attention:
      return "attention";
    case Recompute::unit:
      return "unit";
  }
  return "?";
}

std::string recompute_text(Recompute mode, int blocks, int n_layer) {
  if (mode == Recompute::none) return "";
  if (blocks <= 0 || blocks >= n_layer) return fmt::format(", recompute {}", recompute_name(mode));
  return fmt::format(", recompute {} in {} of {} blocks", recompute_name(mode), blocks, n_layer);
}

Recompute recompute_at(Recompute mode, int blocks, int layer) {
  return blocks <= 0 || layer < blocks ? mode : Recompute::none;
}

int recompute_fewest_blocks(int n_layer, const std::function<bool(int)>& fits) {
  if (!fits(n_layer)) return 0;
  int lo = std::min(2, n_layer), hi = n_layer;  // hi fits
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (fits(mid))
      hi = mid;
    else
      lo = mid + 1;
  }
  return hi;
}

std::string TensorSpec::name() const {
  if (id == ActId::residual) return fmt::format("residual.{}", layer);
  if (layer >= 0) return fmt::format("block.{}.{}", layer, act_name(id));
  return act_name(id);
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

KernelShape kernel_shape(const ModelConfig& c, int B, int T) {
  KernelShape s;
  s.B = B;
  s.T = T;
  s.C = c.d_model;
  s.Q = c.qkv_dim();
  s.A = c.attn_dim();
  s.F = c.d_ff;
  s.M = c.mlp_in_dim();
  s.Hq = c.n_head;
  s.Hkv = c.n_kv_head;
  s.D = c.head_dim();
  s.V = c.vocab;
  s.Vp = c.head_rows();  // the logits' width: a tensor-parallel rank's rows of the head
  return s;
}

ActivationTraits activation_traits(const Kernels& k, const ModelConfig& c, int B, int T,
                                   WorkspaceUse use, int P) {
  ActivationTraits t;
  t.use = use;
  t.compute_bytes = k.compute_bytes();
  t.attention = k.attention_saves(c.head_dim());
  KernelShape s = kernel_shape(c, B, T);
  s.P = use == WorkspaceUse::decode ? P : 0;  // only a decode step attends to the cache
  t.scratch_bytes = k.scratch_bytes(s);
  return t;
}

size_t KvCache::block_bytes(const ModelConfig& c, int slots, int positions, size_t compute_bytes) {
  return static_cast<size_t>(slots) * static_cast<size_t>(c.n_kv_head) *
         static_cast<size_t>(positions) * static_cast<size_t>(c.head_dim()) * compute_bytes;
}

std::vector<TensorSpec> activation_table(const ModelConfig& c, int B, int T,
                                         const ActivationTraits& traits) {
  TD_CHECK(B > 0 && T > 0, "workspace of batch {} and sequence {}", B, T);
  TD_CHECK(T <= c.context, "sequence length {} exceeds the model's context of {}", T, c.context);
  TD_CHECK(int64_t{B} * T < (int64_t{1} << 31), "batch x sequence {} x {} is too large", B, T);
  const int64_t N = int64_t{B} * T, C = c.d_model, F = c.d_ff, M = c.mlp_in_dim(), Q = c.qkv_dim(),
                A = c.attn_dim(), H = c.n_head, Vp = c.head_rows();
  const bool ln = c.norm == NormKind::layernorm;
  using D = ActDType;
  using L = Lifetime;
  std::vector<TensorSpec> t;
  auto add = [&](ActId id, int layer, std::vector<int64_t> shape, D dtype, L life) {
    t.push_back(TensorSpec{id, layer, std::move(shape), dtype, life});
  };
  // Inference: two residual buffers in turn and one block's tensors serve every block.
  const bool train = traits.use == WorkspaceUse::train;
  const int residuals = train ? c.n_layer + 1 : std::min(c.n_layer + 1, 2);
  // [Activation recompute] Training without recompute keeps every block's tensors; with
  // it, the recomputed ones appear once (as block 0's) and serve every block that
  // recomputes ([Partial recompute]: the first recompute_blocks of them).
  const Recompute rc = train ? traits.recompute : Recompute::none;
  TD_CHECK(traits.recompute_blocks >= 0 && traits.recompute_blocks <= c.n_layer,
           "--recompute-blocks {} is not a number of this model's {} blocks (0: every block)",
           traits.recompute_blocks, c.n_layer);
  const int blocks = !train ? std::min(c.n_layer, 1) : c.n_layer;
  for (int l = 0; l < residuals; ++l) add(ActId::residual, l, {N, C}, D::compute, L::step);
  for (int l = 0; l < blocks; ++l) {
    const Recompute r = recompute_at(rc, traits.recompute_blocks, l);
    if (r == Recompute::unit && l > 0) continue;  // block 0's tensors serve it
    const L kept = r == Recompute::unit ? L::recomputed : L::saved;
    const L attn = r == Recompute::none ? L::saved : L::recomputed;
    add(ActId::norm1, l, {N, C}, D::compute, kept);
    if (ln) add(ActId::norm1_mean, l, {N}, D::f32, kept);
    add(ActId::norm1_rstd, l, {N}, D::f32, kept);
    add(ActId::qkv, l, {N, Q}, D::compute, kept);
    if (r != Recompute::attention || l == 0) {
      if (traits.attention == AttentionSaves::probabilities)
        add(ActId::att, l, {B, H, T, T}, D::compute, attn);
      else
        add(ActId::att, l, {B, H, T}, D::f32, attn);
      add(ActId::atty, l, {N, A}, D::compute, attn);
    }
    add(ActId::xmid, l, {N, C}, D::compute, kept);
    add(ActId::norm2, l, {N, C}, D::compute, kept);
    if (ln) add(ActId::norm2_mean, l, {N}, D::f32, kept);
    add(ActId::norm2_rstd, l, {N}, D::f32, kept);
    add(ActId::fch, l, {N, M}, D::compute, kept);
    add(ActId::act, l, {N, F}, D::compute, kept);
  }
  if (traits.use != WorkspaceUse::prefill) {
    add(ActId::normf, -1, {N, C}, D::compute, L::saved);
    if (ln) add(ActId::normf_mean, -1, {N}, D::f32, L::saved);
    add(ActId::normf_rstd, -1, {N}, D::f32, L::saved);
    // [Chunked loss] A training head that makes its logits in chunks holds one chunk.
    const bool chunks = train && traits.loss_chunk > 0;
    add(ActId::logits, -1, {chunks ? std::min<int64_t>(traits.loss_chunk, N) : N, Vp}, D::compute,
        chunks ? L::backward : L::step);
  }
  if (train) {
    add(ActId::losses, -1, {N}, D::f32, L::step);
    add(ActId::dres, -1, {N, C}, D::compute, L::backward);
    add(ActId::dnorm, -1, {N, C}, D::compute, L::backward);
    add(ActId::dfch, -1, {N, M}, D::compute, L::backward);
    // SwiGLU's [N, F] output gradient; GELU's goes straight into dfch (linear_gelu_backward).
    if (c.mlp == MlpKind::swiglu) add(ActId::dact, -1, {N, F}, D::compute, L::backward);
    add(ActId::datty, -1, {N, A}, D::compute, L::backward);
    add(ActId::dqkv, -1, {N, Q}, D::compute, L::backward);
  }
  add(ActId::tokens, -1, {N}, D::i32, L::step);
  if (train) {
    add(ActId::targets, -1, {N}, D::i32, L::step);
  } else {
    add(ActId::positions, -1, {N}, D::i32, L::step);
    add(ActId::slots, -1, {N}, D::i32, L::step);
  }
  if (traits.use == WorkspaceUse::decode) add(ActId::drawn, -1, {2, N}, D::i32, L::step);
  add(ActId::scratch, -1, {static_cast<int64_t>(traits.scratch_bytes)}, D::bytes, L::call);
  return t;
}

size_t tensor_bytes(const TensorSpec& t, const ActivationTraits& traits) {
  size_t e = 1;
  switch (t.dtype) {
    case ActDType::compute:
      e = traits.compute_bytes;
      break;
    case ActDType::f32:
    case ActDType::i32:
      e = 4;
      break;
    case ActDType::bytes:
      e = 1;
      break;
  }
  return static_cast<size_t>(t.numel()) * e;
}

size_t activation_bytes(const ModelConfig& c, int B, int T, const ActivationTraits& traits) {
  size_t off = 0;
  for (const TensorSpec& t : activation_table(c, B, T, traits))
    off += align_up(tensor_bytes(t, traits), traits.alignment);
  return off;
}

Workspace::Workspace(const ModelConfig& c, int B_, int T_, const ActivationTraits& tr,
                     void* storage)
    : B(B_), T(T_), N(B_ * T_), traits(tr) {
  TD_CHECK(storage != nullptr, "workspace without storage");
  residual.assign(static_cast<size_t>(c.n_layer) + 1, nullptr);
  blocks.assign(static_cast<size_t>(c.n_layer), Block{});
  char* base = static_cast<char*>(storage);
  size_t off = 0;
  for (const TensorSpec& t : activation_table(c, B, T, traits)) {
    void* p = base + off;
    off += align_up(tensor_bytes(t, traits), traits.alignment);
    float* f = static_cast<float*>(p);
    Block* b =
        t.layer >= 0 && t.id != ActId::residual ? &blocks[static_cast<size_t>(t.layer)] : nullptr;
    switch (t.id) {
      case ActId::residual:
        residual[static_cast<size_t>(t.layer)] = p;
        break;
      case ActId::norm1:
        b->norm1 = p;
        break;
      case ActId::norm1_mean:
        b->norm1_mean = f;
        break;
      case ActId::norm1_rstd:
        b->norm1_rstd = f;
        break;
      case ActId::qkv:
        b->qkv = p;
        break;
      case ActId::att:
        b->att = p;
        break;
      case ActId::atty:
        b->atty = p;
        break;
      case ActId::xmid:
        b->xmid = p;
        break;
      case ActId::norm2:
        b->norm2 = p;
        break;
      case ActId::norm2_mean:
        b->norm2_mean = f;
        break;
      case ActId::norm2_rstd:
        b->norm2_rstd = f;
        break;
      case ActId::fch:
        b->fch = p;
        break;
      case ActId::act:
        b->act = p;
        break;
      case ActId::normf:
        normf = p;
        break;
      case ActId::normf_mean:
        normf_mean = f;
        break;
      case ActId::normf_rstd:
        normf_rstd = f;
        break;
      case ActId::logits:
        logits = p;
        break;
      case ActId::losses:
        losses = f;
        break;
      case ActId::dres:
        dres = p;
        break;
      case ActId::dnorm:
        dnorm = p;
        break;
      case ActId::dfch:
        dfch = p;
        break;
      case ActId::dact:
        dact = p;
        break;
      case ActId::datty:
        datty = p;
        break;
      case ActId::dqkv:
        dqkv = p;
        break;
      case ActId::tokens:
        tokens = static_cast<int32_t*>(p);
        break;
      case ActId::targets:
        targets = static_cast<int32_t*>(p);
        break;
      case ActId::scratch:
        scratch = p;
        scratch_bytes = traits.scratch_bytes;
        break;
      case ActId::positions:
        positions = static_cast<int32_t*>(p);
        break;
      case ActId::slots:
        slots = static_cast<int32_t*>(p);
        break;
      case ActId::drawn:
        drawn = static_cast<int32_t*>(p);
        break;
    }
  }
  if (traits.use != WorkspaceUse::train) {
    for (size_t l = 2; l < residual.size(); ++l) residual[l] = residual[l % 2];
    for (size_t l = 1; l < blocks.size(); ++l) blocks[l] = blocks[0];
  } else {
    for (size_t l = 1; l < blocks.size(); ++l) {
      const Recompute r =
          recompute_at(traits.recompute, traits.recompute_blocks, static_cast<int>(l));
      if (r == Recompute::unit) {
        blocks[l] = blocks[0];
      } else if (r == Recompute::attention) {
        blocks[l].att = blocks[0].att;
        blocks[l].atty = blocks[0].atty;
      }
    }
  }
}

std::unique_ptr<Workspace> Workspace::on_host(const ModelConfig& c, int B, int T,
                                              const ActivationTraits& traits) {
  const size_t bytes = std::max<size_t>(activation_bytes(c, B, T, traits), traits.alignment);
  std::shared_ptr<void> memory(
      std::aligned_alloc(traits.alignment, align_up(bytes, traits.alignment)), std::free);
  TD_CHECK(memory != nullptr, "cannot allocate a workspace of {} bytes", bytes);
  std::memset(memory.get(), 0, bytes);
  auto ws = std::make_unique<Workspace>(c, B, T, traits, memory.get());
  ws->owned_ = std::move(memory);
  return ws;
}

}  // namespace tandem
