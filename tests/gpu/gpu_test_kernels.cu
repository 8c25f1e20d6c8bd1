// The kernels of the GPU tests: a timed spin to delay a stream (so a missing wait would
// read stale data), and fills/affine maps to check what each stream saw.
#include <cuda_bf16.h>

#include "device/cuda/cuda_device.h"
#include "device/cuda/kernels.cuh"
#include "gpu/gpu_test_util.h"

namespace tandem::gpu_test {

namespace {

__global__ void fill_pattern_f32_kernel(float* p, size_t n, float base) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = base + static_cast<float>(i % 7);
}

__global__ void fill_pattern_bf16_kernel(__nv_bfloat16* p, size_t n, float base) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16_rn(base + static_cast<float>(i % 7));
}

__global__ void axpb_f32_kernel(float* dst, const float* src, size_t n, float a, float b) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = a * src[i] + b;
}

unsigned blocks_for(size_t n) {
  const size_t b = (n + 255) / 256;
  return static_cast<unsigned>(b == 0 ? 1 : (b > 1024 ? 1024 : b));
}

}  // namespace

void sleep_ms(cudaStream_t stream, double ms) {
  ::tandem::cuda::sleep_kernel(ms, stream);
}

void fill_pattern_f32(cudaStream_t stream, float* p, size_t n, float base) {
  fill_pattern_f32_kernel<<<blocks_for(n), 256, 0, stream>>>(p, n, base);
  TD_CUDA_CALL(cudaGetLastError());
}

void fill_pattern_bf16(cudaStream_t stream, void* p, size_t n, float base) {
  fill_pattern_bf16_kernel<<<blocks_for(n), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p), n,
                                                              base);
  TD_CUDA_CALL(cudaGetLastError());
}

void axpb_f32(cudaStream_t stream, float* dst, const float* src, size_t n, float a, float b) {
  axpb_f32_kernel<<<blocks_for(n), 256, 0, stream>>>(dst, src, n, a, b);
  TD_CUDA_CALL(cudaGetLastError());
}

}  // namespace tandem::gpu_test
