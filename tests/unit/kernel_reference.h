// Shared helpers of the CPU kernel tests: seeded random inputs, the fp32-vs-float64 error model,
// central finite differences, and naive float64 reference implementations of every op (written
// independently of src/device/cpu, straightforward loops only).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace tandem::kref {

// ---------------------------------------------------------------------------------------------
// Error model.
//
// eps32 = 2^-23 ~ 1.19e-7 is the fp32 machine epsilon (unit roundoff u = eps32 / 2). An fp32
// reduction of K terms accumulates one rounding per partial sum; with the rounding errors
// behaving as independent zero-mean variables (Higham & Mary, "A new approach to probabilistic
// rounding error analysis", 2019) its error is, with high probability, about u * sqrt(K) times
// the magnitude of the result (for random-sign terms: sum_k delta_k s_k with |s_k| ~ sqrt(k) a
// gives u a K / sqrt(2) against a result ~ sqrt(K) a; for same-sign terms u sqrt(K/3) relative),
// instead of the worst case K * u. Every op here is at most a few reductions followed by O(1)
// pointwise operations (mul, add, exp, tanh, sqrt, div: each <= 1-2 ulp), so we bound
//
//     max_i |out32_i - out64_i|  <=  c * eps32 * sqrt(K) * S
//
// with K the longest reduction feeding an output, S the magnitude scale of the result (the max
// norm of the float64 reference unless a test states otherwise, e.g. when cancellation makes the
// intermediate terms larger than the result: LayerNorm with a nonzero mean is scaled by
// kappa = 1 + |mean| / std), and c a small constant: a few roundings of O(1) pointwise work plus
// a factor ~4 so that the max over all elements of the high-probability bound (a ~4 sigma event
// for a few hundred elements) still holds. c = 8 for plain reductions, 16 for chains with
// transcendental functions or cancellation (softmax backward, GELU derivative). A real bug (a
// wrong sign, a missing term, an off-by-one) produces errors of order S, i.e. 10^4 to 10^6 times
// larger than these bounds.
//
// Gradients are checked against central finite differences of the float64 reference:
// L(x) = sum_j out_j(x) R_j, dL/dx_i ~ (L(x + h e_i) - L(x - h e_i)) / 2h with h = 1e-6. The
// truncation error is h^2/6 |L'''| ~ 1e-13 and the roundoff error about eps64 * sum_j |out_j R_j|
// / h; fd_grad returns a bound of the latter (8x) which is added to the tolerance. Both are far
// below the fp32 error being measured (eps64 / h ~ 2e-10 vs eps32 ~ 1e-7).
// ---------------------------------------------------------------------------------------------
constexpr double kEps32 = 1.1920928955078125e-7;
constexpr double kEps64 = 2.220446049250313e-16;
constexpr double kFdStep = 1e-6;

inline double fp32_bound(double c, double K, double scale) {
  return c * kEps32 * std::sqrt(std::max(K, 1.0)) * scale;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}
inline double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, std::fabs(double(x)));
  return m;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Uniform in [lo, hi), redrawn if a value lands within 1e-3 of zero (never all zeros; keeps
// relative checks meaningful).
inline std::vector<float> uniform(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) {
    do x = dist(rng);
    while (std::fabs(x) < 1e-3f);
  }
  return v;
}

