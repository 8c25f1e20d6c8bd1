// GPU tests of the fused causal flash attention (device/cuda/kernels_flash.cu): forward output
// and log-sum-exp, backward dqkv, against the fp32 CPU reference (device/cpu/kernels.h) on the
// same bf16 inputs and against the GEMM attention of kernels_attention.cu; the wgmma kernels
// (sm90a/kernels_flash_wgmma.cu) against the same references; bitwise determinism; and a timing
// printout of every path at GPT-2 and Llama shapes. Tolerances follow [Tolerances] in
// test_cuda_kernels.cpp (tol(r, K): r bf16 roundings, fp32 reductions of length K). Outputs and
// scratch are poisoned with NaN first, NaN/Inf never pass; the backward writes dqkv over a random
// prefill that must not show in it. Every test skips when no GPU is visible.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "device/cpu/kernels.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"
#include "device/kernels.h"
#include "gpu/cuda_kernel_test_util.h"

namespace tandem::cuda {
namespace {

using namespace kernel_test;

class CudaFlash : public CudaKernels {
 protected:
  void TearDown() override {
    flash_attention_set_warp_tiles(2);  // the defaults, whatever a test left
    flash_attention_set_wgmma_key_tile(0);
    flash_attention_set_wgmma_forward_pipeline(ForwardPipeline::automatic);
    flash_attention_set_wgmma_forward_loads(ForwardLoads::automatic);
    flash_attention_set_wgmma_dkv_query_tile(64);
    flash_attention_set_wgmma_dq_key_tile(64);
    flash_attention_set_wgmma_backward_passes(BackwardPasses::automatic);
    CudaKernels::TearDown();
  }
};

struct FlashCase {
  int B, T, Hq, Hkv, D;
};
// Odd and ragged T (one tile, partial tiles, several query and key tiles), B > 1, GQA groups of
// 3 and 4, every supported D.
const FlashCase kFlash[] = {{1, 1, 1, 1, 64},    {2, 7, 2, 2, 64},   {2, 65, 6, 2, 64},
                            {1, 130, 4, 1, 64},  {1, 300, 2, 2, 64}, {1, 1024, 4, 2, 64},
                            {2, 1, 6, 2, 32},    {2, 7, 6, 2, 32},   {1, 65, 4, 1, 32},
                            {2, 130, 6, 2, 32},  {1, 1, 4, 1, 128},  {2, 65, 6, 2, 128},
                            {1, 130, 4, 1, 128}, {1, 257, 2, 1, 128}};

size_t qkv_elems(const FlashCase& c) {
  return size_t(c.B) * c.T * (c.Hq + 2 * c.Hkv) * c.D;
}
size_t out_elems(const FlashCase& c) {
  return size_t(c.B) * c.T * c.Hq * c.D;
}

// One forward and backward with kernels k from NaN-poisoned outputs and scratch; dqkv starts
// as dqkv_init (the backward writes over it).
struct FlashResult {
  std::vector<float> out, lse, dqkv;
};
FlashResult run_flash(const FlashCase& c, const DevBf& d_qkv, const DevBf& d_dout,
                      const std::vector<float>& dqkv_init, FlashKernels k, cudaStream_t stream) {
  const size_t no = out_elems(c), nl = size_t(c.B) * c.Hq * c.T;
  const size_t sb = flash_attention_scratch_bytes(c.B, c.T, c.Hq, c.Hkv, c.D);
  auto scratch = scratch_of(sb);
  DevBf d_out(no), d_dqkv(dqkv_init);
  Dev<float> d_lse(nl);
  d_out.poison();
  d_lse.poison();
  CUDA_CHECK(cudaMemsetAsync(scratch.get(), 0xFF, std::max<size_t>(sb, 1), stream));
  flash_attention_forward(d_out.bf(), d_lse.get(), d_qkv.bf(), c.B, c.T, c.Hq, c.Hkv, c.D,
                          scratch.get(), sb, stream, k);
  flash_attention_backward(d_dqkv.bf(), d_dout.bf(), d_qkv.bf(), d_out.bf(), d_lse.get(), c.B, c.T,
                           c.Hq, c.Hkv, c.D, scratch.get(), sb, stream, k);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return {d_out.floats(), d_lse.download(), d_dqkv.floats()};
}

// lse[b,h,t] = log sum_{j<=t} exp(q_t . k_j / sqrt(D)), in double on the host.
std::vector<float> reference_lse(const std::vector<float>& qkv, const FlashCase& c) {
  const int G = c.Hq / c.Hkv, S = (c.Hq + 2 * c.Hkv) * c.D;
  const double scale = 1.0 / std::sqrt(double(c.D));
  std::vector<float> lse(size_t(c.B) * c.Hq * c.T);
  std::vector<double> s(size_t(c.T));
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h)
      for (int t = 0; t < c.T; ++t) {
        const float* q = &qkv[(size_t(b) * c.T + t) * S + size_t(h) * c.D];
        double m = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          const float* k = &qkv[(size_t(b) * c.T + j) * S + size_t(c.Hq + h / G) * c.D];
          double dot = 0.0;
          for (int d = 0; d < c.D; ++d) dot += double(q[d]) * k[d];
          s[size_t(j)] = dot * scale;
          m = std::max(m, s[size_t(j)]);
        }
        double sum = 0.0;
        for (int j = 0; j <= t; ++j) sum += std::exp(s[size_t(j)] - m);
        lse[(size_t(b) * c.Hq + h) * c.T + t] = float(m + std::log(sum));
      }
  return lse;
}

