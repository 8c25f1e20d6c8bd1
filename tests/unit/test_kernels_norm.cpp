// Tests of the CPU LayerNorm and RMSNorm kernels against float64 references (forward) and
// central finite differences of the references (backward); see kernel_reference.h for the
// error model.
#include <gtest/gtest.h>

#include <cstring>

#include "device/cpu/kernels.h"
#include "kernel_reference.h"

namespace tandem {
namespace {

using kref::near_ref;
using kref::to_double;
constexpr float kEps = 1e-5f;

// Conditioning of x - mean: the absolute error of the centred values is ~eps32 (|mean| + std),
// so relative to the normalised output it is amplified by kappa = 1 + max |mean| / std.
double ln_kappa(const kref::VD& mean, const kref::VD& rstd) {
  double k = 1.0;
  for (size_t i = 0; i < mean.size(); ++i) k = std::max(k, 1.0 + std::fabs(mean[i]) * rstd[i]);
  return k;
}

struct Shape {
  int N, C;
};

TEST(Kernels, LayerNormForward) {
  std::mt19937 rng(101);
  for (Shape s : {Shape{14, 13}, Shape{1, 1}, Shape{3, 67}, Shape{40, 771}}) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    const auto x = kref::normal(rng, size_t(s.N) * s.C, 1.5f, 1.0f);  // nonzero mean
    const auto w = kref::uniform(rng, s.C, -1.5f, 1.5f);
    const auto b = kref::uniform(rng, s.C);
    std::vector<float> out(x.size()), mean(s.N), rstd(s.N);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), s.N,
                           s.C, kEps);
    kref::VD m, r;
    const auto wd = to_double(w), bd = to_double(b);
    const auto ref = kref::layernorm(to_double(x), wd, &bd, s.N, s.C, kEps, &m, &r);
    const double kappa = ln_kappa(m, r);
    // each output: two length-C reductions, then centring (kappa) and 3 pointwise ops: c = 8.
    EXPECT_TRUE(near_ref("out", out, ref, 8, s.C, kref::max_abs(ref) * kappa));
    EXPECT_TRUE(near_ref("mean", mean, m, 8, s.C, kref::max_abs(x)));
    EXPECT_TRUE(near_ref("rstd", rstd, r, 8, s.C, kref::max_abs(r) * kappa));

    // no bias; mean and rstd not requested
    std::vector<float> out2(x.size());
    cpu::layernorm_forward(out2.data(), nullptr, nullptr, x.data(), w.data(), nullptr, s.N, s.C,
                           kEps);
    const auto ref2 = kref::layernorm(to_double(x), wd, nullptr, s.N, s.C, kEps);
    EXPECT_TRUE(near_ref("out (no bias)", out2, ref2, 8, s.C, kref::max_abs(ref2) * kappa));
  }
}

