// CPU kernels: softmax cross-entropy over (possibly padded) vocabulary logits: the loss alone,
// and the fused loss + in-place dlogits backward. Log-sum-exp is max-subtracted (stable).
#include <cmath>
#include <limits>

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

// Validates shapes and targets serially (throwing inside a parallel region is not allowed).
void check_ce(const int32_t* targets, int N, int V, int Vp) {
  TD_CHECK(N >= 0 && V > 0 && Vp >= V, "bad cross-entropy shape N={} V={} Vp={}", N, V, Vp);
  for (int i = 0; i < N; ++i) {
    TD_CHECK(targets[i] >= 0 && targets[i] < V, "target {} of row {} outside [0, {})", targets[i],
             i, V);
  }
}

// Row max and sum(exp(x - max)) over the first V columns.
inline void row_stats(const float* x, int V, float* maxv, float* sum) {
  float m = -std::numeric_limits<float>::infinity();
  for (int c = 0; c < V; ++c) m = x[c] > m ? x[c] : m;
  float s = 0.0f;
  for (int c = 0; c < V; ++c) s += std::exp(x[c] - m);
  *maxv = m;
  *sum = s;
}

}  // namespace

void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int N, int V,
                          int Vp) {
  check_ce(targets, N, V, Vp);
  TD_OMP(parallel for if (int64_t(N) * V > 16384))
  for (int i = 0; i < N; ++i) {
    const float* x = logits + int64_t(i) * Vp;
    float m, s;
    row_stats(x, V, &m, &s);
    // -log softmax[target] = log(sum exp(x - m)) - (x[target] - m)
    losses[i] = std::log(s) - (x[targets[i]] - m);
  }
}

void crossentropy_fused_backward(float* logits, float* losses, const int32_t* targets, int N, int V,
                                 int Vp, float dloss) {
  check_ce(targets, N, V, Vp);
  TD_OMP(parallel for if (int64_t(N) * V > 16384))
  for (int i = 0; i < N; ++i) {
    float* x = logits + int64_t(i) * Vp;
    const int tgt = targets[i];
    float m, s;
    row_stats(x, V, &m, &s);
    if (losses) losses[i] = std::log(s) - (x[tgt] - m);
    const float inv = 1.0f / s;
    for (int c = 0; c < V; ++c) x[c] = std::exp(x[c] - m) * inv * dloss;
    x[tgt] -= dloss;
    for (int c = V; c < Vp; ++c) x[c] = 0.0f;
  }
}

}  // namespace tandem::cpu
