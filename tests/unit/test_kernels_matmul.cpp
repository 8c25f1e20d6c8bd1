// Tests of the CPU linear-layer kernels (OpenBLAS GEMMs) against a float64 reference and central
// finite differences of it; see kernel_reference.h for the error model.
#include <gtest/gtest.h>

#include "device/cpu/kernels.h"
#include "kernel_reference.h"

namespace tandem {
namespace {

using kref::near_ref;
using kref::to_double;

struct Shape {
  int N, IC, OC;
};

TEST(Kernels, MatmulForward) {
  std::mt19937 rng(201);
  for (Shape s : {Shape{14, 13, 11}, Shape{1, 1, 1}, Shape{7, 70, 9}, Shape{64, 300, 130}}) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " IC=" << s.IC << " OC=" << s.OC);
    const auto x = kref::uniform(rng, size_t(s.N) * s.IC);
    const auto w = kref::uniform(rng, size_t(s.OC) * s.IC);
    const auto b = kref::uniform(rng, s.OC);
    std::vector<float> out(size_t(s.N) * s.OC, 123.0f);  // garbage: the forward overwrites
    cpu::matmul_forward(out.data(), x.data(), w.data(), b.data(), s.N, s.IC, s.OC);
    const auto bd = to_double(b);
    const auto ref = kref::matmul(to_double(x), to_double(w), &bd, s.N, s.IC, s.OC);
    // one length-(IC + 1) dot product per output: c = 8.
    EXPECT_TRUE(near_ref("out", out, ref, 8, s.IC + 1));
    std::fill(out.begin(), out.end(), -7.0f);
    cpu::matmul_forward(out.data(), x.data(), w.data(), nullptr, s.N, s.IC, s.OC);
    const auto ref2 = kref::matmul(to_double(x), to_double(w), nullptr, s.N, s.IC, s.OC);
    EXPECT_TRUE(near_ref("out (no bias)", out, ref2, 8, s.IC));
  }
}

TEST(Kernels, MatmulBackward) {
  std::mt19937 rng(202);
  for (Shape s : {Shape{14, 13, 11}, Shape{1, 1, 1}, Shape{7, 20, 9}, Shape{3, 5, 70}}) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " IC=" << s.IC << " OC=" << s.OC);
    const size_t nx = size_t(s.N) * s.IC, nw = size_t(s.OC) * s.IC, no = size_t(s.N) * s.OC;
    const auto x = kref::uniform(rng, nx);
    const auto w = kref::uniform(rng, nw);
    const auto b = kref::uniform(rng, s.OC);
    const auto R = kref::uniform(rng, no);
    std::vector<float> dx(nx, 0.0f), dw(nw, 0.0f), db(s.OC, 0.0f);
    cpu::matmul_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), s.N, s.IC,
                         s.OC);

    auto xd = to_double(x), wd = to_double(w), bd = to_double(b);
    const auto Rd = to_double(R);
    auto fwd = [&] { return kref::matmul(xd, wd, &bd, s.N, s.IC, s.OC); };
    double fx, fw, fb;
    const auto gx = kref::fd_grad(xd, Rd, fwd, &fx);
    const auto gw = kref::fd_grad(wd, Rd, fwd, &fw);
    const auto gb = kref::fd_grad(bd, Rd, fwd, &fb);
    // dx = dout @ w reduces over OC; dw = dout^T @ x and dbias reduce over N: c = 8.
    EXPECT_TRUE(near_ref("dx", dx, gx, 8, s.OC, 0, fx));
    EXPECT_TRUE(near_ref("dw", dw, gw, 8, s.N, 0, fw));
    EXPECT_TRUE(near_ref("dbias", db, gb, 8, s.N, 0, fb));

    auto dx0 = kref::uniform(rng, nx), dw0 = kref::uniform(rng, nw), db0 = kref::uniform(rng, s.OC);
    auto dx1 = dx0, dw1 = dw0, db1 = db0;
    cpu::matmul_backward(dx1.data(), dw1.data(), db1.data(), R.data(), x.data(), w.data(), s.N,
                         s.IC, s.OC);
    EXPECT_TRUE(near_ref("dx accum", dx1, kref::plus(dx0, gx), 8, s.OC + 1,
                         kref::max_abs(gx) + kref::max_abs(dx0), fx));
    EXPECT_TRUE(near_ref("dw accum", dw1, kref::plus(dw0, gw), 8, s.N + 1,
                         kref::max_abs(gw) + kref::max_abs(dw0), fw));
    EXPECT_TRUE(near_ref("dbias accum", db1, kref::plus(db0, gb), 8, s.N + 1,
                         kref::max_abs(gb) + kref::max_abs(db0), fb));

    // nullptr = skip, each output alone.
    std::vector<float> a(nx, 0.0f), c(nw, 0.0f), d(s.OC, 0.0f);
    cpu::matmul_backward(a.data(), nullptr, nullptr, R.data(), x.data(), w.data(), s.N, s.IC, s.OC);
    cpu::matmul_backward(nullptr, c.data(), nullptr, R.data(), x.data(), w.data(), s.N, s.IC, s.OC);
    cpu::matmul_backward(nullptr, nullptr, d.data(), R.data(), x.data(), w.data(), s.N, s.IC, s.OC);
    EXPECT_EQ(a, dx);
    EXPECT_EQ(c, dw);
    EXPECT_EQ(d, db);
  }
}

