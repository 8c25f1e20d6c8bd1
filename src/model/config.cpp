// Presets and JSON (de)serialisation of model configurations.
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"

namespace tandem {

namespace {

ModelConfig gpt2(const char* name, int vocab, int vocab_padded, int context, int d, int layers,
                 int heads) {
  ModelConfig c;
  c.name = name;
  family_defaults(c, Family::gpt2);
  c.vocab = vocab;
  c.vocab_padded = vocab_padded;
  c.context = context;
  c.d_model = d;
  c.n_layer = layers;
  c.n_head = heads;
  c.n_kv_head = heads;
  c.d_ff = 4 * d;
  return c;
}

ModelConfig llama(const char* name, int vocab, int context, int d, int layers, int heads,
                  int kv_heads, int ff, float theta) {
  ModelConfig c;
  c.name = name;
  family_defaults(c, Family::llama);
  c.vocab = vocab;
  c.vocab_padded = vocab;
  c.context = context;
  c.d_model = d;
  c.n_layer = layers;
  c.n_head = heads;
  c.n_kv_head = kv_heads;
  c.d_ff = ff;
  c.rope_theta = theta;
  return c;
}

// GPT-NeoX as trained for Pythia: d_ff = 4 d_model, a quarter of each head rotates.
ModelConfig neox(const char* name, int vocab, int vocab_padded, int context, int d, int layers,
                 int heads) {
  ModelConfig c;
  c.name = name;
  family_defaults(c, Family::neox);
  c.vocab = vocab;
  c.vocab_padded = vocab_padded;
  c.context = context;
  c.d_model = d;
  c.n_layer = layers;
  c.n_head = heads;
  c.n_kv_head = heads;
  c.d_ff = 4 * d;
  c.rope_theta = 10000.0f;
  return c;
}

std::vector<ModelConfig> all_presets() {
  return {
      // Byte-level models for tests and the demo.
      gpt2("gpt2-tiny", 256, 256, 256, 128, 4, 4),
      llama("llama-tiny", 256, 256, 128, 4, 4, 2, 352, 10000.0f),
      // GPT-2 with its 50257-token vocabulary padded to 50304 rows.
      gpt2("gpt2-124m", 50257, 50304, 1024, 768, 12, 12),
      gpt2("gpt2-350m", 50257, 50304, 1024, 1024, 24, 16),
      gpt2("gpt2-774m", 50257, 50304, 1024, 1280, 36, 20),
      gpt2("gpt2-1558m", 50257, 50304, 1024, 1600, 48, 25),
      llama("llama2-7b", 32000, 4096, 4096, 32, 32, 32, 11008, 10000.0f),
      llama("llama3-8b", 128256, 8192, 4096, 32, 32, 8, 14336, 500000.0f),
      // Pythia: 50254 tokens in rows padded to 50304 (50432 for 6.9B), as published.
      neox("pythia-tiny", 256, 256, 256, 128, 4, 4),
      neox("pythia-160m", 50254, 50304, 2048, 768, 12, 12),
      neox("pythia-1b", 50254, 50304, 2048, 2048, 16, 8),
      neox("pythia-2.8b", 50254, 50304, 2048, 2560, 32, 32),
      neox("pythia-6.9b", 50254, 50432, 2048, 4096, 32, 32),
  };
}

template <typename T>
T get_value(const nlohmann::json& j, const char* key) {
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    TD_THROW("model config: key '{}' has a bad value {} (expected {})", key, j.at(key).dump(),
             std::is_same_v<T, std::string> ? "a string" : "a number");
  }
}

}  // namespace

const char* family_name(Family f) {
  switch (f) {
    case Family::gpt2:
      return "gpt2";
    case Family::llama:
      return "llama";
    case Family::neox:
      return "neox";
  }
  return "?";
}

const char* norm_name(NormKind k) {
  return k == NormKind::layernorm ? "layernorm" : "rmsnorm";
}

const char* mlp_name(MlpKind k) {
  switch (k) {
    case MlpKind::gelu_tanh:
      return "gelu_tanh";
    case MlpKind::gelu_erf:
      return "gelu_erf";
    case MlpKind::swiglu:
      return "swiglu";
  }
  return "?";
}

const char* residual_name(ResidualKind k) {
  return k == ResidualKind::sequential ? "sequential" : "parallel";
}

