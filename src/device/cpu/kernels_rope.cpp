// CPU kernels: rotary position embedding ("rotate half" pairs (i, i + rotary_dim/2) within the
// first rotary_dim channels of each head), in place, and its backward, the transposed (= inverse)
// rotation. Angles are computed in double once per call.
#include <cmath>
#include <vector>

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

// Rotates every (i, i + rotary_dim/2) pair of each head by +angle (sign = 1) or -angle
// (sign = -1); channels [rotary_dim, D) of each head are left alone.
void rope_apply(float* x, int B, int T, int H, int D, int rotary_dim, int row_stride, float theta,
                int pos0, float sign) {
  TD_CHECK(B >= 0 && T >= 0 && H >= 0 && D > 0, "bad shape B={} T={} H={} D={}", B, T, H, D);
  TD_CHECK(rotary_dim > 0 && rotary_dim <= D && rotary_dim % 2 == 0,
           "rope needs an even rotary_dim in (0, D={}], got {}", D, rotary_dim);
  TD_CHECK(row_stride >= int64_t(H) * D, "row_stride {} < H*D = {}", row_stride, int64_t(H) * D);
  TD_CHECK(theta > 0.0f && pos0 >= 0, "bad rope theta={} pos0={}", theta, pos0);
  const int half = rotary_dim / 2;
  // cos/sin table [T, rotary_dim/2] in double precision, rounded once to float.
  std::vector<float> cos_t(size_t(T) * half), sin_t(size_t(T) * half);
  for (int i = 0; i < half; ++i) {
    const double inv_freq = std::pow(double(theta), -2.0 * i / double(rotary_dim));
    for (int t = 0; t < T; ++t) {
      const double a = double(pos0 + int64_t(t)) * inv_freq;
      cos_t[size_t(t) * half + i] = float(std::cos(a));
      sin_t[size_t(t) * half + i] = sign * float(std::sin(a));
    }
  }
  const int64_t rows = int64_t(B) * T;
  TD_OMP(parallel for if (rows * H * rotary_dim > 16384))
  for (int64_t r = 0; r < rows; ++r) {
    const int t = int(r % T);
    const float* cs = cos_t.data() + size_t(t) * half;
    const float* sn = sin_t.data() + size_t(t) * half;
    for (int h = 0; h < H; ++h) {
      float* xh = x + r * row_stride + int64_t(h) * D;
      for (int i = 0; i < half; ++i) {
        const float x1 = xh[i], x2 = xh[i + half];
        xh[i] = x1 * cs[i] - x2 * sn[i];
        xh[i + half] = x1 * sn[i] + x2 * cs[i];
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, int B, int T, int H, int D, int rotary_dim, int row_stride, float theta,
                  int pos0) {
  rope_apply(x, B, T, H, D, rotary_dim, row_stride, theta, pos0, 1.0f);
}

void rope_backward(float* dx, int B, int T, int H, int D, int rotary_dim, int row_stride,
                   float theta, int pos0) {
  // The rotation is orthogonal: its transpose (the gradient map) is the rotation by -angle; the
  // untouched channels have the identity as their gradient map.
  rope_apply(dx, B, T, H, D, rotary_dim, row_stride, theta, pos0, -1.0f);
}

}  // namespace tandem::cpu
