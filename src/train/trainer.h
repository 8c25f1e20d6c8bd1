// Single-rank training: data, parameters, AdamW state and the step loop, with metrics,
// progress output and checkpoints.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <vector>

#include "io/checkpoint.h"
#include "io/dataset.h"
#include "model/model.h"
#include "model/transformer.h"
#include "train/options.h"

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
  // Resolves the model (from --model or the checkpoint), reads the data, initialises or
  // resumes the state. Every inconsistency is reported here, before any step runs.
  explicit Trainer(TrainOptions options);

  // Steps until options.steps with progress, metrics and checkpoints; returns the last
  // step's metrics (step == 0 when nothing was left to do).
  StepMetrics run();
  // One optimizer step over global_batch sequences.
  StepMetrics step();

  const ModelLayout& layout() const { return layout_; }
  const TrainOptions& options() const { return options_; }
  int64_t steps_done() const { return step_; }
  int micro_steps() const { return micro_steps_; }
  const std::vector<std::vector<float>>& params() const { return params_; }
  Checkpoint checkpoint() const;
  void save(const std::string& dir) const;
  // Bytes held by parameters, gradients, optimizer state and activations.
  uint64_t memory_bytes() const;

 private:
  TrainOptions options_;
  std::unique_ptr<Checkpoint> resumed_;  // the checkpoint resumed from, until its state is taken
  ModelLayout layout_;
  std::unique_ptr<Dataset> data_;
  std::unique_ptr<Workspace> ws_;
  std::vector<std::vector<float>> params_, grads_, m_, v_;  // per unit
  int64_t step_ = 0;
  int micro_steps_ = 1;
};

}  // namespace tandem
