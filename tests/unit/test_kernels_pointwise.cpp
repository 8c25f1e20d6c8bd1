// Tests of the CPU elementwise and embedding kernels (embedding, GELU tanh and erf, SwiGLU, add,
// full and partial RoPE) against float64 references and central finite differences of them; see
// kernel_reference.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "device/cpu/kernels.h"
#include "kernel_reference.h"

namespace tandem {
namespace {

using kref::near_ref;
using kref::to_double;

// Float64 references of the GPT-NeoX ops (independent of src/device/cpu: the textbook formulas).
constexpr double kPi = 3.14159265358979323846;

// Exact GELU x Phi(x) with Phi(x) = (1 + erf(x / sqrt(2))) / 2.
kref::VD gelu_erf_ref(const kref::VD& x) {
  kref::VD out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = 0.5 * x[i] * (1.0 + std::erf(x[i] / std::sqrt(2.0)));
  return out;
}

// Its derivative Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
kref::VD gelu_erf_grad_ref(const kref::VD& x) {
  kref::VD g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    g[i] = 0.5 * (1.0 + std::erf(v / std::sqrt(2.0))) +
           v * std::exp(-0.5 * v * v) / std::sqrt(2.0 * kPi);
  }
  return g;
}

// Partial rotary embedding as Hugging Face's GPT-NeoX computes it: inv_freq[i] =
// 1 / theta^(2i / rd) for i < rd/2, cos/sin = cat(freqs, freqs), and
// out[:rd] = x[:rd] cos + rotate_half(x[:rd]) sin with rotate_half(v) = cat(-v[rd/2:], v[:rd/2]);
// out[rd:] = x[rd:]. Applied to the first H heads of D channels of rows row_stride apart.
kref::VD rope_partial_ref(const kref::VD& x, int B, int T, int H, int D, int rd, int row_stride,
                          double theta, int pos0) {
  kref::VD out = x;
  const int half = rd / 2;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const size_t base = (size_t(b) * T + t) * row_stride + size_t(h) * D;
        for (int j = 0; j < rd; ++j) {
          const int i = j % half;  // cat(freqs, freqs)
          const double a = double(pos0 + t) / std::pow(theta, 2.0 * i / rd);
          const double rot = j < half ? -x[base + j + half] : x[base + j - half];
          out[base + j] = x[base + j] * std::cos(a) + rot * std::sin(a);
        }
      }
  return out;
}

TEST(Kernels, EmbeddingForward) {
  std::mt19937 rng(301);
  const int B = 2, T = 7, C = 13, V = 5;
  const auto tok = kref::tokens(rng, size_t(B) * T, V);
  const auto wte = kref::uniform(rng, size_t(V) * C);
  const auto wpe = kref::uniform(rng, size_t(T) * C);
  std::vector<float> out(size_t(B) * T * C);
  cpu::embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  const auto wped = to_double(wpe);
  // one addition per element: a single rounding, |err| <= u |out| = eps32 / 2 |out|.
  EXPECT_TRUE(near_ref("out", out, kref::embedding(tok, to_double(wte), &wped, B, T, C), 0.5, 1));
  cpu::embedding_forward(out.data(), tok.data(), wte.data(), nullptr, B, T, C);
  // without positions it is a copy: exact.
  EXPECT_TRUE(
      near_ref("out (no wpe)", out, kref::embedding(tok, to_double(wte), nullptr, B, T, C), 0, 1));
}

