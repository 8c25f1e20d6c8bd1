// Padding and slicing of the units' flat buffers.
#include "shard/flat.h"

#include <algorithm>

#include "core/error.h"

namespace tandem {

FlatLayout::FlatLayout(const ModelLayout& model, int shard_size, int64_t align)
    : shard_size_(shard_size), align_(align) {
  TD_CHECK(shard_size >= 1, "shard group size {} must be at least 1", shard_size);
  // Up to 2^30, so that the padding quantum (shard size x alignment) and the padded sizes
  // stay far from overflowing int64.
  TD_CHECK(align >= 1 && align <= (int64_t{1} << 30),
           "flat-buffer alignment {} must be between 1 and 2^30", align);
  const int64_t quantum = int64_t{shard_size} * align;
  for (const UnitLayout& u : model.units()) {
    UnitShards s;
    s.numel = u.numel;
    s.padded = (u.numel + quantum - 1) / quantum * quantum;
    s.shard = s.padded / shard_size;
    units_.push_back(s);
  }
}

int64_t FlatLayout::shard_total() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u.shard;
  return n;
}

int64_t FlatLayout::padded_total() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u.padded;
  return n;
}

int64_t FlatLayout::largest_padded() const {
  int64_t n = 0;
  for (const auto& u : units_) n = std::max(n, u.padded);
  return n;
}

int64_t FlatLayout::largest_shard() const {
  int64_t n = 0;
  for (const auto& u : units_) n = std::max(n, u.shard);
  return n;
}

}  // namespace tandem
