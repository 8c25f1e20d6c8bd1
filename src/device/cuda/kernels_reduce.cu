// CUDA reductions: the deterministic column sums behind every parameter-gradient reduction over
// rows ([Column sums] in kernels.cuh) and the sum of squares of the global gradient norm. Both
// use fixed, shape-only partitions and in-order combination, so results are bit-reproducible.
#include <algorithm>

#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace detail {

ColsumPlan colsum_plan(int N) {
  // At most 1024 chunks of at least 128 rows (a multiple of the 8 row phases of pass 1): 16
  // rows per thread keep enough loads in flight, and few chunks keep pass 2 short.
  int rows = std::max(128, (N + 1023) / 1024);
  rows = (rows + 7) / 8 * 8;
  return {rows, std::max(1, (N + rows - 1) / rows)};
}

size_t colsum_scratch_bytes(int N, int C, int nout) {
  if (N <= 0 || C <= 0) return 0;
  return size_t(nout) * size_t(colsum_plan(N).chunks) * size_t(C) * sizeof(float);
}

void check_scratch(const void* scratch, size_t have, size_t needed, const char* op) {
  TD_CHECK(needed == 0 || (scratch != nullptr && have >= needed),
           "{}: scratch of {} bytes at {} is too small, {} bytes needed", op, have, scratch,
           needed);
}

namespace {

// Block (32, 8) per 32 columns of one output: thread (x, y) adds chunks y, y+8, ... of column
// blockIdx.x*32 + x in order, then the 8 phase sums are added in order (a fixed tree, so the
// result depends on the shape only).
__global__ void colsum_finalize_kernel(float* __restrict__ out0, float* __restrict__ out1,
                                       const float* __restrict__ partials, int chunks, int C,
                                       bool accumulate) {
  __shared__ float sm[8][33];
  const int o = blockIdx.y;
  float* out = o == 0 ? out0 : out1;
  if (!out) return;  // the whole block leaves together
  const int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < C) {
    const float* p = partials + int64_t(o) * chunks * C + c;
    for (int k = threadIdx.y; k < chunks; k += 8) s += p[int64_t(k) * C];
  }
  sm[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = 0.0f;
#pragma unroll
    for (int y = 0; y < 8; ++y) t += sm[y][threadIdx.x];
    out[c] = (accumulate ? out[c] : 0.0f) + t;  // never reads out when writing
  }
}

}  // namespace

void colsum_finalize(float* out0, float* out1, const float* partials, int nout, int chunks, int C,
                     cudaStream_t stream, bool accumulate) {
  if (C <= 0 || (!out0 && !out1)) return;
  const dim3 grid(unsigned((C + 31) / 32), unsigned(nout));
  colsum_finalize_kernel<<<grid, dim3(32, 8), 0, stream>>>(out0, out1, partials, chunks, C,
                                                           accumulate);
  CUDA_CHECK_LAUNCH();
}

}  // namespace detail

namespace {

constexpr int kSsqThreads = 256;
constexpr int kSsqMaxBlocks = 1024;

// Blocks of pass 1: a function of n only (never of the GPU), so the partition is fixed.
int ssq_blocks(int64_t n) {
  const int64_t per_block = int64_t(kSsqThreads) * 16;  // >= 16 elements per thread
  return int(std::clamp<int64_t>((n + per_block - 1) / per_block, 1, kSsqMaxBlocks));
}

__device__ double block_sum_double(double v) {
  __shared__ double warp_part[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_part[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) >> 5;
  v = threadIdx.x < nwarps ? warp_part[threadIdx.x] : 0.0;
  if (warp == 0) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  }
  return v;  // valid in thread 0
}

__global__ void ssq_partial_kernel(double* __restrict__ partials, const float* __restrict__ x,
                                   int64_t n) {
  double s = 0.0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double v = x[i];
    s += v * v;
  }
  s = block_sum_double(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void ssq_final_kernel(float* __restrict__ out, const double* __restrict__ partials,
                                 int nparts, bool accumulate) {
  double s = 0.0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += partials[i];
  s = block_sum_double(s);
  if (threadIdx.x == 0) *out = accumulate ? float(double(*out) + s) : float(s);
}

}  // namespace

size_t sum_squares_scratch_bytes(int64_t n) {
  return size_t(ssq_blocks(n)) * sizeof(double);
}

void sum_squares(float* out, const float* x, int64_t n, bool accumulate, void* scratch,
                 size_t scratch_bytes, cudaStream_t stream) {
  TD_CHECK(n >= 0, "bad size n={}", n);
  detail::check_scratch(scratch, scratch_bytes, sum_squares_scratch_bytes(n), "sum_squares");
  const int blocks = ssq_blocks(n);
  double* partials = static_cast<double*>(scratch);
  ssq_partial_kernel<<<blocks, kSsqThreads, 0, stream>>>(partials, x, n);
  CUDA_CHECK_LAUNCH();
  ssq_final_kernel<<<1, kSsqMaxBlocks, 0, stream>>>(out, partials, blocks, accumulate);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::cuda
