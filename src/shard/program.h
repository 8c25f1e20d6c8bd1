// The step program: one optimizer step of a strategy, as data. Ops are bound to the
// compute, all-gather or reduce stream, wait on earlier ops of other streams, and read
// and write buffers whose arena offsets come from their lifetimes. The executor replays
// it; the checker proves it race-free; `tandem plan --print-schedule` prints it.
//
// [Program order] Ops are listed in issue order: the host submits them one by one, each
// to its stream, after making the stream wait on the ops in `waits` (always earlier
// ones). Each stream runs its ops in issue order, so an op happens after every earlier op
// of its stream and after everything its waits happen after. No other ordering exists;
// the host synchronises only at the end of the step.
//
// [Memory reuse] Two arena buffers share bytes only when their lifetimes (first to last
// issue position that touches them, extended for buffers that a communication stream
// reads) do not overlap; the first op writing the later buffer then waits on every op of
// another stream that touched the earlier one. Buffers read by a reduce are kept
// `reduce_slack` compute ops past the reduce, so the compute stream does not stall on a
// reduce that has only just been issued.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/arena.h"
#include "model/model.h"
#include "shard/flat.h"

namespace tandem {

enum class Strategy { full, grad_op, none, hybrid };
Strategy strategy_parse(const std::string& name);  // "full" | "grad-op" | "none" | "hybrid"
const char* strategy_name(Strategy s);
// The dtype gradients are reduced in: "f32" | "bf16"; throws "--reduce-dtype must be f32
// or bf16, got '<name>'" for anything else ([Reduce dtype] in shard/engine_exec.h).
DType reduce_dtype_parse(const std::string& name);

enum class StreamRole : uint8_t { compute, gather, reduce };
constexpr int kStreamRoles = 3;
const char* stream_role_name(StreamRole r);

enum class OpKind : uint8_t {
  zero_grad_shards,  // reduce stream: clear the fp32 gradient shards
  gather,            // all-gather a unit's flat buffer from the shards
  forward,           // a unit's forward
  backward,          // a unit's backward (unsharded gradients)
  reduce,            // reduce-scatter a unit's gradients into its shard (accumulating)
  replicate_reduce,  // hybrid/none: all-reduce the gradient shard across replicas
  grad_norm,         // compute: local sum of squares of the gradient shards
  norm_reduce,       // reduce stream: sum it over the shard group
  optimizer,         // compute: AdamW on the shards
  update,            // gather: AdamW of the last step on one unit's shard ([Update at gather])
  last_rows,         // inference: the last row of each prompt into the decode workspace
  advance,           // inference: every row's position + 1
  sample,            // inference: draw every row's next token from the logits
  tp_reduce,         // inference, tp: all-reduce a block's partial sums (compute stream)
  send,              // inference, pipeline: a micro-batch's activations to the next stage
  recv,              // inference, pipeline: a micro-batch's activations from the previous one
};
const char* op_kind_name(OpKind k);

enum class BufferKind : uint8_t {
  param_shard,
  grad_shard,
  gathered,
  grad_full,
  activations,
  norm,
  params,    // inference, replicated: a unit's whole parameters, held for the session
  kv_cache,  // inference: a block's K and V cache, held for the session
  boundary,  // inference, pipeline: a stage's input or output rows, a view of a workspace
};

struct Buffer {
  BufferKind kind;
  int unit = -1;  // -1 for step-wide buffers
  size_t bytes = 0;
  bool arena = false;         // planned in the arena (else persistent across steps)
  int first = -1, last = -1;  // lifetime in issue positions (arena buffers)
  size_t offset = 0;          // arena offset
  std::string name;
};

struct UnitBuffer {
  int unit, buffer;
};

struct Op {
  OpKind kind;
  StreamRole stream;
  int unit = -1;                   // -1 for step-wide ops
  int micro = -1;                  // micro-step, -1 for step-wide ops
  std::vector<int> waits;          // earlier ops of other streams this op waits for
  std::vector<int> reads, writes;  // buffer ids
  std::vector<UnitBuffer> params;  // compute ops: the gathered buffer of each unit read
  std::vector<UnitBuffer> grads;   // backward: the gradient buffer of each unit written
  std::vector<int> zero_first;     // buffers the op clears before it runs
  // Inference, tp: which part of a block a forward runs, or which part's sums a tp_reduce
  // adds up (values of BlockPart in model/compose.h: 0 whole, 1 attention, 2 mlp).
  int part = 0;
};

struct ProgramSpec {
  Strategy strategy = Strategy::full;
  int world = 1;                // data-parallel ranks
  int shard_group = 0;          // hybrid: ranks per shard group (0: strategy default)
  int micro_steps = 1;          // micro-batches per optimizer step
  int max_gathered = 2;         // full/hybrid: units gathered at once
  int reduce_slack = 2;         // see [Memory reuse]
  size_t param_bytes = 4;       // bytes per element of gathered parameters
  size_t grad_bytes = 4;        // bytes per element of unsharded gradients
  size_t activation_bytes = 0;  // one micro-step's activations and scratch
  bool inference = false;       // a prefill or decode program (program_build_inference)
  // The dtype reduce-scatters and replica all-reduces move gradients in (the gradient
  // buffers and shards stay fp32; [Reduce dtype] in shard/engine_exec.h).
  DType reduce_dtype = DType::f32;
  // [Gradients in the shard] Where a unit's shard is the whole unit and accumulating into
  // it gives the same sums, the backward writes the gradient shard itself (no unsharded
  // buffer, no reduce-scatter). Off: the general path, for tests that compare the two.
  bool grads_in_shard = true;
  // [Update at gather] The optimizer runs per unit on the gather stream, right before the
  // unit's first gather of the next step, instead of over every shard at the step's end: the
  // update of one unit then runs beside the compute of those before it. The step ends with
  // the gradient norm; its update is pending until the next step (or Engine::settle).
  bool update_at_gather = false;
};

struct Program {
  ProgramSpec spec;
  int shard_size = 1;  // ranks sharing one copy of the parameters
  int replicas = 1;    // copies (world / shard_size)
  // Whether the backward accumulates into the gradient shards ([Gradients in the shard]).
  bool grads_in_shard = false;
  std::vector<Op> ops;
  std::vector<Buffer> buffers;
  ArenaPlan plan;
  size_t arena_bytes = 0;       // planned arena (gathered, unsharded grads, activations)
  size_t persistent_bytes = 0;  // per rank: parameter, gradient and AdamW shards
  size_t peak_bytes() const { return arena_bytes + persistent_bytes; }
};

// The engine's reduce-stream scratch beside the program's arena and shards ([Reduce dtype]
// in shard/engine_exec.h), in elements, for what the program's reduces do. f32: one fp32
// shard of the largest unit, which a windowed strategy's later micro-steps reduce into before
// adding it to the gradient shard; none without such reduces. bf16: the largest padded unit's
// gradient cast to bf16, where there are reduce-scatters, and the largest shard in bf16, which
// they write and the replica all-reduce works in, where there are either.
struct ReduceScratch {
  int64_t f32_shard = 0, bf16_unit = 0, bf16_shard = 0;
  uint64_t bytes() const {
    return 4 * static_cast<uint64_t>(f32_shard) + 2 * static_cast<uint64_t>(bf16_unit + bf16_shard);
  }
};
ReduceScratch reduce_scratch(const FlatLayout& flat, const Program& p);
// Whether a reduce op adds into the gradient shard through the scratch (a windowed strategy's
// later micro-steps) rather than writing the shard.
bool reduce_adds_to_shard(const Program& p, const Op& op);

// [Fresh gradients] How an executor starts the gradient buffers a backward op clears first
// (zero_first): it tells the composition which units' gradients the op starts (units, for
// unit_backward's `fresh`), which fills each unit's elements without a clear, and it clears
// only what lies past them (`clear`: the flat layout's padding, a few elements a unit).
// With fresh false (EngineConfig::fresh_gradients off, to compare): no unit is started and
// `clear` is each buffer whole.
struct FreshGrads {
  struct Span {
    int buffer = -1;
    size_t offset = 0, bytes = 0;
  };
  std::vector<bool> units;  // by unit index
  std::vector<Span> clear;
};
FreshGrads fresh_grads(const ModelLayout& model, const Program& p, const Op& op, bool fresh = true);
// fresh_grads of every op of p, by op index: what an executor works out once, not every step.
std::vector<FreshGrads> fresh_grads_by_op(const ModelLayout& model, const Program& p, bool fresh);

// Builds the program of one optimizer step. Throws for inconsistent specs (a world size
// the shard group does not divide, max_gathered below what a unit reads at once, ...).
Program program_build(const ModelLayout& model, const ProgramSpec& spec);
// The programs of cached inference on one rank of a layout:
//  - prefill: for each group of prompts of one length, the embedding and every block over
//    the prefill workspace (each block appends to its KV cache), then the last row of each
//    prompt into the decode workspace; then the head and the draw of each first token;
//  - decode: the embedding, every block (appending and attending to its cache) and the head
//    over the decode workspace, then every position + 1 and the draw of the next tokens.
// The parameters (whole units, or fsdp's shards), the caches and the decode workspace are
// held for the session; the prefill workspace and fsdp's gathered units are arena buffers.
enum class InferPhase : uint8_t { prefill, decode };
// How the ranks of an inference job share the model ("Sharded inference" in docs/design.md):
//  - replicate: every rank holds every unit and decodes its share of the sequences;
//  - fsdp: every rank holds a shard of each unit's flat buffer and decodes its share of the
//    sequences; each forward all-gathers its units on the all-gather stream, at most
//    max_gathered at once, so the gather of the next unit overlaps the current one;
//  - tp: every rank holds its heads, MLP columns and head rows (model/tensor_parallel.h) and
//    decodes every sequence; the blocks' partial sums are all-reduced on the compute stream
//    (after the attention part of a sequential block and after every block);
//  - pipeline: every rank holds consecutive units (its stage, pipeline_stages) and their
//    caches for every sequence; the sequences are split into micro-batches, each flowing
//    through the stages: a stage receives a micro-batch's activations from the previous one
//    (recv, on the all-gather stream), runs its units over them and sends the result on
//    (send); the last stage runs the head and draws the tokens. While a stage works on one
//    micro-batch the next stage works on the one before.
enum class InferLayout : uint8_t { replicate, fsdp, tp, pipeline };
// "replicate" | "fsdp" | "tp" | "pipeline"
InferLayout infer_layout_parse(const std::string& name);
const char* infer_layout_name(InferLayout l);
struct InferenceSpec {
  InferPhase phase = InferPhase::decode;
  InferLayout layout = InferLayout::replicate;
  int world = 1;                // ranks of the layout (fsdp: the shard group; tp: the split)
  int max_gathered = 2;         // fsdp: units gathered at once
  int rank = 0;                 // pipeline: this rank's stage
  int micro_batches = 1;        // pipeline: decode micro-batches, each with its own workspace
  int prefill_groups = 1;       // prefill: groups of prompts of one length
  size_t param_bytes = 4;       // bytes per parameter element
  size_t kv_block_bytes = 0;    // one block's K and V together
  size_t prefill_ws_bytes = 0;  // the largest group's prefill workspace
  size_t decode_ws_bytes = 0;   // the decode workspace (held for the session; pipeline: each
                                // micro-batch's)
};
// The stages of a pipeline over `stages` ranks: stage s holds units [starts[s], starts[s + 1]),
// consecutive, the embedding on the first and the head on the last, every stage at least one
// block. The stages balance what a decode step reads: each block's parameters and the head's
// matrix (the embedding reads only its rows). Throws when there are fewer blocks than stages.
std::vector<int> pipeline_stages(const ModelLayout& model, int stages);
// The units stage `stage` of `stages` holds: its own and those they read (a tied head's
// embedding), one flag per unit.
std::vector<bool> pipeline_units(const ModelLayout& model, int stages, int stage);
Program program_build_inference(const ModelLayout& model, const InferenceSpec& spec);

// Throws a tandem::Error describing the first violation: a read not preceded by its
// write, two unordered accesses to the same bytes (one a write), a compute op reading a
// unit that was not gathered, a unit reduced other than exactly once per period.
void program_check(const ModelLayout& model, const Program& program);
// A readable listing: one line per op with its stream, waits and buffers, then the
// arena plan and memory totals.
std::string program_print(const ModelLayout& model, const Program& program);

}  // namespace tandem