TEST_F(CudaFlash, Supported) {
  for (int D : {32, 64, 128}) EXPECT_TRUE(flash_attention_supported(D)) << D;
  for (int D : {0, 8, 16, 48, 80, 96, 256}) EXPECT_FALSE(flash_attention_supported(D)) << D;
  DevBf a(64 * 64);
  EXPECT_THROW(
      flash_attention_forward(a.bf(), nullptr, a.bf(), 1, 4, 2, 1, 48, nullptr, 0, stream_),
      tandem::Error);  // unsupported D
  EXPECT_THROW(
      flash_attention_forward(a.bf(), nullptr, a.bf(), 1, 4, 3, 2, 32, nullptr, 0, stream_),
      tandem::Error);  // Hq not a multiple of Hkv
  EXPECT_THROW(flash_attention_backward(a.bf(), a.bf(), a.bf(), a.bf(), nullptr, 1, 4, 2, 1, 32,
                                        nullptr, 0, stream_),
               tandem::Error);  // no lse, no scratch
  // The wgmma kernels: head sizes 64 and 128 only, on any build and any GPU.
  EXPECT_FALSE(flash_attention_wgmma_supported(32));
  EXPECT_THROW(flash_attention_require_wgmma(32), tandem::Error);
  if (flash_attention_wgmma_supported(64)) {
    EXPECT_NO_THROW(flash_attention_require_wgmma(64));
    EXPECT_NO_THROW(flash_attention_require_wgmma(128));
  } else {
    EXPECT_THROW(flash_attention_require_wgmma(64), tandem::Error);
  }
  EXPECT_THROW(flash_attention_forward(a.bf(), nullptr, a.bf(), 1, 4, 2, 1, 32, nullptr, 0, stream_,
                                       FlashKernels::wgmma),
               tandem::Error);
  int device = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  std::printf("compute capability %d.%d: wgmma flash kernels %s\n", major, minor,
              flash_attention_wgmma_supported(64) ? "run here" : "do not run here");
}