TEST(Kernels, EmbeddingBackward) {
  std::mt19937 rng(302);
  const int B = 2, T = 7, C = 13, V = 5;  // V < B*T: tokens repeat, rows collide in dwte
  const auto tok = kref::tokens(rng, size_t(B) * T, V);
  const auto wte = kref::uniform(rng, size_t(V) * C);
  const auto wpe = kref::uniform(rng, size_t(T) * C);
  const auto R = kref::uniform(rng, size_t(B) * T * C);
  std::vector<float> dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
  cpu::embedding_backward(dwte.data(), dwpe.data(), R.data(), tok.data(), B, T, C);
  auto wted = to_double(wte), wped = to_double(wpe);
  const auto Rd = to_double(R);
  auto fwd = [&] { return kref::embedding(tok, wted, &wped, B, T, C); };
  double f1, f2;
  const auto g_wte = kref::fd_grad(wted, Rd, fwd, &f1);
  const auto g_wpe = kref::fd_grad(wped, Rd, fwd, &f2);
  // sums of up to B*T rows (dwte) or B rows (dwpe): c = 8.
  EXPECT_TRUE(near_ref("dwte", dwte, g_wte, 8, B * T, 0, f1));
  EXPECT_TRUE(near_ref("dwpe", dwpe, g_wpe, 8, B, 0, f2));

  auto a0 = kref::uniform(rng, wte.size()), b0 = kref::uniform(rng, wpe.size());
  auto a1 = a0, b1 = b0;
  cpu::embedding_backward(a1.data(), b1.data(), R.data(), tok.data(), B, T, C);
  EXPECT_TRUE(near_ref("dwte accum", a1, kref::plus(a0, g_wte), 8, B * T + 1,
                       kref::max_abs(g_wte) + kref::max_abs(a0), f1));
  EXPECT_TRUE(near_ref("dwpe accum", b1, kref::plus(b0, g_wpe), 8, B + 1,
                       kref::max_abs(g_wpe) + kref::max_abs(b0), f2));

  std::vector<float> a2(wte.size(), 0.0f);
  cpu::embedding_backward(a2.data(), nullptr, R.data(), tok.data(), B, T, C);
  EXPECT_EQ(a2, dwte);
  std::vector<float> b2(wpe.size(), 0.0f);
  cpu::embedding_backward(nullptr, b2.data(), R.data(), tok.data(), B, T, C);
  EXPECT_EQ(b2, dwpe);
}

// Many rows, wide rows (several channel blocks, threaded path), few tokens: deterministic and
// equal to a serial float64 scatter-add.
TEST(Kernels, EmbeddingBackwardLarge) {
  std::mt19937 rng(303);
  const int B = 4, T = 50, C = 200, V = 3;
  const auto tok = kref::tokens(rng, size_t(B) * T, V);
  const auto R = kref::uniform(rng, size_t(B) * T * C);
  std::vector<float> dwte(size_t(V) * C, 0.0f), dwpe(size_t(T) * C, 0.0f);
  cpu::embedding_backward(dwte.data(), dwpe.data(), R.data(), tok.data(), B, T, C);
  kref::VD ref(dwte.size(), 0.0);
  for (int i = 0; i < B * T; ++i)
    for (int c = 0; c < C; ++c) ref[size_t(tok[i]) * C + c] += R[size_t(i) * C + c];
  // a sum of ~B*T/V random-sign terms of magnitude <= 1: scale sqrt(B*T/(3V)).
  EXPECT_TRUE(near_ref("dwte", dwte, ref, 8, B * T, std::sqrt(B * T / (3.0 * V))));
  std::vector<float> again(dwte.size(), 0.0f);
  cpu::embedding_backward(again.data(), nullptr, R.data(), tok.data(), B, T, C);
  EXPECT_EQ(again, dwte);
}

TEST(Kernels, GeluForward) {
  std::mt19937 rng(311);
  const auto x = kref::uniform(rng, 1001, -5.0f, 5.0f);
  std::vector<float> out(x.size());
  cpu::gelu_forward(out.data(), x.data(), int64_t(x.size()));
  // pointwise chain of ~8 roundings (x^3, fma-like terms, tanh <= 2 ulp, products): c = 8.
  EXPECT_TRUE(near_ref("out", out, kref::gelu(to_double(x)), 8, 1));
  // in place (out aliases x)
  auto y = x;
  cpu::gelu_forward(y.data(), y.data(), int64_t(y.size()));
  EXPECT_EQ(y, out);
}

