// Tests of the CPU softmax cross-entropy kernels (forward and fused in-place backward) against a
// float64 reference and central finite differences of it, with vocabulary padding (Vp > V).
#include <gtest/gtest.h>

#include <limits>

#include "core/error.h"
#include "device/cpu/kernels.h"
#include "kernel_reference.h"

namespace tandem {
namespace {

using kref::near_ref;
using kref::to_double;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Logits [N, Vp] with NaN padding columns: any read of the padding shows up in the results.
std::vector<float> make_logits(std::mt19937& rng, int N, int V, int Vp, float offset) {
  auto x = kref::normal(rng, size_t(N) * Vp, offset, 2.0f);
  for (int i = 0; i < N; ++i)
    for (int c = V; c < Vp; ++c) x[size_t(i) * Vp + c] = kNaN;
  return x;
}

struct Shape {
  int N, V, Vp;
  float offset;  // added to every logit: stability of the log-sum-exp
};

// Error model: loss = log(sum_c exp(x_c - m)) - (x_t - m). The sum over V terms has relative
// error ~eps sqrt(V) (an absolute error of the log), each exp and the subtraction add ~u |x - m|:
// |err| <= c eps sqrt(V) (1 + max |x - m|), c = 8.
TEST(Kernels, CrossEntropyForward) {
  std::mt19937 rng(501);
  for (Shape s :
       {Shape{7, 11, 16, 0.0f}, Shape{1, 1, 1, 0.0f}, Shape{5, 13, 13, 0.0f},
        Shape{6, 9, 12, 1000.0f}, Shape{6, 9, 12, -1000.0f}, Shape{4, 5003, 5120, 0.0f}}) {
    SCOPED_TRACE(testing::Message()
                 << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp << " offset=" << s.offset);
    const auto x = make_logits(rng, s.N, s.V, s.Vp, s.offset);
    auto tgt = kref::tokens(rng, s.N, s.V);
    tgt[0] = s.V - 1;  // last real column
    std::vector<float> loss(s.N);
    cpu::crossentropy_forward(loss.data(), x.data(), tgt.data(), s.N, s.V, s.Vp);
    const auto ref = kref::crossentropy(to_double(x), tgt, s.N, s.V, s.Vp);
    const double spread = 16.0;  // max |x - m| of N(offset, 2) logits, generously
    EXPECT_TRUE(near_ref("loss", loss, ref, 8, s.V, 1.0 + spread));
  }
}

TEST(Kernels, CrossEntropyFusedBackward) {
  std::mt19937 rng(502);
  for (Shape s : {Shape{7, 11, 16, 0.0f}, Shape{5, 13, 13, 0.0f}, Shape{6, 9, 12, 1000.0f},
                  Shape{1, 1, 3, 0.0f}}) {
    SCOPED_TRACE(testing::Message()
                 << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp << " offset=" << s.offset);
    const float dloss = 1.0f / 7.0f;  // e.g. the mean over rows
    const auto x = make_logits(rng, s.N, s.V, s.Vp, s.offset);
    const auto tgt = kref::tokens(rng, s.N, s.V);
    std::vector<float> loss_fwd(s.N), loss(s.N);
    cpu::crossentropy_forward(loss_fwd.data(), x.data(), tgt.data(), s.N, s.V, s.Vp);
    auto d = x;
    cpu::crossentropy_fused_backward(d.data(), loss.data(), tgt.data(), s.N, s.V, s.Vp, dloss);
    EXPECT_EQ(loss, loss_fwd);  // same losses as the forward

    // L = dloss * sum_i loss_i, a function of the first V columns; padding columns -> 0.
    auto xd = to_double(x);
    for (int i = 0; i < s.N; ++i)
      for (int c = s.V; c < s.Vp; ++c) xd[size_t(i) * s.Vp + c] = 0.0;  // never read
    const kref::VD R(s.N, double(dloss));
    double f;
    const auto g = kref::fd_grad(
        xd, R, [&] { return kref::crossentropy(xd, tgt, s.N, s.V, s.Vp); }, &f);
    // dlogits = (p - onehot) dloss with p relative error ~eps sqrt(V): scale dloss, c = 8.
    EXPECT_TRUE(near_ref("dlogits", d, g, 8, s.V, dloss, f));
    for (int i = 0; i < s.N; ++i)
      for (int c = s.V; c < s.Vp; ++c) ASSERT_EQ(d[size_t(i) * s.Vp + c], 0.0f);

    auto d2 = x;  // losses are optional
    cpu::crossentropy_fused_backward(d2.data(), nullptr, tgt.data(), s.N, s.V, s.Vp, dloss);
    EXPECT_EQ(d2, d);
  }
}

// A GPT-2-like padded vocabulary row: threaded path, sampled finite differences.
TEST(Kernels, CrossEntropyFusedBackwardLarge) {
  std::mt19937 rng(503);
  const int N = 4, V = 5003, Vp = 5120;
  const float dloss = 0.25f;
  const auto x = make_logits(rng, N, V, Vp, 0.0f);
  const auto tgt = kref::tokens(rng, N, V);
  auto d = x;
  cpu::crossentropy_fused_backward(d.data(), nullptr, tgt.data(), N, V, Vp, dloss);
  auto xd = to_double(x);
  for (int i = 0; i < N; ++i)
    for (int c = V; c < Vp; ++c) xd[size_t(i) * Vp + c] = 0.0;
  std::vector<size_t> idx;  // the targets plus random real columns
  for (int i = 0; i < N; ++i) idx.push_back(size_t(i) * Vp + tgt[i]);
  for (size_t j : kref::sample_indices(rng, size_t(V), 8)) idx.push_back(j);
  const kref::VD R(N, double(dloss));
  double f;
  const auto g = kref::fd_grad_at(
      xd, R, idx, [&] { return kref::crossentropy(xd, tgt, N, V, Vp); }, &f);
  EXPECT_TRUE(near_ref("dlogits", kref::gather(d, idx), g, 8, V, dloss, f));
  for (int i = 0; i < N; ++i)
    for (int c = V; c < Vp; ++c) ASSERT_EQ(d[size_t(i) * Vp + c], 0.0f);
}

TEST(Kernels, CrossEntropyRejectsBadArguments) {
  std::vector<float> x(4 * 8, 0.5f), loss(4);
  std::vector<int32_t> tgt{0, 1, 2, 3};
  EXPECT_THROW(cpu::crossentropy_forward(loss.data(), x.data(), tgt.data(), 4, 8, 6), Error);
  tgt[2] = 8;  // >= V
  EXPECT_THROW(cpu::crossentropy_forward(loss.data(), x.data(), tgt.data(), 4, 8, 8), Error);
  tgt[2] = -1;
  EXPECT_THROW(cpu::crossentropy_fused_backward(x.data(), loss.data(), tgt.data(), 4, 8, 8, 1.0f),
               Error);
}

}  // namespace
}  // namespace tandem
