// The planner for training: for every sharding strategy, the predicted step time, the
// communication left exposed, the peak memory per rank and whether it fits, on given
// hardware, before anything runs (docs/planner.md). It replays the real step program on
// a simulated machine.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tandem/config.h"
#include "tandem/error.h"

namespace tandem::api {

struct PlanRequest {
  // A model preset, a JSON model config file or a checkpoint directory.
  std::string model = "gpt2-tiny";
  int ranks = 1;
  int batch = 4;                     // sequences per rank per micro-step
  int seq = 64;                      // sequence length
  int micro_steps = 1;               // micro-steps per optimizer step
  int max_gathered = 2;              // full, hybrid: units gathered at once
  int shard_group = 0;               // hybrid: ranks per shard group; 0 leaves hybrid out
  std::optional<Strategy> strategy;  // plan this strategy only; empty: every one

  // The machine: a preset (see hardware_presets()), then the files `tandem probe compute
  // --save` and `tandem probe links --save` write, then the single figures below, each
  // overriding what came before.
  std::string hardware = "cpu-local";
  std::filesystem::path compute_probe, links_probe;
  std::optional<double> tflops;           // dense matrix rate, TFLOP/s
  std::optional<double> hbm_GBps;         // device memory bandwidth, GB/s
  std::optional<double> mem_GiB;          // memory per rank, GiB
  std::optional<double> link_GBps;        // collective bus bandwidth per rank, GB/s
  std::optional<double> link_latency_us;  // collective latency, microseconds
  // Precision of weights and activations: "auto" (the hardware's: bf16 on GPUs, fp32 on
  // CPUs), "bf16" or "fp32". PlanResult::hardware names the one planned.
  std::string dtype = "auto";
};

struct StrategyPlan {
  Strategy strategy = Strategy::full;
  bool applicable = true;     // false: the strategy does not apply here (bottleneck says why)
  bool fits = false;          // peak memory within the hardware's memory per rank
  double peak_mem_bytes = 0;  // per rank
  double step_ms = 0;         // one optimizer step
  double min_step_ms = 0;     // the shortest step perfect overlap would allow
  double tokens_per_s = 0;    // all ranks together
  double compute_ms = 0, comm_ms = 0, exposed_comm_ms = 0;
  double link_ms = 0;  // the link's work per step
  // Bytes each rank moves over links per step.
  double gather_bytes = 0, reduce_bytes = 0, all_reduce_bytes = 0;
  std::string bottleneck;  // one sentence, with numbers
};

struct PlanResult {
  std::string hardware;  // one line: the machine planned for and where its figures came from
  std::vector<StrategyPlan> strategies;
  int recommended = -1;  // index into strategies; -1 when none fits
  std::string why;       // one sentence on the recommendation and its bottleneck
  std::string overlap;   // the most that perfect overlap could gain
  std::vector<std::string> notes;
  std::string report;  // the table `tandem plan` prints

  const StrategyPlan* best() const {
    return recommended >= 0 ? &strategies[static_cast<std::size_t>(recommended)] : nullptr;
  }
};

// Plans a training job. Throws tandem::Error for an unknown model or hardware preset, an
// unreadable probe file or inconsistent sizes.
PlanResult plan(const PlanRequest& request);

// The names of the hardware presets, e.g. "h200-sxm", "cpu-local".
std::vector<std::string> hardware_presets();

}  // namespace tandem::api

#if !defined(TANDEM_BUILDING_LIBRARY)
namespace tandem {
using namespace api;  // NOLINT(build/namespaces): the re-export (see tandem/error.h)
}  // namespace tandem
#endif