TEST(Kernels, GeluBackward) {
  std::mt19937 rng(312);
  const auto x = kref::uniform(rng, 301, -5.0f, 5.0f);
  const auto R = kref::uniform(rng, x.size());
  std::vector<float> dx(x.size(), 0.0f);
  cpu::gelu_backward(dx.data(), R.data(), x.data(), int64_t(x.size()));
  auto xd = to_double(x);
  double f;
  const auto g = kref::fd_grad(
      xd, to_double(R), [&] { return kref::gelu(xd); }, &f);
  // the derivative chain is ~12 roundings including 1 - tanh^2 (cancellation near |u| large,
  // where the term is multiplied by ~0 anyway): c = 16.
  EXPECT_TRUE(near_ref("dx", dx, g, 16, 1, 0, f));
  // [Written input gradients]: what the buffer held is neither read nor kept.
  std::vector<float> d1(x.size(), std::numeric_limits<float>::quiet_NaN());
  cpu::gelu_backward(d1.data(), R.data(), x.data(), int64_t(x.size()));
  EXPECT_EQ(d1, dx);
}

TEST(Kernels, GeluErfForward) {
  std::mt19937 rng(313);
  const auto x = kref::uniform(rng, 1001, -6.0f, 6.0f);
  std::vector<float> out(x.size());
  cpu::gelu_erf_forward(out.data(), x.data(), int64_t(x.size()));
  // pointwise chain of ~5 roundings (x / sqrt(2), erf <= 2 ulp, 1 + erf, two products): c = 8.
  EXPECT_TRUE(near_ref("out", out, gelu_erf_ref(to_double(x)), 8, 1));
  // in place (out aliases x)
  auto y = x;
  cpu::gelu_erf_forward(y.data(), y.data(), int64_t(y.size()));
  EXPECT_EQ(y, out);
  // the exact GELU is not the tanh approximation: they differ by up to ~2e-4 near |x| ~ 2, far
  // above the fp32 bound, so a kernel computing the wrong one fails the check above.
  std::vector<float> tanh_out(x.size());
  cpu::gelu_forward(tanh_out.data(), x.data(), int64_t(x.size()));
  EXPECT_FALSE(near_ref("tanh out vs erf ref", tanh_out, gelu_erf_ref(to_double(x)), 8, 1));
  // fixed points: gelu(0) = 0, gelu(x) -> x for large x and -> 0 for very negative x
  const std::vector<float> edge{0.0f, 10.0f, -10.0f, 30.0f, -30.0f};
  std::vector<float> e(edge.size());
  cpu::gelu_erf_forward(e.data(), edge.data(), int64_t(edge.size()));
  EXPECT_EQ(e[0], 0.0f);
  EXPECT_EQ(e[1], 10.0f);
  EXPECT_EQ(e[3], 30.0f);
  EXPECT_LE(std::fabs(e[2]), 1e-20f);
  EXPECT_LE(std::fabs(e[4]), 1e-20f);
  cpu::gelu_erf_forward(nullptr, nullptr, 0);  // empty: a no-op
  EXPECT_THROW(cpu::gelu_erf_forward(out.data(), x.data(), -1), Error);
}

TEST(Kernels, GeluErfBackward) {
  std::mt19937 rng(314);
  const auto x = kref::uniform(rng, 301, -6.0f, 6.0f);
  const auto R = kref::uniform(rng, x.size());
  std::vector<float> dx(x.size(), 0.0f);
  cpu::gelu_erf_backward(dx.data(), R.data(), x.data(), int64_t(x.size()));
  auto xd = to_double(x);
  double f;
  const auto g = kref::fd_grad(
      xd, to_double(R), [&] { return gelu_erf_ref(xd); }, &f);
  // erf and exp (<= 2 ulp each), a square, ~6 products and sums, then the product with dout:
  // c = 16.
  EXPECT_TRUE(near_ref("dx vs finite differences", dx, g, 16, 1, 0, f));
  // against the analytic float64 derivative, times dout
  kref::VD ga = gelu_erf_grad_ref(xd);
  for (size_t i = 0; i < ga.size(); ++i) ga[i] *= double(R[i]);
  EXPECT_TRUE(near_ref("dx vs analytic", dx, ga, 16, 1));
  // written over, not added into ([Written input gradients])
  std::vector<float> d1(x.size(), std::numeric_limits<float>::quiet_NaN());
  cpu::gelu_erf_backward(d1.data(), R.data(), x.data(), int64_t(x.size()));
  EXPECT_EQ(d1, dx);
  EXPECT_THROW(cpu::gelu_erf_backward(dx.data(), R.data(), x.data(), -1), Error);
}

