// tandem::TrainConfig: everything a training run is decided by, as typed values. The
// fields and their defaults are those of `tandem train` (docs/usage.md), except that the
// library prints no progress unless asked to.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "tandem/error.h"

namespace tandem::api {

enum class Device { cpu, cuda };

// How parameters, gradients and optimizer state are spread over the ranks
// (docs/design.md, "Strategies"): full (FSDP / ZeRO-3), grad_op (ZeRO-2: gradients and
// optimizer state sharded, parameters replicated), none (plain data parallelism) and
// hybrid (full sharding within groups of shard_group ranks, replicated across them).
enum class Strategy { full, grad_op, none, hybrid };

// What each block keeps for its backward: everything (none), all but attention's state and
// output (attention, recomputed from the saved query/key/value), or only its input (unit:
// the block's forward runs again before its backward). Less activation memory for more
// compute; the gradients are the same.
enum class Recompute { none, attention, unit };

// The dtype gradients are summed across ranks in: f32, or bf16 for half the bytes of every
// reduce-scatter and replica all-reduce, each rank's gradient and each partial sum rounded
// to bf16 (docs/design.md, "bf16 gradient reduction"). Gradients are kept in fp32 either way.
enum class ReduceDtype { f32, bf16 };

// Whether the training step is captured as one CUDA graph on step 2 and replayed for every
// later step (docs/design.md, "Step graph"): the same numbers, fewer launches. automatic
// is on for a run of one CUDA rank and off otherwise; on needs Device::cuda.
enum class CudaGraph { automatic, on, off };

// Progress output on rank 0: automatic (a redrawn bar on a terminal, plain lines
// otherwise), bar, lines (one line every log_every steps) or none.
enum class Progress { automatic, bar, lines, none };

constexpr std::string_view to_string(Device d) noexcept {
  switch (d) {
    case Device::cpu:
      return "cpu";
    case Device::cuda:
      return "cuda";
  }
  return "?";
}

// The spelling of the command line and of checkpoints: "full", "grad-op", "none", "hybrid".
constexpr std::string_view to_string(Strategy s) noexcept {
  switch (s) {
    case Strategy::full:
      return "full";
    case Strategy::grad_op:
      return "grad-op";
    case Strategy::none:
      return "none";
    case Strategy::hybrid:
      return "hybrid";
  }
  return "?";
}

// The spelling of the command line and of checkpoints: "auto", "on", "off".
constexpr std::string_view to_string(CudaGraph g) noexcept {
  switch (g) {
    case CudaGraph::automatic:
      return "auto";
    case CudaGraph::on:
      return "on";
    case CudaGraph::off:
      return "off";
  }
  return "?";
}

constexpr std::string_view to_string(Progress p) noexcept {
  switch (p) {
    case Progress::automatic:
      return "auto";
    case Progress::bar:
      return "bar";
    case Progress::lines:
      return "lines";
    case Progress::none:
      return "none";
  }
  return "?";
}

// AdamW with global gradient-norm clipping; the learning rate warms up linearly over
// `warmup` steps, then follows a cosine from lr down to lr * min_lr_ratio at the last step.
struct OptimizerConfig {
  float lr = 3e-4f;
  float min_lr_ratio = 0.1f;
  int warmup = 0;             // optimizer steps of linear warm-up
  float weight_decay = 0.1f;  // applied to matrices and embeddings only
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float grad_clip = 1.0f;  // global L2 norm; 0 disables clipping
};

struct TrainConfig {
  // A model preset (see model_presets()), a JSON model config file or a model directory. May
  // stay empty when resuming or with init_from: the directory names the model; when given,
  // it must match it.
  std::string model;
  std::filesystem::path data;  // token file (`tandem data prepare`; docs/formats.md)
  Device device = Device::cpu;

  int batch = 4;         // sequences per rank per micro-step
  int global_batch = 0;  // sequences per optimizer step; 0: batch x ranks
  int seq = 64;          // sequence length
  int steps = 100;       // total optimizer steps of the run (a resumed run continues to it)
  uint64_t seed = 1337;  // initialisation and data order (a resumed run keeps its own)
  OptimizerConfig optimizer;

  Strategy strategy = Strategy::full;
  int shard_group = 0;   // hybrid: ranks per shard group (required there, 0 elsewhere)
  int max_gathered = 2;  // full, hybrid: units whose parameters are gathered at once
  Recompute recompute = Recompute::none;
  // How many blocks recompute, the first ones (the others keep everything); 0: every block;
  // kAutoRecomputeBlocks: the fewest that fit mem_limit, or on CUDA the GPUs' free memory
  // (the run's start notes say how many).
  static constexpr int kAutoRecomputeBlocks = -1;
  int recompute_blocks = 0;
  // Rows of logits the loss makes at once, in the head's backward, so the [batch x seq,
  // vocab] logits are never held whole; 0: every row, in the forward. The same loss.
  int loss_chunk = 0;
  ReduceDtype reduce_dtype = ReduceDtype::f32;
  // Capture the step as one CUDA graph on step 2 and replay it every later step: the same
  // numbers, fewer launches. on needs Device::cuda; automatic is on for one CUDA rank.
  CudaGraph cuda_graph = CudaGraph::automatic;
  // Each unit's optimizer update beside the next step's compute, right before the unit is
  // gathered, instead of every update at the step's end: the same numbers. The parameters
  // and checkpoints a trainer hands out always have the last step's update applied.
  bool update_at_gather = false;
  int ranks = 0;                 // expected world size; 0: whatever the launcher started
  double comm_timeout_s = 300;   // seconds before a collective gives up
  uint64_t mem_limit_bytes = 0;  // per-rank memory bound the plan must fit in; 0: none

  std::filesystem::path save_dir;  // checkpoint written at the end of run(); empty: none
  int save_every = 0;              // run() also saves every N steps; 0: only at the end
  // save_dir may replace another run's checkpoint (resuming from save_dir is the same run).
  bool save_overwrite = false;
  // Steps with a NaN or Inf loss or gradient norm skipped (update not applied) before the
  // run stops with an error; 0: the first one stops it.
  int skip_nonfinite = 0;
  std::filesystem::path resume_dir;  // checkpoint to continue from; empty: a fresh run
  // Weights a fresh run starts from (step 0, zero optimizer state), at any world size and
  // strategy: a tandem checkpoint or a Hugging Face model directory (docs/formats.md).
  // Excludes resume_dir.
  std::filesystem::path init_from;
  std::filesystem::path metrics_path;  // run() writes a JSON object per step (JSONL); empty: none

  Progress progress = Progress::none;
  int log_every = 10;  // steps between progress lines
  // A Chrome trace (Perfetto) of the steps of trace_steps ("A:B", 1-based, inclusive);
  // empty: none.
  std::filesystem::path trace_path;
  std::string trace_steps = "1:3";
};

// A config from the JSON object of `tandem train --config FILE`: the flag names without
// their dashes ({"global-batch": 32, "lr": 1e-3}); absent keys keep TrainConfig's defaults
// (progress "none" among them). An unknown key, a value of the wrong type or out of range
// throws tandem::Error with the message `tandem train` gives for it. The keys of the tandem
// command's prediction ("hardware", "hardware-compute", "hardware-links") are refused.
TrainConfig train_config_from_json(const std::string& json);
// The config as that JSON object, every key present.
std::string train_config_to_json(const TrainConfig& config);

}  // namespace tandem::api

#if !defined(TANDEM_BUILDING_LIBRARY)
namespace tandem {
using namespace api;  // NOLINT(build/namespaces): the re-export (see tandem/error.h)
}  // namespace tandem
#endif
