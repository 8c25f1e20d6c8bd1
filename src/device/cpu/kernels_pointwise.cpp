// CPU kernels: elementwise ops (GELU tanh approximation, exact erf GELU, SwiGLU, residual add),
// forward and backward. Every element is independent, so the loops parallelise trivially.
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

namespace {
constexpr int64_t kParallelMin = 16384;
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;    // 1/sqrt(2)
constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // 1/sqrt(2 pi)

inline float sigmoid(float g) {
  return 1.0f / (1.0f + std::exp(-g));
}
}  // namespace

void gelu_forward(float* out, const float* x, int64_t n) {
  TD_CHECK(n >= 0, "bad size n={}", n);
  TD_OMP(parallel for if (n > kParallelMin))
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float u = kGeluS * (xi + kGeluA * xi * xi * xi);
    out[i] = 0.5f * xi * (1.0f + std::tanh(u));
  }
}

void gelu_backward(float* dx, const float* dout, const float* x, int64_t n) {
  TD_CHECK(n >= 0, "bad size n={}", n);
  TD_OMP(parallel for if (n > kParallelMin))
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float u = kGeluS * (xi + kGeluA * xi * xi * xi);
    const float th = std::tanh(u);
    const float du = kGeluS * (1.0f + 3.0f * kGeluA * xi * xi);
    const float grad = 0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * du;
    dx[i] = grad * dout[i];
  }
}

void gelu_erf_forward(float* out, const float* x, int64_t n) {
  TD_CHECK(n >= 0, "bad size n={}", n);
  TD_OMP(parallel for if (n > kParallelMin))
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    out[i] = 0.5f * xi * (1.0f + std::erf(xi * kInvSqrt2));
  }
}

void gelu_erf_backward(float* dx, const float* dout, const float* x, int64_t n) {
  TD_CHECK(n >= 0, "bad size n={}", n);
  TD_OMP(parallel for if (n > kParallelMin))
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    // d/dx [x Phi(x)] = Phi(x) + x phi(x), Phi the standard normal CDF, phi its density.
    const float cdf = 0.5f * (1.0f + std::erf(xi * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * xi * xi);
    dx[i] = (cdf + xi * pdf) * dout[i];
  }
}

void swiglu_forward(float* out, const float* h, int N, int F) {
  TD_CHECK(N >= 0 && F >= 0, "bad shape N={} F={}", N, F);
  TD_OMP(parallel for if (int64_t(N) * F > kParallelMin))
  for (int i = 0; i < N; ++i) {
    const float* gate = h + int64_t(i) * 2 * F;
    const float* up = gate + F;
    float* o = out + int64_t(i) * F;
    for (int j = 0; j < F; ++j) o[j] = gate[j] * sigmoid(gate[j]) * up[j];
  }
}

void swiglu_backward(float* dh, const float* dout, const float* h, int N, int F) {
  TD_CHECK(N >= 0 && F >= 0, "bad shape N={} F={}", N, F);
  TD_OMP(parallel for if (int64_t(N) * F > kParallelMin))
  for (int i = 0; i < N; ++i) {
    const float* gate = h + int64_t(i) * 2 * F;
    const float* up = gate + F;
    const float* d = dout + int64_t(i) * F;
    float* dgate = dh + int64_t(i) * 2 * F;
    float* dup = dgate + F;
    for (int j = 0; j < F; ++j) {
      const float g = gate[j];
      const float sg = sigmoid(g);
      // d silu(g)/dg = sg * (1 + g * (1 - sg))
      dgate[j] = d[j] * up[j] * sg * (1.0f + g * (1.0f - sg));
      dup[j] = d[j] * g * sg;
    }
  }
}

void add_forward(float* out, const float* a, const float* b, int64_t n) {
  TD_CHECK(n >= 0, "bad size n={}", n);
  TD_OMP(parallel for if (n > kParallelMin))
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace tandem::cpu
