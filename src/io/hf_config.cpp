// config.json of Hugging Face model directories: read into a tandem ModelConfig, refusing
// anything tandem cannot honour or does not know, and written back from one. Every key a
// config may hold is one of: used (it sets a ModelConfig field or a token id), checked (it
// must hold the value tandem computes with) or irrelevant (it cannot change the model's
// outputs); any other key is refused, since tandem cannot tell what it would change.
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "io/file.h"
#include "io/hf.h"

namespace fs = std::filesystem;

namespace tandem {

namespace {

using ordered_json = nlohmann::ordered_json;

// Keys no architecture's outputs depend on: bookkeeping, output switches, task heads tandem
// does not build, and the sampling defaults old configs carried.
const std::set<std::string>& common_irrelevant() {
  static const std::set<std::string> keys = {
      "transformers_version", "torch_dtype", "dtype", "use_cache", "_name_or_path", "_commit_hash",
      "_attn_implementation_autoset", "return_dict", "output_hidden_states", "output_attentions",
      "torchscript", "id2label", "label2id", "problem_type", "finetuning_task", "tokenizer_class",
      "prefix", "task_specific_params", "chunk_size_feed_forward", "tie_encoder_decoder",
      "sep_token_id", "decoder_start_token_id", "is_decoder",
      // Sampling defaults (generation, not the model).
      "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
      "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
      "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
      "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
      "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
      "suppress_tokens", "begin_suppress_tokens"};
  return keys;
}

// Per architecture: irrelevant keys of its own.
std::set<std::string> arch_irrelevant(HfArch a) {
  switch (a) {
    case HfArch::gpt2:
      // summary_*: the sequence-summary head of GPT2DoubleHeadsModel. n_ctx: an old spelling
      // the model ignores. reorder_and_upcast_attn: computes attention in fp32, as tandem does.
      return {"summary_type",           "summary_use_proj",      "summary_activation",
              "summary_proj_to_labels", "summary_first_dropout", "n_ctx",
              "reorder_and_upcast_attn"};
    case HfArch::llama:
      return {};
    case HfArch::neox:
      return {"classifier_dropout"};  // the classification head only
  }
  return {};
}

// A config.json being read: every access marks its key, so what is left is unknown.
class Reader {
 public:
  Reader(const ordered_json& j, std::string path) : j_(j), path_(std::move(path)) {}

  const std::string& path() const { return path_; }
  bool has(const std::string& key) {
    seen_.insert(key);
    return j_.contains(key) && !j_.at(key).is_null();
  }
  const ordered_json& at(const std::string& key) {
    seen_.insert(key);
    return j_.at(key);
  }
  int integer(const std::string& key, std::optional<int> fallback = std::nullopt) {
    if (!has(key)) {
      TD_CHECK(fallback.has_value(), "{}: no '{}' (tandem needs it)", path_, key);
      return *fallback;
    }
    const ordered_json& v = at(key);
    TD_CHECK(v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() <= INT32_MAX,
             "{}: '{}' must be a positive integer, got {}", path_, key, v.dump());
    return v.get<int>();
  }
  double number(const std::string& key, double fallback) {
    if (!has(key)) return fallback;
    const ordered_json& v = at(key);
    TD_CHECK(v.is_number(), "{}: '{}' must be a number, got {}", path_, key, v.dump());
    return v.get<double>();
  }
  bool boolean(const std::string& key, bool fallback) {
    if (!has(key)) return fallback;
    const ordered_json& v = at(key);
    TD_CHECK(v.is_boolean(), "{}: '{}' must be true or false, got {}", path_, key, v.dump());
    return v.get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) {
    if (!has(key)) return fallback;
    const ordered_json& v = at(key);
    TD_CHECK(v.is_string(), "{}: '{}' must be a string, got {}", path_, key, v.dump());
    return v.get<std::string>();
  }
  // A key tandem computes with one value only: absent, null or that value.
  void require(const std::string& key, const ordered_json& value, const std::string& why) {
    if (!has(key)) return;
    TD_CHECK(at(key) == value, "{}: '{}' is {}; tandem supports only {} ({})", path_, key,
             at(key).dump(), value.dump(), why);
  }
  void refuse_set(const std::string& key, const std::string& why) {
    TD_CHECK(!has(key), "{}: '{}' is set ({}); tandem cannot honour it ({})", path_, key,
             at(key).dump(), why);
  }
  // Dropout rates: tandem trains without dropout, which a non-zero rate would change.
  void dropout(const std::string& key, std::vector<std::string>& rates) {
    const double p = number(key, 0.0);
    TD_CHECK(p >= 0 && p < 1, "{}: '{}' must be in [0, 1), got {}", path_, key, p);
    if (p != 0) rates.push_back(fmt::format("{} {}", key, p));
  }
  void check_unknown(HfArch arch) {
    const std::set<std::string> own = arch_irrelevant(arch);
    for (const auto& [key, value] : j_.items()) {
      if (seen_.count(key) || common_irrelevant().count(key) || own.count(key)) continue;
      TD_THROW(
          "{}: unknown key '{}' (tandem reads {} configs with the keys it knows, and cannot "
          "tell whether this one changes the model)",
          path_, key, hf_arch_class(arch));
    }
  }