inline std::vector<float> normal(std::mt19937& rng, size_t n, float mean = 0.0f,
                                 float stddev = 1.0f) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<int32_t> tokens(std::mt19937& rng, size_t n, int V) {
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Compares an fp32 result to the float64 reference: max_i |got_i - ref_i| must be at most
// fp32_bound(c, K, scale) + extra. scale <= 0 means max|ref| (1 if the reference is all zero).
// TANDEM_KERNEL_VERBOSE=1 prints the error as a fraction of the bound.
inline ::testing::AssertionResult near_ref(const std::string& what, const float* got,
                                           const double* ref, size_t n, double c, double K,
                                           double scale = 0.0, double extra = 0.0) {
  if (scale <= 0.0) {
    for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(ref[i]));
    if (scale == 0.0) scale = 1.0;
  }
  const double bound = fp32_bound(c, K, scale) + extra;
  double worst = -1.0;
  size_t wi = 0;
  for (size_t i = 0; i < n; ++i) {
    const double e = std::fabs(double(got[i]) - ref[i]);
    if (!(e <= worst)) {  // also catches NaN
      worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
      wi = i;
    }
  }
  if (std::getenv("TANDEM_KERNEL_VERBOSE")) {
    std::printf("  %-28s n=%-5zu K=%-6g max err %.3e  bound %.3e  (%.3f of bound)\n", what.c_str(),
                n, K, worst, bound, worst > 0.0 ? worst / bound : 0.0);
  }
  if (worst <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": max |err| " << worst << " at [" << wi << "] (got " << got[wi] << ", ref "
         << ref[wi] << ") exceeds bound " << bound << " = " << c << " eps32 sqrt(" << K << ") * "
         << scale << " + " << extra;
}
inline ::testing::AssertionResult near_ref(const std::string& what, const std::vector<float>& got,
                                           const std::vector<double>& ref, double c, double K,
                                           double scale = 0.0, double extra = 0.0) {
  if (got.size() != ref.size()) return ::testing::AssertionFailure() << what << ": size mismatch";
  return near_ref(what, got.data(), ref.data(), got.size(), c, K, scale, extra);
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Gradient of L = sum(fwd() * R) with respect to x by central differences; fwd() must read x
// (e.g. capture it by reference). *roundoff receives a bound on the finite-difference roundoff.
template <class Fwd>
std::vector<double> fd_grad(std::vector<double>& x, const std::vector<double>& R, Fwd&& fwd,
                            double* roundoff = nullptr) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double save = x[i];
    const double xp = save + kFdStep, xm = save - kFdStep;
    x[i] = xp;
    const double lp = dot(fwd(), R);
    x[i] = xm;
    const double lm = dot(fwd(), R);
    x[i] = save;
    g[i] = (lp - lm) / (xp - xm);
  }
  if (roundoff) {
    const std::vector<double> out = fwd();
    double s = 0.0;
    for (size_t j = 0; j < out.size(); ++j) s += std::fabs(out[j] * R[j]);
    *roundoff = 8.0 * kEps64 * (s + 1.0) / kFdStep;
  }
  return g;
}

// fd_grad restricted to the indices idx (for shapes too large for a full sweep); returns the
// gradient at idx[0], idx[1], ...
template <class Fwd>
std::vector<double> fd_grad_at(std::vector<double>& x, const std::vector<double>& R,
                               const std::vector<size_t>& idx, Fwd&& fwd,
                               double* roundoff = nullptr) {
  std::vector<double> g(idx.size());
  for (size_t j = 0; j < idx.size(); ++j) {
    const size_t i = idx[j];
    const double save = x[i];
    const double xp = save + kFdStep, xm = save - kFdStep;
    x[i] = xp;
    const double lp = dot(fwd(), R);
    x[i] = xm;
    const double lm = dot(fwd(), R);
    x[i] = save;
    g[j] = (lp - lm) / (xp - xm);
  }
  if (roundoff) {
    const std::vector<double> out = fwd();
    double s = 0.0;
    for (size_t j = 0; j < out.size(); ++j) s += std::fabs(out[j] * R[j]);
    *roundoff = 8.0 * kEps64 * (s + 1.0) / kFdStep;
  }
  return g;
}

