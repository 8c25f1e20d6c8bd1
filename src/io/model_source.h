// Where a model's weights come from: a tandem checkpoint directory or a Hugging Face model
// directory, opened behind one interface, so that generate, export, plan, the library API
// and `train --init-from` take either without asking which.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/hf.h"
#include "io/shard_checkpoint.h"
#include "model/config.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "shard/flat.h"

namespace tandem {

class ModelSource {
 public:
  virtual ~ModelSource() = default;

  // A tandem checkpoint (a directory with index.json) or a Hugging Face model directory
  // (config.json); throws naming the directory when it is neither or is damaged.
  static std::unique_ptr<ModelSource> open(const std::string& dir);

  virtual const std::string& dir() const = 0;
  virtual const ModelConfig& config() const = 0;
  // "tandem checkpoint (step 100)" or "Hugging Face LlamaForCausalLM".
  virtual std::string describe() const = 0;
  virtual int64_t step() const { return 0; }  // optimizer steps a checkpoint holds
  // Every unit's unpadded parameters.
  virtual std::vector<std::vector<float>> load_params() const = 0;
  // The parameters of shard `shard_rank` of every unit under `flat` (any world size).
  virtual std::vector<std::vector<float>> load_param_shard(const FlatLayout& flat,
                                                           int shard_rank) const = 0;
  // Unit `unit`'s unpadded flat buffer cut into pieces (model/tensor_parallel.h),
  // concatenated: only the elements the pieces name are read and converted.
  virtual std::vector<float> load_unit_pieces(int unit,
                                              const std::vector<TpPiece>& pieces) const = 0;
  // Special token ids, where the source records them (Hugging Face directories).
  virtual HfTokens tokens() const { return {}; }
  // The Hugging Face spellings of an imported directory, for an export that keeps them.
  virtual HfNaming hf_naming() const { return {}; }
  // What the user should be told once (settings tandem leaves out, such as dropout).
  virtual std::vector<std::string> notes() const { return {}; }
};

// A tensor-parallel rank's parameters: every unit of `local` (tp_local_config of
// `global`'s config, `global` the source's model) read as its pieces of the source.
std::vector<std::vector<float>> tp_load_params(const ModelSource& source, const ModelLayout& global,
                                               const ModelLayout& local);

// The whole parameters of the units marked in `units` (one flag per unit of `model`, the
// source's model), and nothing of the others: a pipeline stage's (Decoder).
std::vector<std::vector<float>> load_units(const ModelSource& source, const ModelLayout& model,
                                           const std::vector<bool>& units);

// True when `path` is a directory that ModelSource::open should read.
bool model_source_is_dir(const std::string& path);

// A --model argument: a preset name, a JSON model config (a path ending in .json), a tandem
// checkpoint or a Hugging Face directory. Sets *step to a checkpoint's step (0 otherwise).
ModelConfig model_resolve(const std::string& preset_json_or_dir, int64_t* step = nullptr);

// Throws unless `got` (from `what`) has the architecture of `expected` (names aside).
void model_check_same(const ModelConfig& got, const std::string& what, const ModelConfig& expected);

}  // namespace tandem
