// Error checks for the CUDA runtime and cuBLASLt: a failing call throws tandem::Error carrying
// the call's text, file:line, the rank (core/error.h) and the library's own error name/string.
// CUDA_CHECK_LAUNCH() follows every kernel launch (cudaGetLastError: bad configurations).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

#include "core/error.h"

namespace tandem::cuda::detail {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* call, const char* file, int line) {
  ::tandem::error_throw(
      call, file, line,
      std::string("CUDA error ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

[[noreturn]] inline void throw_cublas(cublasStatus_t s, const char* call, const char* file,
                                      int line) {
  ::tandem::error_throw(call, file, line,
                        std::string("cuBLASLt error ") + cublasLtGetStatusName(s) + ": " +
                            cublasLtGetStatusString(s));
}

}  // namespace tandem::cuda::detail

#define CUDA_CHECK(call)                                                           \
  do {                                                                             \
    const cudaError_t td_cuda_err_ = (call);                                       \
    if (td_cuda_err_ != cudaSuccess)                                               \
      ::tandem::cuda::detail::throw_cuda(td_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define CUBLAS_CHECK(call)                                                            \
  do {                                                                                \
    const cublasStatus_t td_cublas_st_ = (call);                                      \
    if (td_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                       \
      ::tandem::cuda::detail::throw_cublas(td_cublas_st_, #call, __FILE__, __LINE__); \
  } while (0)

// After every kernel launch: reports invalid launch configurations at once (asynchronous
// faults surface at the next synchronising call).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