// count distinct random indices in [0, n), sorted, always including 0 and n - 1.
inline std::vector<size_t> sample_indices(std::mt19937& rng, size_t n, size_t count) {
  std::vector<size_t> idx{0, n - 1};
  std::uniform_int_distribution<size_t> dist(0, n - 1);
  while (idx.size() < std::min(count, n)) {
    const size_t i = dist(rng);
    if (std::find(idx.begin(), idx.end(), i) == idx.end()) idx.push_back(i);
  }
  std::sort(idx.begin(), idx.end());
  return idx;
}

template <class Vec>
Vec gather(const Vec& v, const std::vector<size_t>& idx) {
  Vec r(idx.size());
  for (size_t j = 0; j < idx.size(); ++j) r[j] = v[idx[j]];
  return r;
}

// Elementwise a + b (expected value of an accumulating backward pre-filled with a).
inline std::vector<double> plus(const std::vector<float>& a, const std::vector<double>& b) {
  std::vector<double> r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = double(a[i]) + b[i];
  return r;
}

// ---------------------------------------------------------------------------------------------
// Float64 references.
// ---------------------------------------------------------------------------------------------
using VD = std::vector<double>;

inline VD embedding(const std::vector<int32_t>& tok, const VD& wte, const VD* wpe, int B, int T,
                    int C) {
  VD out(size_t(B) * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        double v = wte[size_t(tok[b * T + t]) * C + c];
        if (wpe) v += (*wpe)[size_t(t) * C + c];
        out[(size_t(b) * T + t) * C + c] = v;
      }
  return out;
}

inline VD layernorm(const VD& x, const VD& w, const VD* bias, int N, int C, double eps,
                    VD* mean = nullptr, VD* rstd = nullptr) {
  VD out(x.size());
  if (mean) mean->assign(N, 0.0);
  if (rstd) rstd->assign(N, 0.0);
  for (int i = 0; i < N; ++i) {
    double mu = 0.0;
    for (int c = 0; c < C; ++c) mu += x[size_t(i) * C + c];
    mu /= C;
    double var = 0.0;
    for (int c = 0; c < C; ++c) var += (x[size_t(i) * C + c] - mu) * (x[size_t(i) * C + c] - mu);
    var /= C;
    const double r = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < C; ++c) {
      const size_t k = size_t(i) * C + c;
      out[k] = (x[k] - mu) * r * w[c] + (bias ? (*bias)[c] : 0.0);
    }
    if (mean) (*mean)[i] = mu;
    if (rstd) (*rstd)[i] = r;
  }
  return out;
}

inline VD rmsnorm(const VD& x, const VD& w, int N, int C, double eps, VD* rstd = nullptr) {
  VD out(x.size());
  if (rstd) rstd->assign(N, 0.0);
  for (int i = 0; i < N; ++i) {
    double ms = 0.0;
    for (int c = 0; c < C; ++c) ms += x[size_t(i) * C + c] * x[size_t(i) * C + c];
    const double r = 1.0 / std::sqrt(ms / C + eps);
    for (int c = 0; c < C; ++c) out[size_t(i) * C + c] = x[size_t(i) * C + c] * r * w[c];
    if (rstd) (*rstd)[i] = r;
  }
  return out;
}

// x[N, IC], w[OC, IC], bias[OC] or null -> out[N, OC]
inline VD matmul(const VD& x, const VD& w, const VD* bias, int N, int IC, int OC) {
  VD out(size_t(N) * OC);
  for (int i = 0; i < N; ++i)
    for (int o = 0; o < OC; ++o) {
      double s = bias ? (*bias)[o] : 0.0;
      for (int k = 0; k < IC; ++k) s += x[size_t(i) * IC + k] * w[size_t(o) * IC + k];
      out[size_t(i) * OC + o] = s;
    }
  return out;
}

inline VD gelu(const VD& x) {
  const double pi = 3.14159265358979323846;
  VD out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    out[i] = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (v + 0.044715 * v * v * v)));
  }
  return out;
}