 private:
  const ordered_json& j_;
  std::string path_;
  std::set<std::string> seen_;
};

// rope_parameters (and rope_scaling, its older name): only the default rotary embedding,
// whose base and rotated share may be given here too. Returns them when given.
void read_rope(Reader& r, const std::string& key, std::optional<double>& theta,
               std::optional<double>& partial) {
  if (!r.has(key)) return;
  const ordered_json& o = r.at(key);
  TD_CHECK(o.is_object(), "{}: '{}' must be an object, got {}", r.path(), key, o.dump());
  for (const auto& [k, v] : o.items()) {
    if (k == "rope_type" || k == "type") {
      TD_CHECK(v == "default",
               "{}: '{}.{}' is {}; tandem supports only the default rotary embedding (no "
               "scaling)",
               r.path(), key, k, v.dump());
    } else if (k == "rope_theta" && v.is_number()) {
      theta = v.get<double>();
    } else if (k == "partial_rotary_factor" && v.is_number()) {
      partial = v.get<double>();
    } else {
      TD_THROW(
          "{}: '{}' holds '{}' = {}, which tandem cannot honour (only rope_type \"default\", "
          "rope_theta and partial_rotary_factor)",
          r.path(), key, k, v.dump());
    }
  }
}

// One value given under several spellings: they must agree.
double agree(const std::string& path, const std::string& what,
             const std::vector<std::pair<std::string, std::optional<double>>>& given,
             double fallback) {
  std::optional<double> value;
  std::string first;
  for (const auto& [name, v] : given) {
    if (!v) continue;
    TD_CHECK(!value || *value == *v, "{}: {} is {} in '{}' but {} in '{}'", path, what, *value,
             first, *v, name);
    value = v;
    first = name;
  }
  return value.value_or(fallback);
}

std::optional<int64_t> token_id(Reader& r, const std::string& key) {
  if (!r.has(key)) return std::nullopt;
  const ordered_json& v = r.at(key);
  TD_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0,
           "{}: '{}' must be a non-negative integer, got {}", r.path(), key, v.dump());
  return v.get<int64_t>();
}

std::vector<int64_t> token_ids(Reader& r, const std::string& key) {
  if (!r.has(key)) return {};
  const ordered_json& v = r.at(key);
  std::vector<int64_t> ids;
  for (const ordered_json& e : v.is_array() ? v : ordered_json::array({v})) {
    TD_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0,
             "{}: '{}' must be a non-negative integer or a list of them, got {}", r.path(), key,
             v.dump());
    ids.push_back(e.get<int64_t>());
  }
  return ids;
}

HfTokens read_tokens(Reader& r) {
  HfTokens t;
  t.bos = token_id(r, "bos_token_id");
  t.eos = token_ids(r, "eos_token_id");
  t.pad = token_id(r, "pad_token_id");
  return t;
}

MlpKind gelu_kind(Reader& r, const std::string& key, const std::string& fallback) {
  const std::string act = r.string(key, fallback);
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") return MlpKind::gelu_tanh;
  if (act == "gelu") return MlpKind::gelu_erf;
  TD_THROW(
      "{}: '{}' is \"{}\"; tandem computes \"gelu\" (exact erf), \"gelu_new\" and "
      "\"gelu_pytorch_tanh\" (tanh approximation)",
      r.path(), key, act);
}

// Keys every architecture checks the same way.
void common_checks(Reader& r) {
  r.require("is_encoder_decoder", false, "decoder-only models");
  r.require("add_cross_attention", false, "no cross-attention");
  if (r.has("pruned_heads"))
    TD_CHECK(r.at("pruned_heads").empty(), "{}: 'pruned_heads' is {}; tandem cannot honour it",
             r.path(), r.at("pruned_heads").dump());
  r.refuse_set("quantization_config", "tandem reads fp32, fp16 and bf16 weights only");
}

