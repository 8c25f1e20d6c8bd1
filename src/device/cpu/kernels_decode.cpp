// CPU kernels of decoding with a KV cache: embeddings and rotary embeddings at explicit
// positions, appending to the cache, attention of one query row over the cache, and the
// sampling rule of SamplingParams (device/kernels.h). Scores, softmax and the weighted sum
// run in the order of attention_forward, so a decoded row equals the same row of a full
// recomputation up to the rounding of that order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/gumbel.h"
#include "device/cpu/kernels.h"
#include "device/kernels.h"

#ifdef _OPENMP
#define TD_KPRAGMA(...) _Pragma(#__VA_ARGS__)
#define TD_OMP(...) TD_KPRAGMA(omp __VA_ARGS__)
#else
#define TD_OMP(...)
#endif

namespace tandem::cpu {

void embedding_at(float* out, const int32_t* tokens, const int32_t* pos, const float* wte,
                  const float* wpe, int N, int C) {
  TD_CHECK(N >= 0 && C >= 0, "bad shape N={} C={}", N, C);
  for (int n = 0; n < N; ++n) {
    const float* e = wte + int64_t(tokens[n]) * C;
    float* o = out + int64_t(n) * C;
    if (wpe) {
      const float* p = wpe + int64_t(pos[n]) * C;
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else {
      std::memcpy(o, e, size_t(C) * sizeof(float));
    }
  }
}

void rope_kv_append(float* qkv, float* kcache, float* vcache, const int32_t* slot,
                    const int32_t* pos, int N, int Hq, int Hkv, int D, int rotary_dim, float theta,
                    int P) {
  TD_CHECK(N >= 0 && Hq > 0 && Hkv > 0 && D > 0, "bad shape N={} Hq={} Hkv={} D={}", N, Hq, Hkv, D);
  TD_CHECK(rotary_dim >= 0 && rotary_dim <= D && rotary_dim % 2 == 0,
           "rope needs an even rotary_dim in [0, D={}], got {}", D, rotary_dim);
  const int64_t S = int64_t(Hq + 2 * Hkv) * D;
  const int half = rotary_dim / 2;
  // The angles of rope_forward: theta^(-2i/rotary_dim) in double, cos and sin rounded once.
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i)
    inv_freq[size_t(i)] = std::pow(double(theta), -2.0 * i / double(rotary_dim));
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int n = 0; n < N; ++n) {
    TD_CHECK(pos[n] >= 0 && pos[n] < P, "row {} is at position {}, outside the cache's {}", n,
             pos[n], P);
    float* row = qkv + int64_t(n) * S;
    for (int i = 0; i < half; ++i) {
      const double a = double(pos[n]) * inv_freq[size_t(i)];
      cs[size_t(i)] = float(std::cos(a));
      sn[size_t(i)] = float(std::sin(a));
    }
    for (int h = 0; h < Hq + Hkv; ++h) {
      float* xh = row + int64_t(h) * D;
      for (int i = 0; i < half; ++i) {
        const float x1 = xh[i], x2 = xh[i + half];
        xh[i] = x1 * cs[size_t(i)] - x2 * sn[size_t(i)];
        xh[i + half] = x1 * sn[size_t(i)] + x2 * cs[size_t(i)];
      }
    }
    for (int h = 0; h < Hkv; ++h) {
      const int64_t at = ((int64_t(slot[n]) * Hkv + h) * P + pos[n]) * D;
      std::memcpy(kcache + at, row + int64_t(Hq + h) * D, size_t(D) * sizeof(float));
      std::memcpy(vcache + at, row + int64_t(Hq + Hkv + h) * D, size_t(D) * sizeof(float));
    }
  }
}