TEST(Kernels, SwigluForward) {
  std::mt19937 rng(321);
  for (auto [N, F] : {std::pair{7, 13}, std::pair{1, 1}, std::pair{20, 999}}) {
    SCOPED_TRACE(testing::Message() << "N=" << N << " F=" << F);
    const auto h = kref::uniform(rng, size_t(N) * 2 * F, -4.0f, 4.0f);
    std::vector<float> out(size_t(N) * F);
    cpu::swiglu_forward(out.data(), h.data(), N, F);
    // exp, add, div, two products: c = 8.
    EXPECT_TRUE(near_ref("out", out, kref::swiglu(to_double(h), N, F), 8, 1));
  }
}

TEST(Kernels, SwigluBackward) {
  std::mt19937 rng(322);
  const int N = 7, F = 13;
  const auto h = kref::uniform(rng, size_t(N) * 2 * F, -4.0f, 4.0f);
  const auto R = kref::uniform(rng, size_t(N) * F);
  std::vector<float> dh(h.size(), 0.0f);
  cpu::swiglu_backward(dh.data(), R.data(), h.data(), N, F);
  auto hd = to_double(h);
  double f;
  const auto g = kref::fd_grad(
      hd, to_double(R), [&] { return kref::swiglu(hd, N, F); }, &f);
  EXPECT_TRUE(near_ref("dh", dh, g, 16, 1, 0, f));
  // [Written input gradients]: the gate and up halves are both written.
  std::vector<float> d1(h.size(), std::numeric_limits<float>::quiet_NaN());
  cpu::swiglu_backward(d1.data(), R.data(), h.data(), N, F);
  EXPECT_EQ(d1, dh);
}

TEST(Kernels, AddForward) {
  std::mt19937 rng(331);
  const auto a = kref::uniform(rng, 1003), b = kref::uniform(rng, 1003);
  kref::VD ref(a.size());
  for (size_t i = 0; i < a.size(); ++i) ref[i] = double(a[i]) + double(b[i]);
  std::vector<float> out(a.size());
  cpu::add_forward(out.data(), a.data(), b.data(), int64_t(a.size()));
  // a single rounding: |err| <= u |out|.
  EXPECT_TRUE(near_ref("out", out, ref, 0.5, 1));
  auto a2 = a, b2 = b;
  cpu::add_forward(a2.data(), a2.data(), b.data(), int64_t(a.size()));  // out aliases a
  cpu::add_forward(b2.data(), a.data(), b2.data(), int64_t(a.size()));  // out aliases b
  EXPECT_EQ(a2, out);
  EXPECT_EQ(b2, out);
}

struct RopeCase {
  int B, T, H, D, row_stride;
  float theta;
  int pos0;
};

TEST(Kernels, RopeForward) {
  std::mt19937 rng(341);
  // plain; fused qkv (rotate q and k heads, leave v alone); one head; large positions.
  for (RopeCase c :
       {RopeCase{2, 7, 3, 6, 18, 10000.0f, 0}, RopeCase{2, 7, 6, 8, 64, 10000.0f, 5},
        RopeCase{1, 5, 1, 2, 2, 500000.0f, 3}, RopeCase{2, 3, 2, 6, 12, 10000.0f, 4093}}) {
    SCOPED_TRACE(testing::Message() << "H=" << c.H << " D=" << c.D << " pos0=" << c.pos0);
    const auto x = kref::uniform(rng, size_t(c.B) * c.T * c.row_stride);
    auto y = x;
    cpu::rope_forward(y.data(), c.B, c.T, c.H, c.D, c.D, c.row_stride, c.theta, c.pos0);
    const auto ref = kref::rope(to_double(x), c.B, c.T, c.H, c.D, c.row_stride, c.theta, c.pos0);
    // cos and sin rounded to float (u each), two products and a sum: <= ~4 u (|x1| + |x2|):
    // c = 8 against the max input magnitude.
    EXPECT_TRUE(near_ref("out", y, ref, 8, 1, kref::max_abs(x)));
    // channels past the first H heads are untouched
    for (size_t r = 0; r < size_t(c.B) * c.T; ++r)
      for (int j = c.H * c.D; j < c.row_stride; ++j)
        ASSERT_EQ(y[r * c.row_stride + j], x[r * c.row_stride + j]);
    // the inverse rotation restores x: two rotations, c = 16.
    cpu::rope_backward(y.data(), c.B, c.T, c.H, c.D, c.D, c.row_stride, c.theta, c.pos0);
    EXPECT_TRUE(near_ref("backward(forward(x))", y, to_double(x), 16, 1, kref::max_abs(x)));
  }
}