int round_up(int v, int m) {
  return (v + m - 1) / m * m;
}

void read_gpt2(Reader& r, ModelConfig& c, std::vector<std::string>& dropout) {
  family_defaults(c, Family::gpt2);
  c.vocab = r.integer("vocab_size");
  c.context = r.integer("n_positions", 1024);
  c.d_model = r.integer("n_embd");
  c.n_layer = r.integer("n_layer");
  c.n_head = r.integer("n_head");
  c.n_kv_head = c.n_head;
  c.d_ff = r.integer("n_inner", 4 * c.d_model);
  c.mlp = gelu_kind(r, "activation_function", "gelu_new");
  c.norm_eps = static_cast<float>(r.number("layer_norm_epsilon", 1e-5));
  c.tied_head = r.boolean("tie_word_embeddings", true);
  r.require("scale_attn_weights", true, "attention scores scaled by 1/sqrt(head_dim)");
  r.require("scale_attn_by_inverse_layer_idx", false, "no per-layer attention scaling");
  for (const char* k : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) r.dropout(k, dropout);
}

void read_llama(Reader& r, ModelConfig& c, std::vector<std::string>& dropout) {
  family_defaults(c, Family::llama);
  c.vocab = r.integer("vocab_size");
  c.context = r.integer("max_position_embeddings", 2048);
  c.d_model = r.integer("hidden_size");
  c.n_layer = r.integer("num_hidden_layers");
  c.n_head = r.integer("num_attention_heads");
  c.n_kv_head = r.integer("num_key_value_heads", c.n_head);
  c.d_ff = r.integer("intermediate_size");
  c.norm_eps = static_cast<float>(r.number("rms_norm_eps", 1e-6));
  c.tied_head = r.boolean("tie_word_embeddings", false);
  const std::string act = r.string("hidden_act", "silu");
  TD_CHECK(act == "silu" || act == "swish",
           "{}: 'hidden_act' is \"{}\"; tandem's SwiGLU computes \"silu\"", r.path(), act);
  std::optional<double> theta_p, theta_s, partial_p, partial_s;
  read_rope(r, "rope_parameters", theta_p, partial_p);
  read_rope(r, "rope_scaling", theta_s, partial_s);
  TD_CHECK(!partial_p && !partial_s,
           "{}: Llama rotates every channel of a head; partial_rotary_factor is not honoured",
           r.path());
  std::optional<double> theta_top;
  if (r.has("rope_theta")) theta_top = r.number("rope_theta", 0);
  c.rope_theta = static_cast<float>(agree(r.path(), "the rotary base",
                                          {{"rope_theta", theta_top},
                                           {"rope_parameters.rope_theta", theta_p},
                                           {"rope_scaling.rope_theta", theta_s}},
                                          10000.0));
  r.require("attention_bias", false, "Llama's q/k/v/o projections without biases");
  r.require("mlp_bias", false, "Llama's MLP without biases");
  r.require("pretraining_tp", 1, "the slices of tensor-parallel pretraining sum to one product");
  r.refuse_set("sliding_window", "tandem attends over the whole causal context");
  if (r.has("head_dim"))
    TD_CHECK(r.at("head_dim") == c.d_model / c.n_head && c.d_model % c.n_head == 0,
             "{}: 'head_dim' is {}; tandem needs hidden_size / num_attention_heads = {}", r.path(),
             r.at("head_dim").dump(), c.d_model / c.n_head);
  r.dropout("attention_dropout", dropout);
}

