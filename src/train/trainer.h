// Training on one or many ranks: options, data, the engine that replays the step
// program, metrics, progress output and sharded checkpoints.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "device/device.h"
#include "io/dataset.h"
#include "io/shard_checkpoint.h"
#include "model/model.h"
#include "shard/engine.h"
#include "train/options.h"
#include "train/step_trace.h"

namespace tandem {

struct StepMetrics {
  int64_t step = 0;  // 1-based number of the optimizer step just taken
  double loss = 0;
  float lr = 0;
  double grad_norm = 0;
  double tokens_per_s = 0;
  double step_ms = 0, compute_ms = 0, comm_ms = 0, exposed_comm_ms = 0;
  uint64_t peak_mem_bytes = 0;
};

nlohmann::json step_metrics_to_json(const StepMetrics& m);

class Trainer {
 public:
  // Sets up the device, the communicator (MPI when launched by mpirun/srun, else one
  // rank), the model, the data and the engine, and resumes from --resume. Every
  // inconsistency is reported here, before any step runs; so is a plan that does not fit
  // in --mem-limit.
  explicit Trainer(TrainOptions options);
  ~Trainer();

  // Steps until options.steps with progress (rank 0), metrics and checkpoints; returns
  // the last step's metrics (step == 0 when nothing was left to do).
  StepMetrics run();
  // One optimizer step over global_batch sequences.
  StepMetrics step();
  void save(const std::string& dir);

  const ModelLayout& layout() const { return *layout_; }
  const TrainOptions& options() const { return options_; }
  int64_t steps_done() const { return step_; }
  int micro_steps() const { return engine_->micro_steps(); }
  int rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  const Engine& engine() const { return *engine_; }
  // This rank's parameter shards (the whole padded buffers at one rank).
  std::vector<std::vector<float>> params() const { return engine_->shards().params; }
  // Every unit's unpadded parameters, gathered from all ranks.
  std::vector<std::vector<float>> gather_params();

 private:
  // The host communicator for checkpoints and traces, and its device and stream: the
  // world itself on CPU, a host (MPI or one-rank) communicator beside NCCL on CUDA.
  Device& control_device();
  Stream& control_stream();

  TrainOptions options_;
  std::unique_ptr<Device> host_device_;  // CUDA runs: the CPU device of the control plane
  std::unique_ptr<Communicator> host_world_;
  std::unique_ptr<Stream> host_stream_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Communicator> world_;
  Communicator* control_ = nullptr;
  std::unique_ptr<CheckpointMeta> resumed_;
  std::unique_ptr<ModelLayout> layout_;
  std::unique_ptr<Dataset> data_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<StepTrace> trace_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  int64_t step_ = 0;
};

}  // namespace tandem
