// One warpgroup product on the GPU through the wgmma wrappers and swizzled tiles of
// src/device/cuda/sm90a/wgmma.cuh, for test_wgmma.cpp: each operand mode the flash kernels use,
// checked alone against the host. Built only where the tests' architectures include 90
// (TANDEM_TEST_SM90A).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::cuda::wgmma_test {

// c[64][n] = a[64..127][d] b[n][d]^T (fp32): a is a tile of 128 rows whose second half is the
// A operand, both operands K-major in shared memory, k-steps of 16 starting at mid-row offsets
// (n in {32, 64, 128}, d in {64, 128}).
void product_kmajor(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b, int n, int d,
                    cudaStream_t stream);
// c[64][d] = p[64][n] v[n][d] (fp32), p from registers in the accumulator -> A layout (pack_a),
// v the N-major (transposed) B operand (n in {32, 64, 128}, d in {64, 128}).
void product_nmajor(float* c, const __nv_bfloat16* p, const __nv_bfloat16* v, int n, int d,
                    cudaStream_t stream);
// Whether the current device runs this file's sm_90a code.
bool runs_here();

}  // namespace tandem::cuda::wgmma_test
