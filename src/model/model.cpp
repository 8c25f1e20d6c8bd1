// Unit layouts of both families and their deterministic initialisation.
#include "model/model.h"

#include <cmath>

#include "core/error.h"
#include "core/rng.h"

namespace tandem {

namespace {

using Init = ParamSpec::Init;

void add_param(UnitLayout& u, ParamId id, std::string name, std::vector<int64_t> shape, bool decay,
               Init init) {
  ParamSpec p;
  p.id = id;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.numel = 1;
  for (int64_t s : p.shape) p.numel *= s;
  p.offset = u.numel;
  p.decay = decay;
  p.init = init;
  u.offsets[static_cast<int>(id)] = p.offset;
  u.numel += p.numel;
  u.params.push_back(std::move(p));
}

UnitLayout new_unit(UnitKind kind, std::string name) {
  UnitLayout u;
  u.kind = kind;
  u.name = std::move(name);
  for (int64_t& o : u.offsets) o = -1;
  return u;
}

// A norm's gain (and bias, for a LayerNorm with biases). LayerNorms are named ln1/ln2/lnf,
// RMSNorms norm1/norm2/norm: the names of the checkpoints and of initialisation.
void add_norm(UnitLayout& u, const ModelConfig& c, ParamId w, ParamId b, const char* ln_name,
              const char* rms_name) {
  const int64_t C = c.d_model;
  if (c.norm == NormKind::layernorm) {
    add_param(u, w, std::string(ln_name) + "_w", {C}, false, Init::ones);
    if (c.bias) add_param(u, b, std::string(ln_name) + "_b", {C}, false, Init::zeros);
  } else {
    add_param(u, w, std::string(rms_name) + "_w", {C}, false, Init::ones);
  }
}

// A linear layer [out, in] with its bias when the model has biases.
void add_linear(UnitLayout& u, const ModelConfig& c, ParamId w, ParamId b, const std::string& name,
                int64_t out, int64_t in, Init init) {
  add_param(u, w, name + "_w", {out, in}, true, init);
  if (c.bias) add_param(u, b, name + "_b", {out}, false, Init::zeros);
}

UnitLayout embedding_unit(const ModelConfig& c) {
  UnitLayout u = new_unit(UnitKind::embedding, "embedding");
  add_param(u, ParamId::wte, "wte", {c.vocab_padded, c.d_model}, true, Init::normal);
  if (c.learned_positions)
    add_param(u, ParamId::wpe, "wpe", {c.context, c.d_model}, true, Init::normal);
  return u;
}

UnitLayout block_unit(const ModelConfig& c, int layer) {
  const int64_t C = c.d_model, F = c.d_ff, Q = c.qkv_dim(), A = c.attn_dim();
  UnitLayout u = new_unit(UnitKind::block, "block." + std::to_string(layer));
  u.layer = layer;
  add_norm(u, c, ParamId::norm1_w, ParamId::norm1_b, "ln1", "norm1");
  add_linear(u, c, ParamId::qkv_w, ParamId::qkv_b, "qkv", Q, C, Init::normal);
  add_linear(u, c, ParamId::proj_w, ParamId::proj_b, "proj", C, A, Init::residual);
  add_norm(u, c, ParamId::norm2_w, ParamId::norm2_b, "ln2", "norm2");
  if (c.mlp == MlpKind::swiglu) {  // [gate; up], then down; no biases in this naming
    add_param(u, ParamId::fc_w, "w13", {2 * F, C}, true, Init::normal);
    if (c.bias) add_param(u, ParamId::fc_b, "w13_b", {2 * F}, false, Init::zeros);
    add_param(u, ParamId::fc2_w, "w2", {C, F}, true, Init::residual);
    if (c.bias) add_param(u, ParamId::fc2_b, "w2_b", {C}, false, Init::zeros);
  } else {
    add_linear(u, c, ParamId::fc_w, ParamId::fc_b, "fc", F, C, Init::normal);
    add_linear(u, c, ParamId::fc2_w, ParamId::fc2_b, "fc2", C, F, Init::residual);
  }
  return u;
}

UnitLayout head_unit(const ModelConfig& c) {
  UnitLayout u = new_unit(UnitKind::head, "head");
  add_norm(u, c, ParamId::normf_w, ParamId::normf_b, "lnf", "norm");
  if (!c.tied_head)
    add_param(u, ParamId::head_w, "head_w", {c.head_rows(), c.d_model}, true, Init::normal);
  return u;
}

// A counter-based normal: element `pos` of the stream `key`, independent of any other.
float normal_at(uint64_t key, int64_t pos) {
  uint64_t s = key ^ (static_cast<uint64_t>(pos) * 0xd1b54a32d192ed03ull);
  splitmix64(s);
  Rng rng(s);
  return static_cast<float>(rng.normal());
}

}  // namespace

int64_t UnitLayout::at(ParamId id) const {
  const int64_t o = offsets[static_cast<int>(id)];
  TD_CHECK(o >= 0, "unit '{}' has no parameter number {}", name, static_cast<int>(id));
  return o;
}

const ParamSpec& UnitLayout::param(ParamId id) const {
  for (const auto& p : params)
    if (p.id == id) return p;
  TD_THROW("unit '{}' has no parameter number {}", name, static_cast<int>(id));
}

ModelLayout::ModelLayout(const ModelConfig& config) : config_(config) {
  model_config_validate(config_);
  units_.push_back(embedding_unit(config_));
  for (int l = 0; l < config_.n_layer; ++l) units_.push_back(block_unit(config_, l));
  units_.push_back(head_unit(config_));
  for (size_t i = 0; i < units_.size(); ++i) units_[i].index = static_cast<int>(i);
}

int64_t ModelLayout::total_numel() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u.numel;
  return n;
}

std::vector<int> ModelLayout::reads(int i) const {
  if (config_.tied() && unit(i).kind == UnitKind::head) return {0};
  return {};
}

void ModelLayout::init_slice(int unit_index, uint64_t seed, int64_t begin, int64_t end,
                             float* out) const {
  const UnitLayout& u = unit(unit_index);
  TD_CHECK(0 <= begin && begin <= end, "init_slice [{}, {}) of unit {}", begin, end, u.name);
  const float residual_std =
      config_.init_std / std::sqrt(2.0f * static_cast<float>(config_.n_layer));
  for (const auto& p : u.params) {
    int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    uint64_t key = hash_name(u.name + "/" + p.name, hash_name(std::to_string(seed)));
    // Rows past the real vocabulary are never used; they start (and stay) at zero.
    int64_t live = p.numel;
    if (p.id == ParamId::wte || p.id == ParamId::head_w) live = int64_t{config_.vocab} * p.shape[1];
    for (int64_t i = lo; i < hi; ++i) {
      int64_t pos = i - p.offset;
      float v = 0.0f;
      switch (p.init) {
        case ParamSpec::Init::normal:
          v = pos < live ? config_.init_std * normal_at(key, pos) : 0.0f;
          break;
        case ParamSpec::Init::residual:
          v = residual_std * normal_at(key, pos);
          break;
        case ParamSpec::Init::zeros:
          v = 0.0f;
          break;
        case ParamSpec::Init::ones:
          v = 1.0f;
          break;
      }
      out[i - begin] = v;
    }
  }
  // Elements beyond the parameters (flat-buffer padding) are zero.
  for (int64_t i = std::max(begin, u.numel); i < end; ++i) out[i - begin] = 0.0f;
}

}  // namespace tandem