TEST(Kernels, LayerNormBackward) {
  std::mt19937 rng(102);
  for (Shape s : {Shape{14, 13}, Shape{3, 67}, Shape{1, 5}}) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    const size_t n = size_t(s.N) * s.C;
    const auto x = kref::normal(rng, n, -2.0f, 1.0f);
    const auto w = kref::uniform(rng, s.C, -1.5f, 1.5f);
    const auto b = kref::uniform(rng, s.C);
    const auto R = kref::uniform(rng, n);  // dout
    std::vector<float> out(n), mean(s.N), rstd(s.N);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), s.N,
                           s.C, kEps);

    std::vector<float> dx(n, 0.0f), dw(s.C, 0.0f), db(s.C, 0.0f);
    cpu::layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), s.N, s.C);

    auto xd = to_double(x), wd = to_double(w), bd = to_double(b);
    const auto Rd = to_double(R);
    auto fwd = [&] { return kref::layernorm(xd, wd, &bd, s.N, s.C, kEps); };
    double fx, fw, fb;
    const auto gx = kref::fd_grad(xd, Rd, fwd, &fx);
    const auto gw = kref::fd_grad(wd, Rd, fwd, &fw);
    const auto gb = kref::fd_grad(bd, Rd, fwd, &fb);
    kref::VD m, r;
    kref::layernorm(to_double(x), wd, &bd, s.N, s.C, kEps, &m, &r);
    const double kappa = ln_kappa(m, r);
    // dx: two length-C reductions of products with centred x (kappa), 5 pointwise ops: c = 16.
    // dw, db: length-N reductions over rows (dw of centred x: kappa).
    const double K = std::max(s.N, s.C);
    EXPECT_TRUE(near_ref("dx", dx, gx, 16, s.C, kref::max_abs(gx) * kappa, fx));
    EXPECT_TRUE(near_ref("dw", dw, gw, 8, K, kref::max_abs(gw) * kappa, fw));
    EXPECT_TRUE(near_ref("db", db, gb, 8, s.N, kref::max_abs(gb), fb));

    // [Backward accumulates]: pre-filled buffers receive the gradient on top.
    auto dx0 = kref::uniform(rng, n), dw0 = kref::uniform(rng, s.C), db0 = kref::uniform(rng, s.C);
    auto dx1 = dx0, dw1 = dw0, db1 = db0;
    cpu::layernorm_backward(dx1.data(), dw1.data(), db1.data(), R.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), s.N, s.C);
    EXPECT_TRUE(near_ref("dx accum", dx1, kref::plus(dx0, gx), 16, s.C,
                         (kref::max_abs(gx) + kref::max_abs(dx0)) * kappa, fx));
    EXPECT_TRUE(near_ref("dw accum", dw1, kref::plus(dw0, gw), 8, K,
                         (kref::max_abs(gw) + kref::max_abs(dw0)) * kappa, fw));
    EXPECT_TRUE(near_ref("db accum", db1, kref::plus(db0, gb), 8, s.N,
                         kref::max_abs(gb) + kref::max_abs(db0), fb));

    // nullptr outputs are skipped; the others are unaffected.
    std::vector<float> dw2(s.C, 0.0f);
    cpu::layernorm_backward(nullptr, dw2.data(), nullptr, R.data(), x.data(), w.data(), mean.data(),
                            rstd.data(), s.N, s.C);
    EXPECT_EQ(dw2, dw);
    std::vector<float> dx2(n, 0.0f);
    cpu::layernorm_backward(dx2.data(), nullptr, nullptr, R.data(), x.data(), w.data(), mean.data(),
                            rstd.data(), s.N, s.C);
    EXPECT_EQ(dx2, dx);
  }
}

// Long rows (several 64-channel blocks, remainder block) and enough work for the threaded path:
// finite differences on a sample of coordinates; results bit-identical run to run.
TEST(Kernels, LayerNormBackwardLarge) {
  std::mt19937 rng(103);
  const int N = 40, C = 771;
  const size_t n = size_t(N) * C;
  const auto x = kref::normal(rng, n, 1.0f, 1.0f);
  const auto w = kref::uniform(rng, C, -1.5f, 1.5f);
  const auto b = kref::uniform(rng, C);
  const auto R = kref::uniform(rng, n);
  std::vector<float> out(n), mean(N), rstd(N);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                         kEps);
  std::vector<float> dx(n, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C);

  auto xd = to_double(x), wd = to_double(w), bd = to_double(b);
  const auto Rd = to_double(R);
  // dx by single rows (a perturbation of row i only changes row i): cheap and exact.
  const auto ix = kref::sample_indices(rng, n, 24);
  kref::VD gx;
  double fx = 0.0, scale = 0.0;
  for (size_t i : ix) {
    const int row = int(i / C);
    kref::VD xr(xd.begin() + size_t(row) * C, xd.begin() + size_t(row + 1) * C);
    kref::VD Rr(Rd.begin() + size_t(row) * C, Rd.begin() + size_t(row + 1) * C);
    double f;
    const auto g = kref::fd_grad_at(
        xr, Rr, {i % C}, [&] { return kref::layernorm(xr, wd, &bd, 1, C, kEps); }, &f);
    gx.push_back(g[0]);
    fx = std::max(fx, f);
    kref::VD m, r;
    kref::layernorm(xr, wd, &bd, 1, C, kEps, &m, &r);
    scale = std::max(scale, 1.5 * r[0] * ln_kappa(m, r));  // |dx| <~ rstd |w| |dout|, kappa
  }
  EXPECT_TRUE(near_ref("dx (sampled)", kref::gather(dx, ix), gx, 16, C, scale, fx));
  auto fwd = [&] { return kref::layernorm(xd, wd, &bd, N, C, kEps); };
  const auto iw = kref::sample_indices(rng, C, 16);
  double fw, fb;
  const auto gw = kref::fd_grad_at(wd, Rd, iw, fwd, &fw);
  const auto gb = kref::fd_grad_at(bd, Rd, iw, fwd, &fb);
  EXPECT_TRUE(near_ref("dw", kref::gather(dw, iw), gw, 8, C, kref::max_abs(gw) * 3.0, fw));
  EXPECT_TRUE(near_ref("db", kref::gather(db, iw), gb, 8, N, kref::max_abs(gb), fb));

  // Deterministic: a second run gives the same bits.
  std::vector<float> dx2(n, 0.0f), dw2(C, 0.0f), db2(C, 0.0f);
  cpu::layernorm_backward(dx2.data(), dw2.data(), db2.data(), R.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
  EXPECT_EQ(0, std::memcmp(dx.data(), dx2.data(), n * sizeof(float)));
  EXPECT_EQ(dw, dw2);
  EXPECT_EQ(db, db2);
}

