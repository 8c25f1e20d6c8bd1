// Internal to src/infer: the sizing, program specs and sequence shares that the decoder's
// layouts share (decoder.cpp, decoder_pipeline.cpp).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "infer/decoder.h"
#include "model/activations.h"
#include "shard/program.h"

namespace tandem::decoder_detail {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

inline size_t align256(size_t n) {
  return (n + 255) / 256 * 256;
}

inline int prefill_rows(const DecoderOptions& o) {
  return o.prefill_tokens > 0 ? o.prefill_tokens : std::max(o.max_seq, 4096);
}

// The options with max_seq resolved and checked against the model.
inline DecoderOptions resolve(const ModelConfig& c, DecoderOptions o) {
  if (o.max_seq == 0) o.max_seq = c.context;
  TD_CHECK(o.batch >= 1, "--batch must be at least 1, got {}", o.batch);
  TD_CHECK(o.max_seq >= 1 && o.max_seq <= c.context,
           "--max-seq must be in [1, {}] (the model's context), got {}", c.context, o.max_seq);
  TD_CHECK(o.prefill_tokens >= 0, "prefill chunk of {} tokens", o.prefill_tokens);
  o.prefill_tokens = std::min(prefill_rows(o), c.context * std::max(1, o.batch));
  o.prefill_tokens = std::max(o.prefill_tokens, o.max_seq);
  return o;
}

// Prompts of T tokens one prefill chunk holds: up to prefill_tokens rows, halved until the
// chunk's workspace fits the planned one.
inline int prompts_per_chunk(const Kernels& k, const ModelConfig& c, const DecoderOptions& o,
                             size_t prefill_ws, int T) {
  int each = std::max(1, o.prefill_tokens / T);
  while (each > 1 && activation_bytes(c, each, T,
                                      activation_traits(k, c, each, T, WorkspaceUse::prefill,
                                                        o.max_seq)) > prefill_ws)
    each /= 2;
  return each;
}

// One rank holds every unit whole under any layout (fsdp's one shard is the unit, a
// pipeline's one stage is the model): replicate's programs, with nothing to gather.
inline DecoderOptions for_world(DecoderOptions o, int world) {
  if (world == 1) o.layout = InferLayout::replicate;
  return o;
}

// pipeline: the most micro-batches a request splits into (one per stage, at most one per
// sequence).
inline int pipeline_micro_max(const DecoderOptions& o, int world) {
  return std::max(1, std::min(o.batch, world));
}

struct Sizes {
  ActivationTraits prefill, decode;
  size_t prefill_ws = 0, decode_ws = 0, kv_block = 0;
};

inline Sizes sizes(const Kernels& k, const ModelConfig& c, const DecoderOptions& o,
                   const DecoderShare& share) {
  Sizes s;
  // The prefill workspace of one prompt of prefill_tokens rows bounds every chunk's (a
  // chunk holds at most that many rows; generate checks each chunk's own size).
  const int T = std::min(o.prefill_tokens, c.context);
  const int B = std::max(1, o.prefill_tokens / T);
  s.prefill = activation_traits(k, c, B, T, WorkspaceUse::prefill, o.max_seq);
  s.prefill_ws = activation_bytes(c, B, T, s.prefill);
  s.decode = activation_traits(k, c, share.rows, 1, WorkspaceUse::decode, o.max_seq);
  s.decode_ws = activation_bytes(c, share.rows, 1, s.decode);
  s.kv_block = 2 * KvCache::block_bytes(c, share.slots, o.max_seq, k.compute_bytes());
  return s;
}

inline InferenceSpec spec_of(InferPhase phase, const DecoderOptions& o, int world, size_t cb,
                             const Sizes& s, int groups = 1, int rank = 0, int micro = 1) {
  InferenceSpec spec;
  spec.phase = phase;
  spec.layout = o.layout;
  spec.world = world;
  spec.max_gathered = o.max_gathered;
  spec.rank = rank;
  spec.micro_batches = micro;
  spec.prefill_groups = groups;
  spec.param_bytes = cb;
  spec.kv_block_bytes = s.kv_block;
  spec.prefill_ws_bytes = s.prefill_ws;
  spec.decode_ws_bytes = s.decode_ws;
  return spec;
}

// The arena both phases share: the largest of the decode program's and of a prefill's (the
// planner repeats itself from one prompt group to the next, which generate checks).
inline size_t arena_of(const ModelLayout& model, const DecoderOptions& o, int world, size_t cb,
                       const Sizes& s, int rank = 0, int micro = 1) {
  size_t bytes =
      program_build_inference(model, spec_of(InferPhase::decode, o, world, cb, s, 1, rank, micro))
          .arena_bytes;
  for (int groups : {1, 2})
    bytes = std::max(bytes, program_build_inference(model, spec_of(InferPhase::prefill, o, world,
                                                                   cb, s, groups, rank, micro))
                                .arena_bytes);
  return bytes;
}

// A prefill of `groups` chunks for this rank, checked against the planned arena, and where
// in the arena its workspace lies.
inline Program prefill_program(const ModelLayout& model, const DecoderOptions& o, int world,
                               size_t cb, const Sizes& s, int groups, int rank, int micro,
                               size_t arena_bytes, size_t* ws_offset) {
  Program p = program_build_inference(
      model, spec_of(InferPhase::prefill, o, world, cb, s, groups, rank, micro));
  TD_CHECK(p.arena_bytes <= arena_bytes,
           "internal: a prefill of {} groups needs {} arena bytes, {} planned", groups,
           p.arena_bytes, arena_bytes);
  *ws_offset = 0;
  for (const Buffer& b : p.buffers)
    if (b.name == "prefill-workspace") *ws_offset = b.offset;
  return p;
}

inline std::string gib(uint64_t b) {
  return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1ull << 30));
}

inline int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}

// The sequences [lo, hi) of n that rank r of w decodes under a data-parallel layout.
inline std::pair<int, int> seq_range(int n, int r, int w) {
  return {static_cast<int>(int64_t{n} * r / w), static_cast<int>(int64_t{n} * (r + 1) / w)};
}

// Prefill chunks of the sequences [lo, hi): prompts of one length together, each chunk at
// most `per(T)` prompts; indices relative to lo.
inline std::vector<std::vector<int>> chunks_of(const std::vector<std::vector<int32_t>>& prompts,
                                               int lo, int hi, const std::function<int(int)>& per) {
  std::map<size_t, std::vector<int>> by_length;
  for (int b = lo; b < hi; ++b) by_length[prompts[static_cast<size_t>(b)].size()].push_back(b - lo);
  std::vector<std::vector<int>> chunks;
  for (const auto& [len, seqs] : by_length) {
    const size_t each = static_cast<size_t>(per(static_cast<int>(len)));
    for (size_t i = 0; i < seqs.size(); i += each)
      chunks.emplace_back(seqs.begin() + static_cast<int64_t>(i),
                          seqs.begin() + static_cast<int64_t>(std::min(seqs.size(), i + each)));
  }
  return chunks;
}

}  // namespace tandem::decoder_detail
