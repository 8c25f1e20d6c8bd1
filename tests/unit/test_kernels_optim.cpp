// Tests of the CPU optimizer kernels: AdamW against a float64 reference of the PyTorch formula
// over several steps (weight decay, gradient scaling), and the double sum of squares.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "device/cpu/kernels.h"
#include "kernel_reference.h"

namespace tandem {
namespace {

using kref::near_ref;
using kref::to_double;

struct AdamCase {
  float lr, beta1, beta2, eps, wd, grad_scale;
  int first_step;
};

// Error model, per step: m and v are 3 roundings each (c = 4 against their max norm), p about
// 10 (decay, bias corrections, sqrt, division, update): c = 8 against max |p|, the update being
// lr-sized. Free-running over S steps the per-step errors add up: c S eps (written below as
// fp32_bound(c, S^2, .) since that bound takes sqrt(K)).
TEST(Kernels, AdamW) {
  std::mt19937 rng(601);
  const int64_t n = 20011;  // odd, and large enough for the threaded path
  for (AdamCase a : {AdamCase{0.05f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.37f, 1},
                     AdamCase{0.01f, 0.8f, 0.999f, 1e-6f, 0.0f, 1.0f, 1},
                     AdamCase{0.02f, 0.9f, 0.95f, 1e-8f, 0.5f, 2.5f, 1000}}) {
    SCOPED_TRACE(testing::Message() << "lr=" << a.lr << " wd=" << a.wd
                                    << " grad_scale=" << a.grad_scale << " step0=" << a.first_step);
    auto p = kref::uniform(rng, n);
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    if (a.first_step > 1) {  // resume from a non-trivial state
      m = kref::uniform(rng, n, -0.1f, 0.1f);
      v = kref::uniform(rng, n, 1e-4f, 1e-2f);
    }
    auto pd = to_double(p), md = to_double(m), vd = to_double(v);  // free-running reference
    const int steps = 8;
    for (int k = 0; k < steps; ++k) {
      const int step = a.first_step + k;
      const auto g = kref::normal(rng, n, 0.0f, 0.5f);
      // one-step reference from the kernel's own current state
      auto p1 = to_double(p), m1 = to_double(m), v1 = to_double(v);
      kref::adamw(p1, to_double(g), m1, v1, a.lr, a.beta1, a.beta2, a.eps, a.wd, step,
                  a.grad_scale);
      kref::adamw(pd, to_double(g), md, vd, a.lr, a.beta1, a.beta2, a.eps, a.wd, step,
                  a.grad_scale);
      cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, a.lr, a.beta1, a.beta2, a.eps,
                        a.wd, step, a.grad_scale);
      SCOPED_TRACE(testing::Message() << "step " << step);
      EXPECT_TRUE(near_ref("m", m, m1, 4, 1));
      EXPECT_TRUE(near_ref("v", v, v1, 4, 1));
      EXPECT_TRUE(near_ref("p", p, p1, 8, 1));
      // the update itself (p1 - p_before is ~lr) is resolved to ~1e-4 relative or better: a wrong
      // bias correction, eps placement or decay factor would be off by >= 1e-3 relative.
    }
    EXPECT_TRUE(near_ref("m (free-running)", m, md, 4, steps * steps));
    EXPECT_TRUE(near_ref("v (free-running)", v, vd, 4, steps * steps));
    EXPECT_TRUE(near_ref("p (free-running)", p, pd, 8, steps * steps));
  }
  std::vector<float> x(4, 1.0f);
  EXPECT_THROW(cpu::adamw_update(x.data(), x.data(), x.data(), x.data(), 4, 0.1f, 0.9f, 0.95f,
                                 1e-8f, 0.0f, 0, 1.0f),
               Error);
}

TEST(Kernels, SumSquares) {
  std::mt19937 rng(602);
  const auto x = kref::normal(rng, 100003, 0.3f, 2.0f);
  // float * float is exact in double, so a double loop in index order gives the same bits.
  double ref = 0.0;
  for (float v : x) ref += double(v) * double(v);
  EXPECT_EQ(cpu::sum_squares(x.data(), int64_t(x.size())), ref);
  EXPECT_EQ(cpu::sum_squares(x.data(), 0), 0.0);
  // squares beyond FLT_MAX are fine in double: (3 * 2^70)^2 + (4 * 2^70)^2 = 25 * 2^140
  const std::vector<float> big{std::ldexp(3.0f, 70), std::ldexp(4.0f, 70)};
  EXPECT_EQ(cpu::sum_squares(big.data(), 2), std::ldexp(25.0, 140));
}

}  // namespace
}  // namespace tandem