void family_defaults(ModelConfig& c, Family f) {
  c.family = f;
  switch (f) {
    case Family::gpt2:
      c.norm = NormKind::layernorm;
      c.mlp = MlpKind::gelu_tanh;
      c.residual = ResidualKind::sequential;
      c.bias = true;
      c.tied_head = true;
      c.learned_positions = true;
      c.rotary_pct = 0.0f;
      return;
    case Family::llama:
      c.norm = NormKind::rmsnorm;
      c.mlp = MlpKind::swiglu;
      c.residual = ResidualKind::sequential;
      c.bias = false;
      c.tied_head = false;
      c.learned_positions = false;
      c.rotary_pct = 1.0f;
      return;
    case Family::neox:
      c.norm = NormKind::layernorm;
      c.mlp = MlpKind::gelu_erf;
      c.residual = ResidualKind::parallel;
      c.bias = true;
      c.tied_head = false;
      c.learned_positions = false;
      c.rotary_pct = 0.25f;
      return;
  }
}

int ModelConfig::head_rows() const {
  if (tp.ways <= 1) return vocab_padded;
  const int64_t per = (int64_t{vocab_padded} + tp.ways - 1) / tp.ways;
  return static_cast<int>((per + 63) / 64 * 64);
}

int ModelConfig::rotary_dim() const {
  const int r = static_cast<int>(static_cast<double>(head_dim()) * rotary_pct);
  return r - r % 2;
}

namespace {

int64_t norm_params(const ModelConfig& c) {
  const int64_t C = c.d_model;
  return c.norm == NormKind::layernorm && c.bias ? 2 * C : C;
}

int64_t block_params(const ModelConfig& c) {
  const int64_t C = c.d_model, F = c.d_ff, Q = c.qkv_dim(), A = c.attn_dim(), M = c.mlp_in_dim();
  const int64_t b = c.bias ? 1 : 0;
  return 2 * norm_params(c) + (C * Q + b * Q) + (A * C + b * C) + (C * M + b * M) + (F * C + b * C);
}

// The embedding and the head (the final norm and an untied head matrix).
int64_t count_params_outside_blocks(const ModelConfig& c) {
  const int64_t C = c.d_model, V = c.vocab_padded;
  return V * C + (c.learned_positions ? int64_t{c.context} * C : 0) + norm_params(c) +
         (c.tied_head ? 0 : V * C);
}

// V rows of the embedding, Vh of an untied head.
int64_t count_params(const ModelConfig& c, int64_t V, int64_t Vh) {
  const int64_t C = c.d_model;
  const int64_t embed = V * C + (c.learned_positions ? int64_t{c.context} * C : 0);
  const int64_t head = norm_params(c) + (c.tied_head ? 0 : Vh * C);
  return embed + c.n_layer * block_params(c) + head;
}

// Models beyond this many parameters are refused, so that parameter counts and byte
// sizes computed from a config never overflow 64 bits.
constexpr int64_t kMaxParams = int64_t{1} << 48;

}  // namespace

int64_t ModelConfig::num_params() const {
  const int64_t real_rows = std::clamp<int64_t>(int64_t{vocab} - head_begin(), 0, head_rows());
  return count_params(*this, vocab, real_rows);
}

int64_t ModelConfig::num_params_padded() const {
  return count_params(*this, vocab_padded, head_rows());
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& p : all_presets()) names.push_back(p.name);
  return names;
}

ModelConfig preset(const std::string& name) {
  for (const auto& p : all_presets())
    if (p.name == name) return p;
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  TD_THROW("unknown model preset '{}' (known: {})", name, known);
}