// The wgmma flash kernels (FlashKernels::wgmma) against the fp32 CPU reference with the
// tolerances of Forward and Backward, and against the mma.sync kernels (two independently
// rounded paths: their errors add); deterministic from NaN-poisoned outputs and scratch.
// Skipped, saying why, where the device or the build lacks them.
TEST_F(CudaFlash, WgmmaMatchesTheReference) {
  if (!flash_attention_wgmma_supported(64))
    GTEST_SKIP() << "the wgmma flash kernels need compute capability 9.0 and a build for 90";
  const FlashCase cases[] = {{1, 1, 1, 1, 64},    {2, 7, 2, 2, 64},   {2, 65, 6, 2, 64},
                             {1, 130, 4, 1, 64},  {1, 300, 2, 2, 64}, {1, 1024, 4, 2, 64},
                             {1, 1, 4, 1, 128},   {2, 65, 6, 2, 128}, {1, 130, 4, 1, 128},
                             {1, 257, 2, 1, 128}, {1, 600, 4, 2, 128}};
  for (const FlashCase c : cases) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " Hq=" << c.Hq
                                      << " Hkv=" << c.Hkv << " D=" << c.D);
    const size_t nq = qkv_elems(c), no = out_elems(c);
    const size_t na = size_t(c.B) * c.Hq * c.T * c.T;
    const auto qkv = rand_bf(nq, -2.0f, 2.0f), dout = rand_bf(no);
    std::vector<float> out(no), att(na), d0(nq, 0.0f);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), c.B, c.T, c.Hq, c.Hkv, c.D);
    const auto lse = reference_lse(qkv, c);
    const auto dqkv_init = prefill_bf(d0);  // written over, as on CPU
    auto ref = dqkv_init;
    cpu::attention_backward(ref.data(), dout.data(), qkv.data(), att.data(), c.B, c.T, c.Hq, c.Hkv,
                            c.D);
    DevBf d_qkv(qkv), d_dout(dout);
    // The wgmma kernels on this case, under whatever settings are set at the call.
    auto wgmma = [&] {
      return run_flash(c, d_qkv, d_dout, dqkv_init, FlashKernels::wgmma, stream_);
    };
    const FlashResult w = wgmma();
    const FlashResult again = wgmma();
    const FlashResult mma = run_flash(c, d_qkv, d_dout, dqkv_init, FlashKernels::mma, stream_);
    EXPECT_TRUE(close("wgmma out", w.out, out, tol(2, c.T + c.D)));
    EXPECT_TRUE(close("wgmma lse", w.lse, lse, tol(0.1, c.T + c.D)));
    EXPECT_TRUE(close("wgmma dqkv", w.dqkv, ref, tol(6, c.T + c.D)));
    EXPECT_TRUE(bit_equal("wgmma out", w.out.data(), again.out.data(), no * sizeof(float)));
    EXPECT_TRUE(bit_equal("wgmma dqkv", w.dqkv.data(), again.dqkv.data(), nq * sizeof(float)));
    EXPECT_TRUE(close("wgmma out vs mma", w.out, mma.out, tol(4, c.T + c.D)));
    // [Wgmma forward pipeline] on and off (the threads' kernels, also where the default is the
    // TMA one): the same operations on O in the same order, so the same bits as the default.
    for (const ForwardPipeline mode : {ForwardPipeline::on, ForwardPipeline::off}) {
      flash_attention_set_wgmma_forward_pipeline(mode);
      const FlashResult f = wgmma();
      flash_attention_set_wgmma_forward_pipeline(ForwardPipeline::automatic);
      const char* side = mode == ForwardPipeline::on ? "pipelined" : "waited";
      EXPECT_TRUE(bit_equal(std::string("wgmma out, ") + side, w.out.data(), f.out.data(),
                            no * sizeof(float)));
      EXPECT_TRUE(bit_equal(std::string("wgmma lse, ") + side, w.lse.data(), f.lse.data(),
                            w.lse.size() * sizeof(float)));
    }
    // [Wgmma tiles] 64 and 128 keys per tile, whichever the head size's default is: the same
    // sums per row in runs of that many keys, pipelined or not.
    for (const int keys : {64, 128}) {
      SCOPED_TRACE(::testing::Message() << keys << "-key tiles");
      flash_attention_set_wgmma_key_tile(keys);
      const FlashResult k = wgmma();
      flash_attention_set_wgmma_forward_pipeline(ForwardPipeline::off);
      const FlashResult k_waited = wgmma();
      flash_attention_set_wgmma_forward_pipeline(ForwardPipeline::automatic);
      // [Wgmma TMA forward] on both sides of the switch (automatic takes one of them): other
      // loads and barriers, the same operations on O.
      flash_attention_set_wgmma_forward_loads(ForwardLoads::tma);
      const FlashResult k_tma = wgmma();
      flash_attention_set_wgmma_forward_loads(ForwardLoads::threads);
      const FlashResult k_threads = wgmma();
      flash_attention_set_wgmma_forward_loads(ForwardLoads::automatic);
      flash_attention_set_wgmma_key_tile(0);
      EXPECT_TRUE(close("wgmma out", k.out, out, tol(2, c.T + c.D)));
      EXPECT_TRUE(close("wgmma lse", k.lse, lse, tol(0.1, c.T + c.D)));
      EXPECT_TRUE(bit_equal("wgmma out, pipelined vs waited", k.out.data(), k_waited.out.data(),
                            no * sizeof(float)));
      EXPECT_TRUE(close("wgmma out, TMA", k_tma.out, out, tol(2, c.T + c.D)));
      EXPECT_TRUE(close("wgmma out, threads' loads", k_threads.out, out, tol(2, c.T + c.D)));
      EXPECT_TRUE(bit_equal("wgmma out, TMA vs threads' loads", k_threads.out.data(),
                            k_tma.out.data(), no * sizeof(float)));
      EXPECT_TRUE(bit_equal("wgmma lse, TMA vs threads' loads", k_threads.lse.data(),
                            k_tma.lse.data(), k.lse.size() * sizeof(float)));
      EXPECT_TRUE(bit_equal("wgmma out, default vs threads' loads", k.out.data(),
                            k_threads.out.data(), no * sizeof(float)));
      if (keys == (c.D == 128 ? 128 : 64)) {  // the default
        EXPECT_TRUE(
            bit_equal("wgmma out, default tiles", w.out.data(), k.out.data(), no * sizeof(float)));
      }
    }
    if (c.D == 128) {  // [Wgmma dK/dV tiles] 32 queries per tile: the same sums in 32-query runs
      flash_attention_set_wgmma_dkv_query_tile(32);
      const FlashResult short_tiles = wgmma();
      flash_attention_set_wgmma_dkv_query_tile(64);
      EXPECT_TRUE(
          close("wgmma dqkv, 32-query dK/dV tiles", short_tiles.dqkv, ref, tol(6, c.T + c.D)));
      EXPECT_TRUE(bit_equal("wgmma out, 32-query dK/dV tiles", w.out.data(), short_tiles.out.data(),
                            no * sizeof(float)));
    }
    {
      // [Wgmma one-pass backward] on both sides, at both head sizes: one pass walks and sums
      // dK and dV as two passes do (the same bits), and adds dQ's key-tile shares by bulk
      // reductions in whatever order they land (within the reference's tolerance, not
      // repeatable bit for bit); two passes recompute dQ in the dQ kernel, the same bits every
      // run. The default is two passes.
      flash_attention_set_wgmma_backward_passes(BackwardPasses::one_pass);
      const FlashResult one = wgmma();
      flash_attention_set_wgmma_backward_passes(BackwardPasses::two_pass);
      const FlashResult two = wgmma();
      const FlashResult two_again = wgmma();
      // [Wgmma dQ tiles] 128 keys per tile (two passes): dQ's sums in 128-key runs; dK and dV
      // unchanged (head size 64 has 64-key tiles only: the same kernels).
      flash_attention_set_wgmma_dq_key_tile(128);
      const FlashResult wide_dq = wgmma();
      flash_attention_set_wgmma_dq_key_tile(64);
      flash_attention_set_wgmma_backward_passes(BackwardPasses::automatic);
      // The process-wide setting users reach (TANDEM_FLASH_BACKWARD) takes each side: one pass
      // has the one-pass dK and dV, two passes the two-pass dQ.
      kernels_set_flash_backward(FlashBackward::one_pass);
      const FlashResult via_one = wgmma();
      kernels_set_flash_backward(FlashBackward::two_pass);
      const FlashResult via_two = wgmma();
      kernels_set_flash_backward(FlashBackward::automatic);
      EXPECT_TRUE(bit_equal("wgmma dqkv, FlashBackward::two_pass", two.dqkv.data(),
                            via_two.dqkv.data(), nq * sizeof(float)));
      EXPECT_TRUE(close("wgmma dqkv, one pass", one.dqkv, ref, tol(6, c.T + c.D)));
      EXPECT_TRUE(
          close("wgmma dqkv, FlashBackward::one_pass", via_one.dqkv, ref, tol(6, c.T + c.D)));
      EXPECT_TRUE(close("wgmma dqkv, two passes", two.dqkv, ref, tol(6, c.T + c.D)));
      EXPECT_TRUE(close("wgmma dqkv, 128-key dQ tiles", wide_dq.dqkv, ref, tol(6, c.T + c.D)));
      EXPECT_TRUE(bit_equal("wgmma dqkv, two passes run twice", two.dqkv.data(),
                            two_again.dqkv.data(), nq * sizeof(float)));
      EXPECT_TRUE(bit_equal("wgmma dqkv, default vs two passes", w.dqkv.data(), two.dqkv.data(),
                            nq * sizeof(float)));
      EXPECT_TRUE(bit_equal("wgmma out, one vs two passes", one.out.data(), two.out.data(),
                            no * sizeof(float)));
      const int64_t row = int64_t(c.Hq + 2 * c.Hkv) * c.D, q_cols = int64_t(c.Hq) * c.D;
      for (int64_t r = 0; r < int64_t(c.B) * c.T; ++r) {
        for (const auto& [what, other] :
             {std::pair{"wgmma dK and dV, 128-key dQ tiles", &wide_dq},
              std::pair{"wgmma dK and dV, one pass", &one},
              std::pair{"wgmma dK and dV, FlashBackward::one_pass", &via_one}})
          ASSERT_TRUE(bit_equal(what, two.dqkv.data() + r * row + q_cols,
                                other->dqkv.data() + r * row + q_cols,
                                size_t(row - q_cols) * sizeof(float)))
              << "row " << r;
      }
    }
    EXPECT_TRUE(close("wgmma dqkv vs mma", w.dqkv, mma.dqkv, tol(12, c.T + c.D)));
  }
}