TEST(Kernels, RopeBackward) {
  std::mt19937 rng(342);
  for (RopeCase c : {RopeCase{2, 7, 3, 6, 18, 10000.0f, 0}, RopeCase{2, 7, 6, 8, 64, 10000.0f, 5},
                     RopeCase{2, 3, 2, 6, 12, 10000.0f, 4093}}) {
    SCOPED_TRACE(testing::Message() << "H=" << c.H << " D=" << c.D << " pos0=" << c.pos0);
    const size_t n = size_t(c.B) * c.T * c.row_stride;
    const auto x = kref::uniform(rng, n);
    const auto R = kref::uniform(rng, n);
    // rope_backward(dout) must be the gradient of sum(rope(x) * dout) with respect to x.
    auto d = R;
    cpu::rope_backward(d.data(), c.B, c.T, c.H, c.D, c.D, c.row_stride, c.theta, c.pos0);
    auto xd = to_double(x);
    double f;
    const auto g = kref::fd_grad(
        xd, to_double(R),
        [&] { return kref::rope(xd, c.B, c.T, c.H, c.D, c.row_stride, c.theta, c.pos0); }, &f);
    EXPECT_TRUE(near_ref("dx", d, g, 8, 1, kref::max_abs(R), f));
  }
}

struct PartialRopeCase {
  int B, T, H, D, rotary_dim, row_stride;
  float theta;
  int pos0;
};

// Partial rotary (GPT-NeoX): a quarter of the head (Pythia's rotary_pct = 0.25), the full head
// through the same path, a fused qkv row (q and k heads rotated, v untouched), an odd head dim
// with an even rotary share, the smallest share (one pair) and a large start position.
const PartialRopeCase kPartialRope[] = {
    {2, 7, 3, 32, 8, 96, 10000.0f, 3},    {2, 7, 3, 32, 32, 96, 10000.0f, 3},
    {2, 5, 4, 64, 16, 384, 10000.0f, 11}, {1, 6, 2, 7, 4, 14, 10000.0f, 1},
    {1, 4, 2, 10, 2, 30, 500000.0f, 2},   {2, 3, 2, 32, 8, 64, 10000.0f, 4093}};

TEST(Kernels, RopePartialForward) {
  std::mt19937 rng(343);
  for (const PartialRopeCase& c : kPartialRope) {
    SCOPED_TRACE(testing::Message() << "H=" << c.H << " D=" << c.D << " rotary_dim=" << c.rotary_dim
                                    << " stride=" << c.row_stride << " pos0=" << c.pos0);
    const auto x = kref::uniform(rng, size_t(c.B) * c.T * c.row_stride);
    auto y = x;
    cpu::rope_forward(y.data(), c.B, c.T, c.H, c.D, c.rotary_dim, c.row_stride, c.theta, c.pos0);
    const auto ref = rope_partial_ref(to_double(x), c.B, c.T, c.H, c.D, c.rotary_dim, c.row_stride,
                                      c.theta, c.pos0);
    // cos and sin rounded to float (u each), two products and a sum: c = 8 against the max
    // input magnitude, as for the full rotation.
    EXPECT_TRUE(near_ref("out", y, ref, 8, 1, kref::max_abs(x)));
    // with rotary_dim == D the reference is the full-head rotation of kernel_reference.h
    if (c.rotary_dim == c.D) {
      const auto full = kref::rope(to_double(x), c.B, c.T, c.H, c.D, c.row_stride, c.theta, c.pos0);
      EXPECT_TRUE(near_ref("out vs full rope", y, full, 8, 1, kref::max_abs(x)));
    }
    // channels [rotary_dim, D) of every rotated head, and everything past the H heads, are
    // untouched (bit-exact); every rotated channel moved for t > 0 (the rotation was applied).
    size_t changed = 0;
    for (size_t r = 0; r < size_t(c.B) * c.T; ++r)
      for (int j = 0; j < c.row_stride; ++j) {
        const size_t k = r * c.row_stride + j;
        const bool rotated = j < c.H * c.D && j % c.D < c.rotary_dim;
        if (!rotated) changed += y[k] != x[k];
      }
    EXPECT_EQ(changed, 0u) << "channels outside the rotary share changed";
    // the inverse rotation restores x: two rotations, c = 16.
    cpu::rope_backward(y.data(), c.B, c.T, c.H, c.D, c.rotary_dim, c.row_stride, c.theta, c.pos0);
    EXPECT_TRUE(near_ref("backward(forward(x))", y, to_double(x), 16, 1, kref::max_abs(x)));
  }
}

