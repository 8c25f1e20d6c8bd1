// Unit layouts of both families and their deterministic initialisation.
#include "model/model.h"

#include <cmath>

#include "core/error.h"
#include "core/rng.h"

namespace tandem {

namespace {

using Init = ParamSpec::Init;

void add_param(UnitLayout& u, std::string name, std::vector<int64_t> shape, bool decay, Init init) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.numel = 1;
  for (int64_t s : p.shape) p.numel *= s;
  p.offset = u.numel;
  p.decay = decay;
  p.init = init;
  u.numel += p.numel;
  u.params.push_back(std::move(p));
}

UnitLayout embedding_unit(const ModelConfig& c) {
  UnitLayout u;
  u.kind = UnitKind::embedding;
  u.name = "embedding";
  add_param(u, "wte", {c.vocab_padded, c.d_model}, true, Init::normal);
  if (c.family == Family::gpt2) add_param(u, "wpe", {c.context, c.d_model}, true, Init::normal);
  return u;
}

UnitLayout block_unit(const ModelConfig& c, int layer) {
  const int64_t C = c.d_model, F = c.d_ff, Q = c.qkv_dim(), A = c.n_head * c.head_dim();
  UnitLayout u;
  u.kind = UnitKind::block;
  u.layer = layer;
  u.name = "block." + std::to_string(layer);
  if (c.family == Family::gpt2) {
    add_param(u, "ln1_w", {C}, false, Init::ones);
    add_param(u, "ln1_b", {C}, false, Init::zeros);
    add_param(u, "qkv_w", {Q, C}, true, Init::normal);
    add_param(u, "qkv_b", {Q}, false, Init::zeros);
    add_param(u, "proj_w", {C, A}, true, Init::residual);
    add_param(u, "proj_b", {C}, false, Init::zeros);
    add_param(u, "ln2_w", {C}, false, Init::ones);
    add_param(u, "ln2_b", {C}, false, Init::zeros);
    add_param(u, "fc_w", {F, C}, true, Init::normal);
    add_param(u, "fc_b", {F}, false, Init::zeros);
    add_param(u, "fc2_w", {C, F}, true, Init::residual);
    add_param(u, "fc2_b", {C}, false, Init::zeros);
  } else {
    add_param(u, "norm1_w", {C}, false, Init::ones);
    add_param(u, "qkv_w", {Q, C}, true, Init::normal);
    add_param(u, "proj_w", {C, A}, true, Init::residual);
    add_param(u, "norm2_w", {C}, false, Init::ones);
    add_param(u, "w13", {2 * F, C}, true, Init::normal);  // [gate; up]
    add_param(u, "w2", {C, F}, true, Init::residual);
  }
  return u;
}

UnitLayout head_unit(const ModelConfig& c) {
  UnitLayout u;
  u.kind = UnitKind::head;
  u.name = "head";
  if (c.family == Family::gpt2) {
    add_param(u, "lnf_w", {c.d_model}, false, Init::ones);
    add_param(u, "lnf_b", {c.d_model}, false, Init::zeros);
  } else {
    add_param(u, "norm_w", {c.d_model}, false, Init::ones);
    add_param(u, "head_w", {c.vocab_padded, c.d_model}, true, Init::normal);
  }
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

const ParamSpec& UnitLayout::param(const std::string& pname) const {
  for (const auto& p : params)
    if (p.name == pname) return p;
  TD_THROW("unit '{}' has no parameter '{}'", name, pname);
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
    if (p.name == "wte" || p.name == "head_w") live = int64_t{config_.vocab} * p.shape[1];
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
