// CPU kernels for the optimizer: the AdamW update (PyTorch formulation, decoupled weight
// decay) and the double-precision sum of squares behind the global gradient norm.
#include <cmath>

#include "core/error.h"
#include "device/cpu/kernels.h"

#ifdef _OPENMP
#define TD_KPRAGMA(...) _Pragma(#__VA_ARGS__)
#define TD_OMP(...) TD_KPRAGMA(omp __VA_ARGS__)
#else
#define TD_OMP(...)
#endif

namespace tandem::cpu {

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int step, float grad_scale) {
  TD_CHECK(n >= 0, "bad size n={}", n);
  TD_CHECK(step >= 1, "AdamW step must be >= 1, got {}", step);
  // Bias corrections in double (beta^step for large step), applied as float factors.
  const float bc1 = float(1.0 - std::pow(double(beta1), step));
  const float rsqrt_bc2 = float(1.0 / std::sqrt(1.0 - std::pow(double(beta2), step)));
  const float step_size = lr / bc1;
  const float decay = 1.0f - lr * weight_decay;
  TD_OMP(parallel for if (n > 16384))
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float pi = p[i] * decay;
    p[i] = pi - step_size * mi / (std::sqrt(vi) * rsqrt_bc2 + eps);
  }
}

double sum_squares(const float* x, int64_t n) {
  TD_CHECK(n >= 0, "bad size n={}", n);
  // Serial and in index order: the result is bit-reproducible (float*float is exact in double).
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

}  // namespace tandem::cpu
