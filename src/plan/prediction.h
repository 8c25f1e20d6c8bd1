// Predicted next to measured: what the planner (plan/plan.h) predicts for the step of the
// run being trained, and the summary of the steps it measured, printed by rank 0 at the
// end of `tandem train` and written as the last line of the metrics file. See
// docs/diagnosis.md, "Predicted next to measured".
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "device/device.h"
#include "model/config.h"
#include "plan/kernel_rates.h"
#include "plan/plan.h"
#include "train/options.h"
#include "train/trainer.h"

namespace tandem {

// Checks the prediction's options that need no files: --hardware is auto, none or a
// preset, and --hardware none comes without probe files. The tandem command calls it
// beside train_options_validate, before the run is set up.
void prediction_options_validate(const TrainOptions& o);

// The hardware a run is predicted on: `--hardware` (a preset, `auto` or `none`) with the
// probe files `--hardware-compute` and `--hardware-links` on top.
struct PredictionHardware {
  bool available = false;  // false: no prediction, `why` says why
  std::string why;
  Hardware hw;
  // `auto` on the CPU: the cpu-local preset holds nominal figures, so the run measures
  // this machine at its end: the fp32 GEMM rate, copy bandwidth and the kernel tables of the
  // model's step unless a compute probe file gives them, and with several ranks the links
  // unless a links probe file does.
  bool measure_compute = false, measure_links = false;
  // A caveat for the run to print before its steps ("" when none): its compute file's kernel
  // tables ran another flash backward form (kernel_rates_form_mismatch).
  std::string note;
};

// Resolves the hardware for a run on the device named `device_name` (Device::name(): "cpu",
// or "cuda:0 (NVIDIA H200)"). `auto` takes hardware_preset_for_device, and a GPU without a
// preset leaves no prediction; `none` never predicts. Throws on an unknown preset and on
// unreadable or invalid probe files, so a run finds out before its first step.
PredictionHardware prediction_hardware(const TrainOptions& o, const std::string& device_name);

// [CPU calibration] This process's fp32 GEMM rate (the probes' n x n x n GEMM) and copy
// bandwidth (64 MiB, read + write counted), with the threads the steps used, each as the
// throughput of back-to-back runs over at least window_ms.
struct CpuRates {
  int gemm_n = 0;
  // The GEMM rate, the copy bandwidth and the rate a matrix-vector product of the model's
  // width streams its weights (decoding).
  double tflops = 0, copy_GBps = 0, matvec_GBps = 0;
};
CpuRates prediction_measure_cpu(int gemm_n, double window_ms);
// The GEMM size the calibration uses for a model: its width rounded to a multiple of 64,
// within [128, 2048], since the GEMM rate depends on the size and the step's matrix
// products have the width as their inner dimension.
int prediction_gemm_size(const ModelConfig& model);
// Puts measured rates into hw and says so in its source.
void prediction_apply_cpu(Hardware& hw, const CpuRates& rates);
// [CPU calibration] The kernel tables of the model's training step on this process's CPU
// (`tandem probe compute --model` at the run's batch and sequence, 3 timed batches per call),
// with the threads the steps used: each distinct call of a micro-step five times or more.
std::shared_ptr<const KernelRates> prediction_measure_kernels(const ModelConfig& model, int batch,
                                                              int seq);
// Puts kernel tables into hw (unit costs from them) and says so in its source.
void prediction_apply_kernels(Hardware& hw, std::shared_ptr<const KernelRates> kernels);

// [Decode calibration] The rate one of the model's blocks streams its weights when decoding
// `rows` rows on this device: the block's forward on the device's own kernels (constant
// weights, a cache of `positions` per row, each row at its first), timed back to back over at
// least window_ms. On a GPU this
// folds what a decode step spends besides its products (norms, attention, launches) into the
// rate, which the bandwidth alone leaves out (docs/planner.md, "Generation").
// The head's product is timed alone as well (head_ms, head_GBps): one wide matrix over the
// vocabulary streams faster per byte than a block, and a small model's head is a large share
// of what a step reads (a quarter of GPT-2 124M's).
struct DecodeRates {
  int rows = 0;
  double block_ms = 0, matvec_GBps = 0;
  double head_ms = 0, head_GBps = 0;
};
DecodeRates prediction_measure_decode(Device& device, const ModelConfig& model, int rows,
                                      int positions, double window_ms);
// Puts the measured rates into hw (Hardware::matvec_GBps, head_matvec_GBps) and says so in
// its source.
void prediction_apply_decode(Hardware& hw, const DecodeRates& rates);

// The largest unit's fp32 bytes: what the run's largest gather and reduce-scatter move.
size_t prediction_links_bytes(const ModelConfig& model);
// Collective over world (at least 2 ranks): the links probe's all-gather, reduce-scatter
// and all-reduce at max_bytes / 8 to max_bytes, fitted into hw's link lines, as
// `--hardware-links` would with a saved probe file.
void prediction_calibrate_links(Hardware& hw, size_t max_bytes, Communicator& world,
                                Device& device);

// The planner's request for the run: the model, ranks = world, the per-rank batch and the
// sequence length, micro-steps = global_batch / (batch x world), max_gathered, the shard
// group and the strategy (the only one planned). o.global_batch 0 means batch x world.
PlanRequest prediction_request(const TrainOptions& o, const ModelConfig& model, int world,
                               const Hardware& hw);

struct StepPrediction {
  std::string hardware;     // the hardware's name (a preset)
  std::string source;       // what set its figures (Hardware::source)
  bool calibrated = false;  // figures were measured in this run
  double step_ms = 0, compute_ms = 0, comm_ms = 0, exposed_comm_ms = 0;
};

// Plans the request's one strategy.
StepPrediction prediction_plan(const PlanRequest& r);

// Medians over the measured window: the run's steps without the first two (warm-up), or
// without fewer when the run is short (at most half of its steps are left out).
struct MeasuredSteps {
  int64_t steps = 0;            // steps the run took
  int64_t first = 0, last = 0;  // the window of the medians (step numbers, inclusive)
  double step_ms = 0, compute_ms = 0, comm_ms = 0, exposed_comm_ms = 0, tokens_per_s = 0;
};
MeasuredSteps prediction_measured(const std::vector<StepMetrics>& steps);

struct RunSummary {
  MeasuredSteps measured;
  std::optional<StepPrediction> predicted;
  std::string why;  // without a prediction: why not
};

// What the tandem command calls on every rank after the run's last step, once its
// checkpoint is saved (collective over world): calibrates where
// the hardware asks for it, every rank at once as the steps ran (the compute rates, and with
// several ranks and no --hardware-links the links at the run's sizes), plans, and
// summarises the steps. A calibration or plan that fails leaves `predicted` empty with the
// reason; the run has succeeded by then.
RunSummary prediction_summarize(const PredictionHardware& hw, const TrainOptions& o,
                                const ModelConfig& model, Communicator& world, Device& device,
                                const std::vector<StepMetrics>& steps);

// measured / predicted - 1: positive when the steps took longer than predicted.
double prediction_off(const RunSummary& s);
// One line: "predicted (h200-sxm): step 48.1 ms, exposed communication 0.3 ms | measured
// (median of steps 3..10): step 50.2 ms, exposed 0.4 ms | step time off by +4%".
std::string prediction_line(const RunSummary& s);
// The metrics file's last line: {"summary": true, "steps", "measured": {"step_ms",
// "exposed_comm_ms", "compute_ms", "comm_ms", "tokens_per_s"}, "predicted": {"hardware",
// "source", "step_ms", "exposed_comm_ms", "compute_ms", "comm_ms"} or null}.
nlohmann::json prediction_to_json(const RunSummary& s);

}  // namespace tandem
