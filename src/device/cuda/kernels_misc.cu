// Small CUDA kernels of the engine: fp32 accumulation of reduced gradient shards (reduced in
// fp32 or bf16), the loss sum in double, and a sleep used to delay producers on purpose.
#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

__global__ void add_f32_kernel(float* __restrict__ out, const float* __restrict__ in, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] += in[i];
}

__global__ void add_bf16_to_f32_kernel(float* __restrict__ out, const bf16* __restrict__ in,
                                       int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] += __bfloat162float(in[i]);
}

constexpr int kSumThreads = 256;

// One block: thread t sums x[t], x[t + 256], ... in double; then thread 0 adds the 256
// partials in order. The order depends on n only.
__global__ void sum_to_double_kernel(double* __restrict__ acc, const float* __restrict__ x, int n) {
  __shared__ double part[kSumThreads];
  double s = 0;
  for (int i = threadIdx.x; i < n; i += kSumThreads) s += double(x[i]);
  part[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int t = 0; t < kSumThreads; ++t) total += part[t];
    *acc += total;
  }
}

__global__ void sleep_kernel_impl(uint64_t ns) {
  uint64_t start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= ns) break;
    __nanosleep(1000);
  }
}

}  // namespace

void add_f32(float* out, const float* in, int64_t n, cudaStream_t stream) {
  TD_CHECK(n >= 0, "bad size n={}", n);
  if (n == 0) return;
  add_f32_kernel<<<detail::grid_for(n, 256, 65535), 256, 0, stream>>>(out, in, n);
  CUDA_CHECK_LAUNCH();
}

void add_bf16_to_f32(float* out, const bf16* in, int64_t n, cudaStream_t stream) {
  TD_CHECK(n >= 0, "bad size n={}", n);
  if (n == 0) return;
  add_bf16_to_f32_kernel<<<detail::grid_for(n, 256, 65535), 256, 0, stream>>>(out, in, n);
  CUDA_CHECK_LAUNCH();
}

void sum_to_double(double* acc, const float* x, int n, cudaStream_t stream) {
  TD_CHECK(n >= 0, "bad size n={}", n);
  if (n == 0) return;
  sum_to_double_kernel<<<1, kSumThreads, 0, stream>>>(acc, x, n);
  CUDA_CHECK_LAUNCH();
}

void sleep_kernel(double ms, cudaStream_t stream) {
  TD_CHECK(ms >= 0 && ms < 1e7, "bad sleep of {} ms", ms);
  if (ms <= 0) return;
  sleep_kernel_impl<<<1, 1, 0, stream>>>(uint64_t(ms * 1e6));
  CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::cuda