inline VD swiglu(const VD& h, int N, int F) {
  VD out(size_t(N) * F);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < F; ++j) {
      const double g = h[size_t(i) * 2 * F + j], u = h[size_t(i) * 2 * F + F + j];
      out[size_t(i) * F + j] = g / (1.0 + std::exp(-g)) * u;
    }
  return out;
}

// Returns a rotated copy of x (rows row_stride apart, first H heads of D channels rotated).
inline VD rope(const VD& x, int B, int T, int H, int D, int row_stride, double theta, int pos0) {
  VD out = x;
  const int half = D / 2;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < half; ++i) {
          const double freq = std::exp(-(2.0 * i / D) * std::log(theta));
          const double a = (pos0 + t) * freq;
          const size_t base = (size_t(b) * T + t) * row_stride + size_t(h) * D;
          const double x1 = x[base + i], x2 = x[base + i + half];
          out[base + i] = x1 * std::cos(a) - x2 * std::sin(a);
          out[base + i + half] = x1 * std::sin(a) + x2 * std::cos(a);
        }
  return out;
}

// Causal GQA attention on qkv[B, T, (Hq + 2 Hkv) D] -> out[B, T, Hq D]; att[B, Hq, T, T].
inline VD attention(const VD& qkv, int B, int T, int Hq, int Hkv, int D, VD* att = nullptr) {
  const size_t S = size_t(Hq + 2 * Hkv) * D;
  VD out(size_t(B) * T * Hq * D, 0.0);
  if (att) att->assign(size_t(B) * Hq * T * T, 0.0);
  std::vector<double> p(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h) {
      const int kvh = h / (Hq / Hkv);
      for (int t = 0; t < T; ++t) {
        const double* q = &qkv[(size_t(b) * T + t) * S + size_t(h) * D];
        double mx = -1e300;
        for (int u = 0; u <= t; ++u) {
          const double* k = &qkv[(size_t(b) * T + u) * S + size_t(Hq + kvh) * D];
          double s = 0.0;
          for (int d = 0; d < D; ++d) s += q[d] * k[d];
          p[u] = s / std::sqrt(double(D));
          mx = std::max(mx, p[u]);
        }
        double z = 0.0;
        for (int u = 0; u <= t; ++u) z += std::exp(p[u] - mx);
        for (int u = 0; u <= t; ++u) {
          const double a = std::exp(p[u] - mx) / z;
          if (att) (*att)[((size_t(b) * Hq + h) * T + t) * T + u] = a;
          const double* v = &qkv[(size_t(b) * T + u) * S + size_t(Hq + Hkv + kvh) * D];
          for (int d = 0; d < D; ++d)
            out[(size_t(b) * T + t) * Hq * D + size_t(h) * D + d] += a * v[d];
        }
      }
    }
  return out;
}

// -log softmax(logits[i, :V])[target[i]] for logits[N, Vp].
inline VD crossentropy(const VD& logits, const std::vector<int32_t>& tgt, int N, int V, int Vp) {
  VD out(N);
  for (int i = 0; i < N; ++i) {
    const double* x = &logits[size_t(i) * Vp];
    double mx = x[0];
    for (int c = 1; c < V; ++c) mx = std::max(mx, x[c]);
    double z = 0.0;
    for (int c = 0; c < V; ++c) z += std::exp(x[c] - mx);
    out[i] = mx + std::log(z) - x[tgt[i]];
  }
  return out;
}

// One AdamW step in float64, in place (PyTorch formulation).
inline void adamw(VD& p, const VD& g, VD& m, VD& v, double lr, double b1, double b2, double eps,
                  double wd, int step, double grad_scale) {
  const double bc1 = 1.0 - std::pow(b1, step), bc2 = 1.0 - std::pow(b2, step);
  for (size_t i = 0; i < p.size(); ++i) {
    const double gi = g[i] * grad_scale;
    m[i] = b1 * m[i] + (1.0 - b1) * gi;
    v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
    p[i] *= 1.0 - lr * wd;
    p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
  }
}

}  // namespace tandem::kref
