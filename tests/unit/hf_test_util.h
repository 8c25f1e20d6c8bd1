// Small Hugging Face model directories written by the tests themselves: config.json and
// safetensors in Hugging Face names and layouts (GPT2LMHeadModel, LlamaForCausalLM,
// GPTNeoXForCausalLM), random values in F32, F16 or BF16, one file or shards with an index.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "io/safetensors.h"

namespace tandem::hf_test {

using ordered_json = nlohmann::ordered_json;
using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// Tiny configs: a vocabulary that is not a multiple of 64 (padding rows), two layers,
// grouped-query attention for Llama, a quarter of each head rotating for GPT-NeoX.
inline ordered_json gpt2_config() {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", 100},
          {"n_positions", 32},
          {"n_embd", 16},
          {"n_layer", 2},
          {"n_head", 2},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5},
          {"initializer_range", 0.02},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"summary_type", "cls_index"},
          {"summary_use_proj", true},
          {"summary_activation", nullptr},
          {"summary_proj_to_labels", true},
          {"summary_first_dropout", 0.1},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"use_cache", true},
          {"bos_token_id", 98},
          {"eos_token_id", 99},
          {"task_specific_params", {{"text-generation", {{"do_sample", true}}}}},
          {"torch_dtype", "float32"},
          {"transformers_version", "4.46.0"}};
}

inline ordered_json llama_config(bool tied = false) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", 90},
          {"hidden_size", 16},
          {"intermediate_size", 24},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 4},
          {"hidden_act", "silu"},
          {"max_position_embeddings", 64},
          {"initializer_range", 0.02},
          {"rms_norm_eps", 1e-6},
          {"pretraining_tp", 1},
          {"use_cache", true},
          {"tie_word_embeddings", tied},
          {"rope_theta", 500000.0},
          {"rope_scaling", nullptr},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"mlp_bias", false},
          {"bos_token_id", 1},
          {"eos_token_id", {2, 3}},
          {"dtype", "float32"},
          {"transformers_version", "5.0.0"}};
}

inline ordered_json neox_config() {
  return {{"architectures", {"GPTNeoXForCausalLM"}},
          {"model_type", "gpt_neox"},
          {"vocab_size", 70},
          {"hidden_size", 16},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 2},
          {"intermediate_size", 32},
          {"hidden_act", "gelu"},
          {"rotary_pct", 0.25},
          {"rotary_emb_base", 10000},
          {"max_position_embeddings", 64},
          {"initializer_range", 0.02},
          {"layer_norm_eps", 1e-5},
          {"use_parallel_residual", true},
          {"tie_word_embeddings", false},
          {"attention_dropout", 0.0},
          {"hidden_dropout", 0.0},
          {"classifier_dropout", 0.1},
          {"bos_token_id", 0},
          {"eos_token_id", 0},
          {"torch_dtype", "float32"},
          {"transformers_version", "4.46.0"}};
}

// The tensors save_pretrained writes for each config above, in state-dict order.
inline Shapes gpt2_shapes(const ordered_json& c, bool prefix = true) {
  const int64_t V = c["vocab_size"], P = c["n_positions"], C = c["n_embd"], L = c["n_layer"];
  const int64_t F = c["n_inner"].is_null() ? 4 * C : c["n_inner"].get<int64_t>();
  const std::string p = prefix ? "transformer." : "";
  Shapes s = {{p + "wte.weight", {V, C}}, {p + "wpe.weight", {P, C}}};
  for (int64_t l = 0; l < L; ++l) {
    const std::string h = p + "h." + std::to_string(l) + ".";
    s.push_back({h + "ln_1.weight", {C}});
    s.push_back({h + "ln_1.bias", {C}});
    s.push_back({h + "attn.c_attn.weight", {C, 3 * C}});
    s.push_back({h + "attn.c_attn.bias", {3 * C}});
    s.push_back({h + "attn.c_proj.weight", {C, C}});
    s.push_back({h + "attn.c_proj.bias", {C}});
    s.push_back({h + "ln_2.weight", {C}});
    s.push_back({h + "ln_2.bias", {C}});
    s.push_back({h + "mlp.c_fc.weight", {C, F}});
    s.push_back({h + "mlp.c_fc.bias", {F}});
    s.push_back({h + "mlp.c_proj.weight", {F, C}});
    s.push_back({h + "mlp.c_proj.bias", {C}});
  }
  s.push_back({p + "ln_f.weight", {C}});
  s.push_back({p + "ln_f.bias", {C}});
  return s;
}

