// Cached decoding on one device: a batch of sequences, each with its own prompt length,
// prefilled once and then extended one token per step, every step reading the weights once
// and the KV cache of each sequence once. Prefill and decode are programs
// (shard/program.h, program_build_inference) replayed over the one composition of the
// units (model/compose.h) on the device's kernel table; on a device with graphs the
// decode step is captured once and replayed per token.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "device/device.h"
#include "device/kernels.h"
#include "model/activations.h"
#include "model/compose.h"
#include "model/model.h"
#include "shard/program.h"

namespace tandem {

struct DecoderOptions {
  // Sequences a request may hold (B), over every rank of the layout.
  int batch = 1;
  int max_seq = 0;  // positions of the KV cache per sequence (0: the model's context)
  // Rows of one prefill chunk (prompts of one length are prefilled together up to this
  // many tokens); 0: max(max_seq, 4096).
  int prefill_tokens = 0;
  uint64_t mem_limit = 0;  // bytes the decoder may hold; 0: the device's free memory
  bool graphs = true;      // capture the decode step where the device has graphs
  // Enqueue each decode step before reading the last one's tokens ([Run-ahead] in
  // decoder.cpp), where one device decodes and nothing is forced; off: step by step.
  bool run_ahead = true;
  AttentionImpl attention = AttentionImpl::automatic;
  // How the ranks share the model (shard/program.h, InferLayout) and, for fsdp, how many
  // units are gathered at once.
  InferLayout layout = InferLayout::replicate;
  int max_gathered = 2;
  // Steps whose ops are timed one by one (0 is the prefill, then decode steps from 1),
  // inclusive; none when trace_last < trace_first. A timed decode step runs op by op,
  // not as a graph, so that each op shows (op_timings).
  int64_t trace_first = 0, trace_last = -1;
};

// When one op of a timed step ran on this rank (DecoderOptions::trace_first/last).
struct DecodeOpTiming {
  int64_t step = 0;                 // 0: the prefill; then decode steps from 1
  std::string stream;               // the stream it ran on: "decode", "all-gather", "pipeline"
  std::string name;                 // the op and its unit, e.g. "forward block.3"
  int micro = -1;                   // pipeline: the micro-batch
  double start_ms = 0, dur_ms = 0;  // from the start of the generate call's work
};

// The ranks of a sharded decoder. Without `data` the decoder is one rank.
struct DecoderComms {
  // Collectives on the device's memory: fsdp's gathers, tp's reduces and candidates (MPI
  // on CPU ranks, NCCL on GPUs).
  Communicator* data = nullptr;
  // Host-memory exchanges (results, fsdp's agreement on the steps), with the device its
  // streams belong to: the CPU device of a GPU job's control plane, or the decoder's own
  // device on CPU ranks. Null: `data` on the decoder's device.
  Communicator* control = nullptr;
  Device* control_device = nullptr;
};

// What one rank of a layout decodes: its sequence rows and cache slots.
struct DecoderShare {
  int rows = 1;   // decode rows
  int slots = 1;  // KV cache slots (fsdp keeps one more, for the steps of a rank with less
                  // work: every rank must join every gather)
};
DecoderShare decoder_share(const DecoderOptions& options, int world);

// What the decoder holds on the device, planned before anything is allocated.
struct DecoderMemory {
  uint64_t params = 0, cache = 0, arena = 0, extra = 0;
  uint64_t total() const { return params + cache + arena + extra; }
};

struct GenerateRequest {
  std::vector<std::vector<int32_t>> prompts;  // one per sequence: 1 to `batch`
  int tokens = 64;                            // new tokens per sequence
  SamplingParams sampling;
  std::vector<int32_t> eos;  // ids that end a sequence (unless ignore_eos)
  bool ignore_eos = false;
  // Sees each new token of sequence s as it is made; returning false ends sequence s.
  std::function<bool(int s, int32_t token)> on_token;
  // Teacher forcing (scoring, tests): when not empty, one list per sequence; step i feeds
  // forced[s][i] to the model in place of the token it drew (the result still reports the
  // drawn tokens), so every step's choice is made from a known context.
  std::vector<std::vector<int32_t>> forced;
};

struct GenerateResult {
  std::vector<std::vector<int32_t>> ids;  // the new tokens of each sequence
  std::vector<std::string> finish;        // "length", "eos" or "stop" per sequence
  int64_t prompt_tokens = 0;
  double time_to_first_token_ms = 0;  // from the call to the first tokens on the host
  double prefill_ms = 0;
  double decode_ms = 0;       // the decode steps after the first token
  int64_t decode_steps = 0;   // steps of the whole batch
  int64_t decode_tokens = 0;  // tokens those steps produced for live sequences
  double prefill_tokens_per_s() const;
  double decode_tokens_per_s() const;
};

// The plan of these options on this device for one rank of `world`; throws, saying by how
// much, when it does not fit options.mem_limit (or the device's free memory). `config` is
// the model this rank runs (a tp rank's own, model/tensor_parallel.h). The decoder checks
// it first; a caller may check it before reading any weights.
DecoderMemory decoder_check_fits(const ModelConfig& config, Device& device,
                                 const DecoderOptions& options, int world = 1);

class Decoder {
 public:
  // Plans memory (refusing, before any allocation, a plan over options.mem_limit or the
  // device's free memory, saying by how much), uploads the parameters (converted to the
  // compute dtype; released as they go) and creates the cache. `model` is the model this
  // rank runs (a tp rank's own); `params` its units' unpadded fp32 values, or under fsdp
  // this rank's shard of every unit (FlatLayout(model, world), shard `rank`). Every rank
  // of `comms` constructs its decoder with the same options.
  Decoder(const ModelLayout& model, Device& device, std::vector<std::vector<float>> params,
          const DecoderOptions& options, const DecoderComms& comms = {});
  ~Decoder();