TEST(Kernels, RMSNormForward) {
  std::mt19937 rng(111);
  for (Shape s : {Shape{14, 13}, Shape{1, 1}, Shape{3, 67}, Shape{40, 771}}) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    const auto x = kref::normal(rng, size_t(s.N) * s.C, 0.7f, 1.0f);
    const auto w = kref::uniform(rng, s.C, -1.5f, 1.5f);
    std::vector<float> out(x.size()), rstd(s.N);
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), s.N, s.C, kEps);
    kref::VD r;
    const auto ref = kref::rmsnorm(to_double(x), to_double(w), s.N, s.C, kEps, &r);
    // a length-C sum of squares (no cancellation), then 3 pointwise ops: c = 8.
    EXPECT_TRUE(near_ref("out", out, ref, 8, s.C));
    EXPECT_TRUE(near_ref("rstd", rstd, r, 8, s.C));
    std::vector<float> out2(x.size());
    cpu::rmsnorm_forward(out2.data(), nullptr, x.data(), w.data(), s.N, s.C, kEps);
    EXPECT_EQ(out2, out);
  }
}

TEST(Kernels, RMSNormBackward) {
  std::mt19937 rng(112);
  for (Shape s : {Shape{14, 13}, Shape{3, 67}, Shape{1, 5}}) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    const size_t n = size_t(s.N) * s.C;
    const auto x = kref::normal(rng, n, 0.7f, 1.0f);
    const auto w = kref::uniform(rng, s.C, -1.5f, 1.5f);
    const auto R = kref::uniform(rng, n);
    std::vector<float> out(n), rstd(s.N);
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), s.N, s.C, kEps);
    std::vector<float> dx(n, 0.0f), dw(s.C, 0.0f);
    cpu::rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), s.N,
                          s.C);

    auto xd = to_double(x), wd = to_double(w);
    const auto Rd = to_double(R);
    auto fwd = [&] { return kref::rmsnorm(xd, wd, s.N, s.C, kEps); };
    double fx, fw;
    const auto gx = kref::fd_grad(xd, Rd, fwd, &fx);
    const auto gw = kref::fd_grad(wd, Rd, fwd, &fw);
    // dx: one length-C reduction then 4 pointwise ops with a subtraction (projection): c = 16.
    EXPECT_TRUE(near_ref("dx", dx, gx, 16, s.C, 0, fx));
    EXPECT_TRUE(near_ref("dw", dw, gw, 8, std::max(s.N, s.C), 0, fw));

    auto dx0 = kref::uniform(rng, n), dw0 = kref::uniform(rng, s.C);
    auto dx1 = dx0, dw1 = dw0;
    cpu::rmsnorm_backward(dx1.data(), dw1.data(), R.data(), x.data(), w.data(), rstd.data(), s.N,
                          s.C);
    EXPECT_TRUE(near_ref("dx accum", dx1, kref::plus(dx0, gx), 16, s.C,
                         kref::max_abs(gx) + kref::max_abs(dx0), fx));
    EXPECT_TRUE(near_ref("dw accum", dw1, kref::plus(dw0, gw), 8, std::max(s.N, s.C),
                         kref::max_abs(gw) + kref::max_abs(dw0), fw));

    std::vector<float> dw2(s.C, 0.0f), dx2(n, 0.0f);
    cpu::rmsnorm_backward(nullptr, dw2.data(), R.data(), x.data(), w.data(), rstd.data(), s.N, s.C);
    cpu::rmsnorm_backward(dx2.data(), nullptr, R.data(), x.data(), w.data(), rstd.data(), s.N, s.C);
    EXPECT_EQ(dw2, dw);
    EXPECT_EQ(dx2, dx);
  }
}

}  // namespace
}  // namespace tandem
