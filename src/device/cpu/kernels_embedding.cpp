// CPU kernels: token + position embedding lookup and its backward (scatter-add into the
// tables). Parameter gradients are reduced in a fixed row order so results are deterministic.
#include <cstddef>

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
// Channel block of the deterministic column-parallel reductions below.
constexpr int kColBlock = 64;
}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C) {
  TD_CHECK(B >= 0 && T >= 0 && C >= 0, "bad shape B={} T={} C={}", B, T, C);
  const int64_t N = int64_t(B) * T;
  TD_OMP(parallel for if (N * C > 16384))
  for (int64_t i = 0; i < N; ++i) {
    const int t = int(i % T);
    const float* e = wte + int64_t(tokens[i]) * C;
    float* o = out + i * C;
    if (wpe) {
      const float* p = wpe + int64_t(t) * C;
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else {
      for (int c = 0; c < C; ++c) o[c] = e[c];
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C) {
  TD_CHECK(B >= 0 && T >= 0 && C >= 0, "bad shape B={} T={} C={}", B, T, C);
  const int64_t N = int64_t(B) * T;
  if (dwte) {
    // Rows sharing a token collide, so parallelise over channel blocks instead: every thread
    // walks all rows in order for its own channels (fixed summation order per element).
    const int nblocks = (C + kColBlock - 1) / kColBlock;
    TD_OMP(parallel for if (N * C > 16384))
    for (int blk = 0; blk < nblocks; ++blk) {
      const int c0 = blk * kColBlock;
      const int c1 = c0 + kColBlock < C ? c0 + kColBlock : C;
      for (int64_t i = 0; i < N; ++i) {
        float* g = dwte + int64_t(tokens[i]) * C;
        const float* d = dout + i * C;
        for (int c = c0; c < c1; ++c) g[c] += d[c];
      }
    }
  }
  if (dwpe) {
    TD_OMP(parallel for if (N * C > 16384))
    for (int t = 0; t < T; ++t) {
      float* g = dwpe + int64_t(t) * C;
      for (int b = 0; b < B; ++b) {
        const float* d = dout + (int64_t(b) * T + t) * C;
        for (int c = 0; c < C; ++c) g[c] += d[c];
      }
    }
  }
}

}  // namespace tandem::cpu
