// Learning-rate schedule, clipping factor and the per-parameter AdamW dispatch.
#include "optim/optim.h"

#include <algorithm>
#include <cmath>

#include "device/cpu/kernels.h"

namespace tandem {

float lr_at(const OptimConfig& cfg, int step, int total) {
  if (cfg.warmup > 0 && step < cfg.warmup)
    return cfg.lr * static_cast<float>(step + 1) / static_cast<float>(cfg.warmup);
  const float floor = cfg.lr * cfg.min_lr_ratio;
  const int span = std::max(1, total - cfg.warmup);
  const double progress = std::min(1.0, static_cast<double>(step - cfg.warmup) / span);
  return floor + 0.5f * (cfg.lr - floor) * static_cast<float>(1.0 + std::cos(M_PI * progress));
}

float clip_scale(const OptimConfig& cfg, double grad_norm) {
  if (cfg.grad_clip <= 0) return 1.0f;
  return static_cast<float>(std::min(1.0, cfg.grad_clip / (grad_norm + 1e-6)));
}

void adamw_unit_range(const OptimConfig& cfg, const UnitLayout& unit, int64_t begin, int64_t end,
                      float* p, const float* g, float* m, float* v, float lr, int step,
                      float grad_scale) {
  for (const ParamSpec& ps : unit.params) {
    const int64_t lo = std::max(begin, ps.offset), hi = std::min(end, ps.offset + ps.numel);
    if (lo >= hi) continue;
    const int64_t o = lo - begin;
    cpu::adamw_update(p + o, g + o, m + o, v + o, hi - lo, lr, cfg.beta1, cfg.beta2, cfg.eps,
                      ps.decay ? cfg.weight_decay : 0.0f, step, grad_scale);
  }
}

}  // namespace tandem
