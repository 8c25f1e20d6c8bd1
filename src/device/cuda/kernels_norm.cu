// CUDA kernels: LayerNorm and RMSNorm over the last dimension, forward and backward. One warp per
// row (statistics by warp shuffles, two-pass variance as on CPU, 16-byte accesses when C % 8 == 0);
// the weight/bias gradients use the deterministic two-pass [Column sums] of kernels.cuh.
#include <initializer_list>

#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

using detail::ld;
using detail::load_vec;
using detail::store_vec;
using detail::warp_sum;

constexpr int kWarps = 8;  // rows per block of the row kernels

unsigned row_blocks(int N) {
  return unsigned((N + kWarps - 1) / kWarps);
}

template <int VEC>
__global__ void layernorm_fwd_kernel(bf16* __restrict__ out, float* __restrict__ mean,
                                     float* __restrict__ rstd, const bf16* __restrict__ x,
                                     const bf16* __restrict__ w, const bf16* __restrict__ b, int N,
                                     int C, float eps) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= N) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  const bf16* xr = x + row * C;
  float s = 0.0f;
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float v[VEC];
    load_vec<VEC>(xr + c, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) s += v[j];
  }
  const float m = warp_sum(s) / float(C);
  float ss = 0.0f;
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float v[VEC];
    load_vec<VEC>(xr + c, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = v[j] - m;
      ss += d * d;
    }
  }
  const float r = 1.0f / sqrtf(warp_sum(ss) / float(C) + eps);
  bf16* orow = out + row * C;
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float v[VEC], wv[VEC], bv[VEC], o[VEC];
    load_vec<VEC>(xr + c, v);
    load_vec<VEC>(w + c, wv);
    if (b) load_vec<VEC>(b + c, bv);
#pragma unroll
    for (int j = 0; j < VEC; ++j) o[j] = (v[j] - m) * r * wv[j] + (b ? bv[j] : 0.0f);
    store_vec<VEC>(orow + c, o);
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = r;
  }
}

// dx += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * w, xhat = (x - mean) * rstd.
template <int VEC>
__global__ void layernorm_bwd_dx_kernel(bf16* __restrict__ dx, const bf16* __restrict__ dout,
                                        const bf16* __restrict__ x, const bf16* __restrict__ w,
                                        const float* __restrict__ mean,
                                        const float* __restrict__ rstd, int N, int C) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= N) return;
  const int lane = threadIdx.x & 31;
  const bf16* xr = x + row * C;
  const bf16* dr = dout + row * C;
  const float m = mean[row], s = rstd[row];
  float gsum = 0.0f, gxsum = 0.0f;
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float xv[VEC], dv[VEC], wv[VEC];
    load_vec<VEC>(xr + c, xv);
    load_vec<VEC>(dr + c, dv);
    load_vec<VEC>(w + c, wv);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float g = dv[j] * wv[j];
      gsum += g;
      gxsum += g * (xv[j] - m) * s;
    }
  }
  const float gmean = warp_sum(gsum) / float(C);
  const float gxmean = warp_sum(gxsum) / float(C);
  bf16* dxr = dx + row * C;
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float xv[VEC], dv[VEC], wv[VEC], o[VEC];
    load_vec<VEC>(xr + c, xv);
    load_vec<VEC>(dr + c, dv);
    load_vec<VEC>(w + c, wv);
    load_vec<VEC>(dxr + c, o);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float xhat = (xv[j] - m) * s;
      o[j] += s * (dv[j] * wv[j] - gmean - xhat * gxmean);
    }
    store_vec<VEC>(dxr + c, o);
  }
}