  // The plan of a configuration on one rank of `world`, for refusing or reporting before
  // loading anything.
  static DecoderMemory plan(const ModelConfig& config, DeviceKind kind, const DecoderOptions& o,
                            int world = 1);

  // Prefills the prompts and decodes up to request.tokens new tokens per sequence. Every
  // rank passes the whole request; each decodes its share (replicate, fsdp: a contiguous
  // range of the sequences; tp: all of them), on_token sees this rank's sequences, and the
  // result holds every sequence on every rank. Throws, before any work, for an empty
  // prompt, a token outside the vocabulary, more prompts than the batch, or a prompt whose
  // length plus the new tokens exceeds max_seq.
  GenerateResult generate(const GenerateRequest& request);

  // The logits of the last step (prefill's or a decode step's) of this rank's rows, as
  // fp32: [rows, vocab], or under tp [rows, the rank's head rows]; under pipeline the last
  // stage's (every sequence's) and nothing elsewhere. Refused inside a generate that runs
  // ahead (DecoderOptions::run_ahead), and after one that ran a step past its last token.
  std::vector<float> last_logits();
  // Unit u's parameters as this rank holds them, in the compute dtype (param_bytes() per
  // value) on the decoder's device; null for a unit held elsewhere (a pipeline's other
  // stages). On the CPU, writing them changes what the decoder computes.
  void* unit_params(int unit) const { return params_.at(static_cast<size_t>(unit)); }
  int param_bytes() const;
  const DecoderMemory& memory() const { return memory_; }
  const Program& decode_program() const { return decode_program_; }
  // The timed ops of the last generate call, in issue order.
  const std::vector<DecodeOpTiming>& op_timings() const { return timings_; }
  int batch() const { return options_.batch; }
  int max_seq() const { return options_.max_seq; }
  bool graphs_used() const { return graph_ != nullptr; }
  int world() const { return world_; }
  int rank() const { return rank_; }

