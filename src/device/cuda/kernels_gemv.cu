// CUDA kernel of the skinny linear forward of decoding: out[N,OC] = x[N,IC] @ w[OC,IC]^T + bias
// for N <= kGemvMaxRows rows, where a GEMM library's tiles would mostly multiply padding and the
// product is bound by reading w. See [GEMV].
//
// [GEMV] Each warp owns kGemvRowsPerWarp consecutive rows of w; lane l takes the 16-byte chunks
// l, l + 32, ... of each row (so a warp's loads of one row are 512 contiguous bytes), with
// kGemvUnroll chunks per row in flight before any arithmetic. w is read exactly once, with loads
// that do not allocate in L1 (ld.global.nc.L1::no_allocate), leaving L1 to x: every warp of an SM
// reads the same x chunks (16-byte read-only loads, L1 hits after the first warp), and each x chunk
// loaded serves all of the warp's rows. Accumulation is fp32 (the bf16 pairs unpacked by shifts);
// at the end each of the rows x N sums is reduced over the warp with shuffles, the bias added in
// fp32, and the result rounded once to bf16. Blocks of kGemvWarps warps, one row block per
// block: no shared memory, so many blocks share an SM and keep enough loads in flight.
#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

constexpr int kGemvWarps = 4;
constexpr int kGemvThreads = kGemvWarps * 32;
constexpr int kGemvRowsPerWarp = 4;
// 16-byte chunks of each row in flight per lane: more where few x rows leave registers free.
template <int NR>
constexpr int kGemvUnroll = NR <= 4 ? 4 : 2;

// A 16-byte load of read-only data streamed once: not kept in L1.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    f[2 * j] = __uint_as_float(w[j] << 16);
    f[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
  }
}

// Adds the products of U chunks (starting at chunk k, 32 apart) of R rows of w (from row w0 on,
// rows past `last` reading row `last` again) with NR rows of x.
template <int NR, int R, int U>
__device__ __forceinline__ void gemv_step(float (&acc)[R][NR], const uint4* __restrict__ w0,
                                          int last, const uint4* __restrict__ xr, int chunks,
                                          int k) {
  uint4 wv[U][R];
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      wv[u][r] = ld_stream(w0 + int64_t(min(r, last)) * chunks + k + 32 * u);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    float wf[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) unpack8(wv[u][r], wf[r]);
#pragma unroll
    for (int n = 0; n < NR; ++n) {
      float xf[8];
      unpack8(__ldg(xr + int64_t(n) * chunks + k + 32 * u), xf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r][n] = fmaf(wf[r][e], xf[e], acc[r][n]);
      }
    }
  }
}

template <int NR>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_kernel(bf16* __restrict__ out, const bf16* __restrict__ x, const bf16* __restrict__ w,
                const bf16* __restrict__ bias, int IC, int OC) {
  constexpr int R = kGemvRowsPerWarp, U = kGemvUnroll<NR>;
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * kGemvWarps + (threadIdx.x >> 5)) * R;
  if (row0 >= OC) return;  // uniform over the warp
  const int chunks = IC / 8;
  // Rows past OC read the last row again (computed, never written).
  const uint4* w0 = reinterpret_cast<const uint4*>(w + int64_t(row0) * IC);
  const int last = OC - 1 - row0;
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  float acc[R][NR];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int n = 0; n < NR; ++n) acc[r][n] = 0.0f;
  }
  int k = lane;
  for (; k + 32 * (U - 1) < chunks; k += 32 * U) gemv_step<NR, R, U>(acc, w0, last, xr, chunks, k);
  for (; k < chunks; k += 32) gemv_step<NR, R, 1>(acc, w0, last, xr, chunks, k);
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int n = 0; n < NR; ++n) acc[r][n] = detail::warp_sum(acc[r][n]);
  }
  // Lane (r * NR + n) % 32 writes out[n, row0 + r]; every lane holds every sum.
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int n = 0; n < NR; ++n) {
      if (lane == (r * NR + n) % 32 && row0 + r < OC) {
        const float b = bias ? __bfloat162float(bias[row0 + r]) : 0.0f;
        out[int64_t(n) * OC + row0 + r] = __float2bfloat16_rn(acc[r][n] + b);
      }
    }
  }
}

template <int NR>
void launch_gemv(bf16* out, const bf16* x, const bf16* w, const bf16* bias, int IC, int OC,
                 cudaStream_t stream) {
  constexpr int rows_per_block = kGemvWarps * kGemvRowsPerWarp;
  const unsigned blocks = unsigned((int64_t(OC) + rows_per_block - 1) / rows_per_block);
  gemv_kernel<NR><<<blocks, kGemvThreads, 0, stream>>>(out, x, w, bias, IC, OC);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool gemv_supported(const bf16* x, const bf16* w, int N, int IC, int OC) {
  return N >= 1 && N <= kGemvMaxRows && IC > 0 && IC % 8 == 0 && OC > 0 && detail::aligned16(x) &&
         detail::aligned16(w);
}

void gemv_forward(bf16* out, const bf16* x, const bf16* w, const bf16* bias, int N, int IC, int OC,
                  cudaStream_t stream) {
  TD_CHECK(gemv_supported(x, w, N, IC, OC),
           "gemv_forward: unsupported N={} IC={} OC={} (needs 1 <= N <= {}, IC % 8 == 0 and "
           "16-byte aligned x and w)",
           N, IC, OC, kGemvMaxRows);
  switch (N) {
    case 1:
      launch_gemv<1>(out, x, w, bias, IC, OC, stream);
      break;
    case 2:
      launch_gemv<2>(out, x, w, bias, IC, OC, stream);
      break;
    case 3:
      launch_gemv<3>(out, x, w, bias, IC, OC, stream);
      break;
    case 4:
      launch_gemv<4>(out, x, w, bias, IC, OC, stream);
      break;
    case 5:
      launch_gemv<5>(out, x, w, bias, IC, OC, stream);
      break;
    case 6:
      launch_gemv<6>(out, x, w, bias, IC, OC, stream);
      break;
    case 7:
      launch_gemv<7>(out, x, w, bias, IC, OC, stream);
      break;
    default:
      launch_gemv<8>(out, x, w, bias, IC, OC, stream);
      break;
  }
}

}  // namespace tandem::cuda
