// Deterministic sequence sampling: windows of T+1 tokens, visited once per epoch in an
// order given by a seeded splitmix64 Fisher-Yates shuffle (the rule is in dataset.h).
#include "io/dataset.h"

#include <algorithm>
#include <limits>
#include <mutex>

#include "core/error.h"

namespace tandem {

namespace {

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return mix(state_);
  }
  // Uniform in [0, n), n >= 1, by rejection of the lowest 2^64 mod n values.
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;
    for (;;) {
      const uint64_t r = next();
      if (r >= threshold) return r % n;
    }
  }

 private:
  uint64_t state_;
};

std::vector<int64_t> make_permutation(int64_t windows, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(windows));
  for (int64_t i = 0; i < windows; ++i) perm[static_cast<size_t>(i)] = i;
  SplitMix64 rng(mix(mix(seed) + static_cast<uint64_t>(epoch)));
  for (int64_t i = windows - 1; i >= 1; --i) {
    const uint64_t j = rng.below(static_cast<uint64_t>(i) + 1);
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

}  // namespace

struct Dataset::Cache {
  std::mutex mu;
  int64_t epoch = -1;
  std::shared_ptr<const std::vector<int64_t>> perm;
};

Dataset::Dataset(std::vector<uint32_t> tokens, int T, uint64_t seed, std::string source)
    : tokens_(std::move(tokens)),
      T_(T),
      seed_(seed),
      source_(std::move(source)),
      cache_(std::make_unique<Cache>()) {
  TD_CHECK(T >= 1, "{}: sequence length {} must be at least 1", what(), T);
  const int64_t n = static_cast<int64_t>(tokens_.size());
  windows_ = n >= 1 ? (n - 1) / T : 0;
  TD_CHECK(windows_ > 0, "{} has {} tokens: too few for one sequence of T+1 = {}", what(), n,
           static_cast<int64_t>(T) + 1);
  max_token_ = *std::max_element(tokens_.begin(), tokens_.end());
  if (max_token_ > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
    const auto it = std::find_if(tokens_.begin(), tokens_.end(), [](uint32_t t) {
      return t > static_cast<uint32_t>(std::numeric_limits<int32_t>::max());
    });
    TD_THROW("{} has token {} at position {}, which does not fit int32", what(), *it,
             it - tokens_.begin());
  }
}

Dataset::Dataset(Dataset&&) noexcept = default;
Dataset& Dataset::operator=(Dataset&&) noexcept = default;
Dataset::~Dataset() = default;

std::string Dataset::what() const {
  return source_.empty() ? std::string("data") : fmt::format("data file '{}'", source_);
}

std::shared_ptr<const std::vector<int64_t>> Dataset::perm_for(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  if (cache_->epoch != epoch || !cache_->perm) {
    cache_->perm =
        std::make_shared<const std::vector<int64_t>>(make_permutation(windows_, seed_, epoch));
    cache_->epoch = epoch;
  }
  return cache_->perm;
}

std::vector<int64_t> Dataset::permutation(int64_t epoch) const {
  TD_CHECK(epoch >= 0, "{}: epoch {} must be non-negative", what(), epoch);
  return *perm_for(epoch);
}

int64_t Dataset::window(int64_t k) const {
  TD_CHECK(k >= 0, "{}: sequence number {} must be non-negative", what(), k);
  return (*perm_for(k / windows_))[static_cast<size_t>(k % windows_)];
}

void Dataset::sequence(int64_t k, int32_t* inputs, int32_t* targets) const {
  const uint32_t* src = tokens_.data() + window(k) * T_;
  for (int t = 0; t < T_; ++t) {
    inputs[t] = static_cast<int32_t>(src[t]);
    targets[t] = static_cast<int32_t>(src[t + 1]);
  }
}

void Dataset::batch(int64_t step, int global_batch, int first, int count, int32_t* inputs,
                    int32_t* targets) const {
  TD_CHECK(step >= 0, "{}: step {} must be non-negative", what(), step);
  TD_CHECK(global_batch >= 1, "{}: global batch {} must be at least 1", what(), global_batch);
  TD_CHECK(first >= 0 && count >= 0 && first + count <= global_batch,
           "{}: sequences [{}, {}) are not within the global batch of {}", what(), first,
           static_cast<int64_t>(first) + count, global_batch);
  TD_CHECK(step <= std::numeric_limits<int64_t>::max() / global_batch - 1,
           "{}: step {} is too large", what(), step);
  for (int i = 0; i < count; ++i) {
    const int64_t k = step * global_batch + first + i;
    sequence(k, inputs + static_cast<int64_t>(i) * T_, targets + static_cast<int64_t>(i) * T_);
  }
}

void Dataset::check_vocab(int vocab) const {
  TD_CHECK(vocab >= 1, "{}: vocabulary size {} must be at least 1", what(), vocab);
  if (max_token_ < static_cast<uint32_t>(vocab)) return;
  const auto it = std::find_if(tokens_.begin(), tokens_.end(),
                               [&](uint32_t t) { return t >= static_cast<uint32_t>(vocab); });
  TD_THROW("{} has token {} at position {}, outside the model's vocabulary of {}", what(), *it,
           it - tokens_.begin(), vocab);
}

void Dataset::rank_batch(int64_t step, int global_batch, int B, int micro_steps, int world,
                         int rank, std::vector<int32_t>& inputs,
                         std::vector<int32_t>& targets) const {
  TD_CHECK(B > 0 && micro_steps > 0 && world > 0 && rank >= 0 && rank < world &&
               int64_t{micro_steps} * B * world <= global_batch,
           "rank batch: {} micro-step(s) of {} at rank {} of {} exceed the global batch of {}",
           micro_steps, B, rank, world, global_batch);
  const size_t per = static_cast<size_t>(B) * static_cast<size_t>(T_);
  inputs.resize(per * static_cast<size_t>(micro_steps));
  targets.resize(inputs.size());
  for (int m = 0; m < micro_steps; ++m)
    batch(step, global_batch, m * B * world + rank * B, B, inputs.data() + per * m,
          targets.data() + per * m);
}

}  // namespace tandem
