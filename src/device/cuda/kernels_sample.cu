// CUDA kernel of sampling: the next token of each row drawn from its logits by the rule of
// SamplingParams (device/kernels.h), on the device, with no sort and no host round trip.
//
// [Sampling] One block of kSampleThreads per row; the row's logits (up to a few hundred
// thousand bf16, L2-resident) are read from global memory once per pass, 16 bytes per thread
// where the rows are aligned. With x_i the logits and z_i = x_i / temperature (IEEE division,
// as on the host):
//  - temperature 0: one pass, the argmax of x (lowest index among equal maxima).
//  - the maximum of z (one pass; the maximum of x divided by the temperature, division by a
//    positive number being monotone).
//  - 0 < top_k < V: tau_k = the k-th largest z counting duplicates, by an exact radix select
//    (four passes of 8-bit digits, MSB first) over the order-preserving uint32 key of z (-0 and
//    +0 share a key, so key order is float order); kept: key(z_i) >= key(tau_k).
//  - top_p < 1: over the kept tokens, w_i = expf(z_i - max z) in fixed point (w_i * 2^40 rounded
//    to an integer: integer sums are exact and independent of order, so the four passes agree
//    with one another and every run gives the same token; the total of the weights below 2^-41
//    that round to 0 is under V * 2^-41 of the mass). tau_p = the largest kept z whose mass at or
//    above it reaches top_p * W (W the total kept mass), by a radix select over the same keys
//    with mass histograms (four passes); kept: key(z_i) >= key(tau_p).
//  - one last pass: the argmax over kept i of z_i + gumbel_noise(gumbel_row_key(seed, row_offset +
//  n,
//    pos[n]), i) (core/gumbel.h), ties to the lowest index.
// NaN logits are never drawn. Histograms live in shared memory; counts are aggregated per warp
// (__match_any_sync) before their atomics, masses are 64-bit shared atomics.
#include <cmath>

#include "core/gumbel.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

constexpr int kSampleThreads = 1024;
constexpr int kSampleWarps = kSampleThreads / 32;
constexpr float kMassScale = 1099511627776.0f;  // 2^40

// Order-preserving key: a < b (floats, not NaN) iff key(a) < key(b); -0 and +0 map to one key.
__device__ __forceinline__ uint32_t order_key(float z) {
  if (z == 0.0f) z = 0.0f;
  const uint32_t u = __float_as_uint(z);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Calls f(i, x, valid) for every index of the row: each thread takes 8 consecutive logits per
// step (VEC: one 16-byte load) or 1; the loop is uniform over the block (valid says whether i <
// V), so f may use warp-wide intrinsics.
template <bool VEC, class F>
__device__ __forceinline__ void for_logits(const bf16* __restrict__ row, int V, F&& f) {
  if constexpr (VEC) {
    for (int base = 0; base < V; base += kSampleThreads * 8) {
      const int i0 = base + int(threadIdx.x) * 8;
      float x[8];
      if (i0 + 8 <= V) {
        detail::load_vec<8>(row + i0, x);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = i0 + e < V ? __bfloat162float(row[i0 + e]) : 0.0f;
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) f(i0 + e, x[e], i0 + e < V);
    }
  } else {
    for (int base = 0; base < V; base += kSampleThreads) {
      const int i = base + int(threadIdx.x);
      f(i, i < V ? __bfloat162float(row[i]) : 0.0f, i < V);
    }
  }
}

// (value, index) with index -1 for "none": the better of two is the larger value, then the
// lower index.
struct Best {
  float v;
  int i;
};
__device__ __forceinline__ Best better(Best a, Best b) {
  if (a.i < 0) return b;
  if (b.i < 0) return a;
  if (a.v > b.v || (a.v == b.v && a.i < b.i)) return a;
  return b;
}

// The block's best; every thread gets it. s_best holds kSampleWarps entries.
__device__ Best block_best(Best b, Best* s_best) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best other;
    other.v = __shfl_xor_sync(0xffffffffu, b.v, o);
    other.i = __shfl_xor_sync(0xffffffffu, b.i, o);
    b = better(b, other);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // s_best may still be read from an earlier call
  if (lane == 0) s_best[warp] = b;
  __syncthreads();
  Best r = s_best[0];
  for (int w = 1; w < kSampleWarps; ++w) r = better(r, s_best[w]);
  return r;
}

