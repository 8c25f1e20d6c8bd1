// GPU tests of the CUDA decoding kernels (kernels_decode.cu, kernels_sample.cu, kernels_gemv.cu)
// and of graph capture on the CUDA device: each against a host reference computed in fp32/double
// from the same bf16-rounded inputs, with the tolerances of [Tolerances] in test_cuda_kernels.cpp
// (r bf16 roundings, fp32 reductions of length K); sampling must draw exactly the token of a
// host implementation of the SamplingParams rule (device/kernels.h). Every test skips without a
// GPU. TANDEM_GPU_BENCH=1 also runs DecodeBench.* (GEMV and decode attention bandwidth).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/gumbel.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_device.h"
#include "device/cuda/kernel_table.h"
#include "device/cuda/kernels.cuh"
#include "device/device.h"
#include "device/kernels.h"
#include "gpu/cuda_kernel_test_util.h"

namespace tandem::cuda {
namespace {

using namespace kernel_test;  // helpers and the fixture: cuda_kernel_test_util.h

// ---------------------------------------------------------------------------------------------
// embedding_at

TEST_F(CudaKernels, EmbeddingAt) {
  struct Case {
    int N, C, V, positions;
    bool wpe;
  };
  for (const Case c : {Case{5, 64, 100, 50, true}, Case{5, 64, 100, 50, false},
                       Case{3, 13, 17, 9, true}, Case{8, 768, 50257, 1024, true}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << c.N << " C=" << c.C << " wpe=" << c.wpe);
    const auto tokens = rand_ids(size_t(c.N), c.V);
    const auto pos = rand_ids(size_t(c.N), c.positions);
    const auto wte = rand_bf(size_t(c.V) * c.C);
    const auto wpe = rand_bf(size_t(c.positions) * c.C);
    auto d_tok = to_dev(tokens);
    auto d_pos = to_dev(pos);
    DevBf d_wte(wte), d_wpe(wpe), d_out(size_t(c.N) * c.C);
    d_out.poison();
    embedding_at(d_out.bf(), d_tok.get(), d_pos.get(), d_wte.bf(), c.wpe ? d_wpe.bf() : nullptr,
                 c.N, c.C, c.V, stream_);
    sync();
    std::vector<float> ref(size_t(c.N) * c.C);
    for (int n = 0; n < c.N; ++n)
      for (int k = 0; k < c.C; ++k)
        ref[size_t(n) * c.C + k] =
            wte[size_t(tokens[n]) * c.C + k] + (c.wpe ? wpe[size_t(pos[n]) * c.C + k] : 0.0f);
    // one rounding (of wte + wpe); exact without wpe
    EXPECT_TRUE(close("embedding_at out", d_out.floats(), ref, tol(1, 1)));
  }
}

// ---------------------------------------------------------------------------------------------
// rope_kv_append: the rotated q and k equal rope_forward's at the row's position; the cache
// holds the rotated k and the v of each row at [slot, h, pos] and nothing else is written.

TEST_F(CudaKernels, RopeKvAppend) {
  const int N = 3, Hq = 8, Hkv = 2, D = 64, P = 16, S = 4;
  const float theta = 10000.0f;
  const int W = (Hq + 2 * Hkv) * D;
  const std::vector<int32_t> slot{2, 0, 3}, pos{0, 7, P - 1};
  for (const int rotary_dim : {64, 32, 0}) {
    SCOPED_TRACE(::testing::Message() << "rotary_dim=" << rotary_dim);
    const auto qkv = rand_bf(size_t(N) * W);
    DevBf d_qkv(qkv), d_k(size_t(S) * Hkv * P * D), d_v(size_t(S) * Hkv * P * D);
    d_k.poison();
    d_v.poison();
    auto d_slot = to_dev(slot);
    auto d_pos = to_dev(pos);
    rope_kv_append(d_qkv.bf(), d_k.bf(), d_v.bf(), d_slot.get(), d_pos.get(), N, Hq, Hkv, D,
                   rotary_dim, theta, P, stream_);
    // Reference: rope_forward on each row alone at its position (q and k heads: H = Hq + Hkv).
    DevBf d_ref(qkv);
    if (rotary_dim > 0)
      for (int n = 0; n < N; ++n)
        rope_forward(d_ref.bf() + size_t(n) * W, 1, 1, Hq + Hkv, D, rotary_dim, W, theta, pos[n],
                     stream_);
    sync();
    const std::vector<float> got = d_qkv.floats(), ref = d_ref.floats();
    // the same formula and roundings as rope_forward: equal up to one rounding
    EXPECT_TRUE(close("rope_kv_append qkv", got, ref, tol(1, 1)));
    const std::vector<uint16_t> k = d_k.download(), v = d_v.download();
    const std::vector<uint16_t> qkv_bits = d_qkv.download();
    size_t written = 0;
    for (size_t i = 0; i < k.size(); ++i) written += (k[i] != 0xFFFF) + (v[i] != 0xFFFF);
    EXPECT_EQ(written, size_t(2) * N * Hkv * D) << "cache entries written outside [slot, h, pos]";
    for (int n = 0; n < N; ++n)
      for (int h = 0; h < Hkv; ++h)
        for (int d = 0; d < D; ++d) {
          const size_t at = ((size_t(slot[n]) * Hkv + h) * P + pos[n]) * D + d;
          const size_t kq = size_t(n) * W + size_t(Hq + h) * D + d;
          const size_t vq = size_t(n) * W + size_t(Hq + Hkv + h) * D + d;
          ASSERT_EQ(k[at], qkv_bits[kq]) << "k cache n=" << n << " h=" << h << " d=" << d;
          ASSERT_EQ(v[at], qkv_bits[vq]) << "v cache n=" << n << " h=" << h << " d=" << d;
        }
  }
}

// ---------------------------------------------------------------------------------------------
// attention_decode against a host softmax in double.

std::vector<float> attention_decode_ref(const std::vector<float>& qkv, const std::vector<float>& k,
                                        const std::vector<float>& v,
                                        const std::vector<int32_t>& slot,
                                        const std::vector<int32_t>& pos, int N, int Hq, int Hkv,
                                        int D, int P) {
  const int W = (Hq + 2 * Hkv) * D, G = Hq / Hkv;
  std::vector<float> out(size_t(N) * Hq * D);
  const double scale = 1.0 / std::sqrt(double(D));
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < Hq; ++h) {
      const float* q = qkv.data() + size_t(n) * W + size_t(h) * D;
      const size_t head = (size_t(slot[n]) * Hkv + h / G) * P;
      std::vector<double> s(size_t(pos[n]) + 1);
      double mx = -INFINITY;
      for (int p = 0; p <= pos[n]; ++p) {
        double t = 0.0;
        for (int d = 0; d < D; ++d) t += double(q[d]) * k[(head + p) * D + d];
        s[p] = t * scale;
        mx = std::max(mx, s[p]);
      }
      double sum = 0.0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int d = 0; d < D; ++d) {
        double o = 0.0;
        for (int p = 0; p <= pos[n]; ++p) o += s[p] * v[(head + p) * D + d];
        out[(size_t(n) * Hq + h) * D + d] = float(o / sum);
      }
    }
  return out;
}