TEST_F(CudaFlash, Forward) {
  for (const FlashCase c : kFlash) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " Hq=" << c.Hq
                                      << " Hkv=" << c.Hkv << " D=" << c.D);
    const size_t nq = qkv_elems(c), no = out_elems(c), nl = size_t(c.B) * c.Hq * c.T;
    const auto qkv = rand_bf(nq, -2.0f, 2.0f);
    std::vector<float> out(no);
    cpu::attention_forward(out.data(), nullptr, qkv.data(), c.B, c.T, c.Hq, c.Hkv, c.D);
    const auto lse = reference_lse(qkv, c);
    DevBf d_qkv(qkv), d_out(no), d_out2(no), d_gemm(no);
    Dev<float> d_lse(nl);
    d_out.poison();
    d_out2.poison();
    d_lse.poison();
    const size_t sb = flash_attention_scratch_bytes(c.B, c.T, c.Hq, c.Hkv, c.D);
    auto scratch = scratch_of(sb);
    flash_attention_forward(d_out.bf(), d_lse.get(), d_qkv.bf(), c.B, c.T, c.Hq, c.Hkv, c.D,
                            scratch.get(), sb, stream_);
    // Without lse (no backward follows): the same output, bit for bit.
    flash_attention_forward(d_out2.bf(), nullptr, d_qkv.bf(), c.B, c.T, c.Hq, c.Hkv, c.D,
                            scratch.get(), sb, stream_);
    // The GEMM attention on the same inputs.
    const size_t gsb = attention_scratch_bytes(c.B, c.T, c.Hq, c.Hkv, c.D);
    auto gscratch = scratch_of(gsb);
    d_gemm.poison();
    attention_forward(ctx(), d_gemm.bf(), nullptr, d_qkv.bf(), c.B, c.T, c.Hq, c.Hkv, c.D,
                      gscratch.get(), gsb, stream_);
    sync();
    const auto got = d_out.floats();
    // P rounded to bf16 as the P V operand, the output rounded; fp32 sums over T and D.
    EXPECT_TRUE(close("flash out", got, out, tol(2, c.T + c.D)));
    // lse: fp32 scores (exact bf16 products), fp32 exponentials and sums; no bf16 rounding, so a
    // small fraction of one rounding's budget (a wrong base or a missing max term gives ~0.1).
    EXPECT_TRUE(close("flash lse", d_lse.download(), lse, tol(0.1, c.T + c.D)));
    const auto got2 = d_out2.floats();
    EXPECT_TRUE(bit_equal("flash out without lse", got.data(), got2.data(), no * sizeof(float)));
    // [Warp tiles] one m-tile per warp instead of two: every row sums the same products in the
    // same order, so the same bits.
    {
      DevBf d_out1(no);
      Dev<float> d_lse1(nl);
      d_out1.poison();
      d_lse1.poison();
      flash_attention_set_warp_tiles(1);
      flash_attention_forward(d_out1.bf(), d_lse1.get(), d_qkv.bf(), c.B, c.T, c.Hq, c.Hkv, c.D,
                              scratch.get(), sb, stream_);
      flash_attention_set_warp_tiles(2);
      sync();
      const auto got1 = d_out1.floats();
      EXPECT_TRUE(
          bit_equal("flash out, one warp tile", got.data(), got1.data(), no * sizeof(float)));
      const auto lse2 = d_lse.download(), lse1 = d_lse1.download();
      EXPECT_TRUE(
          bit_equal("flash lse, one warp tile", lse2.data(), lse1.data(), nl * sizeof(float)));
    }
    // Two independently rounded paths: their errors add.
    EXPECT_TRUE(close("flash out vs gemm attention", got, d_gemm.floats(), tol(4, c.T + c.D)));
  }
}