struct SampleShared {
  uint32_t count[256];
  unsigned long long mass[256];
  Best best[kSampleWarps];
  uint32_t digit;
  uint32_t rest;  // top-k: rank still to find within the chosen digit
  int found;
  unsigned long long above;  // top-p: kept mass above the chosen prefix
  unsigned long long total;  // top-p: kept mass W
};

__device__ __forceinline__ void clear_hist(SampleShared& sh) {
  for (int b = threadIdx.x; b < 256; b += kSampleThreads) {
    sh.count[b] = 0;
    sh.mass[b] = 0;
  }
}

// Adds one to the count of bin (bin >= 0), aggregated over the warp's lanes with that bin.
__device__ __forceinline__ void count_bin(SampleShared& sh, int bin) {
  const unsigned peers = __match_any_sync(0xffffffffu, bin);
  if (bin >= 0 && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&sh.count[bin], __popc(peers));
}

template <bool VEC>
__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(int32_t* __restrict__ tokens, const bf16* __restrict__ logits,
                  const int32_t* __restrict__ pos, int V, int64_t Vp, float temperature, int top_k,
                  float top_p, uint64_t seed, int row_offset) {
  __shared__ SampleShared sh;
  detail::pdl_launch_dependents();  // [PDL]: nothing is read or written before the wait
  detail::pdl_wait();
  const int n = blockIdx.x;
  const bf16* row = logits + int64_t(n) * Vp;

  if (temperature == 0.0f) {  // greedy
    Best b{0.0f, -1};
    for_logits<VEC>(row, V, [&](int i, float x, bool valid) {
      if (valid && !isnan(x)) b = better(b, Best{x, i});
    });
    b = block_best(b, sh.best);
    if (threadIdx.x == 0) tokens[n] = b.i < 0 ? 0 : b.i;
    return;
  }

  // The maximum of z.
  Best mx{0.0f, -1};
  for_logits<VEC>(row, V, [&](int i, float x, bool valid) {
    if (valid && !isnan(x)) mx = better(mx, Best{x, i});
  });
  mx = block_best(mx, sh.best);
  if (mx.i < 0) {  // every logit NaN
    if (threadIdx.x == 0) tokens[n] = 0;
    return;
  }
  const float zmax = mx.v / temperature;

  // top-k: the key of the k-th largest z.
  uint32_t keep = 0;  // kept: key(z) >= keep
  if (top_k > 0 && top_k < V) {
    uint32_t prefix = 0, mask = 0, rank = uint32_t(top_k);
    bool ok = true;
    for (int shift = 24; shift >= 0 && ok; shift -= 8) {
      clear_hist(sh);
      __syncthreads();
      for_logits<VEC>(row, V, [&](int, float x, bool valid) {
        const float z = x / temperature;
        const uint32_t key = order_key(z);
        const bool in = valid && !isnan(z) && (key & mask) == prefix;
        count_bin(sh, in ? int((key >> shift) & 255u) : -1);
      });
      __syncthreads();
      if (threadIdx.x == 0) {
        uint32_t cum = 0;
        sh.found = 0;
        for (int b = 255; b >= 0; --b) {
          const uint32_t c = sh.count[b];
          if (cum + c >= rank) {
            sh.digit = uint32_t(b);
            sh.rest = rank - cum;
            sh.found = 1;
            break;
          }
          cum += c;
        }
      }
      __syncthreads();
      ok = sh.found != 0;  // fewer than k non-NaN logits: no cut
      prefix |= sh.digit << shift;
      mask |= 255u << shift;
      rank = sh.rest;
      __syncthreads();
    }
    if (ok) keep = prefix;
  }

  // top-p: the key of the largest kept z whose mass at or above it reaches top_p * W.
  if (top_p < 1.0f) {
    uint32_t prefix = 0, mask = 0;
    bool ok = true;
    if (threadIdx.x == 0) sh.above = 0;
    for (int shift = 24; shift >= 0 && ok; shift -= 8) {
      clear_hist(sh);
      __syncthreads();
      for_logits<VEC>(row, V, [&](int, float x, bool valid) {
        const float z = x / temperature;
        const uint32_t key = order_key(z);
        const bool in = valid && !isnan(z) && key >= keep && (key & mask) == prefix;
        const int bin = in ? int((key >> shift) & 255u) : -1;
        count_bin(sh, bin);
        if (in) {
          const unsigned long long w = __float2ull_rn(expf(z - zmax) * kMassScale);
          if (w != 0) atomicAdd(&sh.mass[bin], w);
        }
      });
      __syncthreads();
      if (threadIdx.x == 0) {
        if (shift == 24) {
          unsigned long long total = 0;
          for (int b = 0; b < 256; ++b) total += sh.mass[b];
          sh.total = total;
        }
        const double target = double(top_p) * double(sh.total);
        unsigned long long cum = sh.above;
        sh.found = 0;
        for (int b = 255; b >= 0; --b) {
          const unsigned long long incl = cum + sh.mass[b];
          if (sh.count[b] > 0 && double(incl) >= target) {
            sh.digit = uint32_t(b);
            sh.above = cum;
            sh.found = 1;
            break;
          }
          cum = incl;
        }
      }
      __syncthreads();
      ok = sh.found != 0;
      prefix |= sh.digit << shift;
      mask |= 255u << shift;
      __syncthreads();
    }
    if (ok && prefix > keep) keep = prefix;
  }

  // The draw: argmax of z + Gumbel noise over the kept tokens.
  const uint64_t key = gumbel_row_key(seed, row_offset + n, pos[n]);
  Best b{0.0f, -1};
  for_logits<VEC>(row, V, [&](int i, float x, bool valid) {
    const float z = x / temperature;
    if (valid && !isnan(z) && order_key(z) >= keep)
      b = better(b, Best{z + gumbel_noise(key, i), i});
  });
  b = block_best(b, sh.best);
  if (threadIdx.x == 0) tokens[n] = b.i < 0 ? mx.i : b.i;
}

}  // namespace

