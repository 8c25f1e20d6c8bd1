// Shared helpers of the GPU tests (tests/gpu): GPU discovery and skipping, this process's
// GPU under an MPI launcher, and the tiny kernels of gpu_test_kernels.cu.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <string>

namespace tandem::gpu_test {

// GPUs visible to this process (0 without a driver or a GPU).
inline int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

// This process's GPU: its node-local rank under an MPI launcher (one GPU per rank), else 0.
inline int local_gpu() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    const char* value = std::getenv(var);
    if (value != nullptr && *value != '\0') {
      const int n = gpu_count();
      return n > 0 ? std::atoi(value) % n : 0;
    }
  }
  return 0;
}

// Kernels (gpu_test_kernels.cu). Each launches onto `stream` and checks the launch.
// One thread spins on the GPU's global timer for `ms` milliseconds.
void sleep_ms(cudaStream_t stream, double ms);
// p[i] = base + (i % 7) for i < n; bf16 stores the value rounded to nearest even.
void fill_pattern_f32(cudaStream_t stream, float* p, size_t n, float base);
void fill_pattern_bf16(cudaStream_t stream, void* p, size_t n, float base);
// dst[i] = a * src[i] + b.
void axpb_f32(cudaStream_t stream, float* dst, const float* src, size_t n, float a, float b);

}  // namespace tandem::gpu_test

// Skips the current test when no GPU is visible (the GPU tests also build on CI machines).
#define TD_SKIP_WITHOUT_GPU()                                                      \
  do {                                                                             \
    if (::tandem::gpu_test::gpu_count() == 0)                                      \
      GTEST_SKIP() << "no CUDA GPU is visible to this process: skipping GPU test"; \
  } while (0)