template <int VEC>
__global__ void rmsnorm_fwd_kernel(bf16* __restrict__ out, float* __restrict__ rstd,
                                   const bf16* __restrict__ x, const bf16* __restrict__ w, int N,
                                   int C, float eps) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= N) return;
  const int lane = threadIdx.x & 31;
  const bf16* xr = x + row * C;
  float ss = 0.0f;
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float v[VEC];
    load_vec<VEC>(xr + c, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) ss += v[j] * v[j];
  }
  const float r = 1.0f / sqrtf(warp_sum(ss) / float(C) + eps);
  bf16* orow = out + row * C;
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float v[VEC], wv[VEC], o[VEC];
    load_vec<VEC>(xr + c, v);
    load_vec<VEC>(w + c, wv);
#pragma unroll
    for (int j = 0; j < VEC; ++j) o[j] = v[j] * r * wv[j];
    store_vec<VEC>(orow + c, o);
  }
  if (lane == 0 && rstd) rstd[row] = r;
}

// dx += rstd * (g - xhat * mean(g * xhat)), g = dout * w, xhat = x * rstd.
template <int VEC>
__global__ void rmsnorm_bwd_dx_kernel(bf16* __restrict__ dx, const bf16* __restrict__ dout,
                                      const bf16* __restrict__ x, const bf16* __restrict__ w,
                                      const float* __restrict__ rstd, int N, int C) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= N) return;
  const int lane = threadIdx.x & 31;
  const bf16* xr = x + row * C;
  const bf16* dr = dout + row * C;
  const float s = rstd[row];
  float gxsum = 0.0f;
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float xv[VEC], dv[VEC], wv[VEC];
    load_vec<VEC>(xr + c, xv);
    load_vec<VEC>(dr + c, dv);
    load_vec<VEC>(w + c, wv);
#pragma unroll
    for (int j = 0; j < VEC; ++j) gxsum += dv[j] * wv[j] * xv[j] * s;
  }
  const float gxmean = warp_sum(gxsum) / float(C);
  bf16* dxr = dx + row * C;
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float xv[VEC], dv[VEC], wv[VEC], o[VEC];
    load_vec<VEC>(xr + c, xv);
    load_vec<VEC>(dr + c, dv);
    load_vec<VEC>(w + c, wv);
    load_vec<VEC>(dxr + c, o);
#pragma unroll
    for (int j = 0; j < VEC; ++j) o[j] += s * (dv[j] * wv[j] - xv[j] * s * gxmean);
    store_vec<VEC>(dxr + c, o);
  }
}

// Per-element contributions to the parameter gradients ([Column sums]).
// V columns from c of row r (V = 4: the rows are read 8 bytes at a time).
struct LayerNormParamGrad {  // {dw, db}
  const bf16* dout;
  const bf16* x;
  const float* mean;
  const float* rstd;
  int C;
  template <int V>
  __device__ void operator()(int64_t r, int c, float (&o)[2][V]) const {
    float d[V], xv[V];
    load_vec<V>(dout + r * C + c, d);
    load_vec<V>(x + r * C + c, xv);
    const float m = mean[r], s = rstd[r];
#pragma unroll
    for (int v = 0; v < V; ++v) {
      o[0][v] = d[v] * (xv[v] - m) * s;
      o[1][v] = d[v];
    }
  }
};

struct RmsNormParamGrad {  // {dw}
  const bf16* dout;
  const bf16* x;
  const float* rstd;
  int C;
  template <int V>
  __device__ void operator()(int64_t r, int c, float (&o)[1][V]) const {
    float d[V], xv[V];
    load_vec<V>(dout + r * C + c, d);
    load_vec<V>(x + r * C + c, xv);
    const float s = rstd[r];
#pragma unroll
    for (int v = 0; v < V; ++v) o[0][v] = d[v] * xv[v] * s;
  }
};

// Whether both inputs of the param-gradient functors start 8-byte aligned (colsum's vec4).
bool aligned8(const void* a, const void* b) {
  return detail::aligned8(a) && detail::aligned8(b);
}

bool vec_ok(int C, std::initializer_list<const void*> ptrs) {
  if (C % 8 != 0) return false;
  for (const void* p : ptrs)
    if (p && !detail::aligned16(p)) return false;
  return true;
}

