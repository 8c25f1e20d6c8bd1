// GPU tests of split sampling (kernels_sample_split.cu, [Split sampling] in device/kernels.h):
// the CUDA candidates of a slice equal the CPU table's, value for value and id for id, on the
// same bf16-rounded logits; the CUDA pick over the gathered candidates of 1 to 8 ranks draws
// the CPU's token; too many candidates per row are refused. Every test skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "device/cpu/kernel_table.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"
#include "device/kernels.h"
#include "gpu/cuda_kernel_test_util.h"

namespace tandem::cuda {
namespace {

using namespace kernel_test;  // helpers and the fixture: cuda_kernel_test_util.h

std::vector<SamplingParams> split_rules() {
  std::vector<SamplingParams> r = {
      {0.0f, 0, 1.0f, 1},    {1.0f, 0, 1.0f, 2},     {0.7f, 0, 1.0f, 3},   {1.0f, 1, 1.0f, 4},
      {0.8f, 50, 1.0f, 5},   {1.0f, 1024, 1.0f, 6},  {0.9f, 40, 0.9f, 7},  {1.3f, 5, 0.5f, 8},
      {2.0f, 700, 0.95f, 9}, {1.0f, 1024, 0.3f, 10}, {0.6f, 300, 1.0f, 11}};
  for (size_t i = 0; i < r.size(); i += 2) r[i].row_offset = 5;
  return r;
}

std::string describe(const SamplingParams& p) {
  return ::testing::PrintToString(p.temperature) + " top_k=" + std::to_string(p.top_k) +
         " top_p=" + ::testing::PrintToString(p.top_p) + " seed=" + std::to_string(p.seed) +
         " row_offset=" + std::to_string(p.row_offset);
}

class CudaSampleSplit : public CudaKernels {
 protected:
  // N rows of Vp bf16-rounded logits spread like a language model's (most low, a few high);
  // with `ties`, multiples of 1/4 in a narrow range (many equal values).
  std::vector<float> logits(int N, int V, int Vp, bool ties) {
    std::vector<float> x = rand_bf(size_t(N) * Vp, -6.0f, 2.0f);
    for (int n = 0; n < N; ++n) {
      for (int i = 0; i < V; ++i) {
        float& v = x[size_t(n) * Vp + i];
        if (ties) v = std::round(v * 4.0f) / 4.0f;
      }
      for (int j = 0; V > 0 && j < 30; ++j)
        x[size_t(n) * Vp + rand_ids(1, V)[0]] = ties ? 5.0f : rand_bf(1, 4.0f, 9.0f)[0];
      for (int i = V; i < Vp; ++i) x[size_t(n) * Vp + i] = 100.0f;  // padding: never a candidate
    }
    return x;
  }
};

TEST_F(CudaSampleSplit, CandidatesEqualTheCpuTables) {
  const auto cpu = cpu_kernels();
  struct Shape {
    int V, Vp, id_offset;
  };
  for (const Shape s :
       {Shape{12565, 12568, 37695}, Shape{18992, 18992, 0}, Shape{128000, 128000, 128000},
        Shape{1001, 1003, 4004}, Shape{5, 8, 50}, Shape{0, 0, 77}}) {
    for (const bool ties : {false, true}) {
      const int N = 4;
      const std::vector<float> x = logits(N, s.V, s.Vp, ties);
      DevBf d_x(x);
      const auto pos = rand_ids(size_t(N), 4096);
      auto d_pos = to_dev(pos);
      for (const SamplingParams& p : split_rules()) {
        SCOPED_TRACE(::testing::Message() << "V=" << s.V << " Vp=" << s.Vp << " id_offset="
                                          << s.id_offset << " ties=" << ties << " " << describe(p));
        const int K = sample_candidates_per_row(p);
        Dev<float> d_vals(size_t(N) * K);
        Dev<int32_t> d_ids(size_t(N) * K);
        d_vals.poison();
        d_ids.poison();
        sample_candidates(d_vals.get(), d_ids.get(), d_x.bf(), d_pos.get(), N, s.V, s.Vp,
                          s.id_offset, K, p.temperature, p.top_k, p.seed, p.row_offset, stream_);
        sync();
        std::vector<float> vals(size_t(N) * K);
        std::vector<int32_t> ids(size_t(N) * K);
        cpu->sample_candidates(vals.data(), ids.data(), x.data(), pos.data(), N, s.V, s.Vp,
                               s.id_offset, p);
        EXPECT_EQ(d_ids.download(), ids);
        const std::vector<float> got = d_vals.download();
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(got[i], vals[i]) << "candidate " << i;  // -inf padding compares equal
      }
    }
  }
}

TEST_F(CudaSampleSplit, PickOverGatheredCandidatesEqualsTheCpuTables) {
  const auto cpu = cpu_kernels();
  for (const int V : {50257, 151936, 3001}) {
    for (const bool ties : {false, true}) {
      const int N = 3;
      const std::vector<float> x = logits(N, V, V, ties);
      const auto pos = rand_ids(size_t(N), 4096);
      auto d_pos = to_dev(pos);
      for (const int ranks : {1, 2, 3, 8}) {
        // Even slices (the last may be short), each in its own buffer.
        const int per = (V + ranks - 1) / ranks;
        for (const SamplingParams& p : split_rules()) {
          SCOPED_TRACE(::testing::Message() << "V=" << V << " ties=" << ties << " ranks=" << ranks
                                            << " " << describe(p));
          const int K = sample_candidates_per_row(p);
          const size_t part = size_t(N) * K;
          Dev<float> d_vals(part * ranks);
          Dev<int32_t> d_ids(part * ranks);
          std::vector<float> vals(part * ranks);
          std::vector<int32_t> ids(part * ranks);
          for (int r = 0; r < ranks; ++r) {
            const int lo = std::min(V, r * per), Vr = std::min(V, lo + per) - lo;
            std::vector<float> slice(size_t(N) * Vr);
            for (int n = 0; n < N; ++n)
              std::copy_n(x.begin() + ptrdiff_t(size_t(n) * V + lo), Vr,
                          slice.begin() + ptrdiff_t(size_t(n) * Vr));
            DevBf d_slice(slice);
            sample_candidates(d_vals.get() + r * part, d_ids.get() + r * part, d_slice.bf(),
                              d_pos.get(), N, Vr, Vr, lo, K, p.temperature, p.top_k, p.seed,
                              p.row_offset, stream_);
            cpu->sample_candidates(vals.data() + r * part, ids.data() + r * part, slice.data(),
                                   pos.data(), N, Vr, Vr, lo, p);
            sync();
          }
          EXPECT_EQ(d_ids.download(), ids);
          Dev<int32_t> d_tok(static_cast<size_t>(N));
          d_tok.poison();
          sample_pick(d_tok.get(), d_vals.get(), d_ids.get(), d_pos.get(), N, ranks, K,
                      p.temperature, p.top_k, p.top_p, p.seed, p.row_offset, stream_);
          sync();
          std::vector<int32_t> tok(static_cast<size_t>(N));
          cpu->sample_pick(tok.data(), vals.data(), ids.data(), pos.data(), N, ranks, K, p);
          EXPECT_EQ(d_tok.download(), tok);
        }
      }
    }
  }
}

TEST_F(CudaSampleSplit, RefusesTooManyCandidatesPerRow) {
  const int ranks = 8, K = kSamplePickMaxCandidates / ranks + 1, N = 1;
  Dev<float> d_vals(size_t(ranks) * K);
  Dev<int32_t> d_ids(size_t(ranks) * K), d_tok(1), d_pos(1);
  try {
    sample_pick(d_tok.get(), d_vals.get(), d_ids.get(), d_pos.get(), N, ranks, K, 1.0f, K, 1.0f, 1,
                0, stream_);
    FAIL() << "not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("candidates per row"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem::cuda
