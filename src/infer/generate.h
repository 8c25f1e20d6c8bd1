// Sampling text from a trained model on CPU: temperature, top-k, greedy at temperature 0.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"

namespace tandem {

// The most new tokens one call generates: a bound on a typo's cost (each token recomputes
// the context on the CPU).
inline constexpr int kMaxNewTokens = 100000;

struct SampleOptions {
  int tokens = 64;           // new tokens to generate
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // 0 = the whole vocabulary
  uint64_t seed = 1;
};

// Picks the next token from logits[V] (real vocabulary only).
int32_t sample_token(const float* logits, int vocab, const SampleOptions& o, uint64_t& rng_state);

// Extends `prompt` by o.tokens tokens; the context is cropped to the model's context
// length. on_token (may be empty) sees each new token as it is produced.
std::vector<int32_t> generate(const ModelLayout& model,
                              const std::vector<std::vector<float>>& params,
                              std::vector<int32_t> prompt, const SampleOptions& o,
                              const std::function<void(int32_t)>& on_token);

}  // namespace tandem
