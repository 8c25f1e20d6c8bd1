// CPU kernels: causal multi-head self-attention with grouped-query heads over a fused qkv
// buffer, forward (saving the softmax probabilities) and backward.
#include <algorithm>
#include <cmath>
#include <limits>
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
void check_attention_shape(int B, int T, int Hq, int Hkv, int D) {
  TD_CHECK(B >= 0 && T >= 0 && D > 0, "bad attention shape B={} T={} D={}", B, T, D);
  TD_CHECK(Hq > 0 && Hkv > 0 && Hq % Hkv == 0,
           "query heads ({}) must be a positive multiple of kv heads ({})", Hq, Hkv);
}
}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int Hq, int Hkv,
                       int D) {
  check_attention_shape(B, T, Hq, Hkv, D);
  const int group = Hq / Hkv;
  const int64_t S = int64_t(Hq + 2 * Hkv) * D;  // qkv row stride
  const int64_t OS = int64_t(Hq) * D;           // out row stride
  const float scale = 1.0f / std::sqrt(float(D));
  const int BH = B * Hq;
  TD_OMP(parallel for schedule(dynamic, 1) if (int64_t(BH) * T * T * D > 16384))
  for (int bh = 0; bh < BH; ++bh) {
    const int b = bh / Hq, h = bh % Hq, kvh = h / group;
    std::vector<float> scratch(att ? 0 : static_cast<size_t>(T));
    const float* base = qkv + int64_t(b) * T * S;
    const int64_t koff = int64_t(Hq + kvh) * D, voff = int64_t(Hq + Hkv + kvh) * D;
    for (int t = 0; t < T; ++t) {
      const float* q = base + t * S + int64_t(h) * D;
      float* p = att ? att + (int64_t(bh) * T + t) * T : scratch.data();
      // scores and row max (stable softmax)
      float maxv = -std::numeric_limits<float>::infinity();
      for (int t2 = 0; t2 <= t; ++t2) {
        const float* k = base + t2 * S + koff;
        float s = 0.0f;
        for (int d = 0; d < D; ++d) s += q[d] * k[d];
        s *= scale;
        p[t2] = s;
        if (s > maxv) maxv = s;
      }
      float sum = 0.0f;
      for (int t2 = 0; t2 <= t; ++t2) {
        p[t2] = std::exp(p[t2] - maxv);
        sum += p[t2];
      }
      const float inv = 1.0f / sum;
      for (int t2 = 0; t2 <= t; ++t2) p[t2] *= inv;
      if (att) {
        for (int t2 = t + 1; t2 < T; ++t2) p[t2] = 0.0f;
      }
      float* o = out + (int64_t(b) * T + t) * OS + int64_t(h) * D;
      for (int d = 0; d < D; ++d) o[d] = 0.0f;
      for (int t2 = 0; t2 <= t; ++t2) {
        const float* v = base + t2 * S + voff;
        const float a = p[t2];
        for (int d = 0; d < D; ++d) o[d] += a * v[d];
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int Hq, int Hkv, int D) {
  check_attention_shape(B, T, Hq, Hkv, D);
  const int group = Hq / Hkv;
  const int64_t S = int64_t(Hq + 2 * Hkv) * D;
  const int64_t OS = int64_t(Hq) * D;
  const float scale = 1.0f / std::sqrt(float(D));
  // One task per (b, kv head): the query heads of a group write the same dk/dv rows, so they
  // run serially inside the task, in a fixed order (deterministic, no atomics).
  const int BK = B * Hkv;
  TD_OMP(parallel for schedule(dynamic, 1) if (int64_t(B) * Hq * T * T * D > 16384))
  for (int bk = 0; bk < BK; ++bk) {
    const int b = bk / Hkv, kvh = bk % Hkv;
    std::vector<float> datt(static_cast<size_t>(T));
    const float* base = qkv + int64_t(b) * T * S;
    float* dbase = dqkv + int64_t(b) * T * S;
    const int64_t koff = int64_t(Hq + kvh) * D, voff = int64_t(Hq + Hkv + kvh) * D;
    // [Written input gradients] this task's columns (the group's q heads, its k and v) are
    // cleared here, then summed into in a fixed order.
    for (int t = 0; t < T; ++t) {
      float* row = dbase + t * S;
      std::fill(row + int64_t(kvh) * group * D, row + int64_t(kvh + 1) * group * D, 0.0f);
      std::fill(row + koff, row + koff + D, 0.0f);
      std::fill(row + voff, row + voff + D, 0.0f);
    }
    for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
      for (int t = 0; t < T; ++t) {
        const float* p = att + ((int64_t(b) * Hq + h) * T + t) * T;
        const float* dout_t = dout + (int64_t(b) * T + t) * OS + int64_t(h) * D;
        const float* q = base + t * S + int64_t(h) * D;
        float* dq = dbase + t * S + int64_t(h) * D;
        // through out = att @ v: datt = dout . v, dv += att * dout
        float dot = 0.0f;  // sum_t2 att * datt, for the softmax backward
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v = base + t2 * S + voff;
          float* dv = dbase + t2 * S + voff;
          float s = 0.0f;
          for (int d = 0; d < D; ++d) {
            s += dout_t[d] * v[d];
            dv[d] += p[t2] * dout_t[d];
          }
          datt[t2] = s;
          dot += p[t2] * s;
        }
        // through softmax and the scaled scores q.k
        for (int t2 = 0; t2 <= t; ++t2) {
          const float ds = p[t2] * (datt[t2] - dot) * scale;
          const float* k = base + t2 * S + koff;
          float* dk = dbase + t2 * S + koff;
          for (int d = 0; d < D; ++d) {
            dq[d] += ds * k[d];
            dk[d] += ds * q[d];
          }
        }
      }
    }
  }
}

}  // namespace tandem::cpu
