// The arena's memory: one device allocation sized by an arena plan (core/arena.h).
#pragma once

#include <cstddef>

#include "device/device.h"

namespace tandem {

// One device allocation sized by a plan.
class Arena {
 public:
  Arena(Device& device, size_t bytes);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  void* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  void* at(size_t offset) const;

 private:
  Device& device_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace tandem