 private:
  void upload_i32(int32_t* dst, const std::vector<int32_t>& src);
  std::vector<float> logits_of(const Workspace& ws);
  // Issues a program's ops [begin, end) on their streams, each after the ops it waits for;
  // `run` is the work of a compute op, called on the host thread (it submits to the compute
  // stream), `transfer` a pipeline's send or recv (it submits to the stream it is given).
  void replay(const Program& p, const std::function<void(const Op&)>& run,
              const std::function<void(const Op&, Stream&)>& transfer = {}, size_t begin = 0,
              size_t end = SIZE_MAX);
  // pipeline (decoder_pipeline.cpp): the stages' loop, from the checked request on.
  GenerateResult generate_pipeline(const GenerateRequest& r, const SamplingParams& sp,
                                   std::chrono::steady_clock::time_point t0);
  int stage_first() const { return stages_.at(static_cast<size_t>(rank_)); }
  int stage_end() const { return stages_.at(static_cast<size_t>(rank_) + 1); }
  // The parameters a forward op reads, by unit.
  UnitParams op_params(const Program& p, const Op& op) const;
  void tp_reduce(const Op& op, Workspace& ws);
  void sample(Workspace& ws, int rows, const SamplingParams& sp);
  // fsdp: every rank's live sequences, added (a collective).
  int64_t live_everywhere(int64_t local);
  // Every rank's share of the result into `out` (replicate, fsdp with several ranks).
  void exchange(GenerateResult& out, int lo, int hi, int n);

  const ModelLayout& model_;
  Device& device_;
  DecoderOptions options_;
  DecoderComms comms_;
  int world_ = 1, rank_ = 0;
  DecoderShare share_;
  DecoderMemory memory_;
  // Device memory, freed on every path (a constructor that throws included); declared
  // before the streams, so it outlives the work queued there.
  std::unique_ptr<DeviceBuffer> params_mem_, cache_mem_, arena_mem_, ws_mem_, cand_mem_;
  std::unique_ptr<Stream> stream_, gather_stream_, control_stream_;
  std::unique_ptr<Communicator> control_comm_, gather_comm_, tp_comm_;
  size_t cand_bytes_ = 0, arena_bytes_ = 0;
  std::unique_ptr<Kernels> kernels_;
  std::vector<void*> params_;              // per unit, compute dtype: whole units, or fsdp's shards
  std::vector<int64_t> shard_elems_;       // per unit, the elements params_ holds
  std::vector<UnitParams> decode_params_;  // per decode op, the parameters it reads
  void* arena_ = nullptr;
  KvCache cache_;
  Program decode_program_;
  std::unique_ptr<Workspace> decode_ws_;
  std::unique_ptr<Graph> graph_;
  std::vector<std::unique_ptr<Event>> done_;   // per op of the program being replayed
  std::vector<std::unique_ptr<Event>> drawn_;  // [Run-ahead]: a step's tokens copied out
  bool ahead_now_ = false;                     // a generate is running ahead
  bool ran_past_ = false;                      // the last generate ran a step no sequence needed
  // Op timing (DecoderOptions::trace_first/last): the step being replayed (-1: untimed),
  // a pool of timing events, the ops they bracket and the zero they are measured from.
  bool timed(int64_t step) const {
    return step >= options_.trace_first && step <= options_.trace_last;
  }
  void timing_begin();
  void timing_end();
  int64_t timing_step_ = -1;
  std::vector<std::unique_ptr<Event>> timing_events_;
  std::unique_ptr<Event> timing_zero_;
  struct PendingTiming {
    size_t start, end;
    DecodeOpTiming t;
  };
  std::vector<PendingTiming> pending_timings_;
  std::vector<DecodeOpTiming> timings_;
  // pipeline: the first unit of every stage (then the unit count), the micro-batches'
  // workspaces (in ws_mem_) and, per micro-batch, the end of its last compute op and of its
  // last transfer, which the next step's work on it waits for.
  std::vector<int> stages_;
  int micro_max_ = 1, stage_blocks_ = 0;
  std::unique_ptr<Communicator> pipe_comm_, tokens_comm_, flags_comm_;
  std::unique_ptr<Stream> tokens_stream_, flags_stream_;
  std::vector<std::unique_ptr<Workspace>> mb_ws_;
  std::vector<std::unique_ptr<Event>> mb_done_, pipe_done_;
};

}  // namespace tandem
