// CPU kernels: LayerNorm and RMSNorm over the last dimension, forward and backward.
// Rows run in parallel; the weight/bias gradients are reduced over rows in a fixed order
// (parallel over channel blocks, serial over rows) so they are deterministic.
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
constexpr int kColBlock = 64;
constexpr int64_t kParallelMin =
    16384;  // below this many elements threads cost more than they save
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int N, int C, float eps) {
  TD_CHECK(N >= 0 && C > 0, "bad shape N={} C={}", N, C);
  TD_OMP(parallel for if (int64_t(N) * C > kParallelMin))
  for (int i = 0; i < N; ++i) {
    const float* xi = x + int64_t(i) * C;
    float* oi = out + int64_t(i) * C;
    float m = 0.0f;
    for (int c = 0; c < C; ++c) m += xi[c];
    m /= float(C);
    float var = 0.0f;  // two-pass variance: no cancellation when the mean is large
    for (int c = 0; c < C; ++c) {
      const float d = xi[c] - m;
      var += d * d;
    }
    var /= float(C);
    const float s = 1.0f / std::sqrt(var + eps);
    for (int c = 0; c < C; ++c) {
      const float n = (xi[c] - m) * s;
      oi[c] = b ? n * w[c] + b[c] : n * w[c];
    }
    if (mean) mean[i] = m;
    if (rstd) rstd[i] = s;
  }
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                        const float* w, const float* mean, const float* rstd, int N, int C) {
  TD_CHECK(N >= 0 && C > 0, "bad shape N={} C={}", N, C);
  [[maybe_unused]] const bool par = int64_t(N) * C > kParallelMin;  // read by TD_OMP
  if (dx) {
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dout * w.
    TD_OMP(parallel for if (par))
    for (int i = 0; i < N; ++i) {
      const float* xi = x + int64_t(i) * C;
      const float* di = dout + int64_t(i) * C;
      float* dxi = dx + int64_t(i) * C;
      const float m = mean[i], s = rstd[i];
      float gmean = 0.0f, gxmean = 0.0f;
      for (int c = 0; c < C; ++c) {
        const float g = di[c] * w[c];
        gmean += g;
        gxmean += g * (xi[c] - m) * s;
      }
      gmean /= float(C);
      gxmean /= float(C);
      for (int c = 0; c < C; ++c) {
        const float xhat = (xi[c] - m) * s;
        dxi[c] += s * (di[c] * w[c] - gmean - xhat * gxmean);
      }
    }
  }
  if (dw || db) {
    const int nblocks = (C + kColBlock - 1) / kColBlock;
    TD_OMP(parallel for if (par))
    for (int blk = 0; blk < nblocks; ++blk) {
      const int c0 = blk * kColBlock;
      const int c1 = c0 + kColBlock < C ? c0 + kColBlock : C;
      for (int i = 0; i < N; ++i) {
        const float* xi = x + int64_t(i) * C;
        const float* di = dout + int64_t(i) * C;
        const float m = mean[i], s = rstd[i];
        for (int c = c0; c < c1; ++c) {
          if (dw) dw[c] += di[c] * (xi[c] - m) * s;
          if (db) db[c] += di[c];
        }
      }
    }
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int N, int C,
                     float eps) {
  TD_CHECK(N >= 0 && C > 0, "bad shape N={} C={}", N, C);
  TD_OMP(parallel for if (int64_t(N) * C > kParallelMin))
  for (int i = 0; i < N; ++i) {
    const float* xi = x + int64_t(i) * C;
    float* oi = out + int64_t(i) * C;
    float ss = 0.0f;
    for (int c = 0; c < C; ++c) ss += xi[c] * xi[c];
    const float s = 1.0f / std::sqrt(ss / float(C) + eps);
    for (int c = 0; c < C; ++c) oi[c] = xi[c] * s * w[c];
    if (rstd) rstd[i] = s;
  }
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int N, int C) {
  TD_CHECK(N >= 0 && C > 0, "bad shape N={} C={}", N, C);
  [[maybe_unused]] const bool par = int64_t(N) * C > kParallelMin;  // read by TD_OMP
  if (dx) {
    // dx = rstd * (g - xhat * mean(g * xhat)) with g = dout * w, xhat = x * rstd.
    TD_OMP(parallel for if (par))
    for (int i = 0; i < N; ++i) {
      const float* xi = x + int64_t(i) * C;
      const float* di = dout + int64_t(i) * C;
      float* dxi = dx + int64_t(i) * C;
      const float s = rstd[i];
      float gxmean = 0.0f;
      for (int c = 0; c < C; ++c) gxmean += di[c] * w[c] * xi[c] * s;
      gxmean /= float(C);
      for (int c = 0; c < C; ++c) dxi[c] += s * (di[c] * w[c] - xi[c] * s * gxmean);
    }
  }
  if (dw) {
    const int nblocks = (C + kColBlock - 1) / kColBlock;
    TD_OMP(parallel for if (par))
    for (int blk = 0; blk < nblocks; ++blk) {
      const int c0 = blk * kColBlock;
      const int c1 = c0 + kColBlock < C ? c0 + kColBlock : C;
      for (int i = 0; i < N; ++i) {
        const float* xi = x + int64_t(i) * C;
        const float* di = dout + int64_t(i) * C;
        const float s = rstd[i];
        for (int c = c0; c < c1; ++c) dw[c] += di[c] * xi[c] * s;
      }
    }
  }
}

}  // namespace tandem::cpu