void attention_decode(float* out, const float* qkv, const float* kcache, const float* vcache,
                      const int32_t* slot, const int32_t* pos, int N, int Hq, int Hkv, int D,
                      int P) {
  TD_CHECK(Hq > 0 && Hkv > 0 && Hq % Hkv == 0,
           "query heads ({}) must be a positive multiple of kv heads ({})", Hq, Hkv);
  const int group = Hq / Hkv;
  const int64_t S = int64_t(Hq + 2 * Hkv) * D;
  const float scale = 1.0f / std::sqrt(float(D));
  TD_OMP(parallel for schedule(dynamic, 1) if (int64_t(N) * Hq * P * D > 65536))
  for (int nh = 0; nh < N * Hq; ++nh) {
    const int n = nh / Hq, h = nh % Hq, kvh = h / group, len = pos[n] + 1;
    const float* q = qkv + int64_t(n) * S + int64_t(h) * D;
    const int64_t base = (int64_t(slot[n]) * Hkv + kvh) * P * D;
    const float* K = kcache + base;
    const float* V = vcache + base;
    std::vector<float> p(static_cast<size_t>(len));
    float maxv = -std::numeric_limits<float>::infinity();
    for (int t = 0; t < len; ++t) {
      const float* k = K + int64_t(t) * D;
      float s = 0.0f;
      for (int d = 0; d < D; ++d) s += q[d] * k[d];
      s *= scale;
      p[size_t(t)] = s;
      maxv = std::max(maxv, s);
    }
    float sum = 0.0f;
    for (int t = 0; t < len; ++t) {
      p[size_t(t)] = std::exp(p[size_t(t)] - maxv);
      sum += p[size_t(t)];
    }
    const float inv = 1.0f / sum;
    float* o = out + int64_t(n) * Hq * D + int64_t(h) * D;
    for (int d = 0; d < D; ++d) o[d] = 0.0f;
    for (int t = 0; t < len; ++t) {
      const float a = p[size_t(t)] * inv;
      const float* v = V + int64_t(t) * D;
      for (int d = 0; d < D; ++d) o[d] += a * v[d];
    }
  }
}