TEST_F(CudaKernels, AttentionDecode) {
  struct Case {
    int Hq, Hkv, D, P;
  };
  for (const Case c : {Case{8, 2, 64, 64}, Case{8, 2, 128, 4096}, Case{8, 2, 80, 300},
                       Case{4, 4, 64, 4096}, Case{4, 4, 128, 200}, Case{4, 4, 80, 4096},
                       Case{16, 1, 64, 1000}, Case{6, 2, 32, 100}, Case{2, 1, 256, 700},
                       // caches of at most one split: the single-pass path (no combine)
                       Case{8, 2, 64, 32}, Case{4, 4, 128, 20}}) {
    for (const int N : {1, 4, 9}) {
      SCOPED_TRACE(::testing::Message() << "N=" << N << " Hq=" << c.Hq << " Hkv=" << c.Hkv
                                        << " D=" << c.D << " P=" << c.P);
      const int S = N + 1, W = (c.Hq + 2 * c.Hkv) * c.D;
      // Slots: a permutation leaving one unused; positions: 0, P-1, then random (P-1 alone
      // for one row).
      std::vector<int32_t> slot(static_cast<size_t>(N)), pos(static_cast<size_t>(N));
      std::iota(slot.begin(), slot.end(), 0);
      std::shuffle(slot.begin(), slot.end(), rng_);
      for (auto& s : slot) s = (s + 1) % S;
      const auto rpos = rand_ids(size_t(N), c.P);
      for (int n = 0; n < N; ++n) pos[n] = n == 0 && N > 1 ? 0 : n <= 1 ? c.P - 1 : rpos[n];
      auto qkv = rand_bf(size_t(N) * W);
      for (auto& x : qkv) x = round_bf16(3.0f * x);  // peakier softmax
      const size_t cache = size_t(S) * c.Hkv * c.P * c.D;
      const auto k = rand_bf(cache), v = rand_bf(cache);
      DevBf d_qkv(qkv), d_k(k), d_v(v), d_out(size_t(N) * c.Hq * c.D);
      d_out.poison();
      auto d_slot = to_dev(slot);
      auto d_pos = to_dev(pos);
      const size_t sb = attention_decode_scratch_bytes(N, c.Hq, c.Hkv, c.D, c.P);
      auto scratch = scratch_of(sb);
      attention_decode(d_out.bf(), d_qkv.bf(), d_k.bf(), d_v.bf(), d_slot.get(), d_pos.get(), N,
                       c.Hq, c.Hkv, c.D, c.P, scratch.get(), sb, stream_);
      sync();
      const auto ref = attention_decode_ref(qkv, k, v, slot, pos, N, c.Hq, c.Hkv, c.D, c.P);
      // one rounding of the output (fp32 softmax and sums are far below it); kappa 1.5 for the
      // fp32 exponentials of the scores
      const std::vector<uint16_t> got = d_out.download();
      EXPECT_TRUE(close("attention_decode out", d_out.floats(), ref, tol(1, 1, 1.5)));
      // The splits merged by a second kernel instead of inside clusters (sm_90): the same bits.
      set_attention_decode_clusters(false);
      d_out.poison();
      attention_decode(d_out.bf(), d_qkv.bf(), d_k.bf(), d_v.bf(), d_slot.get(), d_pos.get(), N,
                       c.Hq, c.Hkv, c.D, c.P, scratch.get(), sb, stream_);
      sync();
      set_attention_decode_clusters(true);
      const std::vector<uint16_t> two = d_out.download();
      EXPECT_TRUE(bit_equal("attention_decode clusters vs combine kernel", got.data(), two.data(),
                            got.size() * 2));
    }
  }
  // Too small a scratch and an unsupported head size throw.
  DevBf d(64);
  Dev<int32_t> ids(1);
  EXPECT_THROW(attention_decode(d.bf(), d.bf(), d.bf(), d.bf(), ids.get(), ids.get(), 1, 2, 2, 64,
                                4096, nullptr, 0, stream_),
               tandem::Error);
  EXPECT_THROW(attention_decode(d.bf(), d.bf(), d.bf(), d.bf(), ids.get(), ids.get(), 1, 2, 2, 36,
                                16, nullptr, 0, stream_),
               tandem::Error);
}

// ---------------------------------------------------------------------------------------------
// rope_append_attention_decode: one kernel ([Decode rope]) gives the output and the cache of
// rope_kv_append then attention_decode, bit for bit, for full, partial and no rotary
// dimensions, GQA, ragged positions (a row at P - 1, rows at position 0), a row without a
// slot, one split and many, clusters on and off; a rotary_dim that is no multiple of 16 runs
// the two kernels.

TEST_F(CudaKernels, RopeAppendAttentionDecodeIsTheTwoKernels) {
  struct Case {
    int Hq, Hkv, D, rot, P;
  };
  for (const Case c : {Case{32, 8, 128, 128, 384}, Case{8, 8, 64, 16, 300}, Case{4, 4, 64, 0, 64},
                       Case{8, 2, 128, 64, 4096}, Case{4, 2, 64, 32, 32}, Case{4, 4, 64, 24, 100},
                       Case{2, 1, 256, 256, 700}}) {
    for (const int N : {1, 3, 8})
      for (const bool clusters : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << "N=" << N << " Hq=" << c.Hq << " Hkv=" << c.Hkv << " D=" << c.D
                     << " rot=" << c.rot << " P=" << c.P << " clusters=" << clusters);
        const int S = N + 1, W = (c.Hq + 2 * c.Hkv) * c.D;
        std::vector<int32_t> slot(static_cast<size_t>(N)), pos(static_cast<size_t>(N));
        const auto rpos = rand_ids(size_t(N), c.P);
        for (int n = 0; n < N; ++n) {
          slot[n] = (n + 1) % S;
          pos[n] = n == 0 ? c.P - 1 : n == 1 ? 0 : rpos[n];
        }
        if (N == 8) slot[5] = -1;  // no cache entry: a NaN output either way
        auto qkv = rand_bf(size_t(N) * W);
        for (auto& x : qkv) x = round_bf16(3.0f * x);
        const size_t cache = size_t(S) * c.Hkv * c.P * c.D;
        const auto k = rand_bf(cache), v = rand_bf(cache);
        const size_t sb = attention_decode_scratch_bytes(N, c.Hq, c.Hkv, c.D, c.P);
        auto scratch = scratch_of(sb);
        auto d_slot = to_dev(slot);
        auto d_pos = to_dev(pos);
        set_attention_decode_clusters(clusters);
        std::vector<uint16_t> outs[2], ks[2], vs[2], qkvs[2];
        for (const bool fused : {true, false}) {
          DevBf d_qkv(qkv), d_k(k), d_v(v), d_out(size_t(N) * c.Hq * c.D);
          d_out.poison();
          set_decode_fused_rope(fused);
          rope_append_attention_decode(d_out.bf(), d_qkv.bf(), d_k.bf(), d_v.bf(), d_slot.get(),
                                       d_pos.get(), N, c.Hq, c.Hkv, c.D, c.rot, 10000.0f, c.P,
                                       scratch.get(), sb, stream_);
          sync();
          outs[fused] = d_out.download();
          ks[fused] = d_k.download();
          vs[fused] = d_v.download();
          qkvs[fused] = d_qkv.download();
        }
        set_decode_fused_rope(true);
        set_attention_decode_clusters(true);
        EXPECT_TRUE(bit_equal("fused vs two kernels: out", outs[1].data(), outs[0].data(),
                              outs[0].size() * 2));
        EXPECT_TRUE(bit_equal("fused vs two kernels: k cache", ks[1].data(), ks[0].data(),
                              ks[0].size() * 2));
        EXPECT_TRUE(bit_equal("fused vs two kernels: v cache", vs[1].data(), vs[0].data(),
                              vs[0].size() * 2));
        // Which path ran: the fused kernel rotates in registers and leaves qkv as it was; the
        // two kernels rotate qkv in place. With no rotary both leave it; with a rotary_dim that
        // is no multiple of 16 both sides are the two kernels.
        const std::vector<uint16_t> given = DevBf(qkv).download();
        const bool fused_ran = c.rot > 0 && c.rot % 16 == 0;
        EXPECT_EQ(qkvs[1] == given, c.rot == 0 || fused_ran);
        EXPECT_EQ(qkvs[0] == given, c.rot == 0);
        // Negative control: the key was appended (row 0's cache row is no longer the random one).
        const size_t at = ((size_t(slot[0]) * c.Hkv) * c.P + size_t(pos[0])) * c.D;
        const std::vector<uint16_t> before = DevBf(k).download();
        EXPECT_NE(std::vector<uint16_t>(ks[1].begin() + at, ks[1].begin() + at + c.D),
                  std::vector<uint16_t>(before.begin() + at, before.begin() + at + c.D));
      }
  }
}

// ---------------------------------------------------------------------------------------------
// copy_rows, advance_positions

TEST_F(CudaKernels, CopyRowsAndAdvancePositions) {
  const int rows = 3, cols = 24, stride = 5 * cols + 8;  // elements between source rows
  const auto src = rand_bf(size_t(rows) * stride);
  DevBf d_src(src), d_dst(size_t(rows) * cols);
  d_dst.poison();
  copy_rows(d_dst.bf(), d_src.bf(), rows, cols, stride, stream_);
  std::vector<int32_t> pos{0, 5, 41, 7, 1000};
  auto d_pos = to_dev(pos);
  advance_positions(d_pos.get(), int(pos.size()), stream_);
  advance_positions(d_pos.get(), int(pos.size()), stream_);
  sync();
  const auto dst = d_dst.floats();
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < cols; ++k)
      ASSERT_EQ(dst[size_t(r) * cols + k], src[size_t(r) * stride + k]) << r << "," << k;
  const auto got = d_pos.download();
  for (size_t i = 0; i < pos.size(); ++i) EXPECT_EQ(got[i], pos[i] + 2);
}

// ---------------------------------------------------------------------------------------------
// sample_tokens against a host implementation of the SamplingParams rule.

struct Sampling {
  float temperature;
  int top_k;
  float top_p;
  uint64_t seed;
};

