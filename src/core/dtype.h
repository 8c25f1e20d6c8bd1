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

// IEEE binary16 (the safetensors F16 of checkpoints). Every f16 value is exactly an fp32
// value, so f16_to_f32 is exact and f16_from_f32(f16_to_f32(h)) == h for every h but NaN
// payloads, which keep their upper bits and become quiet. f16_from_f32 rounds to nearest
// even, overflowing to infinity and underflowing through the subnormals to zero.
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // infinity or NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);  // normal: rebias 15 -> 127
  } else if (man == 0) {
    u = sign;  // signed zero
  } else {
    // Subnormal: man x 2^-24; normalise the mantissa into the implicit bit.
    int e = 113;
    uint32_t m = man;
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --e;
    }
    u = sign | (static_cast<uint32_t>(e) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f16_from_f32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {
    // Below the smallest normal f16 (2^-14): a subnormal step of 2^-24, rounded to even.
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(abs >> 23);  // 14..24
    const uint32_t half = 1u << (shift - 1), rest = m & ((1u << shift) - 1);
    uint32_t r = m >> shift;
    if (rest > half || (rest == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias 127 -> 15 and round the 13 dropped bits to nearest even; a carry out of
  // the mantissa correctly bumps the exponent.
  const uint32_t r = abs - 0x38000000u;
  const uint32_t rounded = r + 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

}  // namespace tandem
