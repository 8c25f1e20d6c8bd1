// Training on one or many ranks: options, data, the engine that replays the step
// program, metrics, progress output and sharded checkpoints.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "device/device.h"
#include "io/dataset.h"
#include "io/file.h"
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
  // The loss or gradient norm was NaN or Inf: the update was not applied (--skip-nonfinite).
  bool skipped = false;
};

nlohmann::json step_metrics_to_json(const StepMetrics& m);

// "SIGINT", "SIGTERM", "SIGUSR1" or "SIGUSR2" (Trainer::interrupted()).
const char* interrupt_signal_name(int sig);

// What the process's launcher and terminal decide for a run; the tandem command and the
// library API fill it from the process environment (api/environment.h). The defaults are
// a process that no launcher started, with stdout not a terminal.
struct TrainContext {
  bool mpi = false;              // a rank of an MPI job: the world is MPI's, else one rank
  int local_rank = 0;            // rank among the node's ranks: a CUDA run drives this GPU
  bool stdout_terminal = false;  // progress `auto` redraws a bar
};

class Trainer {
 public:
  // Sets up the device, the communicator (MPI when context.mpi, else one rank), the model,
  // the data and the engine, and resumes from --resume or starts from --init-from's weights. Every
  // inconsistency is reported here, before any step runs; so is a plan that does not fit in
  // --mem-limit.
  explicit Trainer(TrainOptions options, const TrainContext& context = {});
  ~Trainer();

  // Steps until options.steps with progress (rank 0), metrics and checkpoints, calling
  // on_step (when given) after each step; returns the last step's metrics (step == 0 when
  // nothing was left to do). The metrics file holds one line per step; what follows the
  // steps (the tandem command's prediction summary) is the caller's to append.
  //
  // [Interrupts] SIGINT, SIGTERM, SIGUSR1 or SIGUSR2 on any rank stops the run at the next step
  // boundary on every rank (the ranks agree after each step), saves when --save is given,
  // and returns; interrupted() then names the signal. A second SIGINT or SIGTERM on a
  // rank ends that process at once.
  // A positive `until` ends the run after that step instead (never past options.steps).
  StepMetrics run(const std::function<void(const StepMetrics&)>& on_step = {}, int64_t until = 0);
  // The signal that stopped the last run() early (SIGINT, SIGTERM, SIGUSR1, SIGUSR2), or 0.
  // When only another rank received one, this rank reports SIGTERM.
  int interrupted() const { return interrupted_; }
  // The directory the last run() saved into when it was interrupted, or "".
  const std::string& interrupt_checkpoint() const { return interrupt_checkpoint_; }
  // The steps the last run() took, in order (empty before it and when nothing was left).
  const std::vector<StepMetrics>& ran() const { return ran_; }
  // The seconds the steps of the last run() took in all, as rank 0 measured them: the same
  // figure on every rank (collective: every rank calls it), so that decisions made from it
  // agree.
  double ran_seconds();
  // One optimizer step over global_batch sequences: fills this rank's token ids of the
  // step from the data, then replays the step program.
  StepMetrics step();
  void save(const std::string& dir);

  const ModelLayout& layout() const { return *layout_; }
  const TrainOptions& options() const { return options_; }
  int64_t steps_done() const { return step_; }
  int micro_steps() const { return engine_->micro_steps(); }
  int rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  const Engine& engine() const { return *engine_; }
  Engine& engine() { return *engine_; }
  // Whether the steps are captured as one CUDA graph: --cuda-graph resolved for this run.
  bool cuda_graph() const { return cuda_graph_; }
  // The device the steps run on and the world communicator over it (for collectives the
  // caller runs alongside the steps, such as the prediction's calibration).
  Device& device() { return *device_; }
  Communicator& world() { return *world_; }
  // This rank's parameter shards (the whole padded buffers at one rank).
  std::vector<std::vector<float>> params() const { return engine_->shards().params; }
  // Every unit's unpadded parameters, gathered from all ranks.
  std::vector<std::vector<float>> gather_params();
  // What the user is told once at the start: what --init-from's source asks (e.g. dropout
  // tandem leaves out), and how few blocks need recompute under the run's memory bound.
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  void nonfinite_step(StepMetrics& m);
  void lock_save_dir();
  int agree_on_interrupt();
  // --recompute-blocks auto: sets config's recompute (and options_') to what fits; returns
  // the note that says so.
  std::string choose_recompute_blocks(EngineConfig& config);
  // CUDA: the smallest free memory of the ranks' GPUs (collective, over the control plane).
  uint64_t smallest_free_memory();
  // The host communicator for checkpoints and traces, and its device and stream: the
  // world itself on CPU, a host (MPI or one-rank) communicator beside NCCL on CUDA.
  Device& control_device();
  Stream& control_stream();

  TrainOptions options_;
  TrainContext context_;
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
  bool cuda_graph_ = false;
  std::unique_ptr<StepTrace> trace_;
  // This rank's token ids of the step being taken, micro-step after micro-step.
  std::vector<int32_t> inputs_, targets_;
  std::vector<StepMetrics> ran_;
  std::vector<std::string> notes_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  int64_t step_ = 0;
  int skipped_ = 0;  // non-finite steps skipped so far (--skip-nonfinite)
  int interrupted_ = 0;
  std::string interrupt_checkpoint_;
  std::unique_ptr<DirectoryLock> save_lock_;  // rank 0: --save's, until run() ends
};

}  // namespace tandem
