// AdamW over flat parameter buffers, global gradient-norm clipping, and the learning-rate
// schedule (linear warm-up, then cosine decay to a floor).
#pragma once

#include <cstdint>
#include <vector>

#include "model/model.h"

namespace tandem {

struct OptimConfig {
  float lr = 3e-4f;
  float min_lr_ratio = 0.1f;  // the cosine ends at lr * min_lr_ratio
  int warmup = 0;             // optimizer steps of linear warm-up
  float weight_decay = 0.1f;  // applied to matrices and embeddings only
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float grad_clip = 1.0f;  // global L2 norm; 0 disables clipping
};

// Learning rate of optimizer step `step` (0-based) of a run of `total` steps: warm-up
// lr * (step+1)/warmup, then cosine from lr to lr * min_lr_ratio over the rest.
float lr_at(const OptimConfig& cfg, int step, int total);

// The factor gradients are multiplied by so that their global norm is at most grad_clip
// (PyTorch's clip_grad_norm_: min(1, clip / (norm + 1e-6))).
float clip_scale(const OptimConfig& cfg, double grad_norm);

// One AdamW update of elements [begin, end) of a unit's flat buffer, where p, g, m, v
// point at element `begin`. Weight decay follows each parameter's ParamSpec::decay;
// elements past the unit's parameters (padding) are left alone. step is 1-based.
void adamw_unit_range(const OptimConfig& cfg, const UnitLayout& unit, int64_t begin, int64_t end,
                      float* p, const float* g, float* m, float* v, float lr, int step,
                      float grad_scale);

}  // namespace tandem
