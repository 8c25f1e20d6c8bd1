// Shared state of the distributed tests: the process environment, the CPU device and the
// world communicator that main.cpp creates once per process, and value helpers for f32/bf16
// buffers.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "api/environment.h"
#include "comm/communicator.h"
#include "core/dtype.h"
#include "device/device.h"

namespace tandem::dist {

const Environment& environment();
Device& device();
Communicator& world();

// Raw element storage of a buffer of the given dtype.
inline std::vector<uint8_t> encode(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::f32) {
      std::memcpy(bytes.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t h = bf16_from_f32(values[i]);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  return bytes;
}

inline std::vector<float> decode(const std::vector<uint8_t>& bytes, DType dtype) {
  const size_t n = bytes.size() / dtype_size(dtype);
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::f32) {
      std::memcpy(&values[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      values[i] = bf16_to_f32(h);
    }
  }
  return values;
}

}  // namespace tandem::dist
