// The engine of one rank: binds a step program to memory (the arena and the shards),
// streams, communicators and the model, and replays it once per optimizer step. The work
// of each op is the executor's of the device (shard/engine_exec.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/intervals.h"
#include "device/arena.h"
#include "device/device.h"
#include "device/kernels.h"
#include "model/activations.h"
#include "model/model.h"
#include "optim/optim.h"
#include "shard/flat.h"
#include "shard/program.h"

namespace tandem {

struct EngineConfig {
  Strategy strategy = Strategy::full;
  int shard_group = 0;  // hybrid only
  int max_gathered = 2;
  int batch = 1;  // sequences per rank per micro-step
  int seq = 1;
  int global_batch = 1;  // sequences per optimizer step over all ranks
  int total_steps = 1;   // for the learning-rate schedule
  uint64_t seed = 0;
  OptimConfig optim;
  // Sleep this long in every compute op: makes compute dominate in the overlap tests and
  // delays producers on purpose, so a missing wait shows up as wrong data.
  double compute_delay_ms = 0;
  // Bytes per rank the plan (arena + shards) may take; 0: no bound. Checked before anything
  // is allocated.
  uint64_t mem_limit = 0;
  // Without mem_limit: the free memory the plan must fit, the smallest of every rank's GPU
  // as the Trainer gathers it, so that every rank reaches the same verdict (one refusing
  // alone would leave the others waiting in the communicators' setup). 0: on CUDA this
  // device's own free memory, on CPU no bound.
  uint64_t free_memory = 0;
  // How the CUDA kernel table computes attention (ignored on CPU).
  AttentionImpl attention = AttentionImpl::automatic;
  // What each block keeps for its backward ([Activation recompute], model/activations.h).
  Recompute recompute = Recompute::none;
  int recompute_blocks = 0;  // [Partial recompute]: the first this many blocks; 0: every block
  // Rows of logits the head's loss makes at once; 0: all, in the forward ([Chunked loss]).
  int loss_chunk = 0;
  // The dtype reduce-scatters and replica all-reduces move gradients in: f32, or bf16 for
  // half the bytes, rounding each rank's contribution and each partial sum ([Reduce dtype]
  // in shard/engine_exec.h). Gradient buffers and shards stay fp32 either way.
  DType reduce_dtype = DType::f32;
  // [Step graph] Capture the step once as a graph and replay it every later step (CUDA
  // only): the same work, fewer launches. The first step runs as issued (it warms the
  // libraries up), the second is captured, and from then on each step is one launch.
  bool cuda_graph = false;
  // [Gradients in the shard] (shard/program.h); off only to compare with the general path.
  bool grads_in_shard = true;
  // [Update at gather] (shard/program.h): each unit's AdamW update runs on the gather stream
  // before the unit's first gather of the next step. The same numbers as at the step's end.
  bool update_at_gather = false;
  // [Fresh gradients] (device/kernels.h): a gradient buffer's first backward writes it. Off,
  // the executor clears each such buffer whole and every backward adds: to compare.
  bool fresh_gradients = true;
};

// Token ids of one optimizer step for this rank: micro-step m's inputs are
// inputs[m * batch * seq, (m + 1) * batch * seq), row-major [batch, seq]; targets alike.
// Both hold micro_steps() * batch * seq ids and stay valid until step() returns.
struct StepBatch {
  const int32_t* inputs = nullptr;
  const int32_t* targets = nullptr;
  size_t count = 0;  // ids in each array
};

// When each op of one step ran, in ms from the step's start (for traces).
struct OpTiming {
  double start_ms = 0, end_ms = 0;
  double wait_ms = 0;  // compute ops: time blocked on communication before starting
};

// [Exposed communication] The time, in ms, that the `waits` intervals (the compute stream
// standing still before an op, one interval per waiting op; they never overlap) spend while
// some communication op runs (the `busy` intervals, any order, may overlap). It never exceeds
// the union of `busy`: a compute stream still waiting after the communication it waits for
// has ended (its thread not yet scheduled again, on CPU ranks) is not communication.
double exposed_overlap_ms(const Intervals& busy, const Intervals& waits);

struct StepResult {
  double loss = 0;       // mean over the global batch
  double grad_norm = 0;  // before clipping
  float lr = 0;
  double compute_ms = 0, comm_ms = 0, exposed_comm_ms = 0;
  std::vector<OpTiming> ops;  // one per program op, filled when asked for
};

class EngineExec;

// [Partial recompute] The fewest blocks that, recomputing as `mode` does in their first K,
// keep the program of `config` (its other settings as given) within `room` bytes per rank,
// found by bisection over program peaks (memory falls as K grows; one block recomputing
// keeps as much as none). blocks = 0: even every block recomputing does not fit.
struct RecomputeFit {
  int blocks = 0;
  uint64_t peak = 0;  // the program's peak at that count
};
RecomputeFit engine_fewest_recompute_blocks(const ModelLayout& model, EngineConfig config,
                                            DeviceKind kind, int world, Recompute mode,
                                            double room);
// The share of a memory bound that recompute advice leaves free: the program counts the arena
// and the shards, not a GPU's context, its libraries' workspaces or NCCL's buffers.
constexpr double kRecomputeHeadroom = 0.03;

class Engine {
 public:
  // Builds and (in debug builds) checks the program, allocates the arena and the shards on
  // the device, and initialises the parameters from the seed. world: all data-parallel
  // ranks, a communicator of `device` (MPI or one rank on CPU, NCCL on CUDA).
  Engine(const ModelLayout& model, const EngineConfig& config, Device& device, Communicator& world);
  ~Engine();