namespace {

// The k-th largest of z (counting duplicates), k in [1, z.size()].
float kth_largest(std::vector<float> z, int k) {
  std::nth_element(z.begin(), z.begin() + (k - 1), z.end(), std::greater<float>());
  return z[size_t(k - 1)];
}

// The top-p cut over `kept` (the values kept so far, sorted largest first, not empty): the
// smallest value of the smallest set of largest values, taking each value's tokens whole,
// whose mass (renormalised over kept) reaches top_p.
float top_p_cut(const std::vector<float>& kept, float top_p) {
  const float m = kept.front();
  double total = 0;
  for (float v : kept) total += std::exp(double(v) - m);
  double mass = 0;
  for (size_t i = 0; i < kept.size();) {
    size_t j = i;
    while (j < kept.size() && kept[j] == kept[i]) mass += std::exp(double(kept[j++]) - m);
    if (mass >= double(top_p) * total || j == kept.size()) return kept[i];
    i = j;
  }
  return kept.back();
}

// A candidate: (value, global id); id -1 is padding.
struct Candidate {
  float v;
  int32_t id;
};

// a before b: the larger value, then the lower id.
bool before(const Candidate& a, const Candidate& b) {
  return a.v > b.v || (a.v == b.v && a.id < b.id);
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace

int32_t sample_row(const float* x, int V, int row, int position, float temperature, int top_k,
                   float top_p, uint64_t seed) {
  TD_CHECK(V > 0, "sampling from an empty vocabulary");
  if (temperature == 0.0f) return int32_t(std::max_element(x, x + V) - x);
  std::vector<float> z(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) z[size_t(i)] = x[i] / temperature;
  float keep = kNegInf;  // keep i iff z_i >= keep
  if (top_k > 0 && top_k < V) keep = kth_largest(z, top_k);
  if (top_p < 1.0f) {
    std::vector<float> kept;
    for (float v : z)
      if (v >= keep) kept.push_back(v);
    std::sort(kept.begin(), kept.end(), std::greater<float>());
    keep = top_p_cut(kept, top_p);
  }
  const uint64_t key = gumbel_row_key(seed, row, position);
  int32_t best = -1;
  float best_v = kNegInf;
  for (int i = 0; i < V; ++i) {
    if (z[size_t(i)] < keep) continue;
    const float v = z[size_t(i)] + gumbel_noise(key, i);
    if (best < 0 || v > best_v) {
      best = i;
      best_v = v;
    }
  }
  return best;
}

void sample_candidates_row(float* vals, int32_t* ids, int K, const float* x, int V, int id_offset,
                           int row, int position, const SamplingParams& p) {
  TD_CHECK(K == sample_candidates_per_row(p), "sample_candidates: K={} but the rule asks for {}", K,
           sample_candidates_per_row(p));
  std::vector<Candidate> c;
  if (p.temperature == 0.0f || p.top_k == 0) {
    // One candidate: the slice's best logit (greedy) or logit / temperature + noise.
    const uint64_t key = gumbel_row_key(p.seed, row, position);
    Candidate best{kNegInf, -1};
    for (int i = 0; i < V; ++i) {
      if (std::isnan(x[i])) continue;
      const int32_t id = id_offset + i;
      const float v = p.temperature == 0.0f ? x[i] : x[i] / p.temperature + gumbel_noise(key, id);
      if (best.id < 0 || v > best.v) best = Candidate{v, id};
    }
    if (best.id >= 0) c.push_back(best);
  } else {
    // The slice's K largest z, ties to the lower id, handed over in id order.
    for (int i = 0; i < V; ++i)
      if (!std::isnan(x[i])) c.push_back(Candidate{x[i] / p.temperature, id_offset + i});
    if (int(c.size()) > K) {
      std::nth_element(c.begin(), c.begin() + (K - 1), c.end(), before);
      c.resize(size_t(K));
    }
    std::sort(c.begin(), c.end(),
              [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  }
  for (int k = 0; k < K; ++k) {
    const bool real = size_t(k) < c.size();
    vals[k] = real ? c[size_t(k)].v : kNegInf;
    ids[k] = real ? c[size_t(k)].id : -1;
  }
}

int32_t sample_pick_row(const float* vals, const int32_t* ids, int64_t stride, int ranks, int K,
                        int row, int position, const SamplingParams& p) {
  TD_CHECK(sample_split_supported(p), "sample_pick: top_p without top_k is not split");
  std::vector<Candidate> c;
  for (int r = 0; r < ranks; ++r)
    for (int k = 0; k < K; ++k) {
      const int64_t at = r * stride + k;
      if (ids[at] >= 0 && !std::isnan(vals[at])) c.push_back(Candidate{vals[at], ids[at]});
    }
  TD_CHECK(!c.empty(), "sampling from an empty vocabulary");
  if (p.temperature == 0.0f || p.top_k == 0)  // the best of the slices' best
    return std::min_element(c.begin(), c.end(), before)->id;
  // Largest z first, ties by id: the kept sets below are prefixes.
  std::sort(c.begin(), c.end(), before);
  float keep = kNegInf;  // kept: z >= keep
  if (p.top_k < int(c.size())) keep = c[size_t(p.top_k - 1)].v;
  if (p.top_p < 1.0f) {
    std::vector<float> kept;
    for (const Candidate& x : c)
      if (x.v >= keep) kept.push_back(x.v);
    keep = top_p_cut(kept, p.top_p);
  }
  const uint64_t key = gumbel_row_key(p.seed, row, position);
  Candidate best{kNegInf, -1};
  for (const Candidate& x : c) {
    if (x.v < keep) break;
    const Candidate d{x.v + gumbel_noise(key, x.id), x.id};
    if (best.id < 0 || before(d, best)) best = d;
  }
  return best.id;
}

}  // namespace tandem::cpu
