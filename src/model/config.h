// Model configurations: the GPT-2 and Llama families, their presets, and JSON configs.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

// gpt2: LayerNorm, tanh-GELU MLP, learned positions, tied embeddings, biases.
// llama: RMSNorm, SwiGLU MLP, rotary positions, grouped-query attention, untied head,
// no biases.
enum class Family { gpt2, llama };

struct ModelConfig {
  std::string name = "custom";
  Family family = Family::gpt2;
  int vocab = 256;         // real vocabulary size
  int vocab_padded = 256;  // rows of the embedding/head (>= vocab; padding rows stay 0)
  int context = 256;       // longest sequence the model accepts
  int d_model = 128;
  int n_layer = 4;
  int n_head = 4;
  int n_kv_head = 4;  // llama only; equals n_head for gpt2
  int d_ff = 512;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;  // llama only
  float init_std = 0.02f;

  int head_dim() const { return d_model / n_head; }
  int qkv_dim() const { return (n_head + 2 * n_kv_head) * head_dim(); }
  bool tied() const { return family == Family::gpt2; }
  bool bias() const { return family == Family::gpt2; }
  int64_t num_params() const;  // without vocabulary padding rows
};

const char* family_name(Family f);
std::vector<std::string> preset_names();
// A preset by name, or nullptr-like failure: throws naming the known presets.
ModelConfig preset(const std::string& name);
// "--model" argument: a preset name or a path to a JSON config file.
ModelConfig model_config_resolve(const std::string& preset_or_path);

// JSON keys: name, family ("gpt2"|"llama"), vocab, vocab_padded, context, d_model,
// n_layer, n_head, n_kv_head, d_ff, norm_eps, rope_theta, init_std. Unknown keys and bad
// values are errors. "preset" may name a preset whose values the other keys override.
ModelConfig model_config_from_json(const nlohmann::json& j);
nlohmann::json model_config_to_json(const ModelConfig& c);
// Throws a clear error for any inconsistent value.
void model_config_validate(const ModelConfig& c);
bool operator==(const ModelConfig& a, const ModelConfig& b);

}  // namespace tandem
