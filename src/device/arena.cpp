// The arena's device allocation.
#include "device/arena.h"

#include "core/error.h"

namespace tandem {

Arena::Arena(Device& device, size_t bytes) : device_(device), bytes_(bytes) {
  base_ = device_.alloc(bytes_);
}

Arena::~Arena() {
  device_.free(base_);
}

void* Arena::at(size_t offset) const {
  TD_CHECK(offset < bytes_, "arena offset {} out of range (the arena holds {} bytes)", offset,
           bytes_);
  return static_cast<char*>(base_) + offset;
}

}  // namespace tandem