void check_norm_shape(int N, int C) {
  TD_CHECK(N >= 0 && C > 0, "bad shape N={} C={}", N, C);
}

}  // namespace

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* x, const bf16* w,
                       const bf16* b, int N, int C, float eps, cudaStream_t stream) {
  check_norm_shape(N, C);
  if (N == 0) return;
  if (vec_ok(C, {out, x, w, b})) {
    layernorm_fwd_kernel<8>
        <<<row_blocks(N), kWarps * 32, 0, stream>>>(out, mean, rstd, x, w, b, N, C, eps);
  } else {
    layernorm_fwd_kernel<1>
        <<<row_blocks(N), kWarps * 32, 0, stream>>>(out, mean, rstd, x, w, b, N, C, eps);
  }
  CUDA_CHECK_LAUNCH();
}

size_t layernorm_backward_scratch_bytes(int N, int C) {
  return detail::colsum_scratch_bytes(N, C, 2);
}

void layernorm_backward(bf16* dx, float* dw, float* db, const bf16* dout, const bf16* x,
                        const bf16* w, const float* mean, const float* rstd, int N, int C,
                        void* scratch, size_t scratch_bytes, cudaStream_t stream, bool accumulate) {
  check_norm_shape(N, C);
  if (N == 0) return;
  if (dx) {
    if (vec_ok(C, {dx, dout, x, w})) {
      layernorm_bwd_dx_kernel<8>
          <<<row_blocks(N), kWarps * 32, 0, stream>>>(dx, dout, x, w, mean, rstd, N, C);
    } else {
      layernorm_bwd_dx_kernel<1>
          <<<row_blocks(N), kWarps * 32, 0, stream>>>(dx, dout, x, w, mean, rstd, N, C);
    }
    CUDA_CHECK_LAUNCH();
  }
  if (dw || db) {
    detail::colsum<2>(dw, db, N, C, scratch, scratch_bytes, "layernorm_backward",
                      LayerNormParamGrad{dout, x, mean, rstd, C}, stream, aligned8(dout, x),
                      accumulate);
  }
}

void rmsnorm_forward(bf16* out, float* rstd, const bf16* x, const bf16* w, int N, int C, float eps,
                     cudaStream_t stream) {
  check_norm_shape(N, C);
  if (N == 0) return;
  if (vec_ok(C, {out, x, w})) {
    rmsnorm_fwd_kernel<8><<<row_blocks(N), kWarps * 32, 0, stream>>>(out, rstd, x, w, N, C, eps);
  } else {
    rmsnorm_fwd_kernel<1><<<row_blocks(N), kWarps * 32, 0, stream>>>(out, rstd, x, w, N, C, eps);
  }
  CUDA_CHECK_LAUNCH();
}

size_t rmsnorm_backward_scratch_bytes(int N, int C) {
  return detail::colsum_scratch_bytes(N, C, 1);
}

void rmsnorm_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w,
                      const float* rstd, int N, int C, void* scratch, size_t scratch_bytes,
                      cudaStream_t stream, bool accumulate) {
  check_norm_shape(N, C);
  if (N == 0) return;
  if (dx) {
    if (vec_ok(C, {dx, dout, x, w})) {
      rmsnorm_bwd_dx_kernel<8>
          <<<row_blocks(N), kWarps * 32, 0, stream>>>(dx, dout, x, w, rstd, N, C);
    } else {
      rmsnorm_bwd_dx_kernel<1>
          <<<row_blocks(N), kWarps * 32, 0, stream>>>(dx, dout, x, w, rstd, N, C);
    }
    CUDA_CHECK_LAUNCH();
  }
  if (dw) {
    detail::colsum<1>(dw, nullptr, N, C, scratch, scratch_bytes, "rmsnorm_backward",
                      RmsNormParamGrad{dout, x, rstd, C}, stream, aligned8(dout, x), accumulate);
  }
}

}  // namespace tandem::cuda