int sample_ref(const float* x, int V, int row, int position, const Sampling& s) {
  if (s.temperature == 0.0f) {
    int best = 0;
    for (int i = 1; i < V; ++i)
      if (x[i] > x[best]) best = i;
    return best;
  }
  std::vector<float> z(size_t(V), 0.0f);
  for (int i = 0; i < V; ++i) z[i] = x[i] / s.temperature;
  float keep = -INFINITY;  // kept: z >= keep
  if (s.top_k > 0 && s.top_k < V) {
    std::vector<float> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (s.top_k - 1), sorted.end(),
                     std::greater<float>());
    keep = sorted[size_t(s.top_k) - 1];
  }
  if (s.top_p < 1.0f) {
    const float m = *std::max_element(z.begin(), z.end());
    std::vector<std::pair<float, double>> kept;  // (z, w)
    double W = 0.0;
    for (int i = 0; i < V; ++i)
      if (z[i] >= keep) {
        const double w = std::exp(z[i] - m);
        kept.emplace_back(z[i], w);
        W += w;
      }
    std::sort(kept.begin(), kept.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    const double target = double(s.top_p) * W;
    double cum = 0.0;
    for (size_t j = 0; j < kept.size();) {  // one distinct value at a time, largest first
      const float t = kept[j].first;
      for (; j < kept.size() && kept[j].first == t; ++j) cum += kept[j].second;
      if (cum >= target) {
        keep = std::max(keep, t);
        break;
      }
    }
  }
  const uint64_t key = gumbel_row_key(s.seed, row, position);
  int best = -1;
  float bv = 0.0f;
  for (int i = 0; i < V; ++i) {
    if (!(z[i] >= keep)) continue;
    const float v = z[i] + gumbel_noise(key, i);
    if (best < 0 || v > bv) best = i, bv = v;
  }
  return best;
}

TEST_F(CudaKernels, SampleTokensGreedy) {
  for (const auto& [V, Vp] : {std::pair{50257, 50304}, std::pair{1001, 1003}}) {
    SCOPED_TRACE(::testing::Message() << "V=" << V << " Vp=" << Vp);
    const int N = 3;
    auto logits = rand_bf(size_t(N) * Vp, -4.0f, 4.0f);
    // Row 0: a tie of the maximum at two indices; row 2: the maximum at the last index.
    logits[size_t(V) / 3] = 8.0f;
    logits[size_t(V) / 2] = 8.0f;
    logits[size_t(2) * Vp + V - 1] = 9.0f;
    for (int n = 0; n < N; ++n)
      for (int i = V; i < Vp; ++i) logits[size_t(n) * Vp + i] = 100.0f;  // padding: never drawn
    DevBf d_logits(logits);
    auto d_pos = to_dev(std::vector<int32_t>{3, 4, 5});
    Dev<int32_t> d_tok(static_cast<size_t>(N));
    d_tok.poison();
    sample_tokens(d_tok.get(), d_logits.bf(), d_pos.get(), N, V, Vp, 0.0f, 0, 1.0f, 1, stream_);
    sync();
    const auto tok = d_tok.download();
    EXPECT_EQ(tok[0], V / 3);
    EXPECT_EQ(tok[2], V - 1);
    for (int n = 0; n < N; ++n)
      EXPECT_EQ(tok[n], sample_ref(logits.data() + size_t(n) * Vp, V, n, 0, {0.0f, 0, 1.0f, 1}));
  }
}

TEST_F(CudaKernels, SampleTokensMatchHostRule) {
  const std::vector<Sampling> params{
      {1.0f, 0, 1.0f, 1},  {0.7f, 50, 1.0f, 2}, {1.0f, 0, 0.9f, 3}, {0.8f, 1000, 0.95f, 4},
      {1.3f, 1, 1.0f, 5},  {0.6f, 5, 0.5f, 6},  {1.0f, 0, 0.3f, 7}, {2.0f, 20000, 0.99f, 8},
      {0.9f, 40, 0.9f, 9}, {1.0f, 0, 1.0f, 10}};
  for (const auto& [V, Vp] :
       {std::pair{50257, 50304}, std::pair{152064, 152064}, std::pair{32001, 32003}}) {
    const int N = 4;
    // Logits spread like a language model's: most low, a few high.
    auto logits = rand_bf(size_t(N) * Vp, -6.0f, 2.0f);
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < 30; ++j) {
        const auto i = rand_ids(1, V)[0];
        logits[size_t(n) * Vp + i] = rand_bf(1, 4.0f, 9.0f)[0];
      }
    DevBf d_logits(logits);
    const auto pos = rand_ids(size_t(N), 4096);
    auto d_pos = to_dev(pos);
    Dev<int32_t> d_tok(static_cast<size_t>(N));
    for (const Sampling& s : params) {
      SCOPED_TRACE(::testing::Message()
                   << "V=" << V << " Vp=" << Vp << " T=" << s.temperature << " top_k=" << s.top_k
                   << " top_p=" << s.top_p << " seed=" << s.seed);
      d_tok.poison();
      sample_tokens(d_tok.get(), d_logits.bf(), d_pos.get(), N, V, Vp, s.temperature, s.top_k,
                    s.top_p, s.seed, stream_);
      sync();
      const auto tok = d_tok.download();
      for (int n = 0; n < N; ++n)
        EXPECT_EQ(tok[n], sample_ref(logits.data() + size_t(n) * Vp, V, n, pos[n], s))
            << "row " << n;
    }
  }
}

// top_k = 1 keeps exactly the maxima, a tiny top_p only the maximum: both are greedy draws.
TEST_F(CudaKernels, SampleTokensDegenerateCuts) {
  const int N = 2, V = 5000, Vp = 5000;
  auto logits = rand_bf(size_t(N) * Vp, -4.0f, 4.0f);
  logits[123] = 7.0f;
  logits[size_t(Vp) + 4321] = 7.5f;
  DevBf d_logits(logits);
  auto d_pos = to_dev(std::vector<int32_t>{0, 1});
  Dev<int32_t> d_tok(static_cast<size_t>(N));
  for (const Sampling& s : {Sampling{1.0f, 1, 1.0f, 11}, Sampling{1.0f, 0, 1e-6f, 12}}) {
    sample_tokens(d_tok.get(), d_logits.bf(), d_pos.get(), N, V, Vp, s.temperature, s.top_k,
                  s.top_p, s.seed, stream_);
    sync();
    const auto tok = d_tok.download();
    EXPECT_EQ(tok[0], 123);
    EXPECT_EQ(tok[1], 4321);
  }
}

// ---------------------------------------------------------------------------------------------
// GEMV against a host product in double.

TEST_F(CudaKernels, Gemv) {
  struct Case {
    int OC, IC;
  };
  for (const Case c : {Case{64, 256}, Case{37, 136}, Case{300, 4096}, Case{17, 8}, Case{1, 1032}}) {
    for (int N = 1; N <= kGemvMaxRows; ++N) {
      for (const bool with_bias : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "N=" << N << " OC=" << c.OC << " IC=" << c.IC << " bias=" << with_bias);
        const auto x = rand_bf(size_t(N) * c.IC), w = rand_bf(size_t(c.OC) * c.IC),
                   b = rand_bf(size_t(c.OC));
        DevBf d_x(x), d_w(w), d_b(b), d_y(size_t(N) * c.OC);
        d_y.poison();
        ASSERT_TRUE(gemv_supported(d_x.bf(), d_w.bf(), N, c.IC, c.OC));
        gemv_forward(d_y.bf(), d_x.bf(), d_w.bf(), with_bias ? d_b.bf() : nullptr, N, c.IC, c.OC,
                     stream_);
        sync();
        std::vector<float> ref(size_t(N) * c.OC);
        for (int n = 0; n < N; ++n)
          for (int o = 0; o < c.OC; ++o) {
            double t = with_bias ? b[o] : 0.0;
            for (int i = 0; i < c.IC; ++i)
              t += double(x[size_t(n) * c.IC + i]) * w[size_t(o) * c.IC + i];
            ref[size_t(n) * c.OC + o] = float(t);
          }
        // one rounding of the output; fp32 sums of length IC
        EXPECT_TRUE(close("gemv out", d_y.floats(), ref, tol(1, c.IC)));
      }
    }
  }
  DevBf d(64);
  EXPECT_FALSE(gemv_supported(d.bf(), d.bf(), 1, 12, 4));      // IC % 8
  EXPECT_FALSE(gemv_supported(d.bf(), d.bf(), 9, 16, 4));      // N > 8
  EXPECT_FALSE(gemv_supported(d.bf() + 1, d.bf(), 1, 16, 4));  // misaligned x
}

// ---------------------------------------------------------------------------------------------
// The fused linears of decoding through the CUDA kernel table (the GEMV for N <= 8, the unfused
// fallback for N > 8), against host references with the unfused kernels' bf16-rounded
// intermediates: the normalised rows and the SwiGLU rows are rounded to bf16 before the product.

class CudaFusedLinear : public CudaKernels {
 protected:
  std::unique_ptr<Kernels> table(int N, int C, int F) {
    auto t = cuda_kernels(AttentionImpl::automatic, &ctx(), stream_);
    KernelShape s;
    s.B = N;
    s.C = s.Q = s.A = C;
    s.F = s.M = F;
    s.Hq = s.Hkv = 1;
    s.D = 32;
    s.V = s.Vp = 8;
    s.P = 16;
    scratch_ = scratch_of(t->scratch_bytes(s));
    t->set_scratch(scratch_.get(), scratch_.bytes());
    return t;
  }
  // y[n, o] = sum_i a[n, i] w[o, i] + (bias) + (residual), in double.
  static std::vector<float> product(const std::vector<float>& a, const std::vector<float>& w,
                                    const std::vector<float>* b, const std::vector<float>* res,
                                    int N, int IC, int OC) {
    std::vector<float> y(size_t(N) * OC);
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < OC; ++o) {
        double t = b ? (*b)[o] : 0.0;
        if (res) t += (*res)[size_t(n) * OC + o];
        for (int i = 0; i < IC; ++i) t += double(a[size_t(n) * IC + i]) * w[size_t(o) * IC + i];
        y[size_t(n) * OC + o] = float(t);
      }
    return y;
  }
  Dev<uint8_t> scratch_;
};

