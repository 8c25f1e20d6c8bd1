// tandem::Trainer: a training run driven from a program. One process is one rank: run the
// program under mpirun (or srun) for several ranks, as `tandem train` is run, and every
// rank constructs its Trainer with the same TrainConfig.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>

#include "tandem/config.h"
#include "tandem/error.h"
#include "tandem/model.h"

namespace tandem::api {

// One optimizer step, as measured on this rank. The loss and gradient norm are those of
// the whole global batch, the same on every rank.
struct StepMetrics {
  int64_t step = 0;             // 1-based number of the optimizer step just taken; 0: none taken
  double loss = 0;              // mean cross-entropy of the step's tokens
  float lr = 0;                 // learning rate the step used
  double grad_norm = 0;         // global L2 norm before clipping
  double tokens_per_s = 0;      // all ranks together
  double step_ms = 0;           // wall time of the step
  double compute_ms = 0;        // time the compute stream was busy
  double comm_ms = 0;           // time the communication streams were busy
  double exposed_comm_ms = 0;   // time compute stood waiting on communication
  uint64_t peak_mem_bytes = 0;  // device memory the step program holds at its peak
  // The loss or gradient norm was NaN or Inf and the update was skipped (skip_nonfinite).
  bool skipped = false;
};

using StepCallback = std::function<void(const StepMetrics&)>;

class Trainer {
 public:
  // Sets up the device, the ranks, the model, the data and the step program, and loads
  // config.resume_dir when set. Every inconsistency (bad values, missing files, a model
  // that does not match its checkpoint, a plan over mem_limit_bytes) throws tandem::Error
  // here, before any step runs.
  explicit Trainer(const TrainConfig& config);
  ~Trainer();
  Trainer(Trainer&&) noexcept;
  Trainer& operator=(Trainer&&) noexcept;  // a moved-from Trainer may only be destroyed
  Trainer(const Trainer&) = delete;
  // Continues the run saved in checkpoint `dir` with the options it was saved with (its
  // "train" record: data, batch, steps, save directory, ...), then the keys of
  // `overrides_json`, a JSON object in the spelling of train_config_from_json (e.g.
  // {"steps": 2000} to go further). Progress output stays off unless overridden.
  static Trainer resume(const std::filesystem::path& dir, const std::string& overrides_json = "{}");
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step over global_batch sequences. Throws when the loss is not finite.
  StepMetrics step();
  // Steps until config.steps optimizer steps are done, calling on_step (when given) after
  // each one on every rank, with progress output (rank 0), the metrics file, and
  // checkpoints every save_every steps and at the end into save_dir. Returns the last
  // step's metrics; step == 0 when the run had already reached config.steps. An exception
  // thrown by on_step ends the run and reaches the caller as it is.
  //
  // SIGINT, SIGTERM or SIGUSR1 during run() stops it after the current step on every rank,
  // saves into save_dir when set, and returns that step's metrics; interrupted() then names
  // the signal. A second SIGINT or SIGTERM ends the process at once.
  StepMetrics run(const StepCallback& on_step = {});
  // The same, ending after at most `steps` more optimizer steps (never past config.steps);
  // a later call continues the run.
  StepMetrics run(const StepCallback& on_step, int64_t steps);
  // The signal number that stopped the last run() early, or 0.
  int interrupted() const;
  // Writes a checkpoint of the current step into dir (every rank must call it).
  void save(const std::filesystem::path& dir);

  int64_t steps_done() const;  // optimizer steps taken, those of a resumed checkpoint included
  int rank() const;
  int world_size() const;
  // The configuration as the run resolved it: global_batch filled in, and a resumed run's
  // seed taken from its checkpoint.
  const TrainConfig& config() const;
  // The model being trained (a resumed run's is the checkpoint's, with its step).
  const ModelInfo& model() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A program run as several ranks (under mpirun or srun) ends its part of the job with
// finalize(), once, after its last Trainer is destroyed and before main returns; in a
// one-rank run it does nothing. On a failure that the other ranks cannot know of, a rank
// ends the whole job at once with abort_job(exit_code) instead of leaving them waiting in
// a collective (until comm_timeout_s).
void finalize();
[[noreturn]] void abort_job(int exit_code);

}  // namespace tandem::api

#if !defined(TANDEM_BUILDING_LIBRARY)
namespace tandem {
using namespace api;  // NOLINT(build/namespaces): the re-export (see tandem/error.h)
}  // namespace tandem
#endif
