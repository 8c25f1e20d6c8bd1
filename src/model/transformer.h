// Forward and backward of the model's units on CPU, in fp32, composed from the kernels of
// device/cpu. A Workspace holds the activations of one micro-batch shape (B, T).
#pragma once

#include <cstdint>
#include <vector>

#include "model/model.h"

namespace tandem {

// Activations saved for the backward, and the gradient scratch, of one (B, T) shape.
// N = B*T rows; C = d_model; F = d_ff; Q = qkv width; H = n_head.
class Workspace {
 public:
  // storage: bytes_needed(config, B, T) bytes of 64-byte aligned memory the workspace uses
  // (an arena region); null to allocate its own.
  Workspace(const ModelConfig& config, int B, int T, float* storage = nullptr);
  static size_t bytes_needed(const ModelConfig& config, int B, int T);
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  struct Block {
    float* norm1;       // [N, C] normalised input of attention
    float* norm1_mean;  // [N] (LayerNorm only)
    float* norm1_rstd;  // [N]
    float* qkv;         // [N, Q] q,k after rotary embedding (Llama)
    float* att;         // [B, H, T, T] softmax probabilities
    float* atty;        // [N, H*D] attention output before the projection
    float* xmid;        // [N, C] residual after attention
    float* norm2;       // [N, C]
    float* norm2_mean;  // [N]
    float* norm2_rstd;  // [N]
    float* fch;         // [N, F] (GPT-2, before GELU) or [N, 2F] (Llama, gate|up)
    float* act;         // [N, F] GELU or SwiGLU output
  };

  int B, T, N;
  std::vector<float*> residual;  // L+1 entries [N, C]: embedding output, each block output
  std::vector<Block> blocks;
  float* normf;       // [N, C]
  float* normf_mean;  // [N]
  float* normf_rstd;  // [N]
  float* logits;      // [N, Vp]; becomes dlogits in the backward
  float* losses;      // [N]
  // Gradient scratch.
  float* dres;   // [N, C] gradient of the residual stream, updated in place unit by unit
  float* dnorm;  // [N, C]
  float* dfch;   // [N, 2F]
  float* dact;   // [N, F]
  float* datty;  // [N, H*D]
  float* dqkv;   // [N, Q]
  std::vector<int32_t> tokens;   // [N]
  std::vector<int32_t> targets;  // [N]
  size_t bytes() const { return floats_ * sizeof(float); }

 private:
  size_t floats_ = 0;
  std::vector<float> owned_;
};

// Parameter (and gradient) buffers by unit index: params[u] is unit u's gathered flat
// buffer. A unit reads its own buffer and those of ModelLayout::reads(u).
using UnitBuffers = std::vector<float*>;

// Runs unit u forward. The embedding reads ws.tokens; the head writes ws.logits.
void unit_forward(const ModelLayout& model, int u, const UnitBuffers& params, Workspace& ws);
// Runs unit u backward, adding parameter gradients into grads. The head starts the
// backward: it turns the logits into dlogits with the fused cross-entropy (writing
// ws.losses) scaled by dloss, the gradient of the objective with respect to each token's
// loss (1 / tokens per optimizer step for a mean).
void unit_backward(const ModelLayout& model, int u, const UnitBuffers& params,
                   const UnitBuffers& grads, Workspace& ws, float dloss);

// Whole-model helpers for one micro-batch.
void model_forward(const ModelLayout& model, const UnitBuffers& params, Workspace& ws);
void model_backward(const ModelLayout& model, const UnitBuffers& params, const UnitBuffers& grads,
                    Workspace& ws, float dloss);
// Mean cross-entropy of ws.logits against ws.targets (forward only; for evaluation).
double model_loss(const ModelLayout& model, Workspace& ws);

}  // namespace tandem
