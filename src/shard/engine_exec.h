// The device half of the engine: what each op of the step program does on one kind of
// device, and the state it owns there (parameter, gradient and AdamW shards). The Engine
// (engine.h) replays the program, orders the streams and times the ops; an executor only
// enqueues each op's work on the op's stream. engine_cpu.cpp is the CPU executor (fp32
// everywhere); shard/cuda/engine_cuda.cu the CUDA one (bf16 gathered parameters, fp32 shards).
//
// [Reduce dtype] Gradients cross the links in fp32 unless EngineConfig::reduce_dtype is
// bf16. Then the reduce op, on the reduce stream, casts the unit's fp32 unsharded gradient
// to a bf16 scratch (round to nearest even), reduce-scatters it in bf16 into a bf16 shard
// scratch (each pairwise sum is computed in fp32 and rounded to bf16: NCCL's bf16 sum, and
// bf16_sum in comm/mpi.cpp), and widens the result into the fp32 gradient shard: written
// by the step's first reduce, added by later micro-steps (full, hybrid). The replica
// all-reduce casts the shard to the bf16 scratch, all-reduces it there in place and widens
// it back. Gradient buffers and shards stay fp32, so the backward accumulates and the
// optimizer reads fp32; only what crosses a link is bf16, half the bytes. The error bound
// is in docs/design.md ("bf16 gradient reduction"). The scratch (reduce_scratch in
// shard/program.h: what the program's reduces use) is allocated with the executor: nothing is
// allocated inside a step and the host does not wait there.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "device/arena.h"
#include "device/device.h"
#include "model/model.h"
#include "shard/flat.h"
#include "shard/program.h"

namespace tandem {

struct EngineConfig;
struct StepBatch;

// Everything an executor works with; owned by the Engine, valid for the executor's life.
struct EngineParts {
  const ModelLayout& model;
  const EngineConfig& config;
  Device& device;
  Communicator& world;  // all data-parallel ranks (loss)
  const Program& program;
  const FlatLayout& flat;
  int shard_rank;
  Communicator& gather_comm;  // the shard group, for all-gathers
  Communicator& reduce_comm;  // the shard group, for reduce-scatters and the norm
  Communicator& replicate;    // across shard groups (hybrid, none)
  Stream& compute;
  Stream& gather;
  Stream& reduce;
  Arena& arena;
};

class EngineExec {
 public:
  virtual ~EngineExec() = default;
  // Host, before the step's ops are issued or its graph is launched: puts what changes from
  // step to step (the token ids, the learning rate) where the step's work reads it, so that a
  // captured step replays with this step's values ([Step graph], docs/design.md). batch:
  // this rank's token ids of the step (engine.h), valid until the step returns.
  virtual void begin_step(int64_t step, const StepBatch& batch) = 0;
  // Host, before begin_step (and before Engine::settle runs the update ops alone): the step
  // whose AdamW update the optimizer or update ops apply, for its learning rate and bias
  // corrections; -1: none, the update ops change nothing ([Update at gather]).
  virtual void set_optimizer_step(int64_t step) = 0;
  // Enqueues the work of op i on its stream (the Engine has made the stream wait already).
  // While the Engine captures a step, only enqueues that read per-step values from where
  // begin_step put them (the CUDA executor); the CPU executor is never captured.
  virtual void run_op(const Op& op, int64_t step, const StepBatch& batch) = 0;
  // Host, after every stream drained. Collective over the world: returns the sum of the
  // token losses over all ranks, added in rank order; and the squared global gradient norm.
  virtual void end_step(double& loss_total, double& norm_sq) = 0;

  // This rank's shards (parameters and moments) as host copies, and their replacement.
  virtual ShardState shards() const = 0;
  virtual void set_shards(const ShardState& state) = 0;
  // Every unit's unpadded fp32 parameters, all-gathered from the shard group (collective).
  virtual std::vector<std::vector<float>> gather_params() = 0;
  // This rank's gradient shards as host copies, per unit (diagnosis after a step whose
  // gradient norm was not finite; not on the step's path).
  virtual std::vector<std::vector<float>> grad_shards() const = 0;
  // Device memory it holds beyond the program's arena and shards (scratch, copies).
  virtual uint64_t extra_bytes() const = 0;
};

// The index of op in p.ops: run_op is handed the program's own ops.
inline size_t op_index(const Program& p, const Op& op) {
  const auto i = &op - p.ops.data();
  TD_CHECK(i >= 0 && static_cast<size_t>(i) < p.ops.size(), "op is not one of the program's");
  return static_cast<size_t>(i);
}

std::unique_ptr<EngineExec> engine_exec_cpu(const EngineParts& parts);
// Throws when tandem was built without CUDA.
std::unique_ptr<EngineExec> engine_exec_cuda(const EngineParts& parts);

// Bytes of one micro-step's activations and scratch on a device of this kind: the
// activation table (model/activations.h) under that device's kernel table, keeping what
// `recompute` keeps in its first `recompute_blocks` blocks (0: every block), with logits of
// `loss_chunk` rows (0: all).
size_t engine_activation_bytes(DeviceKind kind, AttentionImpl attention, const ModelConfig& config,
                               int B, int T, Recompute recompute = Recompute::none,
                               int loss_chunk = 0, int recompute_blocks = 0);

}  // namespace tandem
