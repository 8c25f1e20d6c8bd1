// The cost model behind `tandem plan`: training is predicted by replaying the real step
// program (program_build) on a simulated machine, op durations from the model's shapes
// and the hardware; generation by closed forms per inference layout. See docs/planner.md.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <vector>

#include "model/activations.h"
#include "model/model.h"
#include "plan/hardware.h"
#include "plan/kernel_rates.h"
#include "shard/program.h"

namespace tandem {

enum class PlanTask { train, generate };

struct PlanRequest {
  PlanTask task = PlanTask::train;
  ModelConfig model;
  int ranks = 1;
  int batch = 4;  // train: sequences per rank per micro-step; generate: sequences decoded together
  int seq = 64;   // train: sequence length; generate: KV-cache length per sequence
  int micro_steps = 1;                    // train
  int max_gathered = 2;                   // full/hybrid (train), fsdp (generate)
  int shard_group = 0;                    // hybrid: ranks per shard group (0: hybrid not planned)
  Recompute recompute = Recompute::none;  // train: what each block keeps for its backward
  int recompute_blocks = 0;  // train: the blocks that recompute, the first ones; 0: every block
  int loss_chunk = 0;        // train: rows of logits made at once (0: all)
  DType reduce_dtype = DType::f32;  // train: the dtype gradients are reduced in
  bool update_at_gather = false;    // train: [Update at gather] (shard/program.h)
  std::string strategy;             // plan only this strategy (empty: all)
  Hardware hw;
};

struct StrategyPlan {
  std::string name;
  bool applicable = true;  // false: the layout does not apply (the bottleneck says why)
  bool fits = false;
  double peak_mem_bytes = 0;       // per rank
  double step_ms = 0;              // train: one optimizer step; generate: one decode step
  double tokens_per_s = 0;         // at the request's batch (all ranks together)
  double tokens_per_s_batch1 = 0;  // generate only
  double compute_ms = 0, comm_ms = 0, exposed_comm_ms = 0;
  // train: the shortest step perfect overlap allows: the busiest of the compute stream,
  // each communication stream and the shared link ([Overlap bound] in plan.cpp).
  double min_step_ms = 0;
  double link_ms = 0;  // train: the link's work per step (its collectives run alone)
  // Bytes each rank moves over links per step (train) or per decode step (generate).
  double gather_bytes = 0, reduce_bytes = 0, all_reduce_bytes = 0;
  std::string bottleneck;  // one sentence, with numbers
};

// Kernel calls priced from kernel tables, and how many each kind of estimate priced
// ([Kernel estimate] in plan/kernel_rates.h).
struct KernelCost {
  double ms = 0;
  int calls = 0, measured = 0, interpolated = 0, ceiling = 0;
  void add(const KernelCost& o);
};

struct PlanResult {
  PlanRequest request;
  std::vector<StrategyPlan> strategies;
  int recommended = -1;  // index into strategies; -1 when none fits
  std::string why;       // one sentence on the recommendation and its bottleneck
  std::string overlap;   // train: the most that perfect overlap could gain
  std::vector<std::string> notes;
  // train with kernel tables: the calls of one micro-step (every unit forward and backward)
  // and how they were priced.
  std::optional<KernelCost> kernel_cost;
};

// Forward cost of one unit at (B, T): FLOPs of its matrix products and attention, and the
// bytes its elementwise ops and weight reads move. A backward costs twice its forward, plus
// what recompute runs again (unit_recompute_cost).
struct UnitCost {
  double flops = 0, bytes = 0;
};
UnitCost unit_forward_cost(const ModelLayout& model, int unit, int B, int T, const Hardware& hw);
// What a block's backward runs again under `recompute` before it starts: its whole forward
// (unit) or attention's (attention); nothing for other units or Recompute::none.
UnitCost unit_recompute_cost(const ModelLayout& model, int unit, int B, int T, const Hardware& hw,
                             Recompute recompute);

// [Kernel estimate] With kernel tables (Hardware::kernels): one call's duration, the tables'
// estimate, or where no shape of its kernel was measured the ceilings (FLOPs at tflops plus
// nominal bytes at hbm_GBps) plus one launch. *fit says which (none: the ceilings).
double kernel_call_ms(const KernelCall& call, const Hardware& hw, KernelRates::Fit* fit = nullptr);
// A unit's forward or backward as the sum of the calls the composition makes for it
// (unit_kernel_calls), each at kernel_call_ms. Needs hw.kernels.
KernelCost unit_kernel_cost(const ModelLayout& model, int unit, bool backward, int B, int T,
                            const Hardware& hw, Recompute recompute = Recompute::none,
                            int loss_chunk = 0, const std::vector<bool>& fresh = {});

// Per op of a program: its duration on the hardware and the bytes it moves per rank over
// a link (0 for compute and for local copies).
struct OpCost {
  double ms = 0;
  double link_bytes = 0;
};
// `recompute` applies to the first `recompute_blocks` blocks (0: every block).
std::vector<OpCost> program_costs(const ModelLayout& model, const Program& p, const Hardware& hw,
                                  int B, int T, Recompute recompute = Recompute::none,
                                  int loss_chunk = 0, int recompute_blocks = 0);

// [List schedule] Replays a program with given op durations: an op starts when the
// previous op of its stream and every op it waits for have finished. Ops flagged in
// on_link (empty: none) share the link while they overlap ([Link sharing]); ops flagged in
// on_processors share the compute stream's processors with its ops ([Processor sharing]).
struct Timeline {
  std::vector<double> start_ms, end_ms;
  double step_ms = 0;          // makespan
  double compute_ms = 0;       // sum of compute-stream op durations
  double comm_ms = 0;          // sum of the other streams' op durations
  double exposed_comm_ms = 0;  // time the compute stream stood waiting on another stream
};
Timeline schedule_simulate(const Program& p, const std::vector<double>& duration_ms,
                           const std::vector<bool>& on_link = {},
                           const std::vector<bool>& on_processors = {});

// Activation bytes of one micro-step as the engine plans them on this hardware.
double plan_activation_bytes(const ModelConfig& c, int B, int T, const Hardware& hw,
                             Recompute recompute = Recompute::none, int loss_chunk = 0,
                             int recompute_blocks = 0);
// The ProgramSpec a training strategy runs with on this hardware.
ProgramSpec plan_program_spec(const PlanRequest& r, Strategy s);

StrategyPlan plan_train_strategy(const PlanRequest& r, Strategy s);
// Inference layouts: "replicate", "fsdp", "tp", "pipeline".
StrategyPlan plan_generate_strategy(const PlanRequest& r, const std::string& name);
const std::vector<std::string>& plan_generate_strategies();

// `--strategy auto` of generate: plans each layout of `runnable` (names of
// plan_generate_strategies) for the request and picks the fastest that applies and fits, the
// least memory among those within 2% of it, and never fsdp while another layout fits (it
// moves every weight over the links per token). name is empty when none fits; why says, in
// one sentence with numbers, what the choice is and what bounds it (or why none fits).
struct LayoutChoice {
  std::string name;
  StrategyPlan plan;
  std::string why;
};
LayoutChoice plan_choose_layout(const PlanRequest& r, const std::vector<std::string>& runnable);

// Plans every strategy of the task (or the requested one) and picks one.
PlanResult plan_run(const PlanRequest& r);
std::string plan_format(const PlanResult& result);
// Keys: task, model, ranks, hardware, strategies (name, fits, peak_mem_bytes, step_ms,
// tokens_per_s, compute_ms, comm_ms, exposed_comm_ms, bottleneck, ...), recommended, why.
nlohmann::json plan_to_json(const PlanResult& result);

}  // namespace tandem
