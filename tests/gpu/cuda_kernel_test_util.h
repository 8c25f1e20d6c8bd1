// Shared host helpers of the GPU kernel tests (test_cuda_kernels.cpp, test_cuda_flash.cpp):
// bf16 rounding, device buffers, the normwise comparisons and tolerances ([Tolerances] in
// test_cuda_kernels.cpp) and the CudaKernels fixture (stream, seeded generator, shared cuBLASLt
// context). Everything is inline so that each test file can include it.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"
#include "device/cuda/matmul.h"

namespace tandem::cuda::kernel_test {

// ---------------------------------------------------------------------------------------------
// Host helpers: bf16 rounding, device buffers, comparisons.

inline uint16_t bf16_bits(float f) {  // round to nearest even, as __float2bfloat16_rn
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float round_bf16(float f) {
  return bf16_float(bf16_bits(f));
}

inline bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

// A device allocation of n elements of T (bf16 is stored as uint16_t bits).
template <class T>
class Dev {
 public:
  explicit Dev(size_t n = 0) : n_(n) {
    if (n_ > 0) CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
  }
  ~Dev() {
    if (p_) cudaFree(p_);
  }
  Dev(Dev&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  Dev& operator=(Dev&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  // 0xFF bytes: a NaN in bf16 and in fp32.
  void poison() {
    if (n_) CUDA_CHECK(cudaMemset(p_, 0xFF, bytes()));
  }
  void upload(const std::vector<T>& v) {
    EXPECT_EQ(v.size(), n_);
    if (n_) CUDA_CHECK(cudaMemcpy(p_, v.data(), bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    if (n_) CUDA_CHECK(cudaMemcpy(v.data(), p_, bytes(), cudaMemcpyDeviceToHost));
    return v;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// bf16 device buffer, moved to and from the host as floats.
class DevBf : public Dev<uint16_t> {
 public:
  explicit DevBf(size_t n = 0) : Dev<uint16_t>(n) {}
  explicit DevBf(const std::vector<float>& v) : Dev<uint16_t>(v.size()) { set(v); }
  bf16* bf() const { return reinterpret_cast<bf16*>(get()); }
  void set(const std::vector<float>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = bf16_bits(v[i]);
    upload(b);
  }
  std::vector<float> floats() const {
    const std::vector<uint16_t> b = download();
    std::vector<float> f(b.size());
    for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_float(b[i]);
    return f;
  }
};

template <class T>
Dev<T> to_dev(const std::vector<T>& v) {
  Dev<T> d(v.size());
  d.upload(v);
  return d;
}

// Scratch of `bytes` (poisoned: kernels must not rely on its contents).
inline Dev<uint8_t> scratch_of(size_t bytes) {
  Dev<uint8_t> s(std::max<size_t>(bytes, 1));
  s.poison();
  return s;
}

inline constexpr double kEpsBf16 = 1.0 / 256.0;           // 2^-8: bf16 unit roundoff
inline constexpr double kEpsF32 = 1.1920928955078125e-7;  // 2^-23

// See [Tolerances]: r bf16 roundings amplified by kappa, fp32 reductions of length K.
inline double tol(double r, double K, double kappa = 1.0) {
  return r * kappa * kappa * kEpsBf16 * kEpsBf16 + 16.0 * std::max(K, 1.0) * kEpsF32 * kEpsF32;
}

inline double nmse(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(got[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return den > 0.0 ? num / den : num;
}

// Every element finite (catches unwritten NaN poison, NaN and Inf), then nmse <= tolerance.
inline ::testing::AssertionResult close(const std::string& what, const std::vector<float>& got,
                                        const std::vector<float>& ref, double tolerance) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " != reference size " << ref.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]))
      return ::testing::AssertionFailure() << what << ": element " << i << " of " << got.size()
                                           << " is " << got[i] << " (unwritten poison, NaN or Inf)";
    if (!std::isfinite(ref[i]))
      return ::testing::AssertionFailure()
             << what << ": reference element " << i << " is " << ref[i];
  }
  const double e = nmse(got, ref);
  if (env_on("TANDEM_GPU_VERBOSE"))
    std::printf("  %-44s n=%-9zu nmse %.3e  tol %.3e  (%.3f of tol)\n", what.c_str(), got.size(), e,
                tolerance, e / tolerance);
  if (!(e <= tolerance))
    return ::testing::AssertionFailure()
           << what << ": nmse " << e << " exceeds the tolerance " << tolerance;
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult bit_equal(const std::string& what, const void* a, const void* b,
                                            size_t bytes) {
  if (std::memcmp(a, b, bytes) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": results differ between identical runs";
}

inline double rms(const std::vector<float>& v) {
  double s = 0.0;
  for (float x : v) s += double(x) * x;
  return v.empty() ? 0.0 : std::sqrt(s / double(v.size()));
}

inline std::vector<float> add(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = a[i] + b[i];
  return r;
}

inline bool gpu_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e);
    return false;
  }
  if (n == 0) {
    *why = "cudaGetDeviceCount returned 0 devices";
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// The fixture: skips without a GPU, owns a stream, a seeded generator and the shared context.

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::string why;
    static const bool ok = gpu_available(&why);
    if (!ok) GTEST_SKIP() << "no CUDA GPU visible, skipping the GPU kernel tests (" << why << ")";
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const char* seed_env = std::getenv("TANDEM_GPU_SEED");
    const uint32_t base = seed_env ? uint32_t(std::strtoul(seed_env, nullptr, 10)) : 1234u;
    rng_.seed(base ^ uint32_t(std::hash<std::string>{}(std::string(info->name()))));
  }
  void TearDown() override {
    if (stream_) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  void sync() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  // One context for the whole run (created once, like the engine's), never destroyed: its
  // destructor would otherwise run after the CUDA runtime has shut down at exit.
  static MatmulContext& ctx() {
    static MatmulContext* c = new MatmulContext();
    return *c;
  }

  // Uniform in [lo, hi), rounded to bf16, never within 1e-3 of zero (never all zeros).
  std::vector<float> rand_bf(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) {
      do x = round_bf16(dist(rng_));
      while (std::fabs(x) < 1e-3f);
    }
    return v;
  }
  // The same without rounding (fp32 inputs: gradients, optimizer state).
  std::vector<float> rand_f32(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) {
      do x = dist(rng_);
      while (std::fabs(x) < 1e-3f);
    }
    return v;
  }
  // Random prefill of an accumulated gradient, of the same RMS as the delta the kernel adds (so
  // the check sees the delta's errors and a kernel that overwrites fails by O(1)).
  std::vector<float> prefill_bf(const std::vector<float>& delta) {
    const float s = float(std::max(rms(delta), 1e-3));
    return rand_bf(delta.size(), -1.7f * s, 1.7f * s);
  }
  std::vector<float> prefill_f32(const std::vector<float>& delta) {
    const float s = float(std::max(rms(delta), 1e-3));
    return rand_f32(delta.size(), -1.7f * s, 1.7f * s);
  }
  std::vector<int32_t> rand_ids(size_t n, int V) {
    std::uniform_int_distribution<int32_t> dist(0, V - 1);
    std::vector<int32_t> v(n);
    for (auto& x : v) x = dist(rng_);
    return v;
  }

  cudaStream_t stream_ = nullptr;
  std::mt19937 rng_;
};

}  // namespace tandem::cuda::kernel_test