  // The program's spec for this configuration on a device of this kind: what
  // program_build needs to plan memory before anything is allocated.
  static ProgramSpec program_spec(const ModelLayout& model, const EngineConfig& config,
                                  DeviceKind kind, int world);

  // Runs optimizer step `step` (0-based) on this rank's batch; with timings, also reports
  // when each op ran. Throws, before anything runs, when a token or target is outside the
  // vocabulary or the batch has the wrong size.
  StepResult step(int64_t step, const StepBatch& batch, bool timings = false);
  // With EngineConfig::cuda_graph: whether the steps now replay a captured graph.
  bool graph_replays() const { return graph_ != nullptr; }

  const Program& program() const { return program_; }
  // The bytes per rank the plan was checked against: --mem-limit, or without one a GPU's
  // free memory before the engine took any; 0: no bound (the CPU without --mem-limit).
  uint64_t memory_bound() const { return memory_bound_; }
  const FlatLayout& flat() const { return flat_; }
  int shard_rank() const { return shard_rank_; }
  int micro_steps() const { return micro_steps_; }
  // This rank's parameter and AdamW shards (host copies, the last step's update applied),
  // and their replacement (resume; it drops an update not yet applied).
  ShardState shards();
  void set_shards(const ShardState& state);
  // Every unit's unpadded parameters, all-gathered from the shard group (collective; the last
  // step's update applied).
  std::vector<std::vector<float>> gather_params();
  // [Update at gather] Applies the last step's update now, where the next step's gathers
  // would have (a no-op when none is pending or the program updates at the step's end).
  void settle();
  // The step whose update the shards still lack, or -1.
  int64_t pending_update() const { return pending_update_; }
  // Per unit, whether this rank's gradient shard holds a NaN or Inf: the diagnosis after a
  // step whose gradient norm was not finite (host copies of the shards; not collective).
  std::vector<bool> nonfinite_grad_units() const;
  // This rank's gradient shards after the last step, per unit (host copies; tests and
  // diagnosis, not on the step's path).
  std::vector<std::vector<float>> grad_shards() const;
  uint64_t peak_bytes() const;
  Stream& comm_stream() { return *reduce_; }

 private:
  const ModelLayout& model_;
  EngineConfig config_;
  Device& device_;
  int micro_steps_;
  FlatLayout flat_;
  Program program_;
  uint64_t memory_bound_ = 0;
  int shard_rank_ = 0;
  Mesh mesh_;
  std::unique_ptr<Communicator> gather_comm_, reduce_comm_;
  std::unique_ptr<Stream> compute_, gather_, reduce_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<EngineExec> exec_;
  // Issues every op of the program on its stream, as run_op describes (eager or captured).
  void issue(int64_t step, const StepBatch& batch, bool capturing);
  // The step's exposed communication from its ops' durations and compute waits (ms, per op).
  double exposed_comm_ms(const std::vector<double>& ms, const std::vector<double>& waited);

  std::vector<std::unique_ptr<Event>> before_wait_, before_, done_;  // per op
  std::vector<double> op_ms_, op_wait_ms_;  // per op, the last step's durations and waits
  std::unique_ptr<Event> step_start_;
  // [Step graph] The captured step, the events that order its streams inside the capture
  // (done_ times each op there, these order them), and the steps issued so far.
  std::unique_ptr<Graph> graph_;
  std::vector<std::unique_ptr<Event>> order_;  // per op
  std::unique_ptr<Event> fork_, join_gather_, join_reduce_;
  int64_t steps_issued_ = 0;
  int64_t pending_update_ = -1;  // [Update at gather]
};

}  // namespace tandem