void sample_tokens(int32_t* tokens, const bf16* logits, const int32_t* pos, int N, int V, int Vp,
                   float temperature, int top_k, float top_p, uint64_t seed, cudaStream_t stream,
                   int row_offset) {
  TD_CHECK(N >= 0 && V > 0 && Vp >= V, "sample_tokens: bad shape N={} V={} Vp={}", N, V, Vp);
  TD_CHECK(temperature >= 0.0f && std::isfinite(temperature),
           "sample_tokens: temperature {} is not a finite number >= 0", temperature);
  TD_CHECK(top_k >= 0, "sample_tokens: top_k {} < 0", top_k);
  TD_CHECK(top_p > 0.0f && top_p <= 1.0f, "sample_tokens: top_p {} is not in (0, 1]", top_p);
  TD_CHECK(V < (1 << 23),
           "sample_tokens: V={} is too large (the masses of top-p are 64-bit sums "
           "of 2^40-scaled weights)",
           V);
  if (N == 0) return;
  const bool vec = Vp % 8 == 0 && detail::aligned16(logits);
  detail::launch_pdl(vec ? sample_kernel<true> : sample_kernel<false>, dim3(unsigned(N)),
                     dim3(kSampleThreads), 0, stream, tokens, logits, pos, V, int64_t(Vp),
                     temperature, top_k, top_p, seed, row_offset);
}

}  // namespace tandem::cuda