void read_neox(Reader& r, ModelConfig& c, std::vector<std::string>& dropout) {
  family_defaults(c, Family::neox);
  c.vocab = r.integer("vocab_size");
  c.context = r.integer("max_position_embeddings", 2048);
  c.d_model = r.integer("hidden_size");
  c.n_layer = r.integer("num_hidden_layers");
  c.n_head = r.integer("num_attention_heads");
  c.n_kv_head = c.n_head;
  c.d_ff = r.integer("intermediate_size");
  c.mlp = gelu_kind(r, "hidden_act", "gelu");
  c.norm_eps = static_cast<float>(r.number("layer_norm_eps", 1e-5));
  c.tied_head = r.boolean("tie_word_embeddings", false);
  c.residual =
      r.boolean("use_parallel_residual", true) ? ResidualKind::parallel : ResidualKind::sequential;
  std::optional<double> theta_p, theta_s, partial_p, partial_s, theta_top, base, pct, factor;
  read_rope(r, "rope_parameters", theta_p, partial_p);
  read_rope(r, "rope_scaling", theta_s, partial_s);
  if (r.has("rope_theta")) theta_top = r.number("rope_theta", 0);
  if (r.has("rotary_emb_base")) base = r.number("rotary_emb_base", 0);
  if (r.has("rotary_pct")) pct = r.number("rotary_pct", 0);
  if (r.has("partial_rotary_factor")) factor = r.number("partial_rotary_factor", 0);
  c.rope_theta = static_cast<float>(agree(r.path(), "the rotary base",
                                          {{"rotary_emb_base", base},
                                           {"rope_theta", theta_top},
                                           {"rope_parameters.rope_theta", theta_p},
                                           {"rope_scaling.rope_theta", theta_s}},
                                          10000.0));
  const double share = agree(r.path(), "the rotary share",
                             {{"rotary_pct", pct},
                              {"partial_rotary_factor", factor},
                              {"rope_parameters.partial_rotary_factor", partial_p},
                              {"rope_scaling.partial_rotary_factor", partial_s}},
                             0.25);
  TD_CHECK(share > 0 && share <= 1, "{}: the rotary share {} is outside (0, 1]", r.path(), share);
  c.rotary_pct = static_cast<float>(share);
  // The rotated channels per head, as the Hugging Face model counts them, must be tandem's.
  if (c.n_head > 0 && c.d_model % c.n_head == 0) {
    const int hf_dim = static_cast<int>(static_cast<double>(c.d_model / c.n_head) * share);
    TD_CHECK(hf_dim == c.rotary_dim() && hf_dim >= 2,
             "{}: the rotary share {} rotates {} channels of a head of {}; tandem rotates an even "
             "number of at least 2",
             r.path(), share, hf_dim, c.d_model / c.n_head);
  }
  r.require("attention_bias", true, "tandem has biases on every linear of a GPT-NeoX block");
  r.refuse_set("sliding_window", "tandem attends over the whole causal context");
  for (const char* k : {"attention_dropout", "hidden_dropout"}) r.dropout(k, dropout);
}

HfArch arch_of(Reader& r) {
  TD_CHECK(r.has("architectures"), "{}: no 'architectures' (tandem reads {}, {} and {})", r.path(),
           hf_arch_class(HfArch::gpt2), hf_arch_class(HfArch::llama), hf_arch_class(HfArch::neox));
  const ordered_json& a = r.at("architectures");
  TD_CHECK(a.is_array() && a.size() == 1 && a[0].is_string(),
           "{}: 'architectures' must list one class name, got {}", r.path(), a.dump());
  const std::string name = a[0].get<std::string>();
  HfArch arch = HfArch::gpt2;
  const char* model_type = "gpt2";
  if (name == hf_arch_class(HfArch::gpt2)) {
    arch = HfArch::gpt2;
  } else if (name == hf_arch_class(HfArch::llama)) {
    arch = HfArch::llama;
    model_type = "llama";
  } else if (name == hf_arch_class(HfArch::neox)) {
    arch = HfArch::neox;
    model_type = "gpt_neox";
  } else {
    TD_THROW("{}: architecture '{}' is not supported (tandem reads {}, {} and {})", r.path(), name,
             hf_arch_class(HfArch::gpt2), hf_arch_class(HfArch::llama),
             hf_arch_class(HfArch::neox));
  }
  const std::string type = r.string("model_type", model_type);
  TD_CHECK(type == model_type, "{}: 'model_type' is \"{}\" but {} has \"{}\"", r.path(), type, name,
           model_type);
  return arch;
}

// Floats as the shortest decimal that reads back as the same float (1e-05, not
// 9.999999747378752e-06).
double short_decimal(float f) {
  return std::stod(fmt::format("{}", f));
}

const char* torch_dtype_name(const std::string& dtype) {
  if (dtype == "f32") return "float32";
  if (dtype == "bf16") return "bfloat16";
  if (dtype == "f16") return "float16";
  TD_THROW("--dtype must be f32, bf16 or f16, got '{}'", dtype);
}

}  // namespace

const char* hf_arch_class(HfArch a) {
  switch (a) {
    case HfArch::gpt2:
      return "GPT2LMHeadModel";
    case HfArch::llama:
      return "LlamaForCausalLM";
    case HfArch::neox:
      return "GPTNeoXForCausalLM";
  }
  return "?";
}

