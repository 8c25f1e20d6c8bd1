// Planned memory: buffers are requested with a size and a lifetime (first and last
// program position that touches them); the planner gives each an offset so that buffers
// whose lifetimes overlap never share bytes. One allocation then backs the whole plan,
// and its size is known before anything runs.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace tandem {

struct ArenaRequest {
  std::string name;
  size_t bytes = 0;
  int first = 0;  // first position that uses the buffer
  int last = 0;   // last position (inclusive)
};

struct ArenaPlan {
  std::vector<ArenaRequest> requests;
  std::vector<size_t> offsets;  // one per request
  size_t total_bytes = 0;       // the arena size the plan needs
  size_t alignment = 256;
};

class ArenaPlanner {
 public:
  explicit ArenaPlanner(size_t alignment = 256) : alignment_(alignment) {}
  // Returns the request's id (its index in the plan).
  int add(std::string name, size_t bytes, int first, int last);
  // Greedy placement, largest first, at the lowest offset free over the lifetime.
  ArenaPlan solve() const;

 private:
  size_t alignment_;
  std::vector<ArenaRequest> requests_;
};

// Throws when two buffers with overlapping lifetimes overlap in memory, or a buffer is
// misaligned or runs past the end.
void arena_plan_verify(const ArenaPlan& plan);

}  // namespace tandem
