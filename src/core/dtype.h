// Element types of tensors: fp32 everywhere on CPU, bf16 storage on GPU.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace tandem {

enum class DType : uint8_t { f32, bf16 };

inline size_t dtype_size(DType t) {
  return t == DType::f32 ? 4 : 2;
}
inline std::string_view dtype_name(DType t) {
  return t == DType::f32 ? "f32" : "bf16";
}

// bf16 is the upper half of an fp32; rounding is to nearest even, NaN stays NaN.
inline uint16_t bf16_from_f32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace tandem
