// Cached decoding on one device: a batch of sequences, each with its own prompt length,
// prefilled once and then extended one token per step, every step reading the weights once
// and the KV cache of each sequence once. Prefill and decode are programs
// (shard/program.h, program_build_inference) replayed over the one composition of the
// units (model/compose.h) on the device's kernel table; on a device with graphs the
// decode step is captured once and replayed per token.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "device/kernels.h"
#include "model/activations.h"
#include "model/model.h"
#include "shard/program.h"

namespace tandem {

struct DecoderOptions {
  int batch = 1;    // sequence slots (B)
  int max_seq = 0;  // positions of the KV cache per sequence (0: the model's context)
  // Rows of one prefill chunk (prompts of one length are prefilled together up to this
  // many tokens); 0: max(max_seq, 4096).
  int prefill_tokens = 0;
  uint64_t mem_limit = 0;  // bytes the decoder may hold; 0: the device's free memory
  bool graphs = true;      // capture the decode step where the device has graphs
  AttentionImpl attention = AttentionImpl::automatic;
};

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

// The plan of these options on this device; throws, saying by how much, when it does not
// fit options.mem_limit (or the device's free memory). The decoder checks it first; a caller
// may check it before reading any weights.
DecoderMemory decoder_check_fits(const ModelConfig& config, Device& device,
                                 const DecoderOptions& options);

class Decoder {
 public:
  // Plans memory (refusing, before any allocation, a plan over options.mem_limit or the
  // device's free memory, saying by how much), uploads the parameters (every unit's
  // unpadded fp32 values, converted to the compute dtype; released as they go) and creates
  // the cache.
  Decoder(const ModelLayout& model, Device& device, std::vector<std::vector<float>> params,
          const DecoderOptions& options);
  ~Decoder();

  // The plan of a configuration, for refusing or reporting before loading anything.
  static DecoderMemory plan(const ModelConfig& config, DeviceKind kind, const DecoderOptions& o);

  // Prefills the prompts and decodes up to request.tokens new tokens per sequence.
  // Throws, before any work, for an empty prompt, a token outside the vocabulary, more
  // prompts than slots, or a prompt whose length plus the new tokens exceeds max_seq.
  GenerateResult generate(const GenerateRequest& request);

  // The logits of the last step (prefill's or a decode step's), [sequences, vocab] as fp32.
  std::vector<float> last_logits();
  const DecoderMemory& memory() const { return memory_; }
  const Program& decode_program() const { return decode_program_; }
  int batch() const { return options_.batch; }
  int max_seq() const { return options_.max_seq; }
  bool graphs_used() const { return graph_ != nullptr; }

 private:
  void upload_i32(int32_t* dst, const std::vector<int32_t>& src);

  const ModelLayout& model_;
  Device& device_;
  DecoderOptions options_;
  DecoderMemory memory_;
  // Device memory, freed on every path (a constructor that throws included); declared
  // before the stream, so it outlives the work queued there.
  std::unique_ptr<DeviceBuffer> params_mem_, cache_mem_, arena_mem_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Kernels> kernels_;
  std::vector<void*> params_;  // per unit, compute dtype
  void* arena_ = nullptr;
  KvCache cache_;
  Program decode_program_;
  size_t decode_ws_offset_ = 0, prefill_ws_offset_ = 0;
  std::unique_ptr<Workspace> decode_ws_;
  std::unique_ptr<Graph> graph_;
};

}  // namespace tandem