inline Shapes llama_shapes(const ordered_json& c) {
  const int64_t V = c["vocab_size"], C = c["hidden_size"], F = c["intermediate_size"];
  const int64_t L = c["num_hidden_layers"], H = c["num_attention_heads"];
  const int64_t Hkv = c["num_key_value_heads"], D = C / H;
  Shapes s = {{"model.embed_tokens.weight", {V, C}}};
  for (int64_t l = 0; l < L; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    s.push_back({b + "self_attn.q_proj.weight", {H * D, C}});
    s.push_back({b + "self_attn.k_proj.weight", {Hkv * D, C}});
    s.push_back({b + "self_attn.v_proj.weight", {Hkv * D, C}});
    s.push_back({b + "self_attn.o_proj.weight", {C, H * D}});
    s.push_back({b + "mlp.gate_proj.weight", {F, C}});
    s.push_back({b + "mlp.up_proj.weight", {F, C}});
    s.push_back({b + "mlp.down_proj.weight", {C, F}});
    s.push_back({b + "input_layernorm.weight", {C}});
    s.push_back({b + "post_attention_layernorm.weight", {C}});
  }
  s.push_back({"model.norm.weight", {C}});
  if (!c.value("tie_word_embeddings", false)) s.push_back({"lm_head.weight", {V, C}});
  return s;
}

inline Shapes neox_shapes(const ordered_json& c, const std::string& head = "embed_out.weight") {
  const int64_t V = c["vocab_size"], C = c["hidden_size"], F = c["intermediate_size"];
  const int64_t L = c["num_hidden_layers"];
  Shapes s = {{"gpt_neox.embed_in.weight", {V, C}}};
  for (int64_t l = 0; l < L; ++l) {
    const std::string b = "gpt_neox.layers." + std::to_string(l) + ".";
    s.push_back({b + "input_layernorm.weight", {C}});
    s.push_back({b + "input_layernorm.bias", {C}});
    s.push_back({b + "post_attention_layernorm.weight", {C}});
    s.push_back({b + "post_attention_layernorm.bias", {C}});
    s.push_back({b + "attention.query_key_value.weight", {3 * C, C}});
    s.push_back({b + "attention.query_key_value.bias", {3 * C}});
    s.push_back({b + "attention.dense.weight", {C, C}});
    s.push_back({b + "attention.dense.bias", {C}});
    s.push_back({b + "mlp.dense_h_to_4h.weight", {F, C}});
    s.push_back({b + "mlp.dense_h_to_4h.bias", {F}});
    s.push_back({b + "mlp.dense_4h_to_h.weight", {C, F}});
    s.push_back({b + "mlp.dense_4h_to_h.bias", {C}});
  }
  s.push_back({"gpt_neox.final_layer_norm.weight", {C}});
  s.push_back({"gpt_neox.final_layer_norm.bias", {C}});
  if (!c.value("tie_word_embeddings", false)) s.push_back({head, {V, C}});
  return s;
}

// A tensor of random values (uniform in [-0.5, 0.5), scaled by 3 so some exceed 1) in `dtype`,
// the stream keyed by its name and `seed`.
inline SafeTensor random_tensor(const std::string& name, const std::vector<int64_t>& shape,
                                const std::string& dtype, uint64_t seed = 7) {
  SafeTensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = shape;
  const int64_t n = t.numel();
  Rng rng(hash_name(name, seed));
  const size_t esize = dtype == "F32" ? 4 : 2;
  t.data.resize(static_cast<size_t>(n) * esize);
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>((rng.uniform() - 0.5) * 3.0);
    uint8_t* dst = t.data.data() + static_cast<size_t>(i) * esize;
    if (dtype == "F32") {
      std::memcpy(dst, &v, 4);
    } else {
      const uint16_t h = dtype == "BF16" ? bf16_from_f32(v) : f16_from_f32(v);
      std::memcpy(dst, &h, 2);
    }
  }
  return t;
}

inline std::vector<SafeTensor> random_tensors(const Shapes& shapes, const std::string& dtype,
                                              uint64_t seed = 7) {
  std::vector<SafeTensor> out;
  for (const auto& [name, shape] : shapes) out.push_back(random_tensor(name, shape, dtype, seed));
  return out;
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// Writes config.json and the tensors: one model.safetensors when shards == 1, else that many
// files of consecutive tensors and model.safetensors.index.json.
inline void write_dir(const std::string& dir, const ordered_json& config,
                      const std::vector<SafeTensor>& tensors, int shards = 1) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  write_text((fs::path(dir) / "config.json").string(), config.dump(2));
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (shards == 1) {
    safetensors_write((fs::path(dir) / "model.safetensors").string(), tensors, meta);
    return;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total = 0;
  const size_t per =
      (tensors.size() + static_cast<size_t>(shards) - 1) / static_cast<size_t>(shards);
  for (int s = 0; s < shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
    std::vector<SafeTensor> part;
    for (size_t i = static_cast<size_t>(s) * per; i < std::min(tensors.size(), (s + 1) * per);
         ++i) {
      part.push_back(tensors[i]);
      weight_map[tensors[i].name] = name;
      total += tensors[i].data.size();
    }
    safetensors_write((fs::path(dir) / name).string(), part, meta);
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_text((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2));
}

// The fp32 value of element i of a tensor written above.
inline float value_at(const SafeTensor& t, int64_t i) {
  if (t.dtype == "F32") {
    float v;
    std::memcpy(&v, t.data.data() + i * 4, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, t.data.data() + i * 2, 2);
  return t.dtype == "BF16" ? bf16_to_f32(h) : f16_to_f32(h);
}

inline const SafeTensor& by_name(const std::vector<SafeTensor>& ts, const std::string& name) {
  for (const SafeTensor& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

}  // namespace tandem::hf_test
