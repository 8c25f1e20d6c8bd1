// Hugging Face model directories: config.json and safetensors weights (one file, or shards
// with model.safetensors.index.json) of GPT2LMHeadModel, LlamaForCausalLM and
// GPTNeoXForCausalLM, read into tandem's units and written back from them. The mapping of
// every tensor, and what is refused and why, is in docs/formats.md, "Hugging Face model
// directories".
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "shard/flat.h"

namespace tandem {

enum class HfArch { gpt2, llama, neox };

// "GPT2LMHeadModel", "LlamaForCausalLM", "GPTNeoXForCausalLM".
const char* hf_arch_class(HfArch a);

// Special token ids of config.json, overridden by generation_config.json where it sets them.
struct HfTokens {
  std::optional<int64_t> bos;
  std::vector<int64_t> eos;  // Llama 3 lists several
  std::optional<int64_t> pad;
};

// Names a directory may spell either way; an export of an imported model keeps them, so
// import then export gives the same tensor names.
struct HfNaming {
  bool gpt2_prefix = true;                     // "transformer.wte.weight", not "wte.weight"
  std::string neox_head = "embed_out.weight";  // or "lm_head.weight"
};

struct HfConfig {
  HfArch arch = HfArch::gpt2;
  ModelConfig model;
  HfTokens tokens;
  std::vector<std::string> notes;  // said once to the user (dropout that tandem leaves out)
};

// Reads dir/config.json (and the token ids of dir/generation_config.json when present) into
// a tandem ModelConfig. Throws, naming the file and the field, for an unknown architecture,
// a field tandem cannot honour, an unknown key, or a bad value.
HfConfig hf_config_read(const std::string& dir);

// The class that expresses a tandem model; throws naming the field no class can express.
HfArch hf_arch_for(const ModelConfig& c);
// config.json of a tandem model stored in `dtype` ("f32", "bf16" or "f16").
nlohmann::ordered_json hf_config_json(const ModelConfig& c, const HfTokens& tokens,
                                      const std::string& dtype);

// A Hugging Face directory opened for reading: config, every safetensors header (validated,
// and checked against the tensors the model needs), and the files mapped read-only. Loads
// convert only the elements asked for, so a rank's shard reads only its own bytes.
class HfModel {
 public:
  explicit HfModel(const std::string& dir);
  ~HfModel();
  HfModel(const HfModel&) = delete;
  HfModel& operator=(const HfModel&) = delete;

  const std::string& dir() const { return dir_; }
  const HfConfig& config() const { return config_; }
  const ModelLayout& layout() const { return *layout_; }
  const HfNaming& naming() const { return naming_; }

  // out[0, end - begin) = elements [begin, end) of unit u's flat buffer, converted to fp32;
  // elements past the unit's parameters and vocabulary padding rows are zero.
  void read_range(int unit, int64_t begin, int64_t end, float* out) const;
  // The pieces of unit u's unpadded flat buffer, concatenated (model/tensor_parallel.h):
  // only the elements they name are converted.
  std::vector<float> read_pieces(int unit, const std::vector<TpPiece>& pieces) const;
  // Every unit's unpadded parameters.
  std::vector<std::vector<float>> load_params() const;
  // Shard `shard_rank` of every unit's flat buffer under `flat` (a layout of this model).
  std::vector<std::vector<float>> load_param_shard(const FlatLayout& flat, int shard_rank) const;

  struct Source;  // one tensor's bytes in a mapped file

 private:
  std::string dir_;
  HfConfig config_;
  HfNaming naming_;
  std::unique_ptr<ModelLayout> layout_;
  std::vector<std::unique_ptr<SafeTensorsMap>> files_;
  struct Plan;
  std::unique_ptr<Plan> plan_;
};

// One Hugging Face tensor as a strided view of a unit's flat buffer: element (i0, i1, ...)
// is at offset + i0 * strides[0] + i1 * strides[1] + ... (in elements). Shapes are the Hugging
// Face ones, except GPT-NeoX's fused query_key_value weight and bias, viewed as [H, 3, D(, C)]
// (the Hugging Face rows (head, q|k|v, channel) as separate dimensions; tandem keeps them as
// (q|k|v, head, channel)), and the embedding and head without vocabulary padding rows.
struct HfTensorView {
  std::string name;
  int unit = 0;
  int64_t offset = 0;
  std::vector<int64_t> shape, strides;
};
// Every tensor of `layout` under `naming`, in the Hugging Face state dict's order.
std::vector<HfTensorView> hf_tensor_views(const ModelLayout& layout, const HfNaming& naming);

// What an export writes besides the weights.
struct HfExportOptions {
  std::string dtype = "f32";              // f32 | bf16 | f16
  uint64_t max_shard_bytes = 5ull << 30;  // a new file when the next tensor would pass it
  HfTokens tokens;                        // written to config.json when known
  HfNaming naming;
};

// The model's tensors in Hugging Face names and layouts, in the order of the Hugging Face
// state dict, converted to the export dtype. Throws when a value overflows f16.
std::vector<SafeTensor> hf_tensors(const ModelLayout& layout,
                                   const std::vector<std::vector<float>>& params,
                                   const HfExportOptions& options);

// Writes a Hugging Face directory: config.json, generation_config.json (when token ids are
// known), and model.safetensors or model-0000i-of-0000n.safetensors with
// model.safetensors.index.json. Everything is written under out_dir + ".tmp" and renamed
// into place at the end, so a failure leaves no half-written directory; an existing
// out_dir must be empty.
void hf_export(const std::string& out_dir, const ModelLayout& layout,
               const std::vector<std::vector<float>>& params, const HfExportOptions& options);

}  // namespace tandem