// Larger shapes (OpenBLAS threading, several bias column blocks): sampled finite differences
// and bit-identical repeated runs.
TEST(Kernels, MatmulBackwardLarge) {
  std::mt19937 rng(203);
  const int N = 96, IC = 130, OC = 200;
  const auto x = kref::uniform(rng, size_t(N) * IC);
  const auto w = kref::uniform(rng, size_t(OC) * IC);
  const auto b = kref::uniform(rng, OC);
  const auto R = kref::uniform(rng, size_t(N) * OC);
  std::vector<float> dx(x.size(), 0.0f), dw(w.size(), 0.0f), db(OC, 0.0f);
  cpu::matmul_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), N, IC, OC);
  auto xd = to_double(x), wd = to_double(w), bd = to_double(b);
  const auto Rd = to_double(R);
  auto fwd = [&] { return kref::matmul(xd, wd, &bd, N, IC, OC); };
  const auto ix = kref::sample_indices(rng, xd.size(), 12);
  const auto iw = kref::sample_indices(rng, wd.size(), 12);
  const auto ib = kref::sample_indices(rng, bd.size(), 12);
  double fx, fw, fb;
  const auto gx = kref::fd_grad_at(xd, Rd, ix, fwd, &fx);
  const auto gw = kref::fd_grad_at(wd, Rd, iw, fwd, &fw);
  const auto gb = kref::fd_grad_at(bd, Rd, ib, fwd, &fb);
  // Scale: a length-K sum of products of magnitude <= 1 has magnitude ~sqrt(K / 9) (uniform
  // inputs, E[(xy)^2] = 1/9); the sampled max is too few values to be a robust scale.
  EXPECT_TRUE(near_ref("dx", kref::gather(dx, ix), gx, 8, OC, std::sqrt(OC / 9.0), fx));
  EXPECT_TRUE(near_ref("dw", kref::gather(dw, iw), gw, 8, N, std::sqrt(N / 9.0), fw));
  EXPECT_TRUE(near_ref("dbias", kref::gather(db, ib), gb, 8, N, std::sqrt(N / 3.0), fb));
  std::vector<float> dx2(x.size(), 0.0f), dw2(w.size(), 0.0f), db2(OC, 0.0f);
  cpu::matmul_backward(dx2.data(), dw2.data(), db2.data(), R.data(), x.data(), w.data(), N, IC, OC);
  EXPECT_EQ(dx, dx2);
  EXPECT_EQ(dw, dw2);
  EXPECT_EQ(db, db2);
}

TEST(Kernels, MatmulEmptyReduction) {
  // IC = 0: out is the broadcast bias; dbias still receives the column sums.
  const int N = 3, OC = 4;
  const std::vector<float> b{1.0f, -2.0f, 3.0f, 0.5f};
  std::vector<float> out(N * OC, 9.0f);
  cpu::matmul_forward(out.data(), nullptr, nullptr, b.data(), N, 0, OC);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < OC; ++j) EXPECT_EQ(out[i * OC + j], b[j]);
  const std::vector<float> dout(N * OC, 0.25f);
  std::vector<float> db(OC, 1.0f);
  cpu::matmul_backward(nullptr, nullptr, db.data(), dout.data(), nullptr, nullptr, N, 0, OC);
  for (int j = 0; j < OC; ++j) EXPECT_EQ(db[j], 1.75f);
}

}  // namespace
}  // namespace tandem
