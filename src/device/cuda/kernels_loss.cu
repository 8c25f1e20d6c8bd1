// CUDA kernels: softmax cross-entropy over (possibly padded) vocabulary logits: the losses alone,
// and the fused loss + in-place dlogits backward. One block per row; one online-softmax pass
// (running max and rescaled sum, combined in a fixed order) then, for the backward, one write pass.
#include <cfloat>

#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

using detail::load_vec;
using detail::store_vec;

constexpr int kThreads = 512;

struct MaxSum {
  float m, s;  // running max and sum of exp(x - m)
};

constexpr float kLog2e = 1.4426950408889634f;

// exp(v - m) as exp2(v log2e - m log2e): one FMA and the hardware exp2 (2 ulp) per element.
__device__ __forceinline__ float exp_shifted(float v, float m_log2e) {
  return exp2f(fmaf(v, kLog2e, -m_log2e));
}

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  const float ml = m * kLog2e;
  return {m, a.s * exp_shifted(a.m, ml) + b.s * exp_shifted(b.m, ml)};
}

// Adds VEC values (the first `valid` of them) to the running state: the max first, so the sum
// is rescaled at most once per VEC elements.
template <int VEC>
__device__ __forceinline__ void accumulate(MaxSum& acc, const float (&v)[VEC], int valid) {
  float m = acc.m;
#pragma unroll
  for (int j = 0; j < VEC; ++j)
    if (j < valid) m = fmaxf(m, v[j]);
  const float ml = m * kLog2e;
  if (m > acc.m) acc.s = acc.m == -INFINITY ? 0.0f : acc.s * exp_shifted(acc.m, ml);
  acc.m = m;
#pragma unroll
  for (int j = 0; j < VEC; ++j)
    if (j < valid) acc.s += exp_shifted(v[j], ml);
}

// Combines the per-thread states in a fixed order; every thread gets the result.
__device__ MaxSum block_combine(MaxSum v) {
  __shared__ MaxSum part[32];
  __shared__ MaxSum result;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const MaxSum w{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = combine(v, w);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum r = part[0];
    for (int i = 1; i < int(blockDim.x >> 5); ++i) r = combine(r, part[i]);
    result = r;
  }
  __syncthreads();
  return result;
}

// Pass 1 over row x: the softmax statistics of columns [0, V).
template <int VEC>
__device__ MaxSum row_stats(const bf16* x, int V) {
  MaxSum acc{-INFINITY, 0.0f};
  for (int c = threadIdx.x * VEC; c < V; c += blockDim.x * VEC) {
    float v[VEC];
    load_vec<VEC>(x + c, v);
    accumulate<VEC>(acc, v, V - c);
  }
  return block_combine(acc);
}

template <int VEC>
__global__ void ce_fwd_kernel(float* __restrict__ losses, const bf16* __restrict__ logits,
                              const int32_t* __restrict__ targets, int V, int Vp) {
  const int64_t row = blockIdx.x;
  const bf16* x = logits + row * Vp;
  const int tgt = targets[row];
  const bool ok = tgt >= 0 && tgt < V;
  const MaxSum st = row_stats<VEC>(x, V);
  if (threadIdx.x == 0)
    losses[row] = ok ? logf(st.s) - (__bfloat162float(x[tgt]) - st.m) : detail::qnan();
}

template <int VEC>
__global__ void ce_fused_bwd_kernel(bf16* __restrict__ logits, float* __restrict__ losses,
                                    const int32_t* __restrict__ targets, int V, int Vp,
                                    float dloss) {
  const int64_t row = blockIdx.x;
  bf16* x = logits + row * Vp;
  const int tgt = targets[row];
  const bool ok = tgt >= 0 && tgt < V;
  // Read before any thread of the block overwrites the row (block_combine synchronises).
  const float xt = (threadIdx.x == 0 && ok) ? __bfloat162float(x[tgt]) : 0.0f;
  const MaxSum st = row_stats<VEC>(x, V);
  if (threadIdx.x == 0 && losses) losses[row] = ok ? logf(st.s) - (xt - st.m) : detail::qnan();
  const float scale = dloss / st.s;
  const float ml = st.m * kLog2e;
  for (int c = threadIdx.x * VEC; c < Vp; c += blockDim.x * VEC) {
    float v[VEC];
    load_vec<VEC>(x + c, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int col = c + j;
      float d = col < V ? exp_shifted(v[j], ml) * scale : 0.0f;
      if (col == tgt) d -= dloss;
      v[j] = d;
    }
    store_vec<VEC>(x + c, v);
  }
}

void check_ce(int N, int V, int Vp) {
  TD_CHECK(N >= 0 && V > 0 && Vp >= V, "bad cross-entropy shape N={} V={} Vp={}", N, V, Vp);
}

}  // namespace

void crossentropy_forward(float* losses, const bf16* logits, const int32_t* targets, int N, int V,
                          int Vp, cudaStream_t stream) {
  check_ce(N, V, Vp);
  if (N == 0) return;
  if (Vp % 8 == 0 && detail::aligned16(logits)) {
    ce_fwd_kernel<8><<<N, kThreads, 0, stream>>>(losses, logits, targets, V, Vp);
  } else {
    ce_fwd_kernel<1><<<N, kThreads, 0, stream>>>(losses, logits, targets, V, Vp);
  }
  CUDA_CHECK_LAUNCH();
}

void crossentropy_fused_backward(bf16* logits, float* losses, const int32_t* targets, int N, int V,
                                 int Vp, float dloss, cudaStream_t stream) {
  check_ce(N, V, Vp);
  if (N == 0) return;
  if (Vp % 8 == 0 && detail::aligned16(logits)) {
    ce_fused_bwd_kernel<8><<<N, kThreads, 0, stream>>>(logits, losses, targets, V, Vp, dloss);
  } else {
    ce_fused_bwd_kernel<1><<<N, kThreads, 0, stream>>>(logits, losses, targets, V, Vp, dloss);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::cuda
