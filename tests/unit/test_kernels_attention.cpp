// Tests of the CPU causal GQA attention kernels: float64 reference for the forward, central
// finite differences of it for the backward, causality, and odd/GQA shapes.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "core/error.h"
#include "device/cpu/kernels.h"
#include "kernel_reference.h"

namespace tandem {
namespace {

using kref::near_ref;
using kref::to_double;

struct Shape {
  int B, T, Hq, Hkv, D;
};

std::ostream& operator<<(std::ostream& os, const Shape& s) {
  return os << "B=" << s.B << " T=" << s.T << " Hq=" << s.Hq << " Hkv=" << s.Hkv << " D=" << s.D;
}

size_t qkv_size(const Shape& s) {
  return size_t(s.B) * s.T * (s.Hq + 2 * s.Hkv) * s.D;
}
size_t out_size(const Shape& s) {
  return size_t(s.B) * s.T * s.Hq * s.D;
}
size_t att_size(const Shape& s) {
  return size_t(s.B) * s.Hq * s.T * s.T;
}

const Shape kShapes[] = {
    {2, 7, 6, 2, 6},   // GQA, 3 query heads per kv head
    {2, 7, 4, 1, 6},   // GQA, all query heads on one kv head (MQA)
    {1, 5, 1, 1, 13},  // one head, odd D
    {2, 7, 3, 3, 8},   // plain multi-head
    {3, 1, 2, 1, 4},   // T = 1
};

// Error model: scores are length-D dot products (error ~ eps sqrt(D) |s|, |s| ~ 1 here), which
// perturb the probabilities by the same absolute amount; the softmax sum and att @ v reduce over
// up to T terms. The output is a convex combination of v rows, so max|v| is its natural scale and
// 1 that of att. K = T + D, c = 16 (exp, division and the score error feeding two reductions).
TEST(Kernels, AttentionForward) {
  std::mt19937 rng(401);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << s);
    const auto qkv = kref::normal(rng, qkv_size(s), 0.0f, 1.2f);
    std::vector<float> out(out_size(s), 5.0f);
    std::vector<float> att(att_size(s), std::numeric_limits<float>::quiet_NaN());
    cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
    kref::VD att_ref;
    const auto ref = kref::attention(to_double(qkv), s.B, s.T, s.Hq, s.Hkv, s.D, &att_ref);
    EXPECT_TRUE(near_ref("out", out, ref, 16, s.T + s.D, kref::max_abs(qkv)));
    EXPECT_TRUE(near_ref("att", att, att_ref, 16, s.T + s.D, 1.0));
    // entries above the diagonal are written as exactly 0; rows sum to 1
    for (int bh = 0; bh < s.B * s.Hq; ++bh)
      for (int t = 0; t < s.T; ++t) {
        double sum = 0.0;
        for (int u = 0; u < s.T; ++u) {
          const float a = att[(size_t(bh) * s.T + t) * s.T + u];
          if (u > t) {
            ASSERT_EQ(a, 0.0f) << "bh=" << bh << " t=" << t << " u=" << u;
          }
          sum += a;
        }
        EXPECT_NEAR(sum, 1.0, kref::fp32_bound(8, s.T, 1.0));
      }
    // without att (inference) the output is the same
    std::vector<float> out2(out.size());
    cpu::attention_forward(out2.data(), nullptr, qkv.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
    EXPECT_EQ(out2, out);
  }
}

// Error model of the backward: dv sums att * dout over the T query positions of every query
// head of the group; dq, dk go through datt (length-D dot products) and the softmax backward
// att * (datt - sum att * datt) (length-T reduction with cancellation), then sums over T (and
// the group for dk). K = T * group + D, c = 16, each of q, k, v scaled by its own max gradient.
void check_backward(const Shape& s, std::mt19937& rng) {
  const size_t n = qkv_size(s);
  const auto qkv = kref::normal(rng, n, 0.0f, 1.2f);
  const auto R = kref::uniform(rng, out_size(s));
  std::vector<float> out(out_size(s)), att(att_size(s));
  cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  std::vector<float> dqkv(n, 0.0f);
  cpu::attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), s.B, s.T, s.Hq, s.Hkv,
                          s.D);
  auto xd = to_double(qkv);
  double f;
  const auto g = kref::fd_grad(
      xd, to_double(R), [&] { return kref::attention(xd, s.B, s.T, s.Hq, s.Hkv, s.D); }, &f);
  const double K = double(s.T) * (s.Hq / s.Hkv) + s.D;
  // split q / k / v channels of every row
  const int S = (s.Hq + 2 * s.Hkv) * s.D;
  const int ends[3] = {s.Hq * s.D, (s.Hq + s.Hkv) * s.D, S};
  const char* names[3] = {"dq", "dk", "dv"};
  for (int part = 0; part < 3; ++part) {
    const int c0 = part == 0 ? 0 : ends[part - 1], c1 = ends[part];
    std::vector<float> got;
    kref::VD ref;
    for (size_t r = 0; r < n / S; ++r)
      for (int c = c0; c < c1; ++c) {
        got.push_back(dqkv[r * S + c]);
        ref.push_back(g[r * S + c]);
      }
    EXPECT_TRUE(near_ref(names[part], got, ref, 16, K, 0, f));
  }
  // [Written input gradients]: every q, k and v column is written; what the buffer held is
  // neither read nor kept.
  std::vector<float> d1(n, std::numeric_limits<float>::quiet_NaN());
  cpu::attention_backward(d1.data(), R.data(), qkv.data(), att.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  EXPECT_EQ(d1, dqkv);
}

