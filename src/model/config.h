// Model configurations: the GPT-2 and Llama families, their presets, and JSON configs.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

// A model family is a name for a default description; every field of the description
// below can also be set on its own in a JSON config.
//   gpt2:  LayerNorm, tanh-GELU MLP, learned positions, tied head, biases, sequential.
//   llama: RMSNorm, SwiGLU MLP, full rotary, grouped-query attention, untied head, no
//          biases, sequential.
//   neox:  GPT-NeoX (Pythia): LayerNorm, exact-erf GELU MLP, partial rotary (rotary_pct),
//          untied head, biases, parallel residual (attention and MLP both read the input).
enum class Family { gpt2, llama, neox };

enum class NormKind { layernorm, rmsnorm };
enum class MlpKind { gelu_tanh, gelu_erf, swiglu };
// sequential: x + attn(norm1(x)) = m, then m + mlp(norm2(m)).
// parallel:   x + attn(norm1(x)) + mlp(norm2(x)).
enum class ResidualKind { sequential, parallel };

struct ModelConfig {
  std::string name = "custom";
  Family family = Family::gpt2;
  int vocab = 256;         // real vocabulary size
  int vocab_padded = 256;  // rows of the embedding/head (>= vocab; padding rows stay 0)
  int context = 256;       // longest sequence the model accepts
  int d_model = 128;
  int n_layer = 4;
  int n_head = 4;
  int n_kv_head = 4;  // grouped-query attention: key/value heads (divides n_head)
  int d_ff = 512;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  float init_std = 0.02f;
  // The block description (defaults from the family; see family_defaults).
  NormKind norm = NormKind::layernorm;
  MlpKind mlp = MlpKind::gelu_tanh;
  ResidualKind residual = ResidualKind::sequential;
  bool bias = true;               // biases on every linear but the head, and on LayerNorms
  bool tied_head = true;          // the head reuses the token embedding
  bool learned_positions = true;  // a [context, d_model] position embedding
  float rotary_pct = 0.0f;        // share of each head's channels that rotate (0: none)
  // Channels of one attention head; 0: d_model / n_head. A tensor-parallel rank's config
  // sets it, since its n_head query heads no longer divide d_model into heads.
  int head_size = 0;

  // The tensor-parallel share a config describes: rank `rank` of `ways` (model/
  // tensor_parallel.h). Runtime only, never written to or read from JSON: a checkpoint or
  // config file always describes the whole model, and a rank's config is derived from it.
  struct TpShare {
    int ways = 1, rank = 0;
  };
  TpShare tp;

  int head_dim() const { return head_size > 0 ? head_size : d_model / n_head; }
  int qkv_dim() const { return (n_head + 2 * n_kv_head) * head_dim(); }
  int attn_dim() const { return n_head * head_dim(); }
  // Rotated channels per head: head_dim x rotary_pct, rounded down to an even number.
  int rotary_dim() const;
  bool tied() const { return tied_head; }
  // Width of the first MLP product: d_ff, or 2 d_ff for SwiGLU's [gate | up].
  int mlp_in_dim() const { return mlp == MlpKind::swiglu ? 2 * d_ff : d_ff; }
  // The rank that adds the residual and the output biases (rank 0).
  bool tp_lead() const { return tp.rank == 0; }
  // Rows of the head this rank computes, the width of its logits: the padded vocabulary
  // when ways == 1, else Vl = ceil(vocab_padded / ways) rounded up to a multiple of 64.
  // Rank r covers global ids [r Vl, r Vl + Vl); rows past vocab_padded are zero.
  int head_rows() const;
  int head_begin() const { return tp.rank * head_rows(); }  // first global id of the rows
  // Parameters of the model, or of this rank's share (an untied head counts its rows).
  int64_t num_params() const;         // without vocabulary padding rows
  int64_t num_params_padded() const;  // every stored element, padding rows included
};

// The family's description: norm, MLP, residual, biases, head, positions and rotary.
void family_defaults(ModelConfig& c, Family f);

const char* family_name(Family f);
const char* norm_name(NormKind k);
const char* mlp_name(MlpKind k);
const char* residual_name(ResidualKind k);
std::vector<std::string> preset_names();
// A preset by name, or nullptr-like failure: throws naming the known presets.
ModelConfig preset(const std::string& name);
// "--model" argument: a preset name or a path to a JSON config file.
ModelConfig model_config_resolve(const std::string& preset_or_path);

// JSON keys: name, family ("gpt2"|"llama"|"neox"), vocab, vocab_padded, context, d_model,
// n_layer, n_head, n_kv_head, d_ff, norm_eps, rope_theta, init_std, and the description:
// norm ("layernorm"|"rmsnorm"), mlp ("gelu_tanh"|"gelu_erf"|"swiglu"), residual
// ("sequential"|"parallel"), bias, tied_head, learned_positions (booleans), rotary_pct,
// and head_size (read when present, written only when non-zero).
// "family" sets the description's defaults, the other keys override them; "preset" may
// name a preset whose values the other keys override. Unknown keys and bad values are
// errors.
ModelConfig model_config_from_json(const nlohmann::json& j);
nlohmann::json model_config_to_json(const ModelConfig& c);
// Throws a clear error for any inconsistent value.
void model_config_validate(const ModelConfig& c);
// Equal JSON and equal tensor-parallel shares.
bool operator==(const ModelConfig& a, const ModelConfig& b);

}  // namespace tandem
