// The arena planner (greedy offset assignment), its verifier, and the arena allocation.
#include "core/arena.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <utility>

#include "core/error.h"

namespace tandem {

namespace {

// x rounded up to a multiple of a (a > 0); throws instead of wrapping around.
size_t align_up(size_t x, size_t a) {
  const size_t rem = x % a;
  if (rem == 0) return x;
  TD_CHECK(x <= SIZE_MAX - (a - rem), "arena: offset {} aligned to {} overflows", x, a);
  return x + (a - rem);
}

size_t end_of(size_t offset, size_t bytes) {
  TD_CHECK(offset <= SIZE_MAX - bytes, "arena: buffer of {} bytes at offset {} overflows", bytes,
           offset);
  return offset + bytes;
}

bool lifetimes_overlap(const ArenaRequest& a, const ArenaRequest& b) {
  return a.first <= b.last && b.first <= a.last;
}

}  // namespace

int ArenaPlanner::add(std::string name, size_t bytes, int first, int last) {
  TD_CHECK(bytes > 0, "arena request '{}': size must be positive", name);
  TD_CHECK(first >= 0 && first <= last,
           "arena request '{}': lifetime [{}, {}] must satisfy 0 <= first <= last", name, first,
           last);
  TD_CHECK(requests_.size() < static_cast<size_t>(INT32_MAX), "arena: too many requests");
  requests_.push_back(ArenaRequest{std::move(name), bytes, first, last});
  return static_cast<int>(requests_.size() - 1);
}

ArenaPlan ArenaPlanner::solve() const {
  TD_CHECK(alignment_ > 0, "arena: alignment must be positive");
  ArenaPlan plan;
  plan.requests = requests_;
  plan.alignment = alignment_;
  plan.offsets.assign(requests_.size(), 0);
  const size_t n = requests_.size();

  // Largest first; equal sizes by request index, so the plan is deterministic.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return requests_[a].bytes > requests_[b].bytes; });

  std::vector<size_t> placed;  // request indices, in placement order
  placed.reserve(n);
  std::vector<std::pair<size_t, size_t>> busy;  // [begin, end) of live conflicting buffers
  size_t total = 0;
  for (size_t i : order) {
    const ArenaRequest& req = requests_[i];
    busy.clear();
    for (size_t j : placed) {
      if (lifetimes_overlap(req, requests_[j])) {
        busy.emplace_back(plan.offsets[j], plan.offsets[j] + requests_[j].bytes);
      }
    }
    std::sort(busy.begin(), busy.end());
    // The lowest aligned offset whose [offset, offset + bytes) misses every busy range:
    // walk the ranges by start, bumping past each one that collides.
    size_t offset = 0;
    for (const auto& [begin, end] : busy) {
      if (end_of(offset, req.bytes) <= begin) break;  // fits in the gap before this range
      if (end > offset) offset = align_up(end, alignment_);
    }
    plan.offsets[i] = offset;
    total = std::max(total, end_of(offset, req.bytes));
    placed.push_back(i);
  }
  plan.total_bytes = align_up(total, alignment_);
  return plan;
}

void arena_plan_verify(const ArenaPlan& plan) {
  const size_t n = plan.requests.size();
  TD_CHECK(plan.offsets.size() == n, "arena plan: {} offsets for {} requests", plan.offsets.size(),
           n);
  TD_CHECK(plan.alignment > 0, "arena plan: alignment must be positive");
  for (size_t i = 0; i < n; ++i) {
    const ArenaRequest& r = plan.requests[i];
    const size_t off = plan.offsets[i];
    TD_CHECK(r.bytes > 0, "arena plan: buffer '{}' has size 0", r.name);
    TD_CHECK(r.first >= 0 && r.first <= r.last, "arena plan: buffer '{}' has lifetime [{}, {}]",
             r.name, r.first, r.last);
    TD_CHECK(off % plan.alignment == 0, "arena plan: buffer '{}' at offset {} is not aligned to {}",
             r.name, off, plan.alignment);
    TD_CHECK(off <= plan.total_bytes && r.bytes <= plan.total_bytes - off,
             "arena plan: buffer '{}' [{}, {}) runs past the arena end {}", r.name, off,
             end_of(off, r.bytes), plan.total_bytes);
  }
  // Every buffer lies within total_bytes (checked above), so the ends below cannot overflow.
  for (size_t i = 0; i < n; ++i) {
    const ArenaRequest& a = plan.requests[i];
    const size_t a0 = plan.offsets[i], a1 = a0 + a.bytes;
    for (size_t j = i + 1; j < n; ++j) {
      const ArenaRequest& b = plan.requests[j];
      const size_t b0 = plan.offsets[j], b1 = b0 + b.bytes;
      if (!lifetimes_overlap(a, b) || a1 <= b0 || b1 <= a0) continue;
      TD_THROW(
          "arena plan: buffers '{}' [{}, {}) live [{}, {}] and '{}' [{}, {}) live [{}, {}] "
          "overlap in memory and in time",
          a.name, a0, a1, a.first, a.last, b.name, b0, b1, b.first, b.last);
    }
  }
}

}  // namespace tandem