ModelConfig model_config_from_json(const nlohmann::json& j) {
  TD_CHECK(j.is_object(), "model config must be a JSON object, got {}", j.type_name());
  ModelConfig c;
  if (j.contains("preset")) c = preset(get_value<std::string>(j, "preset"));
  static const char* known[] = {
      "preset",   "name",   "family",    "vocab", "vocab_padded", "context",           "d_model",
      "n_layer",  "n_head", "n_kv_head", "d_ff",  "norm_eps",     "rope_theta",        "init_std",
      "norm",     "mlp",    "residual",  "bias",  "tied_head",    "learned_positions", "rotary_pct",
      "head_size"};
  for (const auto& [key, value] : j.items()) {
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    TD_CHECK(ok, "model config: unknown key '{}'", key);
  }
  if (j.contains("name")) c.name = get_value<std::string>(j, "name");
  if (j.contains("family")) {
    std::string f = get_value<std::string>(j, "family");
    TD_CHECK(f == "gpt2" || f == "llama" || f == "neox",
             "model config: family '{}' (expected gpt2, llama or neox)", f);
    family_defaults(c, f == "gpt2" ? Family::gpt2 : f == "llama" ? Family::llama : Family::neox);
  }
  auto set_enum = [&](const char* key, auto& field, auto name_of, auto... values) {
    if (!j.contains(key)) return;
    const std::string v = get_value<std::string>(j, key);
    std::string names;
    bool found = false;
    for (auto value : {values...}) {
      names += (names.empty() ? "" : ", ") + std::string(name_of(value));
      if (v == name_of(value)) {
        field = value;
        found = true;
      }
    }
    TD_CHECK(found, "model config: {} '{}' (expected one of {})", key, v, names);
  };
  set_enum("norm", c.norm, norm_name, NormKind::layernorm, NormKind::rmsnorm);
  set_enum("mlp", c.mlp, mlp_name, MlpKind::gelu_tanh, MlpKind::gelu_erf, MlpKind::swiglu);
  set_enum("residual", c.residual, residual_name, ResidualKind::sequential, ResidualKind::parallel);
  auto set_bool = [&](const char* key, bool& field) {
    if (!j.contains(key)) return;
    TD_CHECK(j.at(key).is_boolean(), "model config: key '{}' must be true or false, got {}", key,
             j.at(key).dump());
    field = j.at(key).get<bool>();
  };
  set_bool("bias", c.bias);
  set_bool("tied_head", c.tied_head);
  set_bool("learned_positions", c.learned_positions);
  auto set_int = [&](const char* key, int& field) {
    if (!j.contains(key)) return;
    const nlohmann::json& v = j.at(key);
    TD_CHECK(v.is_number_integer(), "model config: key '{}' must be an integer, got {}", key,
             v.dump());
    const bool fits = v.is_number_unsigned()
                          ? v.get<uint64_t>() <= static_cast<uint64_t>(INT32_MAX)
                          : v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX;
    TD_CHECK(fits, "model config: key '{}' is out of range: {}", key, v.dump());
    field = v.get<int>();
  };
  auto set_float = [&](const char* key, float& field) {
    if (!j.contains(key)) return;
    const nlohmann::json& v = j.at(key);
    TD_CHECK(v.is_number(), "model config: key '{}' must be a number, got {}", key, v.dump());
    // A double beyond float's range has no float value (the conversion is undefined).
    TD_CHECK(std::fabs(v.get<double>()) <= std::numeric_limits<float>::max(),
             "model config: key '{}' is out of range: {}", key, v.dump());
    field = v.get<float>();
  };
  bool padded_given = j.contains("vocab_padded");
  set_int("vocab", c.vocab);
  set_int("vocab_padded", c.vocab_padded);
  if (!padded_given && c.vocab_padded < c.vocab) c.vocab_padded = c.vocab;
  set_int("context", c.context);
  set_int("d_model", c.d_model);
  set_int("n_layer", c.n_layer);
  set_int("n_head", c.n_head);
  c.n_kv_head = c.family != Family::llama ? c.n_head : c.n_kv_head;
  set_int("n_kv_head", c.n_kv_head);
  // n_kv_head may be 0 here (n_head 0 in a gpt2 config); validation reports it below.
  if (!j.contains("n_kv_head") && c.n_kv_head != 0 && c.n_head % c.n_kv_head != 0)
    c.n_kv_head = c.n_head;
  set_int("d_ff", c.d_ff);
  set_int("head_size", c.head_size);
  set_float("norm_eps", c.norm_eps);
  set_float("rope_theta", c.rope_theta);
  set_float("init_std", c.init_std);
  set_float("rotary_pct", c.rotary_pct);
  model_config_validate(c);
  return c;
}

nlohmann::json model_config_to_json(const ModelConfig& c) {
  nlohmann::json j = {{"name", c.name},
                      {"family", family_name(c.family)},
                      {"vocab", c.vocab},
                      {"vocab_padded", c.vocab_padded},
                      {"context", c.context},
                      {"d_model", c.d_model},
                      {"n_layer", c.n_layer},
                      {"n_head", c.n_head},
                      {"n_kv_head", c.n_kv_head},
                      {"d_ff", c.d_ff},
                      {"norm_eps", c.norm_eps},
                      {"rope_theta", c.rope_theta},
                      {"init_std", c.init_std},
                      {"norm", norm_name(c.norm)},
                      {"mlp", mlp_name(c.mlp)},
                      {"residual", residual_name(c.residual)},
                      {"bias", c.bias},
                      {"tied_head", c.tied_head},
                      {"learned_positions", c.learned_positions},
                      {"rotary_pct", c.rotary_pct}};
  // Only when set, so that every config without it is written as before.
  if (c.head_size != 0) j["head_size"] = c.head_size;
  return j;
}