TEST_F(CudaFlash, Backward) {
  for (const FlashCase c : kFlash) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " Hq=" << c.Hq
                                      << " Hkv=" << c.Hkv << " D=" << c.D);
    const size_t nq = qkv_elems(c), no = out_elems(c), nl = size_t(c.B) * c.Hq * c.T;
    const size_t na = size_t(c.B) * c.Hq * c.T * c.T;
    const auto qkv = rand_bf(nq, -2.0f, 2.0f), dout = rand_bf(no);
    std::vector<float> out(no), att(na), d0(nq, 0.0f);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), c.B, c.T, c.Hq, c.Hkv, c.D);
    cpu::attention_backward(d0.data(), dout.data(), qkv.data(), att.data(), c.B, c.T, c.Hq, c.Hkv,
                            c.D);
    const auto dqkv_init = prefill_bf(d0);  // written over, as on CPU
    auto ref = dqkv_init;
    cpu::attention_backward(ref.data(), dout.data(), qkv.data(), att.data(), c.B, c.T, c.Hq, c.Hkv,
                            c.D);
    DevBf d_qkv(qkv), d_dout(dout), d_out(no);
    Dev<float> d_lse(nl);
    const size_t sb = flash_attention_scratch_bytes(c.B, c.T, c.Hq, c.Hkv, c.D);
    auto scratch = scratch_of(sb);
    flash_attention_forward(d_out.bf(), d_lse.get(), d_qkv.bf(), c.B, c.T, c.Hq, c.Hkv, c.D,
                            scratch.get(), sb, stream_);
    std::vector<float> runs[2];
    for (int run = 0; run < 2; ++run) {
      DevBf d_dqkv(dqkv_init);
      CUDA_CHECK(cudaMemsetAsync(scratch.get(), 0xFF, std::max<size_t>(sb, 1), stream_));
      flash_attention_backward(d_dqkv.bf(), d_dout.bf(), d_qkv.bf(), d_out.bf(), d_lse.get(), c.B,
                               c.T, c.Hq, c.Hkv, c.D, scratch.get(), sb, stream_);
      sync();
      runs[run] = d_dqkv.floats();
      // Roundings: the forward's output (2, through dvec = dO . O), P and dS as bf16 GEMM
      // operands, the accumulation into dqkv: r = 6 (kappa 1 on random data, as for the GEMM
      // attention); fp32 sums over T and D.
      EXPECT_TRUE(close("flash dqkv", runs[run], ref, tol(6, c.T + c.D)));
    }
    EXPECT_TRUE(
        bit_equal("flash dqkv", runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)));
    {  // [Warp tiles] one m-tile per warp: the same sums in the same order, the same bits
      DevBf d_dqkv(dqkv_init);
      CUDA_CHECK(cudaMemsetAsync(scratch.get(), 0xFF, std::max<size_t>(sb, 1), stream_));
      flash_attention_set_warp_tiles(1);
      flash_attention_backward(d_dqkv.bf(), d_dout.bf(), d_qkv.bf(), d_out.bf(), d_lse.get(), c.B,
                               c.T, c.Hq, c.Hkv, c.D, scratch.get(), sb, stream_);
      flash_attention_set_warp_tiles(2);
      sync();
      const auto one = d_dqkv.floats();
      EXPECT_TRUE(bit_equal("flash dqkv, one warp tile", runs[0].data(), one.data(),
                            one.size() * sizeof(float)));
    }
    // Against the GEMM attention's backward (its own forward's probabilities): errors add.
    DevBf d_att(na), d_gout(no), d_gdqkv(dqkv_init);
    const size_t gsb = attention_scratch_bytes(c.B, c.T, c.Hq, c.Hkv, c.D);
    auto gscratch = scratch_of(gsb);
    attention_forward(ctx(), d_gout.bf(), d_att.bf(), d_qkv.bf(), c.B, c.T, c.Hq, c.Hkv, c.D,
                      gscratch.get(), gsb, stream_);
    attention_backward(ctx(), d_gdqkv.bf(), d_dout.bf(), d_qkv.bf(), d_att.bf(), c.B, c.T, c.Hq,
                       c.Hkv, c.D, gscratch.get(), gsb, stream_);
    sync();
    EXPECT_TRUE(
        close("flash dqkv vs gemm attention", runs[0], d_gdqkv.floats(), tol(10, c.T + c.D)));
  }
}

