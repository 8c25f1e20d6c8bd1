// Sharded checkpoints: a directory with one binary file per shard rank and a JSON index
// written last by rank 0. A checkpoint written at N ranks loads at M ranks: each rank
// reads the slices of the old shards that make up its new shard. See docs/formats.md,
// "Checkpoints".
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/config.h"
#include "model/tensor_parallel.h"
#include "shard/flat.h"

namespace tandem {

// What a run needs to continue exactly, besides the shards.
struct CheckpointMeta {
  ModelConfig model;
  int64_t step = 0;   // optimizer steps completed
  uint64_t seed = 0;  // initialisation and data order
  int world_size = 1;
  std::string strategy = "none";
  int shard_size = 1;    // ranks the parameters were sharded over
  int64_t align = 64;    // flat-buffer alignment of the shard layout
  nlohmann::json train;  // the options the run used (informational)
  nlohmann::json data;   // {"global_batch", "seq", "sequences_consumed"}
};

// Collective over `world`: the ranks holding shard copy 0 (world ranks 0 .. shard_size-1)
// each write step-<S>-shard<r>-of-<n>.bin atomically; then rank 0 writes index.json
// (with every file's size and checksum, gathered from the writers) atomically, and only
// then deletes files of older steps. A crash at any point leaves the previous checkpoint
// loadable. `stream` is a communication stream the collectives may use.
void checkpoint_save(const std::string& dir, const CheckpointMeta& meta, const FlatLayout& flat,
                     int shard_rank, const ShardState& state, Communicator& world, Device& device,
                     Stream& stream);

// Reads and validates the index (format, version, model, files present with the listed
// sizes). Every rank may call it.
CheckpointMeta checkpoint_read_meta(const std::string& dir);

// Reads the shard of rank `shard_rank` under `flat` (any shard size and alignment),
// assembling it from whichever old shard files hold its elements; verifies each file's
// checksum. Elements past a unit's parameters are zero.
ShardState checkpoint_load_shard(const std::string& dir, const FlatLayout& flat, int shard_rank);
// The parameters of that shard alone (a fresh run's start): the moments are not read.
std::vector<std::vector<float>> checkpoint_load_param_shard(const std::string& dir,
                                                            const FlatLayout& flat, int shard_rank);

// The whole model: every unit's unpadded parameters (for export and generation).
std::vector<std::vector<float>> checkpoint_load_params(const std::string& dir,
                                                       CheckpointMeta* meta = nullptr);

// A checkpoint's parameters open for element-range reads: the index is read once, and each
// shard file is opened (its checksum verified, as every load does) the first time a range
// needs it. Not thread-safe.
class CheckpointParamReader {
 public:
  explicit CheckpointParamReader(const std::string& dir);
  ~CheckpointParamReader();
  CheckpointParamReader(const CheckpointParamReader&) = delete;
  CheckpointParamReader& operator=(const CheckpointParamReader&) = delete;

  const CheckpointMeta& meta() const;
  // out[0, count) = elements [begin, begin + count) of unit u's unpadded flat buffer.
  void read(int unit, int64_t begin, int64_t count, float* out);
  // The pieces of unit u's unpadded flat buffer, concatenated (model/tensor_parallel.h):
  // only the elements they name are read.
  std::vector<float> read_pieces(int unit, const std::vector<TpPiece>& pieces);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Throws unless the checkpoint's model has the architecture of `expected` (names aside).
void checkpoint_check_model(const CheckpointMeta& meta, const ModelConfig& expected);

}  // namespace tandem
