// The Gumbel noise of sampling (SamplingParams in device/kernels.h), written once for the
// host and CUDA device code: the noise of token i of row r at position p is a function of
// (seed, r, p, i) alone, so the CPU and CUDA tables draw the same token from the same
// logits, and a CUDA graph replays a draw without host state.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define TD_HOST_DEVICE __host__ __device__
#else
#define TD_HOST_DEVICE
#endif

namespace tandem {

// The splitmix64 finaliser: a bijection of 64-bit words that mixes every input bit.
TD_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The key of one (seed, row, position): the part of the hash shared by a row's tokens.
TD_HOST_DEVICE inline uint64_t gumbel_row_key(uint64_t seed, int row, int position) {
  const uint64_t rp =
      (static_cast<uint64_t>(static_cast<uint32_t>(row)) << 32) | static_cast<uint32_t>(position);
  return mix64(mix64(seed + 0x9e3779b97f4a7c15ull) ^ (rp * 0xd6e8feb86659fd93ull));
}

// -log(-log(u)), u uniform in (0, 1) from 53 bits of the hash of (row key, token).
TD_HOST_DEVICE inline float gumbel_noise(uint64_t row_key, int token) {
  const uint64_t h = mix64(
      row_key ^ (static_cast<uint64_t>(static_cast<uint32_t>(token)) * 0x9e3779b97f4a7c15ull));
  const double u = (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53;
  return static_cast<float>(-log(-log(u)));
}

}  // namespace tandem