// The flash kernels alone (no cuBLASLt, so compute-sanitizer's racecheck can watch every kernel
// of this test: gpu-check.sh runs it under racecheck): forward and backward twice on shapes
// with several query and key tiles, ragged tails and GQA, from NaN-poisoned scratch; outputs
// finite and bitwise equal between the runs; the mma.sync kernels and, where they run, the wgmma
// ones.
TEST_F(CudaFlash, RepeatsBitwiseWithoutOtherKernels) {
  const FlashCase cases[] = {{2, 300, 6, 2, 64}, {1, 257, 4, 1, 32}, {1, 200, 2, 1, 128}};
  for (const FlashCase c : cases)
    for (const FlashKernels k : {FlashKernels::mma, FlashKernels::wgmma}) {
      if (k == FlashKernels::wgmma && !flash_attention_wgmma_supported(c.D)) continue;
      SCOPED_TRACE(::testing::Message() << "T=" << c.T << " D=" << c.D << " kernels "
                                        << (k == FlashKernels::mma ? "mma" : "wgmma"));
      const size_t nq = qkv_elems(c), no = out_elems(c);
      DevBf d_qkv(rand_bf(nq, -2.0f, 2.0f)), d_dout(rand_bf(no));
      const std::vector<float> zero(nq, 0.0f);
      std::vector<float> outs[2], grads[2];
      for (int run = 0; run < 2; ++run) {
        FlashResult r = run_flash(c, d_qkv, d_dout, zero, k, stream_);
        outs[run] = std::move(r.out);
        grads[run] = std::move(r.dqkv);
        for (float x : outs[run]) ASSERT_TRUE(std::isfinite(x));
        for (float x : grads[run]) ASSERT_TRUE(std::isfinite(x));
      }
      EXPECT_TRUE(bit_equal("flash out", outs[0].data(), outs[1].data(), no * sizeof(float)));
      EXPECT_TRUE(bit_equal("flash dqkv", grads[0].data(), grads[1].data(), nq * sizeof(float)));
    }
}

