// Flat parameters: each unit's parameters live in one flat buffer padded to a multiple of
// (shard group size x alignment); a rank's shard is one contiguous slice of it. The
// layout is a pure function of the model, the shard group size and the alignment.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "model/model.h"

namespace tandem {

struct UnitShards {
  int64_t numel = 0;   // parameters of the unit
  int64_t padded = 0;  // flat buffer length: numel rounded up to shard_size * align
  int64_t shard = 0;   // elements per rank: padded / shard_size
};

class FlatLayout {
 public:
  // align: elements per shard are a multiple of it (64 keeps every shard 256-byte aligned
  // in fp32 and 128-byte aligned in bf16).
  FlatLayout(const ModelLayout& model, int shard_size, int64_t align = 64);

  int shard_size() const { return shard_size_; }
  int64_t align() const { return align_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  const UnitShards& unit(int u) const { return units_.at(static_cast<size_t>(u)); }
  // First element of shard `rank` of unit u within the unit's flat buffer.
  int64_t shard_begin(int u, int rank) const { return unit(u).shard * rank; }
  // Elements per rank over all units (the size of one rank's master shard).
  int64_t shard_total() const;
  int64_t padded_total() const;
  int64_t largest_padded() const;
  int64_t largest_shard() const;

 private:
  int shard_size_;
  int64_t align_;
  std::vector<UnitShards> units_;
};

// One rank's shard of every unit: params, AdamW moments, each FlatLayout::unit(u).shard
// elements (the rank's slice of the padded flat buffer).
struct ShardState {
  std::vector<std::vector<float>> params, m, v;
};

}  // namespace tandem