void model_config_validate(const ModelConfig& c) {
  auto positive = [](const char* key, int v) {
    TD_CHECK(v > 0, "model config: {} must be positive, got {}", key, v);
  };
  positive("vocab", c.vocab);
  positive("context", c.context);
  positive("d_model", c.d_model);
  positive("n_layer", c.n_layer);
  positive("n_head", c.n_head);
  positive("n_kv_head", c.n_kv_head);
  positive("d_ff", c.d_ff);
  TD_CHECK(c.vocab_padded >= c.vocab, "model config: vocab_padded {} is smaller than vocab {}",
           c.vocab_padded, c.vocab);
  TD_CHECK(c.head_size >= 0,
           "model config: head_size must be positive (0: d_model / n_head), got {}", c.head_size);
  TD_CHECK(c.head_size > 0 || c.d_model % c.n_head == 0,
           "model config: d_model {} is not a multiple of n_head {}", c.d_model, c.n_head);
  TD_CHECK(c.tp.ways >= 1 && c.tp.rank >= 0 && c.tp.rank < c.tp.ways,
           "model config: tensor-parallel rank {} of {} ranks", c.tp.rank, c.tp.ways);
  TD_CHECK(c.n_head % c.n_kv_head == 0, "model config: n_head {} is not a multiple of n_kv_head {}",
           c.n_head, c.n_kv_head);
  TD_CHECK(c.family != Family::gpt2 || c.n_kv_head == c.n_head,
           "model config: gpt2 models have n_kv_head == n_head ({} != {})", c.n_kv_head, c.n_head);
  TD_CHECK(c.rotary_pct >= 0 && c.rotary_pct <= 1, "model config: rotary_pct {} out of [0, 1]",
           c.rotary_pct);
  TD_CHECK(c.rotary_pct == 0 || c.rotary_dim() >= 2,
           "model config: rotary_pct {} of a head of {} channels rotates no channel pair",
           c.rotary_pct, c.head_dim());
  TD_CHECK(c.norm_eps > 0 && c.norm_eps < 1, "model config: norm_eps {} out of (0, 1)", c.norm_eps);
  TD_CHECK(c.rope_theta > 1, "model config: rope_theta {} must exceed 1", c.rope_theta);
  TD_CHECK(c.init_std > 0, "model config: init_std {} must be positive", c.init_std);
  // Buffers are indexed with 32-bit ints in the kernels: every matrix (the embedding and
  // head, the position embedding, the fused QKV, the MLP's two products) stays below 2^31
  // elements, which also keeps the int widths of ModelConfig from overflowing.
  const int64_t C = c.d_model, limit = int64_t{1} << 31;
  const int64_t qkv_rows = (int64_t{c.n_head} + 2 * int64_t{c.n_kv_head}) * c.head_dim();
  const int64_t mlp_rows = (c.mlp == MlpKind::swiglu ? 2 : 1) * int64_t{c.d_ff};
  TD_CHECK(c.vocab_padded * C < limit && qkv_rows * C < limit && mlp_rows * C < limit &&
               (!c.learned_positions || c.context * C < limit),
           "model config: a weight matrix exceeds 2^31 elements");
  TD_CHECK(c.n_layer <= (kMaxParams - count_params_outside_blocks(c)) / block_params(c),
           "model config: {} layers of {} parameters exceed {} parameters in all", c.n_layer,
           block_params(c), kMaxParams);
}

ModelConfig model_config_resolve(const std::string& preset_or_path) {
  bool is_file = preset_or_path.size() > 5 &&
                 preset_or_path.compare(preset_or_path.size() - 5, 5, ".json") == 0;
  if (!is_file) return preset(preset_or_path);
  const nlohmann::json j = json_read_file(preset_or_path, "model config");
  try {
    return model_config_from_json(j);
  } catch (const Error& e) {
    TD_THROW("{}: {}", preset_or_path, e.message());
  }
}

bool operator==(const ModelConfig& a, const ModelConfig& b) {
  return a.tp.ways == b.tp.ways && a.tp.rank == b.tp.rank &&
         model_config_to_json(a) == model_config_to_json(b);
}

}  // namespace tandem
