// Forward and backward of the model's units on one GPU: the same composition as the CPU's
// model/transformer.cpp, from the bf16 kernels of device/cuda/kernels.cuh. Activations,
// gathered parameters and activation gradients are bf16; normalisation statistics, losses
// and parameter gradients fp32. Every call only enqueues work on the given stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "device/cuda/kernels.cuh"
#include "model/model.h"

namespace tandem::cuda {

// Activations saved for the backward, gradient scratch and kernel scratch of one (B, T)
// shape, carved from one block of device memory (an arena region). N = B*T rows.
class CudaWorkspace {
 public:
  // storage: bytes_needed(config, B, T) bytes of 256-byte aligned device memory.
  CudaWorkspace(const ModelConfig& config, int B, int T, void* storage);
  static size_t bytes_needed(const ModelConfig& config, int B, int T);

  struct Block {
    bf16* norm1;        // [N, C]
    float* norm1_mean;  // [N] (LayerNorm only)
    float* norm1_rstd;  // [N]
    bf16* qkv;          // [N, Q] (q, k after rotary embedding for Llama)
    bf16* att;          // [B, H, T, T] softmax probabilities (GEMM attention), else null
    float* lse;         // [B, H, T] log-sum-exp (flash attention), else null
    bf16* atty;         // [N, H*D]
    bf16* xmid;         // [N, C]
    bf16* norm2;        // [N, C]
    float* norm2_mean;  // [N]
    float* norm2_rstd;  // [N]
    bf16* fch;          // [N, F] pre-GELU (GPT-2) or [N, 2F] gate|up (Llama)
    bf16* act;          // [N, F]
  };

  int B = 0, T = 0, N = 0;
  std::vector<bf16*> residual;  // L+1 entries [N, C]
  std::vector<Block> blocks;
  bf16* normf = nullptr;
  float* normf_mean = nullptr;
  float* normf_rstd = nullptr;
  bf16* logits = nullptr;      // [N, Vp]; dlogits in the backward
  float* losses = nullptr;     // [N]
  bf16* dres = nullptr;        // [N, C]
  bf16* dnorm = nullptr;       // [N, C]
  bf16* dfch = nullptr;        // [N, 2F]
  bf16* dact = nullptr;        // [N, F]
  bf16* datty = nullptr;       // [N, H*D]
  bf16* dqkv = nullptr;        // [N, Q]
  int32_t* tokens = nullptr;   // [N] device
  int32_t* targets = nullptr;  // [N] device
  void* scratch = nullptr;     // kernel scratch, enough for every kernel of this shape
  size_t scratch_bytes = 0;

 private:
  // Assigns the pointers from base (or only counts when base is null); returns the bytes.
  size_t carve(const ModelConfig& c, char* base);
};

// Unit u forward: params[v] is unit v's gathered bf16 flat buffer. The embedding reads
// ws.tokens, the head writes ws.logits.
void unit_forward(MatmulContext& ctx, const ModelLayout& model, int u,
                  const std::vector<const bf16*>& params, CudaWorkspace& ws, cudaStream_t stream);
// Unit u backward, adding fp32 parameter gradients into grads[v] (unit v's unsharded flat
// gradient buffer). The head starts it: fused cross-entropy (losses into ws.losses) scaled
// by dloss.
void unit_backward(MatmulContext& ctx, const ModelLayout& model, int u,
                   const std::vector<const bf16*>& params, const std::vector<float*>& grads,
                   CudaWorkspace& ws, float dloss, cudaStream_t stream);

}  // namespace tandem::cuda