HfConfig hf_config_read(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  const ordered_json j = json_read_unique(path);
  TD_CHECK(j.is_object(), "'{}' must hold a JSON object", path);
  Reader r(j, fmt::format("'{}'", path));
  HfConfig out;
  out.arch = arch_of(r);
  ModelConfig& c = out.model;
  std::vector<std::string> dropout;
  switch (out.arch) {
    case HfArch::gpt2:
      read_gpt2(r, c, dropout);
      break;
    case HfArch::llama:
      read_llama(r, c, dropout);
      break;
    case HfArch::neox:
      read_neox(r, c, dropout);
      break;
  }
  c.init_std = static_cast<float>(r.number("initializer_range", 0.02));
  c.vocab_padded = round_up(c.vocab, 64);
  std::string name = fs::path(dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::path(dir).lexically_normal().parent_path().filename().string();
  c.name = name.empty() ? "hf" : name;
  common_checks(r);
  out.tokens = read_tokens(r);
  r.check_unknown(out.arch);
  try {
    model_config_validate(c);
  } catch (const Error& e) {
    TD_THROW("{}: {}", r.path(), e.message());
  }
  if (!dropout.empty()) {
    std::string list;
    for (const std::string& d : dropout) list += (list.empty() ? "" : ", ") + d;
    out.notes.push_back(
        fmt::format("'{}' sets dropout ({}); tandem trains without dropout", path, list));
  }

  // generation_config.json: only its token ids; the rest are sampling defaults.
  const std::string gen = (fs::path(dir) / "generation_config.json").string();
  if (fs::exists(gen)) {
    const ordered_json g = json_read_unique(gen);
    TD_CHECK(g.is_object(), "'{}' must hold a JSON object", gen);
    Reader gr(g, fmt::format("'{}'", gen));
    const HfTokens t = read_tokens(gr);
    if (t.bos) out.tokens.bos = t.bos;
    if (!t.eos.empty()) out.tokens.eos = t.eos;
    if (t.pad) out.tokens.pad = t.pad;
  }
  return out;
}

HfArch hf_arch_for(const ModelConfig& c) {
  auto need = [&](bool ok, const char* cls, const std::string& what) {
    TD_CHECK(ok, "model '{}' ({} family) cannot be written as {}: {}", c.name,
             family_name(c.family), cls, what);
  };
  const bool gelu = c.mlp == MlpKind::gelu_tanh || c.mlp == MlpKind::gelu_erf;
  TD_CHECK(c.tp.ways == 1, "model '{}' is rank {} of a tensor-parallel split of {}, not a model",
           c.name, c.tp.rank, c.tp.ways);
  TD_CHECK(c.head_size == 0 || int64_t{c.head_size} * c.n_head == c.d_model,
           "model '{}' cannot be written as a Hugging Face model: its heads of {} channels are not "
           "d_model {} / n_head {}",
           c.name, c.head_size, c.d_model, c.n_head);
  switch (c.family) {
    case Family::gpt2: {
      const char* cls = hf_arch_class(HfArch::gpt2);
      need(c.norm == NormKind::layernorm, cls, "it has LayerNorms, not RMSNorms");
      need(gelu, cls, "its MLP is a GELU MLP, not SwiGLU");
      need(c.residual == ResidualKind::sequential, cls, "its residual is sequential");
      need(c.bias, cls, "it has biases");
      need(c.learned_positions, cls, "it has learned positions");
      need(c.rotary_pct == 0, cls,
           fmt::format("it has no rotary embedding (rotary_pct {})", c.rotary_pct));
      return HfArch::gpt2;
    }
    case Family::llama: {
      const char* cls = hf_arch_class(HfArch::llama);
      need(c.norm == NormKind::rmsnorm, cls, "it has RMSNorms, not LayerNorms");
      need(c.mlp == MlpKind::swiglu, cls, "its MLP is SwiGLU");
      need(c.residual == ResidualKind::sequential, cls, "its residual is sequential");
      need(!c.bias, cls, "it has no biases");
      need(!c.learned_positions, cls, "it has no learned positions");
      need(c.rotary_pct == 1, cls,
           fmt::format("it rotates every channel of a head (rotary_pct {})", c.rotary_pct));
      return HfArch::llama;
    }
    case Family::neox: {
      const char* cls = hf_arch_class(HfArch::neox);
      need(c.norm == NormKind::layernorm, cls, "it has LayerNorms, not RMSNorms");
      need(gelu, cls, "its MLP is a GELU MLP, not SwiGLU");
      need(c.bias, cls, "it has biases");
      need(!c.learned_positions, cls, "it has no learned positions");
      need(c.n_kv_head == c.n_head, cls, "it has no grouped-query attention");
      need(c.rotary_pct > 0, cls, "it has a rotary embedding");
      const int hf_dim = static_cast<int>(static_cast<double>(c.head_dim()) * c.rotary_pct);
      need(hf_dim == c.rotary_dim(), cls,
           fmt::format("its rotary share {} of a head of {} is an odd {} channels", c.rotary_pct,
                       c.head_dim(), hf_dim));
      return HfArch::neox;
    }
  }
  TD_THROW("unknown family {}", static_cast<int>(c.family));
}

nlohmann::ordered_json hf_config_json(const ModelConfig& c, const HfTokens& tokens,
                                      const std::string& dtype) {
  const HfArch arch = hf_arch_for(c);
  const char* torch_dtype = torch_dtype_name(dtype);
  ordered_json j;
  j["architectures"] = {hf_arch_class(arch)};
  const char* act = c.mlp == MlpKind::gelu_erf ? "gelu" : "gelu_new";
  switch (arch) {
    case HfArch::gpt2:
      j["model_type"] = "gpt2";
      j["vocab_size"] = c.vocab;
      j["n_positions"] = c.context;
      j["n_embd"] = c.d_model;
      j["n_layer"] = c.n_layer;
      j["n_head"] = c.n_head;
      j["n_inner"] = c.d_ff;
      j["activation_function"] = act;
      j["layer_norm_epsilon"] = short_decimal(c.norm_eps);
      for (const char* k : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) j[k] = 0.0;
      break;
    case HfArch::llama:
      j["model_type"] = "llama";
      j["vocab_size"] = c.vocab;
      j["max_position_embeddings"] = c.context;
      j["hidden_size"] = c.d_model;
      j["num_hidden_layers"] = c.n_layer;
      j["num_attention_heads"] = c.n_head;
      j["num_key_value_heads"] = c.n_kv_head;
      j["head_dim"] = c.head_dim();
      j["intermediate_size"] = c.d_ff;
      j["hidden_act"] = "silu";
      j["rms_norm_eps"] = short_decimal(c.norm_eps);
      j["rope_theta"] = short_decimal(c.rope_theta);
      j["rope_parameters"] = {{"rope_type", "default"},
                              {"rope_theta", short_decimal(c.rope_theta)}};
      j["attention_bias"] = false;
      j["mlp_bias"] = false;
      j["attention_dropout"] = 0.0;
      j["pretraining_tp"] = 1;
      break;
    case HfArch::neox:
      j["model_type"] = "gpt_neox";
      j["vocab_size"] = c.vocab;
      j["max_position_embeddings"] = c.context;
      j["hidden_size"] = c.d_model;
      j["num_hidden_layers"] = c.n_layer;
      j["num_attention_heads"] = c.n_head;
      j["intermediate_size"] = c.d_ff;
      j["hidden_act"] = act;
      j["layer_norm_eps"] = short_decimal(c.norm_eps);
      j["use_parallel_residual"] = c.residual == ResidualKind::parallel;
      j["rotary_pct"] = short_decimal(c.rotary_pct);
      j["rotary_emb_base"] = short_decimal(c.rope_theta);
      j["rope_parameters"] = {{"rope_type", "default"},
                              {"rope_theta", short_decimal(c.rope_theta)},
                              {"partial_rotary_factor", short_decimal(c.rotary_pct)}};
      j["attention_bias"] = true;
      j["attention_dropout"] = 0.0;
      j["hidden_dropout"] = 0.0;
      break;
  }
  j["tie_word_embeddings"] = c.tied_head;
  j["initializer_range"] = short_decimal(c.init_std);
  if (tokens.bos) j["bos_token_id"] = *tokens.bos;
  if (tokens.eos.size() == 1) j["eos_token_id"] = tokens.eos[0];
  if (tokens.eos.size() > 1) j["eos_token_id"] = tokens.eos;
  if (tokens.pad) j["pad_token_id"] = *tokens.pad;
  j["torch_dtype"] = torch_dtype;
  j["dtype"] = torch_dtype;
  j["use_cache"] = true;
  return j;
}

}  // namespace tandem
