// Deterministic sampling of training sequences from a token array. Sequence k of the run is
// a pure function of (tokens, T, seed, k), so every world size and micro-batch split reads
// the same sequences for a given optimizer step. The rule is in docs/formats.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem {

// The windows: with N tokens and sequence length T there are W = (N - 1) / T of them;
// window w covers tokens [w*T, w*T + T + 1): inputs are the first T, targets the last T.
//
// Global sequence k (k = step * global_batch + g, g in [0, global_batch)) is read from
// window perm_e[k % W] of epoch e = k / W. perm_e is this Fisher-Yates shuffle of [0, W),
// with all arithmetic on uint64 wrapping modulo 2^64:
//
//   mix(z):    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
//              z = (z ^ (z >> 27)) * 0x94D049BB133111EB
//              return z ^ (z >> 31)                        (the splitmix64 finaliser)
//   state  = mix(mix(seed) + e)
//   next():    state = state + 0x9E3779B97F4A7C15; return mix(state)     (splitmix64)
//   below(n):  t = (0 - n) % n          (= 2^64 mod n; n >= 1)
//              repeat r = next() until r >= t; return r % n              (unbiased)
//   perm = [0, 1, ..., W-1]
//   for i = W-1 down to 1: j = below(i + 1); swap(perm[i], perm[j])
//
// Check values: W = 10, seed = 42 gives perm_0 = [2, 8, 9, 7, 1, 4, 6, 0, 5, 3] and
// perm_1 = [3, 1, 6, 8, 4, 5, 9, 7, 2, 0].
//
// Thread safety: the object is immutable after construction except for a cache of the
// last permutation computed, which is guarded by a mutex; const methods (sequence, batch,
// window, check_vocab) may be called concurrently from several threads.
class Dataset {
 public:
  // `source` (a file name, may be empty) is only used in error messages. Throws when T < 1,
  // when there is not one full window, or when a token does not fit int32.
  Dataset(std::vector<uint32_t> tokens, int T, uint64_t seed, std::string source = {});
  Dataset(Dataset&&) noexcept;
  Dataset& operator=(Dataset&&) noexcept;
  ~Dataset();

  int64_t windows() const { return windows_; }
  int seq_len() const { return T_; }
  uint64_t seed() const { return seed_; }
  const std::vector<uint32_t>& tokens() const { return tokens_; }

  // The window global sequence k (k >= 0) reads.
  int64_t window(int64_t k) const;
  // Fills inputs[0, T) and targets[0, T) with global sequence k.
  void sequence(int64_t k, int32_t* inputs, int32_t* targets) const;
  // Sequences g in [first, first + count) of optimizer step `step`, each of the
  // global_batch sequences per step; inputs and targets are row-major [count, T].
  void batch(int64_t step, int global_batch, int first, int count, int32_t* inputs,
             int32_t* targets) const;
  // This rank's token ids of optimizer step `step`, for every micro-step: rank r of W reads,
  // in micro-step m, sequences [m*B*W + r*B, m*B*W + (r+1)*B) of the step's global_batch,
  // so every world size and micro-batch split sees the same sequences per step. inputs and
  // targets are resized to micro_steps * B * T ids, micro-step after micro-step.
  void rank_batch(int64_t step, int global_batch, int B, int micro_steps, int world, int rank,
                  std::vector<int32_t>& inputs, std::vector<int32_t>& targets) const;
  // Throws naming the first token >= vocab and its position.
  void check_vocab(int vocab) const;

  // The permutation of epoch e (for tests and other tools); W entries.
  std::vector<int64_t> permutation(int64_t epoch) const;

 private:
  struct Cache;
  std::shared_ptr<const std::vector<int64_t>> perm_for(int64_t epoch) const;
  std::string what() const;

  std::vector<uint32_t> tokens_;
  int T_ = 0;
  uint64_t seed_ = 0;
  std::string source_;
  int64_t windows_ = 0;
  uint32_t max_token_ = 0;
  std::unique_ptr<Cache> cache_;
};

}  // namespace tandem
