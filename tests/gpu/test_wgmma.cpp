// The warpgroup MMA building blocks of the wgmma flash kernels (src/device/cuda/sm90a/wgmma.cuh),
// one product at a time against the host: each operand mode the kernels use (K-major A and B
// at mid-row k-steps, registers as A with the N-major B) at every N and head size they use. A
// wrong descriptor field, swizzle or fragment layout shows here as a wrong element, named with
// where its value belongs, before it shows as a wrong attention. Products of bf16 are exact in
// fp32, so only the fp32 sums' rounding is allowed. Skipped where the GPU or the build lacks
// sm_90a.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu/cuda_kernel_test_util.h"
#if TANDEM_TEST_SM90A
#include "gpu/sm90a/wgmma_products.h"
#endif

namespace tandem::cuda {
namespace {

using namespace kernel_test;

#if TANDEM_TEST_SM90A

// The first element of got off the reference, and where in the reference its value is (a
// permutation of rows or columns says which layout is wrong).
std::string first_wrong(const std::vector<float>& got, const std::vector<float>& ref, int cols) {
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(double(got[i]) - ref[i]);
    if (err <= 1e-4 * (1.0 + std::fabs(ref[i]))) continue;
    std::string where = "nowhere in the reference";
    for (size_t j = 0; j < ref.size(); ++j)
      if (std::fabs(double(got[i]) - ref[j]) <= 1e-4 * (1.0 + std::fabs(ref[j]))) {
        where = "at row " + std::to_string(j / cols) + " col " + std::to_string(j % cols);
        break;
      }
    return "row " + std::to_string(i / cols) + " col " + std::to_string(i % cols) + ": got " +
           std::to_string(got[i]) + ", want " + std::to_string(ref[i]) + "; the value is " + where;
  }
  return "none";
}

class CudaWgmma : public CudaKernels {
 protected:
  void SetUp() override {
    CudaKernels::SetUp();
    if (!IsSkipped() && !wgmma_test::runs_here())
      GTEST_SKIP() << "sm_90a code does not run on this GPU (compute capability 9.0 only)";
  }
};

TEST_F(CudaWgmma, KMajorProducts) {
  for (int d : {64, 128})
    for (int n : {32, 64, 128}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " d=" << d);
      const auto a = rand_bf(size_t(128) * d), b = rand_bf(size_t(n) * d);
      std::vector<float> ref(size_t(64) * n);
      for (int r = 0; r < 64; ++r)
        for (int c = 0; c < n; ++c) {
          double s = 0.0;
          for (int k = 0; k < d; ++k) s += double(a[size_t(64 + r) * d + k]) * b[size_t(c) * d + k];
          ref[size_t(r) * n + c] = float(s);
        }
      DevBf d_a(a), d_b(b);
      Dev<float> d_c(ref.size());
      d_c.poison();
      wgmma_test::product_kmajor(d_c.get(), d_a.bf(), d_b.bf(), n, d, stream_);
      sync();
      const auto got = d_c.download();
      EXPECT_TRUE(close("K-major product", got, ref, tol(0, d))) << first_wrong(got, ref, n);
    }
}

TEST_F(CudaWgmma, RegisterTimesNMajorProducts) {
  for (int d : {64, 128})
    for (int n : {32, 64, 128}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " d=" << d);
      const auto p = rand_bf(size_t(64) * n), v = rand_bf(size_t(n) * d);
      std::vector<float> ref(size_t(64) * d);
      for (int r = 0; r < 64; ++r)
        for (int c = 0; c < d; ++c) {
          double s = 0.0;
          for (int k = 0; k < n; ++k) s += double(p[size_t(r) * n + k]) * v[size_t(k) * d + c];
          ref[size_t(r) * d + c] = float(s);
        }
      DevBf d_p(p), d_v(v);
      Dev<float> d_c(ref.size());
      d_c.poison();
      wgmma_test::product_nmajor(d_c.get(), d_p.bf(), d_v.bf(), n, d, stream_);
      sync();
      const auto got = d_c.download();
      EXPECT_TRUE(close("registers x N-major product", got, ref, tol(0, n)))
          << first_wrong(got, ref, d);
    }
}

#else

TEST(CudaWgmma, NotBuilt) {
  GTEST_SKIP() << "the tests were built without architecture 90 (no sm_90a code)";
}

#endif

}  // namespace
}  // namespace tandem::cuda