TEST(Kernels, AttentionBackward) {
  std::mt19937 rng(402);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(testing::Message() << s);
    check_backward(s, rng);
  }
}

// Output (and probabilities) at t must not depend on any input at t' > t.
TEST(Kernels, AttentionCausality) {
  std::mt19937 rng(403);
  const Shape s{2, 7, 6, 2, 6};
  const int S = (s.Hq + 2 * s.Hkv) * s.D, OS = s.Hq * s.D;
  const auto qkv = kref::normal(rng, qkv_size(s));
  std::vector<float> out(out_size(s)), att(att_size(s));
  cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  for (int t0 = 0; t0 < s.T - 1; ++t0) {
    auto qkv2 = qkv;
    const auto noise = kref::normal(rng, qkv.size(), 0.0f, 3.0f);
    for (int b = 0; b < s.B; ++b)
      for (int t = t0 + 1; t < s.T; ++t)
        for (int c = 0; c < S; ++c) qkv2[(size_t(b) * s.T + t) * S + c] = noise[size_t(t) * S + c];
    std::vector<float> out2(out.size()), att2(att.size());
    cpu::attention_forward(out2.data(), att2.data(), qkv2.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
    for (int b = 0; b < s.B; ++b) {
      for (int t = 0; t <= t0; ++t)
        ASSERT_EQ(0, std::memcmp(&out[(size_t(b) * s.T + t) * OS],
                                 &out2[(size_t(b) * s.T + t) * OS], OS * sizeof(float)))
            << "t0=" << t0 << " b=" << b << " t=" << t;
      // and the outputs after t0 did change (the perturbation is real)
      EXPECT_NE(out[(size_t(b) * s.T + t0 + 1) * OS], out2[(size_t(b) * s.T + t0 + 1) * OS]);
    }
    for (int bh = 0; bh < s.B * s.Hq; ++bh)
      for (int t = 0; t <= t0; ++t)
        ASSERT_EQ(0, std::memcmp(&att[(size_t(bh) * s.T + t) * s.T],
                                 &att2[(size_t(bh) * s.T + t) * s.T], s.T * sizeof(float)));
  }
}

// Enough work for the threaded path: sampled finite differences, bit-identical repeated runs.
TEST(Kernels, AttentionLarge) {
  std::mt19937 rng(404);
  const Shape s{2, 48, 8, 2, 16};
  const size_t n = qkv_size(s);
  const auto qkv = kref::normal(rng, n);
  const auto R = kref::uniform(rng, out_size(s));
  std::vector<float> out(out_size(s)), att(att_size(s));
  cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.Hq, s.Hkv, s.D);
  const auto ref = kref::attention(to_double(qkv), s.B, s.T, s.Hq, s.Hkv, s.D);
  EXPECT_TRUE(near_ref("out", out, ref, 16, s.T + s.D, kref::max_abs(qkv)));
  std::vector<float> dqkv(n, 0.0f), dqkv2(n, 0.0f);
  cpu::attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), s.B, s.T, s.Hq, s.Hkv,
                          s.D);
  cpu::attention_backward(dqkv2.data(), R.data(), qkv.data(), att.data(), s.B, s.T, s.Hq, s.Hkv,
                          s.D);
  EXPECT_EQ(0, std::memcmp(dqkv.data(), dqkv2.data(), n * sizeof(float)));
  auto xd = to_double(qkv);
  const auto idx = kref::sample_indices(rng, n, 40);
  double f;
  const auto g = kref::fd_grad_at(
      xd, to_double(R), idx, [&] { return kref::attention(xd, s.B, s.T, s.Hq, s.Hkv, s.D); }, &f);
  // scale: the largest gradient of the whole buffer (dv entries, O(1)); see check_backward.
  double scale = 0.0;
  for (float v : dqkv) scale = std::max(scale, double(std::fabs(v)));
  EXPECT_TRUE(near_ref("dqkv (sampled)", kref::gather(dqkv, idx), g, 16,
                       double(s.T) * (s.Hq / s.Hkv) + s.D, scale, f));
}

TEST(Kernels, AttentionRejectsBadHeads) {
  std::vector<float> buf(1024, 0.5f), att(1024);
  EXPECT_THROW(cpu::attention_forward(buf.data(), att.data(), buf.data(), 1, 2, 6, 4, 4), Error);
  EXPECT_THROW(
      cpu::attention_backward(buf.data(), buf.data(), buf.data(), att.data(), 1, 2, 6, 4, 4),
      Error);
  EXPECT_THROW(cpu::attention_forward(buf.data(), att.data(), buf.data(), 1, 2, 2, 0, 4), Error);
}

}  // namespace
}  // namespace tandem