TEST(Kernels, RopePartialBackward) {
  std::mt19937 rng(344);
  for (const PartialRopeCase& c : kPartialRope) {
    SCOPED_TRACE(testing::Message() << "H=" << c.H << " D=" << c.D << " rotary_dim=" << c.rotary_dim
                                    << " stride=" << c.row_stride << " pos0=" << c.pos0);
    const size_t n = size_t(c.B) * c.T * c.row_stride;
    const auto x = kref::uniform(rng, n);
    const auto R = kref::uniform(rng, n);
    // rope_backward(dout) must be the gradient of sum(rope(x) * dout) with respect to x: the
    // inverse rotation on the rotary share, the identity elsewhere.
    auto d = R;
    cpu::rope_backward(d.data(), c.B, c.T, c.H, c.D, c.rotary_dim, c.row_stride, c.theta, c.pos0);
    auto xd = to_double(x);
    double f;
    const auto g = kref::fd_grad(
        xd, to_double(R),
        [&] {
          return rope_partial_ref(xd, c.B, c.T, c.H, c.D, c.rotary_dim, c.row_stride, c.theta,
                                  c.pos0);
        },
        &f);
    EXPECT_TRUE(near_ref("dx", d, g, 8, 1, kref::max_abs(R), f));
    // backward then forward restores the gradient
    cpu::rope_forward(d.data(), c.B, c.T, c.H, c.D, c.rotary_dim, c.row_stride, c.theta, c.pos0);
    EXPECT_TRUE(near_ref("forward(backward(R))", d, to_double(R), 16, 1, kref::max_abs(R)));
  }
}

TEST(Kernels, RopeRejectsBadShapes) {
  std::vector<float> x(64, 1.0f);
  EXPECT_THROW(cpu::rope_forward(x.data(), 1, 2, 1, 5, 5, 5, 10000.0f, 0),
               Error);  // odd rotary_dim = D
  EXPECT_THROW(cpu::rope_backward(x.data(), 1, 2, 1, 5, 5, 5, 10000.0f, 0),
               Error);  // odd rotary_dim = D
  EXPECT_THROW(cpu::rope_forward(x.data(), 1, 2, 3, 8, 8, 16, 10000.0f, 0), Error);  // stride < H*D
  // rotary_dim odd, larger than D, zero or negative
  for (const int rd : {7, 34, 0, -2}) {
    SCOPED_TRACE(testing::Message() << "rotary_dim=" << rd);
    EXPECT_THROW(cpu::rope_forward(x.data(), 1, 2, 1, 32, rd, 32, 10000.0f, 0), Error);
    EXPECT_THROW(cpu::rope_backward(x.data(), 1, 2, 1, 32, rd, 32, 10000.0f, 0), Error);
  }
  // a rejected call leaves x alone
  EXPECT_TRUE(std::all_of(x.begin(), x.end(), [](float v) { return v == 1.0f; }));
}

}  // namespace
}  // namespace tandem
