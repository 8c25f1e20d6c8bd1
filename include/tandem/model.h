// Model descriptions: the presets tandem ships and the shape of a model, from a preset, a
// JSON model config or a checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/error.h"

namespace tandem::api {

// The model families (docs/design.md, "The model as data"): GPT-2, Llama and GPT-NeoX.
enum class Family { gpt2, llama, neox };

constexpr std::string_view to_string(Family f) noexcept {
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

struct ModelInfo {
  std::string name;
  Family family = Family::gpt2;
  int vocab = 0;         // real vocabulary size
  int vocab_padded = 0;  // rows of the embedding and head (>= vocab)
  int context = 0;       // longest sequence the model accepts
  int d_model = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_kv_head = 0;  // key/value heads (grouped-query attention)
  int d_ff = 0;
  int64_t num_params = 0;         // without the vocabulary padding rows
  int64_t num_params_padded = 0;  // every stored element
  int64_t checkpoint_step = 0;    // optimizer steps a checkpoint holds; 0 otherwise
};

// The model named by a preset (see model_presets()), a JSON model config file (a path
// ending in .json; docs/formats.md), a checkpoint directory or a Hugging Face model
// directory (config.json with safetensors weights; docs/formats.md). Throws tandem::Error for
// an unknown preset, an unreadable or invalid file, or a damaged checkpoint.
ModelInfo load_model_info(const std::string& preset_or_path);

// The names of the model presets, e.g. "gpt2-tiny".
std::vector<std::string> model_presets();

}  // namespace tandem::api

#if !defined(TANDEM_BUILDING_LIBRARY)
namespace tandem {
using namespace api;  // NOLINT(build/namespaces): the re-export (see tandem/error.h)
}  // namespace tandem
#endif
