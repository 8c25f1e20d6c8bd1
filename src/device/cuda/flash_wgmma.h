// The flash attention kernels on Hopper's warpgroup MMA (sm90a/kernels_flash_wgmma.cu), for
// kernels_flash.cu, which checks the shapes and runs the backward's prep. Built only when
// TANDEM_CUDA_ARCH includes 90 (TANDEM_HAVE_SM90A); see [Wgmma layout] and [Wgmma kernels].
#pragma once

#include <cuda_runtime.h>

#include "device/cuda/flash_common.cuh"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

// Whether the current device runs the sm_90a kernels (compute capability 9.0, image loaded).
bool flash_wgmma_device();
// [Wgmma tiles]: keys per tile of the forward, 64 or 128, or 0 for the head size's default
// (checked by the caller).
void flash_wgmma_set_forward_key_tile(int keys);
// [Wgmma dK/dV tiles]: queries per tile of the dK/dV kernel at head size 128, 32 or 64.
void flash_wgmma_set_dkv_query_tile(int queries);
// [Wgmma dQ tiles]: keys per tile of the dQ kernel at head size 128, 64 or 128.
void flash_wgmma_set_dq_key_tile(int keys);
// [Wgmma forward pipeline] (ForwardPipeline in kernels.cuh).
void flash_wgmma_set_forward_pipeline(ForwardPipeline mode);
// [Wgmma TMA forward] (ForwardLoads in kernels.cuh).
void flash_wgmma_set_forward_loads(ForwardLoads loads);
// [Wgmma one-pass backward] (BackwardPasses in kernels.cuh).
void flash_wgmma_set_backward_passes(BackwardPasses passes);
// The one-pass backward's scratch, after the prep's lse2 and dvec: the fp32 dQ accumulator,
// B Hq D fp32 per query, T rounded up to whole 64-query tiles ([Wgmma bulk dQ]).
inline size_t dq_acc_bytes(int B, int T, int Hq, int D) {
  return flash::align256(size_t(B) * Hq * ((T + 63) / 64) * 64 * D * sizeof(float));
}
// As flash_attention_forward, head size 64 or 128.
void flash_wgmma_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int Hq, int Hkv,
                         int D, cudaStream_t stream);
// dK, dV, then dQ into dqkv (written), from the prep's lse2 and dvec; head size 64 or 128.
// dq_scratch: dq_acc_bytes bytes (used by the one-pass backward).
void flash_wgmma_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse2,
                          const float* dvec, int B, int T, int Hq, int Hkv, int D, void* dq_scratch,
                          cudaStream_t stream);

}  // namespace tandem::cuda