// Timing printout (no assertion): flash against the GEMM attention at GPT-2 training shapes.
// TANDEM_FLASH_TIMING_SHAPE=<text> keeps only the shapes whose name contains it, so that a
// profiler's first launch of a kernel is that shape's.
TEST_F(CudaFlash, Timing) {
  struct Shape {
    const char* name;
    int B, T, H, Hkv, D;
  };
  const char* only = std::getenv("TANDEM_FLASH_TIMING_SHAPE");
  for (const Shape s :
       {Shape{"GPT-2 124M", 16, 1024, 12, 12, 64}, Shape{"GPT-2 1.5B", 8, 1024, 25, 25, 64},
        Shape{"Llama-1B", 4, 2048, 16, 8, 128}, Shape{"Llama-3-8B", 1, 8192, 32, 8, 128}}) {
    if (only != nullptr && std::string(s.name).find(only) == std::string::npos) continue;
    const FlashCase c{s.B, s.T, s.H, s.Hkv, s.D};
    const size_t nq = qkv_elems(c), no = out_elems(c), nl = size_t(c.B) * c.Hq * c.T;
    const size_t na = size_t(c.B) * c.Hq * c.T * c.T;
    DevBf d_qkv(nq), d_dqkv(nq), d_out(no), d_dout(no), d_att(na);
    Dev<float> d_lse(nl);
    {  // random inputs: a host block tiled over the buffers by device copies
      const DevBf block(rand_bf(size_t(1) << 20));
      for (const DevBf* d : {&d_qkv, &d_dqkv, &d_dout})
        for (size_t off = 0; off < d->size(); off += block.size())
          CUDA_CHECK(cudaMemcpy(d->get() + off, block.get(),
                                std::min(block.size(), d->size() - off) * sizeof(uint16_t),
                                cudaMemcpyDeviceToDevice));
      CUDA_CHECK(cudaDeviceSynchronize());  // the copies ran on the legacy stream
    }
    const size_t fsb = flash_attention_scratch_bytes(c.B, c.T, c.Hq, c.Hkv, c.D);
    const size_t gsb = attention_scratch_bytes(c.B, c.T, c.Hq, c.Hkv, c.D);
    auto scratch = scratch_of(std::max(fsb, gsb));
    auto time_us = [&](auto&& fn) {
      for (int i = 0; i < 3; ++i) fn();
      cudaEvent_t e0, e1;
      CUDA_CHECK(cudaEventCreate(&e0));
      CUDA_CHECK(cudaEventCreate(&e1));
      const int iters = 20;
      CUDA_CHECK(cudaEventRecord(e0, stream_));
      for (int i = 0; i < iters; ++i) fn();
      CUDA_CHECK(cudaEventRecord(e1, stream_));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0.0f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      return 1000.0 * double(ms) / iters;
    };
    FlashKernels kernels = FlashKernels::mma;
    auto flash_fwd = [&] {
      flash_attention_forward(d_out.bf(), d_lse.get(), d_qkv.bf(), c.B, c.T, c.Hq, c.Hkv, c.D,
                              scratch.get(), fsb, stream_, kernels);
    };
    auto flash_bwd = [&] {
      flash_attention_backward(d_dqkv.bf(), d_dout.bf(), d_qkv.bf(), d_out.bf(), d_lse.get(), c.B,
                               c.T, c.Hq, c.Hkv, c.D, scratch.get(), fsb, stream_, kernels);
    };
    flash_attention_set_warp_tiles(1);
    const double us_ff1 = time_us(flash_fwd), us_fb1 = time_us(flash_bwd);
    flash_attention_set_warp_tiles(2);
    const double us_ff = time_us(flash_fwd), us_fb = time_us(flash_bwd);
    const double us_gf = time_us([&] {
      attention_forward(ctx(), d_out.bf(), d_att.bf(), d_qkv.bf(), c.B, c.T, c.Hq, c.Hkv, c.D,
                        scratch.get(), gsb, stream_);
    });
    const double us_gb = time_us([&] {
      attention_backward(ctx(), d_dqkv.bf(), d_dout.bf(), d_qkv.bf(), d_att.bf(), c.B, c.T, c.Hq,
                         c.Hkv, c.D, scratch.get(), gsb, stream_);
    });
    // Causal FLOPs: forward 2 GEMMs of B H T^2 D / 2 multiply-adds, backward 5 (the FA-2
    // convention; the flash backward actually runs 7, recomputing P for dQ).
    const double fwd_flops = 4.0 * c.B * c.Hq * double(c.T) * c.T * c.D / 2.0;
    const double bwd_flops = 2.5 * fwd_flops;
    std::printf("%s attention B=%d T=%d H=%d Hkv=%d D=%d (per layer)\n", s.name, c.B, c.T, c.Hq,
                c.Hkv, c.D);
    std::printf("  flash forward   %8.1f us  %6.0f TFLOP/s   gemm forward   %8.1f us  (x%.1f)\n",
                us_ff, fwd_flops / us_ff * 1e-6, us_gf, us_gf / us_ff);
    std::printf("  flash backward  %8.1f us  %6.0f TFLOP/s   gemm backward  %8.1f us  (x%.1f)\n",
                us_fb, bwd_flops / us_fb * 1e-6, us_gb, us_gb / us_fb);
    std::printf("  one warp tile:  forward %8.1f us (x%.2f of two), backward %8.1f us (x%.2f)\n",
                us_ff1, us_ff1 / us_ff, us_fb1, us_fb1 / us_fb);
    if (flash_attention_wgmma_supported(c.D)) {
      kernels = FlashKernels::wgmma;
      const double us_wf = time_us(flash_fwd), us_wb = time_us(flash_bwd);
      double us_pipe[2];  // [Wgmma forward pipeline] on, off
      for (const ForwardPipeline mode : {ForwardPipeline::on, ForwardPipeline::off}) {
        flash_attention_set_wgmma_forward_pipeline(mode);
        us_pipe[mode == ForwardPipeline::off] = time_us(flash_fwd);
      }
      flash_attention_set_wgmma_forward_pipeline(ForwardPipeline::automatic);
      std::printf(
          "  wgmma forward   %8.1f us  %6.0f TFLOP/s   (x%.2f of mma; pipelined %.1f us, waited "
          "%.1f us)\n",
          us_wf, fwd_flops / us_wf * 1e-6, us_ff / us_wf, us_pipe[0], us_pipe[1]);
      {  // [Wgmma tiles]: the key tile the head size does not take by default
        const int other = c.D == 128 ? 64 : 128;
        flash_attention_set_wgmma_key_tile(other);
        const double us_wo = time_us(flash_fwd);
        flash_attention_set_wgmma_forward_pipeline(ForwardPipeline::off);
        const double us_wow = time_us(flash_fwd);
        flash_attention_set_wgmma_forward_pipeline(ForwardPipeline::automatic);
        flash_attention_set_wgmma_key_tile(0);
        std::printf("  wgmma forward, %d-key tiles %8.1f us  %6.0f TFLOP/s   (waited %.1f us)\n",
                    other, us_wo, fwd_flops / us_wo * 1e-6, us_wow);
      }
      for (const ForwardLoads loads : {ForwardLoads::tma, ForwardLoads::threads}) {
        // [Wgmma TMA forward] on both sides, both key tiles
        double us_keys[2];
        for (const int keys : {64, 128}) {
          flash_attention_set_wgmma_key_tile(keys);
          flash_attention_set_wgmma_forward_loads(loads);
          us_keys[keys == 128] = time_us(flash_fwd);
          flash_attention_set_wgmma_forward_loads(ForwardLoads::automatic);
        }
        flash_attention_set_wgmma_key_tile(0);
        std::printf(
            "  wgmma forward, %s: 64-key tiles %8.1f us  %6.0f TFLOP/s, 128-key tiles "
            "%8.1f us  %6.0f TFLOP/s\n",
            loads == ForwardLoads::tma ? "TMA" : "threads' loads", us_keys[0],
            fwd_flops / us_keys[0] * 1e-6, us_keys[1], fwd_flops / us_keys[1] * 1e-6);
      }
      std::printf("  wgmma backward  %8.1f us  %6.0f TFLOP/s   (x%.2f of mma)\n", us_wb,
                  bwd_flops / us_wb * 1e-6, us_fb / us_wb);
      if (c.D == 128) {  // [Wgmma dK/dV tiles]: 32 queries per tile
        flash_attention_set_wgmma_dkv_query_tile(32);
        const double us_wb32 = time_us(flash_bwd);
        flash_attention_set_wgmma_dkv_query_tile(64);
        std::printf("  wgmma backward, 32-query dK/dV tiles %8.1f us  %6.0f TFLOP/s\n", us_wb32,
                    bwd_flops / us_wb32 * 1e-6);
      }
      {  // [Wgmma one-pass backward]: one pass against two passes (64- and, at head size 128,
         // 128-key dQ tiles).
        flash_attention_set_wgmma_backward_passes(BackwardPasses::one_pass);
        const double us_one = time_us(flash_bwd);
        flash_attention_set_wgmma_backward_passes(BackwardPasses::two_pass);
        const double us_two = time_us(flash_bwd);
        flash_attention_set_wgmma_dq_key_tile(128);
        const double us_wdq = time_us(flash_bwd);
        flash_attention_set_wgmma_dq_key_tile(64);
        flash_attention_set_wgmma_backward_passes(BackwardPasses::automatic);
        std::printf("  wgmma backward, one pass %8.1f us  %6.0f TFLOP/s (x%.2f of two passes)\n",
                    us_one, bwd_flops / us_one * 1e-6, us_two / us_one);
        std::printf("  wgmma backward, two passes %8.1f us  %6.0f TFLOP/s\n", us_two,
                    bwd_flops / us_two * 1e-6);
        if (c.D == 128)
          std::printf("  wgmma backward, two passes, 128-key dQ tiles %8.1f us  %6.0f TFLOP/s\n",
                      us_wdq, bwd_flops / us_wdq * 1e-6);
      }
    }
  }
}

}  // namespace
}  // namespace tandem::cuda