constexpr int kFusedRows[] = {1, 2, 3, 4, 5, 6, 7, 8, 12};

TEST_F(CudaFusedLinear, LinearResidual) {
  const int IC = 136, OC = 70;
  for (const int N : kFusedRows) {
    for (const bool with_bias : {false, true}) {
      const bool alias = N % 2 == 0;
      SCOPED_TRACE(::testing::Message()
                   << "N=" << N << " bias=" << with_bias << " alias=" << alias);
      auto t = table(N, IC, 64);
      const auto x = rand_bf(size_t(N) * IC), w = rand_bf(size_t(OC) * IC), b = rand_bf(size_t(OC)),
                 res = rand_bf(size_t(N) * OC);
      DevBf d_x(x), d_w(w), d_b(b), d_res(res), d_y(size_t(N) * OC);
      d_y.poison();
      bf16* out = alias ? d_res.bf() : d_y.bf();
      t->linear_residual_forward(out, d_x.bf(), d_w.bf(), with_bias ? d_b.bf() : nullptr,
                                 d_res.bf(), N, IC, OC);
      sync();
      const auto ref = product(x, w, with_bias ? &b : nullptr, &res, N, IC, OC);
      // one rounding (two where cuBLASLt adds the bias separately); fp32 sums of length IC
      EXPECT_TRUE(close("linear_residual out", (alias ? d_res : d_y).floats(), ref, tol(2, IC)));
    }
  }
}

TEST_F(CudaFusedLinear, NormLinear) {
  const int IC = 264, OC = 52;
  const float eps = 1e-5f;
  enum class Norm { layernorm, layernorm_nobias, rmsnorm };
  for (const Norm norm : {Norm::layernorm, Norm::layernorm_nobias, Norm::rmsnorm}) {
    for (const int N : kFusedRows) {
      const bool rms = norm == Norm::rmsnorm, nbias = norm == Norm::layernorm;
      SCOPED_TRACE(::testing::Message() << "N=" << N << " norm=" << int(norm));
      auto t = table(N, IC, 64);
      // an offset mean, so the LayerNorm's centring matters
      const auto x = rand_bf(size_t(N) * IC, -0.5f, 1.5f), nw = rand_bf(size_t(IC), 0.5f, 1.5f),
                 nb = rand_bf(size_t(IC)), w = rand_bf(size_t(OC) * IC), b = rand_bf(size_t(OC));
      DevBf d_x(x), d_nw(nw), d_nb(nb), d_w(w), d_b(b), d_y(size_t(N) * OC);
      d_y.poison();
      t->norm_linear_forward(d_y.bf(), d_x.bf(), d_nw.bf(), nbias ? d_nb.bf() : nullptr, rms, eps,
                             d_w.bf(), d_b.bf(), N, IC, OC);
      sync();
      std::vector<float> a(size_t(N) * IC);
      for (int n = 0; n < N; ++n) {
        const float* xr = x.data() + size_t(n) * IC;
        double m = 0.0, ss = 0.0;
        if (!rms) {
          for (int i = 0; i < IC; ++i) m += xr[i];
          m /= IC;
        }
        for (int i = 0; i < IC; ++i) ss += (xr[i] - m) * (xr[i] - m);
        const double r = 1.0 / std::sqrt(ss / IC + eps);
        for (int i = 0; i < IC; ++i)
          a[size_t(n) * IC + i] =
              round_bf16(float((xr[i] - m) * r * nw[i] + (nbias ? nb[i] : 0.0)));
      }
      const auto ref = product(a, w, &b, nullptr, N, IC, OC);
      // the normalised rows rounded (an ulp apart where the statistics differ), the output
      // rounded; fp32 sums of length IC
      EXPECT_TRUE(close("norm_linear out", d_y.floats(), ref, tol(3, IC)));
    }
  }
}

TEST_F(CudaFusedLinear, SwigluLinearResidual) {
  const int F = 200, OC = 44;
  for (const int N : kFusedRows) {
    for (const bool with_bias : {false, true}) {
      const bool alias = N % 2 == 1;
      SCOPED_TRACE(::testing::Message()
                   << "N=" << N << " bias=" << with_bias << " alias=" << alias);
      auto t = table(N, 64, F);
      const auto hh = rand_bf(size_t(N) * 2 * F, -3.0f, 3.0f), w = rand_bf(size_t(OC) * F),
                 b = rand_bf(size_t(OC)), res = rand_bf(size_t(N) * OC);
      DevBf d_h(hh), d_w(w), d_b(b), d_res(res), d_y(size_t(N) * OC);
      d_y.poison();
      bf16* out = alias ? d_res.bf() : d_y.bf();
      t->swiglu_linear_residual_forward(out, d_h.bf(), d_w.bf(), with_bias ? d_b.bf() : nullptr,
                                        d_res.bf(), N, F, OC);
      sync();
      std::vector<float> a(size_t(N) * F);
      for (int n = 0; n < N; ++n)
        for (int i = 0; i < F; ++i) {
          const double g = hh[size_t(n) * 2 * F + i], u = hh[size_t(n) * 2 * F + F + i];
          a[size_t(n) * F + i] = round_bf16(float(g / (1.0 + std::exp(-g)) * u));
        }
      const auto ref = product(a, w, with_bias ? &b : nullptr, &res, N, F, OC);
      EXPECT_TRUE(
          close("swiglu_linear_residual out", (alias ? d_res : d_y).floats(), ref, tol(3, F)));
    }
  }
}

