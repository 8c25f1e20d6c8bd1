// Checkpoints: a directory with one binary file per rank and a JSON index written last.
// See docs/formats.md, "Checkpoints".
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace tandem {

struct CheckpointUnit {
  std::vector<float> params, m, v;  // the unit's flat buffer and AdamW moments
};

struct Checkpoint {
  ModelConfig model;
  int64_t step = 0;   // optimizer steps completed
  uint64_t seed = 0;  // the run's seed (initialisation and data order)
  int world_size = 1;
  std::string strategy = "none";
  nlohmann::json train;  // the options the run was started with (informational)
  nlohmann::json data;   // data position: {"global_batch", "seq", "sequences_consumed"}
  std::vector<CheckpointUnit> units;
};

// Writes dir/step-<S>-rank0.bin and then dir/index.json, each atomically; files of older
// checkpoints in dir are removed only after the new index is in place, so a crash at any
// point leaves a loadable checkpoint.
void checkpoint_save(const std::string& dir, const Checkpoint& ckpt);
// Reads and validates (format, version, sizes, checksums) a checkpoint directory.
Checkpoint checkpoint_load(const std::string& dir);
// Throws unless the checkpoint's model has the architecture of `expected` (names aside).
void checkpoint_check_model(const Checkpoint& ckpt, const ModelConfig& expected);

}  // namespace tandem