TEST_F(CudaFusedLinear, LinearGelu) {
  const int IC = 96, OC = 136;
  for (const GeluKind kind : {GeluKind::tanh, GeluKind::erf}) {
    for (const int N : kFusedRows) {
      SCOPED_TRACE(::testing::Message() << "N=" << N << " erf=" << (kind == GeluKind::erf));
      auto t = table(N, IC, 64);
      const auto x = rand_bf(size_t(N) * IC), w = rand_bf(size_t(OC) * IC), b = rand_bf(size_t(OC));
      DevBf d_x(x), d_w(w), d_b(b), d_pre(size_t(N) * OC), d_out(size_t(N) * OC);
      d_pre.poison();
      d_out.poison();
      t->linear_gelu_forward(d_out.bf(), d_pre.bf(), d_x.bf(), d_w.bf(), d_b.bf(), N, IC, OC, kind);
      sync();
      const auto pre = product(x, w, &b, nullptr, N, IC, OC);
      std::vector<float> out(pre.size());
      for (size_t i = 0; i < pre.size(); ++i) {
        const double p = pre[i];
        out[i] = float(
            kind == GeluKind::erf
                ? 0.5 * p * (1.0 + std::erf(p / std::sqrt(2.0)))
                : 0.5 * p * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (p + 0.044715 * p * p * p))));
      }
      EXPECT_TRUE(close("linear_gelu pre", d_pre.floats(), pre, tol(1, IC)));
      // pre rounded, then the GELU's output rounded
      EXPECT_TRUE(close("linear_gelu out", d_out.floats(), out, tol(2, IC)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The GEMV and its fused variants at shapes of few output rows and long rows (Llama-7B's O and
// down projections, whose rows end in a partial unrolled step) and at odd shapes (a last tile of
// a few rows, rows of an odd number of 16-byte chunks), against host products in double.

TEST_F(CudaFusedLinear, GemvWideRows) {
  struct Case {
    int OC, IC;
  };
  const float eps = 1e-5f;
  for (const Case c :
       {Case{4096, 4096}, Case{4096, 11008}, Case{4100, 1032}, Case{263, 11008}, Case{5, 2056}}) {
    for (const int N : {1, 2, 8}) {
      SCOPED_TRACE(::testing::Message() << "N=" << N << " OC=" << c.OC << " IC=" << c.IC);
      const int IC = c.IC, OC = c.OC;
      const auto x = rand_bf(size_t(N) * IC, -0.5f, 1.5f), w = rand_bf(size_t(OC) * IC),
                 b = rand_bf(size_t(OC)), res = rand_bf(size_t(N) * OC),
                 nw = rand_bf(size_t(IC), 0.5f, 1.5f),
                 hh = rand_bf(size_t(N) * 2 * IC, -3.0f, 3.0f);
      DevBf d_x(x), d_w(w), d_b(b), d_res(res), d_nw(nw), d_h(hh), d_y(size_t(N) * OC);
      ASSERT_TRUE(gemv_supported(d_x.bf(), d_w.bf(), N, IC, OC));

      d_y.poison();
      gemv_forward(d_y.bf(), d_x.bf(), d_w.bf(), d_b.bf(), N, IC, OC, stream_);
      sync();
      // one rounding of the output; fp32 sums of length IC
      EXPECT_TRUE(
          close("gemv out", d_y.floats(), product(x, w, &b, nullptr, N, IC, OC), tol(1, IC)));

      // the residual aliased by the output
      gemv_residual_forward(d_res.bf(), d_x.bf(), d_w.bf(), nullptr, d_res.bf(), N, IC, OC,
                            stream_);
      sync();
      EXPECT_TRUE(close("gemv_residual out", d_res.floats(),
                        product(x, w, nullptr, &res, N, IC, OC), tol(1, IC)));

      d_y.poison();
      gemv_norm_forward(d_y.bf(), d_x.bf(), d_nw.bf(), nullptr, true, eps, d_w.bf(), nullptr, N, IC,
                        OC, stream_);
      sync();
      std::vector<float> a(size_t(N) * IC);
      for (int n = 0; n < N; ++n) {
        const float* xr = x.data() + size_t(n) * IC;
        double ss = 0.0;
        for (int i = 0; i < IC; ++i) ss += double(xr[i]) * xr[i];
        const double r = 1.0 / std::sqrt(ss / IC + eps);
        for (int i = 0; i < IC; ++i) a[size_t(n) * IC + i] = round_bf16(float(xr[i] * r * nw[i]));
      }
      // the normalised rows rounded (an ulp apart where the statistics differ), the output
      // rounded; fp32 sums of length IC
      EXPECT_TRUE(close("gemv_norm out", d_y.floats(), product(a, w, nullptr, nullptr, N, IC, OC),
                        tol(3, IC)));

      const auto res2 = d_res.floats();  // the residual as the previous product left it
      d_y.poison();
      gemv_swiglu_residual_forward(d_y.bf(), d_h.bf(), d_w.bf(), d_b.bf(), d_res.bf(), N, IC, OC,
                                   stream_);
      sync();
      for (int n = 0; n < N; ++n)
        for (int i = 0; i < IC; ++i) {
          const double g = hh[size_t(n) * 2 * IC + i], u = hh[size_t(n) * 2 * IC + IC + i];
          a[size_t(n) * IC + i] = round_bf16(float(g / (1.0 + std::exp(-g)) * u));
        }
      EXPECT_TRUE(close("gemv_swiglu_residual out", d_y.floats(),
                        product(a, w, &b, &res2, N, IC, OC), tol(3, IC)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// [GEMV MMA] Every fused variant on both main loops (CUDA cores and tensor cores, forced with
// set_gemv_path) at Llama-7B shapes and odd ones (OC not a multiple of 16; IC a multiple of 8
// but not of 16; fewer rows than one m16 tile), against host products in double, and the two
// paths against each other; the tensor-core path is also run twice and must repeat bit for bit.

class GemvPathScope {
 public:
  explicit GemvPathScope(GemvPath path) : was_(gemv_path()) { set_gemv_path(path); }
  ~GemvPathScope() { set_gemv_path(was_); }
  GemvPathScope(const GemvPathScope&) = delete;
  GemvPathScope& operator=(const GemvPathScope&) = delete;

 private:
  GemvPath was_;
};

// d[n, o] = sum_i a[n, i] w[o, i] in double (four partial sums, for speed at 4096 x 12288).
std::vector<double> dots(const std::vector<float>& a, const std::vector<float>& w, int N, int IC,
                         int OC) {
  std::vector<double> d(size_t(N) * OC);
  for (int n = 0; n < N; ++n) {
    const float* ar = a.data() + size_t(n) * IC;
    for (int o = 0; o < OC; ++o) {
      const float* wr = w.data() + size_t(o) * IC;
      double s[4] = {0.0, 0.0, 0.0, 0.0};
      int i = 0;
      for (; i + 4 <= IC; i += 4)
        for (int j = 0; j < 4; ++j) s[j] += double(ar[i + j]) * wr[i + j];
      for (; i < IC; ++i) s[0] += double(ar[i]) * wr[i];
      d[size_t(n) * OC + o] = (s[0] + s[1]) + (s[2] + s[3]);
    }
  }
  return d;
}

TEST_F(CudaKernels, GemvTensorCoresEveryVariant) {
  struct Case {
    int OC, IC;
  };
  const float eps = 1e-5f;
  for (const Case c : {Case{4096, 4096}, Case{4096, 11008}, Case{12288, 4096}, Case{4100, 1032},
                       Case{263, 2056}, Case{5, 136}, Case{17, 8}}) {
    for (const int N : {2, 3, 5, 8}) {
      SCOPED_TRACE(::testing::Message() << "N=" << N << " OC=" << c.OC << " IC=" << c.IC);
      const int IC = c.IC, OC = c.OC;
      const size_t nin = size_t(N) * IC, nout = size_t(N) * OC;
      const auto x = rand_bf(nin, -0.5f, 1.5f), w = rand_bf(size_t(OC) * IC),
                 b = rand_bf(size_t(OC)), res = rand_bf(nout), nw = rand_bf(size_t(IC), 0.5f, 1.5f),
                 nb = rand_bf(size_t(IC)), hh = rand_bf(2 * nin, -3.0f, 3.0f);
      DevBf d_x(x), d_w(w), d_b(b), d_res(res), d_nw(nw), d_nb(nb), d_h(hh), d_y(nout), d_pre(nout);
      ASSERT_TRUE(gemv_supported(d_x.bf(), d_w.bf(), N, IC, OC));

      // The host inputs of the product: the RMSNorm, LayerNorm and SwiGLU rows rounded to bf16.
      std::vector<float> a_rms(nin), a_ln(nin), a_sw(nin);
      for (int n = 0; n < N; ++n) {
        const float* xr = x.data() + size_t(n) * IC;
        double m = 0.0, ss = 0.0, sc = 0.0;
        for (int i = 0; i < IC; ++i) m += xr[i];
        m /= IC;
        for (int i = 0; i < IC; ++i) {
          ss += double(xr[i]) * xr[i];
          sc += (xr[i] - m) * (xr[i] - m);
        }
        const double r = 1.0 / std::sqrt(ss / IC + eps), rc = 1.0 / std::sqrt(sc / IC + eps);
        for (int i = 0; i < IC; ++i) {
          const size_t k = size_t(n) * IC + i;
          a_rms[k] = round_bf16(float(xr[i] * r * nw[i]));
          a_ln[k] = round_bf16(float((xr[i] - m) * rc * nw[i] + nb[i]));
          const double g = hh[size_t(n) * 2 * IC + i], u = hh[size_t(n) * 2 * IC + IC + i];
          a_sw[k] = round_bf16(float(g / (1.0 + std::exp(-g)) * u));
        }
      }
      const auto dx = dots(x, w, N, IC, OC), drms = dots(a_rms, w, N, IC, OC),
                 dln = dots(a_ln, w, N, IC, OC), dsw = dots(a_sw, w, N, IC, OC);
      std::vector<float> ref_plain(nout), ref_res(nout), ref_rms(nout), ref_ln(nout), ref_sw(nout),
          ref_gelu(nout);
      const bool exact = N % 2 == 1;
      for (size_t k = 0; k < nout; ++k) {
        const int o = int(k % size_t(OC));
        ref_plain[k] = float(dx[k] + b[o]);
        ref_res[k] = float(dx[k] + res[k]);
        ref_rms[k] = float(drms[k]);
        ref_ln[k] = float(dln[k] + b[o]);
        ref_sw[k] = float(dsw[k] + b[o] + res[k]);
        const double p = ref_plain[k];
        ref_gelu[k] = float(
            exact
                ? 0.5 * p * (1.0 + std::erf(p / std::sqrt(2.0)))
                : 0.5 * p * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (p + 0.044715 * p * p * p))));
      }

      // Outputs of each variant, per path: plain, residual, RMSNorm, LayerNorm, SwiGLU +
      // residual, GELU's pre and out.
      constexpr int kVariants = 7;
      const char* names[kVariants] = {"gemv",
                                      "gemv_residual",
                                      "gemv_norm rms",
                                      "gemv_norm layernorm",
                                      "gemv_swiglu_residual",
                                      "gemv_gelu pre",
                                      "gemv_gelu out"};
      const std::vector<float>* refs[kVariants] = {&ref_plain, &ref_res,   &ref_rms, &ref_ln,
                                                   &ref_sw,    &ref_plain, &ref_gelu};
      // one output rounding; the normalised or SwiGLU rows rounded too (an ulp apart where the
      // statistics differ); GELU's output rounded after its rounded input
      const double tols[kVariants] = {tol(1, IC), tol(1, IC), tol(3, IC), tol(3, IC),
                                      tol(3, IC), tol(1, IC), tol(2, IC)};
      std::vector<float> got[2][kVariants];
      for (const GemvPath path : {GemvPath::cuda_cores, GemvPath::tensor_cores}) {
        const int p = path == GemvPath::tensor_cores;
        SCOPED_TRACE(p ? "tensor cores" : "CUDA cores");
        GemvPathScope scope(path);
        auto run = [&](int v) {
          d_y.poison();
          d_pre.poison();
          switch (v) {
            case 0:
              gemv_forward(d_y.bf(), d_x.bf(), d_w.bf(), d_b.bf(), N, IC, OC, stream_);
              break;
            case 1:
              gemv_residual_forward(d_y.bf(), d_x.bf(), d_w.bf(), nullptr, d_res.bf(), N, IC, OC,
                                    stream_);
              break;
            case 2:
              gemv_norm_forward(d_y.bf(), d_x.bf(), d_nw.bf(), nullptr, true, eps, d_w.bf(),
                                nullptr, N, IC, OC, stream_);
              break;
            case 3:
              gemv_norm_forward(d_y.bf(), d_x.bf(), d_nw.bf(), d_nb.bf(), false, eps, d_w.bf(),
                                d_b.bf(), N, IC, OC, stream_);
              break;
            case 4:
              gemv_swiglu_residual_forward(d_y.bf(), d_h.bf(), d_w.bf(), d_b.bf(), d_res.bf(), N,
                                           IC, OC, stream_);
              break;
            default:
              gemv_gelu_forward(d_y.bf(), d_pre.bf(), d_x.bf(), d_w.bf(), d_b.bf(), N, IC, OC,
                                exact, stream_);
              break;
          }
          sync();
        };
        for (int v = 0; v < kVariants; ++v) {
          if (v == 6) continue;  // GELU's out comes with its pre
          run(v);
          if (v == 5) {
            got[p][5] = d_pre.floats();
            got[p][6] = d_y.floats();
          } else {
            got[p][v] = d_y.floats();
          }
        }
        for (int v = 0; v < kVariants; ++v)
          EXPECT_TRUE(close(names[v], got[p][v], *refs[v], tols[v]));
        // Deterministic: the same launch repeats its output bit for bit.
        run(4);
        const auto again = d_y.floats();
        EXPECT_TRUE(bit_equal("gemv_swiglu_residual rerun", again.data(), got[p][4].data(),
                              again.size() * sizeof(float)));
      }
      // The two paths agree (each within one output rounding of the exact product).
      for (int v = 0; v < kVariants; ++v)
        EXPECT_TRUE(close(std::string(names[v]) + " tensor vs CUDA cores", got[1][v], got[0][v],
                          2.0 * tols[v]));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// [PDL] Decoding steps of a two-block model through the fused GEMVs, the cache kernels and the
// draw give bit for bit the same tokens, cache and activations with programmatic dependent
// launch on and off, run directly and replayed from a graph. The blocks reuse the qkv and
// hidden buffers and update the residual in place, so a kernel that wrote before waiting for
// its predecessor would show.

class PdlScope {
 public:
  explicit PdlScope(bool on) : was_(pdl_enabled()) { set_pdl(on); }
  ~PdlScope() { set_pdl(was_); }
  PdlScope(const PdlScope&) = delete;
  PdlScope& operator=(const PdlScope&) = delete;

 private:
  bool was_;
};

TEST_F(CudaKernels, DecodeStepPdlOnOffBitEqual) {
  const int N = 3, C = 256, Hq = 4, Hkv = 2, D = 64, F = 1376, P = 64, S = 4, V = 500, Vp = 512;
  const int L = 2, W = (Hq + 2 * Hkv) * D, A = Hq * D;
  const float eps = 1e-5f;
  const std::vector<int32_t> tok0{1, 250, 499}, slot{3, 0, 2}, pos0{0, 10, 5};
  DevBf d_wte(rand_bf(size_t(V) * C)), d_head(rand_bf(size_t(Vp) * C, -0.2f, 0.2f)),
      d_nwf(rand_bf(size_t(C), 0.5f, 1.5f));
  struct Block {
    DevBf nw1, wqkv, wo, nw2, wgu, wd, k, v;
  };
  std::vector<Block> blocks;
  for (int l = 0; l < L; ++l)
    blocks.push_back(
        Block{DevBf(rand_bf(size_t(C), 0.5f, 1.5f)), DevBf(rand_bf(size_t(W) * C, -0.2f, 0.2f)),
              DevBf(rand_bf(size_t(C) * A, -0.1f, 0.1f)), DevBf(rand_bf(size_t(C), 0.5f, 1.5f)),
              DevBf(rand_bf(size_t(2) * F * C, -0.2f, 0.2f)),
              DevBf(rand_bf(size_t(C) * F, -0.05f, 0.05f)), DevBf(size_t(S) * Hkv * P * D),
              DevBf(size_t(S) * Hkv * P * D)});
  DevBf d_x(size_t(N) * C), d_qkv(size_t(N) * W), d_att(size_t(N) * A), d_h(size_t(N) * 2 * F),
      d_logits(size_t(N) * Vp);
  Dev<int32_t> d_tok(static_cast<size_t>(N)), d_pos(static_cast<size_t>(N));
  auto d_slot = to_dev(slot);
  const size_t sb = attention_decode_scratch_bytes(N, Hq, Hkv, D, P);
  auto scratch = scratch_of(sb);

  auto reset = [&] {
    d_tok.upload(tok0);
    d_pos.upload(pos0);
    for (Block& b : blocks) {
      CUDA_CHECK(cudaMemset(b.k.get(), 0, b.k.bytes()));
      CUDA_CHECK(cudaMemset(b.v.get(), 0, b.v.bytes()));
    }
    CUDA_CHECK(cudaDeviceSynchronize());
  };
  auto step = [&] {
    embedding_at(d_x.bf(), d_tok.get(), d_pos.get(), d_wte.bf(), nullptr, N, C, V, stream_);
    for (Block& b : blocks) {
      gemv_norm_forward(d_qkv.bf(), d_x.bf(), b.nw1.bf(), nullptr, true, eps, b.wqkv.bf(), nullptr,
                        N, C, W, stream_);
      rope_kv_append(d_qkv.bf(), b.k.bf(), b.v.bf(), d_slot.get(), d_pos.get(), N, Hq, Hkv, D, D,
                     10000.0f, P, stream_);
      attention_decode(d_att.bf(), d_qkv.bf(), b.k.bf(), b.v.bf(), d_slot.get(), d_pos.get(), N, Hq,
                       Hkv, D, P, scratch.get(), sb, stream_);
      gemv_residual_forward(d_x.bf(), d_att.bf(), b.wo.bf(), nullptr, d_x.bf(), N, A, C, stream_);
      gemv_norm_forward(d_h.bf(), d_x.bf(), b.nw2.bf(), nullptr, true, eps, b.wgu.bf(), nullptr, N,
                        C, 2 * F, stream_);
      gemv_swiglu_residual_forward(d_x.bf(), d_h.bf(), b.wd.bf(), nullptr, d_x.bf(), N, F, C,
                                   stream_);
    }
    gemv_norm_forward(d_logits.bf(), d_x.bf(), d_nwf.bf(), nullptr, true, eps, d_head.bf(), nullptr,
                      N, C, Vp, stream_);
    advance_positions(d_pos.get(), N, stream_);
    sample_tokens(d_tok.get(), d_logits.bf(), d_pos.get(), N, V, Vp, 0.8f, 40, 0.9f, 7, stream_);
  };
  struct State {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::vector<uint16_t>> caches;
    std::vector<uint16_t> x, logits;
    std::vector<int32_t> pos;
  };
  const int steps = 4;
  auto finish = [&](State& s) {
    sync();
    for (Block& b : blocks) {
      s.caches.push_back(b.k.download());
      s.caches.push_back(b.v.download());
    }
    s.x = d_x.download();
    s.logits = d_logits.download();
    s.pos = d_pos.download();
  };
  auto run_direct = [&](bool pdl) {
    PdlScope scope(pdl);
    State s;
    reset();
    for (int i = 0; i < steps; ++i) {
      step();
      sync();
      s.tokens.push_back(d_tok.download());
    }
    finish(s);
    return s;
  };
  auto run_graph = [&](bool pdl) {
    PdlScope scope(pdl);
    State s;
    reset();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    step();
    CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < steps; ++i) {
      CUDA_CHECK(cudaGraphLaunch(exec, stream_));
      sync();
      s.tokens.push_back(d_tok.download());
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    finish(s);
    return s;
  };
  const State off = run_direct(false), on = run_direct(true), graph_on = run_graph(true),
              graph_off = run_graph(false);
  EXPECT_TRUE(pdl_enabled()) << "PDL is on by default and the scopes restore it";
  for (const auto& [name, got] :
       {std::pair<const char*, const State*>{"pdl on", &on},
        std::pair<const char*, const State*>{"graph, pdl on", &graph_on},
        std::pair<const char*, const State*>{"graph, pdl off", &graph_off}}) {
    SCOPED_TRACE(name);
    for (int i = 0; i < steps; ++i) EXPECT_EQ(got->tokens[i], off.tokens[i]) << "step " << i;
    EXPECT_EQ(got->pos, off.pos);
    for (size_t c = 0; c < off.caches.size(); ++c)
      EXPECT_TRUE(bit_equal("cache", got->caches[c].data(), off.caches[c].data(),
                            off.caches[c].size() * 2));
    EXPECT_TRUE(bit_equal("residual", got->x.data(), off.x.data(), off.x.size() * 2));
    EXPECT_TRUE(bit_equal("logits", got->logits.data(), off.logits.data(), off.logits.size() * 2));
  }
  for (int n = 0; n < N; ++n) EXPECT_EQ(off.pos[n], pos0[n] + steps);
  EXPECT_NE(off.tokens[0], off.tokens[steps - 1]) << "the draw is stuck";
}

// ---------------------------------------------------------------------------------------------
// A decoding step captured into a CUDA graph replays like the same calls run directly.

TEST_F(CudaKernels, DecodeStepGraphReplay) {
  std::unique_ptr<Device> dev = cuda_device_create(0);
  ASSERT_TRUE(dev->supports_graphs());
  EXPECT_GT(dev->free_bytes(), size_t(0));
  const int N = 3, Hq = 8, Hkv = 2, D = 64, P = 64, S = 4, V = 1000, Vp = 1008;
  const int W = (Hq + 2 * Hkv) * D, A = Hq * D;
  // The embedding row is the qkv row (no projection); the logits are a GEMV of the attention.
  const auto wte = rand_bf(size_t(V) * W), wout = rand_bf(size_t(Vp) * A, -0.2f, 0.2f);
  const std::vector<int32_t> tok0{1, 500, 999}, slot{3, 0, 2}, pos0{0, 10, 5};
  DevBf d_wte(wte), d_wout(wout), d_qkv(size_t(N) * W), d_att(size_t(N) * A),
      d_logits(size_t(N) * Vp), d_k(size_t(S) * Hkv * P * D), d_v(size_t(S) * Hkv * P * D);
  Dev<int32_t> d_tok(static_cast<size_t>(N)), d_pos(static_cast<size_t>(N));
  auto d_slot = to_dev(slot);
  const size_t sb = attention_decode_scratch_bytes(N, Hq, Hkv, D, P);
  auto scratch = scratch_of(sb);
  std::unique_ptr<Stream> stream = dev->stream_create("decode");
  const cudaStream_t cs = cuda_stream_of(*stream);

  auto reset = [&] {
    d_tok.upload(tok0);
    d_pos.upload(pos0);
    CUDA_CHECK(cudaMemset(d_k.get(), 0, d_k.bytes()));
    CUDA_CHECK(cudaMemset(d_v.get(), 0, d_v.bytes()));
    CUDA_CHECK(cudaDeviceSynchronize());  // the memsets ran on the legacy stream
  };
  auto step = [&] {
    embedding_at(d_qkv.bf(), d_tok.get(), d_pos.get(), d_wte.bf(), nullptr, N, W, V, cs);
    rope_kv_append(d_qkv.bf(), d_k.bf(), d_v.bf(), d_slot.get(), d_pos.get(), N, Hq, Hkv, D, D,
                   10000.0f, P, cs);
    attention_decode(d_att.bf(), d_qkv.bf(), d_k.bf(), d_v.bf(), d_slot.get(), d_pos.get(), N, Hq,
                     Hkv, D, P, scratch.get(), sb, cs);
    gemv_forward(d_logits.bf(), d_att.bf(), d_wout.bf(), nullptr, N, A, Vp, cs);
    advance_positions(d_pos.get(), N, cs);
    sample_tokens(d_tok.get(), d_logits.bf(), d_pos.get(), N, V, Vp, 0.8f, 40, 0.9f, 7, cs);
  };
  struct State {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<uint16_t> k, v, att;
    std::vector<int32_t> pos;
  };
  auto snapshot = [&](State& s) {
    CUDA_CHECK(cudaStreamSynchronize(cs));
    s.tokens.push_back(d_tok.download());
  };

  State direct, replayed;
  reset();
  for (int i = 0; i < 3; ++i) {
    step();
    snapshot(direct);
  }
  direct.k = d_k.download(), direct.v = d_v.download(), direct.att = d_att.download();
  direct.pos = d_pos.download();

  reset();
  dev->capture_begin(*stream);
  step();
  std::unique_ptr<Graph> graph = dev->capture_end(*stream);
  for (int i = 0; i < 3; ++i) {
    dev->graph_launch(*graph, *stream);
    snapshot(replayed);
  }
  replayed.k = d_k.download(), replayed.v = d_v.download(), replayed.att = d_att.download();
  replayed.pos = d_pos.download();

  for (int i = 0; i < 3; ++i) EXPECT_EQ(replayed.tokens[i], direct.tokens[i]) << "step " << i;
  for (int n = 0; n < N; ++n) EXPECT_EQ(replayed.pos[n], pos0[n] + 3);
  EXPECT_EQ(replayed.pos, direct.pos);
  EXPECT_TRUE(bit_equal("k cache", replayed.k.data(), direct.k.data(), direct.k.size() * 2));
  EXPECT_TRUE(bit_equal("v cache", replayed.v.data(), direct.v.data(), direct.v.size() * 2));
  EXPECT_TRUE(
      bit_equal("attention", replayed.att.data(), direct.att.data(), direct.att.size() * 2));
  // The tokens change from step to step (the draw is not stuck).
  EXPECT_NE(direct.tokens[0], direct.tokens[2]);
}

// ---------------------------------------------------------------------------------------------
// Timing (TANDEM_GPU_BENCH=1): the GEMV at Llama-7B shapes and the decode attention, in GB/s and
// as a fraction of the device-to-device copy bandwidth. No assertions on time.

class DecodeBench : public CudaKernels {
 protected:
  void SetUp() override {
    if (!env_on("TANDEM_GPU_BENCH")) GTEST_SKIP() << "set TANDEM_GPU_BENCH=1 to time the kernels";
    CudaKernels::SetUp();
  }
  // Mean microseconds of fn(i) over `iters` launches after warm-ups, timed with cudaEvents.
  double time_us(const std::function<void(int)>& fn, int iters = 50) {
    for (int i = 0; i < 3; ++i) fn(i);
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0, stream_));
    for (int i = 0; i < iters; ++i) fn(i);
    CUDA_CHECK(cudaEventRecord(e1, stream_));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 1000.0 * ms / iters;
  }
  // Device-to-device copy bandwidth (read + write bytes), GB/s.
  double copy_gbps() {
    const size_t bytes = size_t(512) << 20;
    Dev<uint8_t> a(bytes), b(bytes);
    CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
    const double us = time_us(
        [&](int) {
          CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream_));
        },
        20);
    const double gbps = 2.0 * double(bytes) / us * 1e-3;
    std::printf("  device-to-device copy of %zu MiB: %.1f us, %.0f GB/s (read + write)\n",
                bytes >> 20, us, gbps);
    return gbps;
  }
};

TEST_F(DecodeBench, Gemv) {
  const double copy = copy_gbps();
  // Weights cycle through a 1 GiB pool so that no iteration finds its weights in L2.
  const size_t pool = size_t(1) << 29;  // bf16 elements
  DevBf w(pool);
  CUDA_CHECK(cudaMemset(w.get(), 0x3c, w.bytes()));
  struct Shape {
    int OC, IC;
    const char* name;
  };
  for (const Shape s :
       {Shape{12288, 4096, "qkv"}, Shape{4096, 4096, "attn out"}, Shape{22016, 4096, "gate+up"},
        Shape{4096, 11008, "down"}, Shape{32000, 4096, "lm head"}}) {
    const size_t welems = size_t(s.OC) * s.IC;
    const int copies = int(std::max<size_t>(1, pool / welems));
    for (const int N : {1, 2, 4, 8}) {
      // N = 1 runs on CUDA cores only; from 2 rows on, both main loops ([GEMV MMA]).
      for (const GemvPath path :
           {GemvPath::cuda_cores, GemvPath::tensor_cores, GemvPath::automatic}) {
        if ((N == 1) != (path == GemvPath::automatic)) continue;
        GemvPathScope scope(path);
        const char* on = path == GemvPath::tensor_cores ? "tensor" : "cuda";
        DevBf x(size_t(N) * s.IC), y(size_t(N) * s.OC);
        CUDA_CHECK(cudaMemset(x.get(), 0x3c, x.bytes()));
        CUDA_CHECK(cudaDeviceSynchronize());
        const double us = time_us([&](int i) {
          gemv_forward(y.bf(), x.bf(), w.bf() + size_t(i % copies) * welems, nullptr, N, s.IC, s.OC,
                       stream_);
        });
        const double bytes = 2.0 * (double(welems) + double(N) * s.IC + double(N) * s.OC);
        const double gbps = bytes / us * 1e-3;
        std::printf("  gemv %-9s OC=%5d IC=%5d N=%d %-6s %8.1f us %7.0f GB/s %5.1f%% of copy\n",
                    s.name, s.OC, s.IC, N, on, us, gbps, 100.0 * gbps / copy);
        // The fused prologues at the shapes that use them in Llama: RMSNorm before qkv, SwiGLU
        // (and the residual) before down.
        const bool qkv = s.OC == 12288, down = s.IC == 11008;
        if (!qkv && !down) continue;
        DevBf h(size_t(N) * 2 * s.IC), nw(size_t(s.IC));
        CUDA_CHECK(cudaMemset(h.get(), 0x3c, h.bytes()));
        CUDA_CHECK(cudaMemset(nw.get(), 0x3c, nw.bytes()));
        CUDA_CHECK(cudaDeviceSynchronize());
        const double fused_us = time_us([&](int i) {
          const bf16* wi = w.bf() + size_t(i % copies) * welems;
          if (qkv)
            gemv_norm_forward(y.bf(), x.bf(), nw.bf(), nullptr, true, 1e-5f, wi, nullptr, N, s.IC,
                              s.OC, stream_);
          else
            gemv_swiglu_residual_forward(y.bf(), h.bf(), wi, nullptr, y.bf(), N, s.IC, s.OC,
                                         stream_);
        });
        const double fused_gbps = bytes / fused_us * 1e-3;
        std::printf(
            "  gemv %-9s OC=%5d IC=%5d N=%d %-6s %8.1f us %7.0f GB/s %5.1f%% of copy (%s)\n",
            s.name, s.OC, s.IC, N, on, fused_us, fused_gbps, 100.0 * fused_gbps / copy,
            qkv ? "with RMSNorm" : "with SwiGLU and residual");
        if (down) {  // [SwiGLU prologue rows]: SwiGLU staged once, then the product
          const double staged_us = time_us([&](int i) {
            const bf16* wi = w.bf() + size_t(i % copies) * welems;
            swiglu_forward(x.bf(), h.bf(), N, s.IC, stream_);
            gemv_residual_forward(y.bf(), x.bf(), wi, nullptr, y.bf(), N, s.IC, s.OC, stream_);
          });
          const double staged_gbps = bytes / staged_us * 1e-3;
          std::printf(
              "  gemv %-9s OC=%5d IC=%5d N=%d %-6s %8.1f us %7.0f GB/s %5.1f%% of copy (SwiGLU "
              "staged, then with residual)\n",
              s.name, s.OC, s.IC, N, on, staged_us, staged_gbps, 100.0 * staged_gbps / copy);
        }
      }
    }
  }
}

TEST_F(DecodeBench, AttentionDecode) {
  const double copy = copy_gbps();
  const int D = 128, P = 512, position = 383, copies = 8;
  for (const int Hkv : {32, 8}) {
    const int Hq = 32;
    for (const int N : {1, 8, 32}) {
      // copies sets of N slots, cycled, so that no iteration finds its cache in L2.
      const int S = N * copies;
      const size_t cache = size_t(S) * Hkv * P * D;
      DevBf k(cache), v(cache), qkv(size_t(N) * (Hq + 2 * Hkv) * D), out(size_t(N) * Hq * D);
      CUDA_CHECK(cudaMemset(k.get(), 0x3c, k.bytes()));
      CUDA_CHECK(cudaMemset(v.get(), 0x3c, v.bytes()));
      CUDA_CHECK(cudaMemset(qkv.get(), 0x3c, qkv.bytes()));
      CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<Dev<int32_t>> slots;
      for (int c = 0; c < copies; ++c) {
        std::vector<int32_t> sl(static_cast<size_t>(N));
        for (int n = 0; n < N; ++n) sl[n] = c * N + n;
        slots.push_back(to_dev(sl));
      }
      auto pos = to_dev(std::vector<int32_t>(size_t(N), position));
      const size_t sb = attention_decode_scratch_bytes(N, Hq, Hkv, D, P);
      auto scratch = scratch_of(sb);
      for (const bool clusters : {true, false}) {
        set_attention_decode_clusters(clusters);
        const double us = time_us([&](int i) {
          attention_decode(out.bf(), qkv.bf(), k.bf(), v.bf(), slots[i % copies].get(), pos.get(),
                           N, Hq, Hkv, D, P, scratch.get(), sb, stream_);
        });
        set_attention_decode_clusters(true);
        const double bytes = 2.0 * 2.0 * double(N) * Hkv * (position + 1) * D;
        const double gbps = bytes / us * 1e-3;
        std::printf(
            "  attention_decode N=%2d Hq=%d Hkv=%2d D=%d pos=%d %-16s %8.1f us %7.0f GB/s "
            "%5.1f%% of copy\n",
            N, Hq, Hkv, D, position, clusters ? "(clusters)" : "(combine kernel)", us, gbps,
            100.0 * gbps / copy);
      }
    }
  }
}

// Llama-2-7B blocks at N rows (8 blocks, each with its own weights, 3.2 GB in all, so that no
// replay finds them in L2), captured into one graph and replayed, with [PDL] on and off: the
// time per block and the weight bytes over it as a fraction of the copy bandwidth.
TEST_F(DecodeBench, LlamaBlocksPdl) {
  const double copy = copy_gbps();
  const int C = 4096, Hq = 32, Hkv = 32, D = 128, F = 11008, P = 512, position = 383, L = 8;
  const int W = (Hq + 2 * Hkv) * D, A = Hq * D;
  const size_t per_block = size_t(W) * C + size_t(C) * A + size_t(2) * F * C + size_t(C) * F;
  DevBf weights(per_block * L), nw(static_cast<size_t>(C)), cache(size_t(2) * L * 8 * Hkv * P * D);
  CUDA_CHECK(cudaMemset(weights.get(), 0x3c, weights.bytes()));
  CUDA_CHECK(cudaMemset(nw.get(), 0x3c, nw.bytes()));
  CUDA_CHECK(cudaMemset(cache.get(), 0x3c, cache.bytes()));
  for (const int N : {1, 2, 8}) {
    DevBf x(size_t(N) * C), qkv(size_t(N) * W), att(size_t(N) * A), h(size_t(N) * 2 * F);
    CUDA_CHECK(cudaMemset(x.get(), 0, x.bytes()));
    std::vector<int32_t> sl(static_cast<size_t>(N));
    std::iota(sl.begin(), sl.end(), 0);
    auto slot = to_dev(sl);
    auto pos = to_dev(std::vector<int32_t>(size_t(N), position));
    const size_t sb = attention_decode_scratch_bytes(N, Hq, Hkv, D, P);
    auto scratch = scratch_of(sb);
    CUDA_CHECK(cudaDeviceSynchronize());
    auto blocks = [&] {
      for (int l = 0; l < L; ++l) {
        const bf16* wqkv = weights.bf() + per_block * l;
        const bf16* wo = wqkv + size_t(W) * C;
        const bf16* wgu = wo + size_t(C) * A;
        const bf16* wd = wgu + size_t(2) * F * C;
        bf16* kc = cache.bf() + size_t(2 * l) * 8 * Hkv * P * D;
        bf16* vc = kc + size_t(8) * Hkv * P * D;
        gemv_norm_forward(qkv.bf(), x.bf(), nw.bf(), nullptr, true, 1e-5f, wqkv, nullptr, N, C, W,
                          stream_);
        rope_append_attention_decode(att.bf(), qkv.bf(), kc, vc, slot.get(), pos.get(), N, Hq, Hkv,
                                     D, D, 10000.0f, P, scratch.get(), sb, stream_);
        gemv_residual_forward(x.bf(), att.bf(), wo, nullptr, x.bf(), N, A, C, stream_);
        gemv_norm_forward(h.bf(), x.bf(), nw.bf(), nullptr, true, 1e-5f, wgu, nullptr, N, C, 2 * F,
                          stream_);
        gemv_swiglu_residual_forward(x.bf(), h.bf(), wd, nullptr, x.bf(), N, F, C, stream_);
      }
    };
    // Without PDL, with it, and with it and the rope and the append in the attention kernel.
    for (const int variant : {0, 1, 2}) {
      const bool pdl = variant > 0;
      const bool was = pdl_enabled();
      set_pdl(pdl);
      set_decode_fused_rope(variant == 2);
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      blocks();
      CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
      CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      set_pdl(was);
      set_decode_fused_rope(true);
      const double us = time_us([&](int) { CUDA_CHECK(cudaGraphLaunch(exec, stream_)); }, 20) / L;
      CUDA_CHECK(cudaGraphExecDestroy(exec));
      CUDA_CHECK(cudaGraphDestroy(graph));
      const double gbps = 2.0 * double(per_block) / us * 1e-3;
      std::printf(
          "  llama-7b block N=%d pdl=%d fused rope=%d %8.1f us/block %7.0f GB/s %5.1f%% of "
          "copy\n",
          N, int(pdl), int(variant == 2), us, gbps, 100.0 * gbps / copy);
    }
  }
}

}  // namespace
}  // namespace tandem::cuda
