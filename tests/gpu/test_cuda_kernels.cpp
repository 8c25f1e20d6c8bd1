// GPU tests of the CUDA kernels (device/cuda/kernels.cuh, matmul.h): every op, forward and
// backward, against the fp32 CPU reference (device/cpu/kernels.h) run on the same bf16-rounded
// inputs. Outputs are poisoned with NaN before each run (so an unwritten element fails), NaN/Inf
// never pass, backward kernels start from random gradients (added into, or written over by the
// [Written input gradients] of GELU, SwiGLU and attention). Every test skips when no
// GPU is visible. TANDEM_GPU_BENCH=1 also runs Bench.* (per-op microseconds at GPT-2 124M
// shapes), TANDEM_GPU_VERBOSE=1 prints every comparison's error against its tolerance and
// TANDEM_GPU_SEED=<n> changes the random inputs.
//
// [Tolerances] The reference runs in fp32 on exactly the bf16 values the GPU sees, so differences
// come from what the CUDA path rounds to bf16 and from the fp32 summation order. bf16 keeps 8
// significant bits: round to nearest has unit roundoff u = 2^-8 (the "bf16 epsilon" below), so
// rounding an exactly computed value changes it by at most u relative, and the normalised error
//     nmse = ||got - ref||^2 / ||ref||^2
// of one rounding is at most u^2 (worst case; about u^2/5 on average for values spread over a
// binade, which is what the H200 runs show). A path with r roundings (bf16 intermediates such as
// the attention probabilities and dS, the output, the accumulation into a bf16 gradient), each
// amplified by at most a condition factor kappa, stays below r kappa^2 u^2 in practice (the
// errors are independent, so their squares add). An fp32 reduction of length K rounds once per
// partial sum; modelled as a random walk its relative error is about eps32 sqrt(K/2) on each side
// (the GPU's and CPU's orders differ), E[nmse] ~ K eps32^2 with eps32 = 2^-23; tree-shaped GPU
// reductions do better, so this term is pessimistic. We allow
//     tol = r kappa^2 u^2 + 16 K eps32^2,
// a worst-case bound for single roundings, ~5x the typical value; the fp32 term matters only for
// fp32 outputs (statistics, parameter gradients, losses). Every tolerance here is at most 7e-5,
// while a real bug (wrong index, sign, missing term, unscaled or unwritten output) gives an nmse
// of 1e-2 to 1. The r, kappa and K of each check are stated next to it.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "device/cpu/kernels.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"
#include "device/cuda/matmul.h"
#include "gpu/cuda_kernel_test_util.h"

namespace tandem::cuda {
namespace {

using namespace kernel_test;  // helpers and the fixture: cuda_kernel_test_util.h

// ---------------------------------------------------------------------------------------------
// Embedding

TEST_F(CudaKernels, EmbeddingForward) {
  struct Case {
    int B, T, C, V;
    bool wpe;
  };
  for (const Case c : {Case{2, 7, 13, 11, true}, Case{2, 7, 13, 11, false}, Case{1, 5, 16, 3, true},
                       Case{4, 256, 768, 50257, true}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " C=" << c.C << " V=" << c.V
                                      << " wpe=" << c.wpe);
    const int N = c.B * c.T;
    const auto tokens = rand_ids(size_t(N), c.V);
    const auto wte = rand_bf(size_t(c.V) * c.C);
    const auto wpe = rand_bf(size_t(c.T) * c.C);
    auto d_tok = to_dev(tokens);
    DevBf d_wte(wte), d_wpe(wpe), d_out(size_t(N) * c.C);
    d_out.poison();
    embedding_forward(d_out.bf(), d_tok.get(), d_wte.bf(), c.wpe ? d_wpe.bf() : nullptr, c.B, c.T,
                      c.C, c.V, stream_);
    sync();
    std::vector<float> ref(size_t(N) * c.C);
    cpu::embedding_forward(ref.data(), tokens.data(), wte.data(), c.wpe ? wpe.data() : nullptr, c.B,
                           c.T, c.C);
    // one rounding (of wte + wpe); exact without wpe
    EXPECT_TRUE(close("embedding out", d_out.floats(), ref, tol(1, 1)));
  }
}

TEST_F(CudaKernels, EmbeddingBackward) {
  struct Case {
    int B, T, C, V;
    double hot;  // fraction of rows using token 0 (long runs of one token)
  };
  for (const Case c : {Case{2, 7, 13, 5, 0.0}, Case{2, 7, 13, 40, 0.3}, Case{3, 100, 24, 300, 0.5},
                       Case{4, 256, 768, 50257, 0.2}}) {
    SCOPED_TRACE(::testing::Message()
                 << "B=" << c.B << " T=" << c.T << " C=" << c.C << " V=" << c.V);
    const int N = c.B * c.T;
    auto tokens = rand_ids(size_t(N), c.V);
    std::bernoulli_distribution hot(c.hot);
    for (auto& t : tokens)
      if (hot(rng_)) t = 0;
    const auto dout = rand_bf(size_t(N) * c.C);
    // deltas from zero, to size the random prefills
    std::vector<float> dwte0(size_t(c.V) * c.C, 0.0f), dwpe0(size_t(c.T) * c.C, 0.0f);
    cpu::embedding_backward(dwte0.data(), dwpe0.data(), dout.data(), tokens.data(), c.B, c.T, c.C);
    const auto dwte_init = prefill_f32(dwte0), dwpe_init = prefill_f32(dwpe0);
    auto ref_wte = dwte_init, ref_wpe = dwpe_init;
    cpu::embedding_backward(ref_wte.data(), ref_wpe.data(), dout.data(), tokens.data(), c.B, c.T,
                            c.C);

    auto d_tok = to_dev(tokens);
    DevBf d_dout(dout);
    const size_t sb = embedding_backward_scratch_bytes(c.B, c.T, c.V);
    auto scratch = scratch_of(sb);
    std::vector<float> runs[2];
    for (int run = 0; run < 2; ++run) {
      auto d_wte = to_dev(dwte_init), d_wpe = to_dev(dwpe_init);
      embedding_backward(d_wte.get(), d_wpe.get(), d_dout.bf(), d_tok.get(), c.B, c.T, c.C, c.V,
                         scratch.get(), sb, stream_);
      sync();
      runs[run] = d_wte.download();
      const auto got_wpe = d_wpe.download();
      // fp32 sums of at most N rows (per token) and B rows (per position)
      EXPECT_TRUE(close("embedding dwte", runs[run], ref_wte, tol(0, N)));
      EXPECT_TRUE(close("embedding dwpe", got_wpe, ref_wpe, tol(0, c.B)));
      if (run == 0) {
        // tokens that never occur keep their gradient rows bit-exactly
        std::vector<char> seen(size_t(c.V), 0);
        for (int t : tokens) seen[size_t(t)] = 1;
        size_t bad = 0;
        for (int v = 0; v < c.V; ++v)
          if (!seen[size_t(v)])
            for (int k = 0; k < c.C; ++k)
              bad += runs[0][size_t(v) * c.C + k] != dwte_init[size_t(v) * c.C + k];
        EXPECT_EQ(bad, 0u) << "gradient rows of absent tokens changed";
      }
    }
    EXPECT_TRUE(bit_equal("embedding dwte", runs[0].data(), runs[1].data(),
                          runs[0].size() * sizeof(float)));
  }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm and RMSNorm

TEST_F(CudaKernels, LayerNormForward) {
  struct Case {
    int N, C;
    bool stats, bias;
  };
  for (const Case c : {Case{14, 13, true, true}, Case{14, 13, false, true},
                       Case{9, 24, true, false}, Case{1024, 768, true, true}}) {
    SCOPED_TRACE(::testing::Message()
                 << "N=" << c.N << " C=" << c.C << " stats=" << c.stats << " bias=" << c.bias);
    const size_t n = size_t(c.N) * c.C;
    const auto x = rand_bf(n, -1.0f, 2.0f);  // nonzero mean
    const auto w = rand_bf(size_t(c.C)), b = rand_bf(size_t(c.C));
    DevBf d_x(x), d_w(w), d_b(b), d_out(n);
    Dev<float> d_mean(size_t(c.N)), d_rstd(size_t(c.N));
    d_out.poison();
    d_mean.poison();
    d_rstd.poison();
    layernorm_forward(d_out.bf(), c.stats ? d_mean.get() : nullptr,
                      c.stats ? d_rstd.get() : nullptr, d_x.bf(), d_w.bf(),
                      c.bias ? d_b.bf() : nullptr, c.N, c.C, 1e-5f, stream_);
    sync();
    std::vector<float> ref(n), mean(size_t(c.N)), rstd(size_t(c.N));
    cpu::layernorm_forward(ref.data(), mean.data(), rstd.data(), x.data(), w.data(),
                           c.bias ? b.data() : nullptr, c.N, c.C, 1e-5f);
    // output rounded once; statistics are fp32 sums over C
    EXPECT_TRUE(close("layernorm out", d_out.floats(), ref, tol(1, c.C)));
    if (c.stats) {
      EXPECT_TRUE(close("layernorm mean", d_mean.download(), mean, tol(0, c.C)));
      EXPECT_TRUE(close("layernorm rstd", d_rstd.download(), rstd, tol(0, c.C)));
    } else {  // not requested: left untouched (still poison)
      const auto m = d_mean.download();
      EXPECT_TRUE(std::all_of(m.begin(), m.end(), [](float v) { return std::isnan(v); }));
    }
  }
}

TEST_F(CudaKernels, LayerNormBackward) {
  struct Case {
    int N, C;
    bool dx, dw, db;
  };
  for (const Case c : {Case{14, 13, true, true, true}, Case{14, 13, true, false, false},
                       Case{14, 13, false, true, false}, Case{9, 24, true, true, true},
                       Case{1024, 768, true, true, true}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << c.N << " C=" << c.C << " dx=" << c.dx
                                      << " dw=" << c.dw << " db=" << c.db);
    const size_t n = size_t(c.N) * c.C;
    const auto x = rand_bf(n, -1.0f, 2.0f), dout = rand_bf(n);
    const auto w = rand_bf(size_t(c.C)), b = rand_bf(size_t(c.C));
    std::vector<float> tmp(n), mean(size_t(c.N)), rstd(size_t(c.N));
    cpu::layernorm_forward(tmp.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), c.N,
                           c.C, 1e-5f);
    std::vector<float> dx0(n, 0.0f), dw0(size_t(c.C), 0.0f), db0(size_t(c.C), 0.0f);
    cpu::layernorm_backward(dx0.data(), dw0.data(), db0.data(), dout.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), c.N, c.C);
    const auto dx_init = prefill_bf(dx0);
    const auto dw_init = prefill_f32(dw0), db_init = prefill_f32(db0);
    auto ref_dx = dx_init, ref_dw = dw_init, ref_db = db_init;
    cpu::layernorm_backward(c.dx ? ref_dx.data() : nullptr, c.dw ? ref_dw.data() : nullptr,
                            c.db ? ref_db.data() : nullptr, dout.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), c.N, c.C);

    DevBf d_x(x), d_dout(dout), d_w(w), d_dx(dx_init);
    auto d_mean = to_dev(mean), d_rstd = to_dev(rstd);
    auto d_dw = to_dev(dw_init), d_db = to_dev(db_init);
    const size_t sb = layernorm_backward_scratch_bytes(c.N, c.C);
    auto scratch = scratch_of(sb);
    layernorm_backward(c.dx ? d_dx.bf() : nullptr, c.dw ? d_dw.get() : nullptr,
                       c.db ? d_db.get() : nullptr, d_dout.bf(), d_x.bf(), d_w.bf(), d_mean.get(),
                       d_rstd.get(), c.N, c.C, scratch.get(), sb, stream_);
    sync();
    // dx: one rounding of (prefill + delta); dw, db: fp32 sums over the N rows
    EXPECT_TRUE(close("layernorm dx", d_dx.floats(), ref_dx, tol(1, c.C)));
    EXPECT_TRUE(close("layernorm dw", d_dw.download(), ref_dw, tol(0, c.N)));
    EXPECT_TRUE(close("layernorm db", d_db.download(), ref_db, tol(0, c.N)));
  }
}

TEST_F(CudaKernels, RmsNormForward) {
  struct Case {
    int N, C;
    bool stats;
  };
  for (const Case c : {Case{14, 13, true}, Case{14, 13, false}, Case{1024, 768, true}}) {
    const int N = c.N, C = c.C;
    const bool stats = c.stats;
    SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C << " stats=" << stats);
    const size_t n = size_t(N) * C;
    const auto x = rand_bf(n), w = rand_bf(static_cast<size_t>(C));
    DevBf d_x(x), d_w(w), d_out(n);
    Dev<float> d_rstd(static_cast<size_t>(N));
    d_out.poison();
    d_rstd.poison();
    rmsnorm_forward(d_out.bf(), stats ? d_rstd.get() : nullptr, d_x.bf(), d_w.bf(), N, C, 1e-5f,
                    stream_);
    sync();
    std::vector<float> ref(n), rstd(static_cast<size_t>(N));
    cpu::rmsnorm_forward(ref.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
    EXPECT_TRUE(close("rmsnorm out", d_out.floats(), ref, tol(1, C)));
    if (stats) {
      EXPECT_TRUE(close("rmsnorm rstd", d_rstd.download(), rstd, tol(0, C)));
    }
  }
}

TEST_F(CudaKernels, RmsNormBackward) {
  struct Case {
    int N, C;
    bool dx, dw;
  };
  for (const Case c : {Case{14, 13, true, true}, Case{14, 13, false, true},
                       Case{14, 13, true, false}, Case{1024, 768, true, true}}) {
    const int N = c.N, C = c.C;
    const bool with_dx = c.dx, with_dw = c.dw;
    SCOPED_TRACE(::testing::Message()
                 << "N=" << N << " C=" << C << " dx=" << with_dx << " dw=" << with_dw);
    const size_t n = size_t(N) * C;
    const auto x = rand_bf(n), dout = rand_bf(n), w = rand_bf(static_cast<size_t>(C));
    std::vector<float> tmp(n), rstd(static_cast<size_t>(N));
    cpu::rmsnorm_forward(tmp.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
    std::vector<float> dx0(n, 0.0f), dw0(size_t(C), 0.0f);
    cpu::rmsnorm_backward(dx0.data(), dw0.data(), dout.data(), x.data(), w.data(), rstd.data(), N,
                          C);
    const auto dx_init = prefill_bf(dx0);
    const auto dw_init = prefill_f32(dw0);
    auto ref_dx = dx_init, ref_dw = dw_init;
    cpu::rmsnorm_backward(with_dx ? ref_dx.data() : nullptr, with_dw ? ref_dw.data() : nullptr,
                          dout.data(), x.data(), w.data(), rstd.data(), N, C);
    DevBf d_x(x), d_dout(dout), d_w(w), d_dx(dx_init);
    auto d_rstd = to_dev(rstd), d_dw = to_dev(dw_init);
    const size_t sb = rmsnorm_backward_scratch_bytes(N, C);
    auto scratch = scratch_of(sb);
    rmsnorm_backward(with_dx ? d_dx.bf() : nullptr, with_dw ? d_dw.get() : nullptr, d_dout.bf(),
                     d_x.bf(), d_w.bf(), d_rstd.get(), N, C, scratch.get(), sb, stream_);
    sync();
    EXPECT_TRUE(close("rmsnorm dx", d_dx.floats(), ref_dx, tol(1, C)));
    EXPECT_TRUE(close("rmsnorm dw", d_dw.download(), ref_dw, tol(0, N)));
  }
}

// ---------------------------------------------------------------------------------------------
// Matmul (cuBLASLt)

TEST_F(CudaKernels, MatmulForward) {
  struct Case {
    int N, IC, OC;
    bool bias, gelu;
  };
  for (const Case c :
       {Case{14, 13, 11, true, false}, Case{14, 13, 11, false, false}, Case{14, 13, 11, true, true},
        Case{7, 16, 24, false, true}, Case{7, 16, 24, true, true},
        Case{1024, 768, 2304, true, false}, Case{1024, 768, 3072, true, true}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << c.N << " IC=" << c.IC << " OC=" << c.OC
                                      << " bias=" << c.bias << " gelu=" << c.gelu);
    const auto x = rand_bf(size_t(c.N) * c.IC), w = rand_bf(size_t(c.OC) * c.IC);
    const auto bias = rand_bf(size_t(c.OC));
    DevBf d_x(x), d_w(w), d_bias(bias), d_out(size_t(c.N) * c.OC), d_pre(size_t(c.N) * c.OC);
    std::vector<float> pre(size_t(c.N) * c.OC), out(pre.size());
    cpu::matmul_forward(pre.data(), x.data(), w.data(), c.bias ? bias.data() : nullptr, c.N, c.IC,
                        c.OC);
    cpu::gelu_forward(out.data(), pre.data(), int64_t(pre.size()));
    for (int rep = 0; rep < 2; ++rep) {  // the second call reuses the cached plan
      d_out.poison();
      d_pre.poison();
      const size_t plans = ctx().cached_plans();
      matmul_forward(ctx(), d_out.bf(), c.gelu ? d_pre.bf() : nullptr, d_x.bf(), d_w.bf(),
                     c.bias ? d_bias.bf() : nullptr, c.N, c.IC, c.OC, stream_);
      sync();
      if (rep == 1) {
        EXPECT_EQ(ctx().cached_plans(), plans) << "the plan was not reused";
      }
      // fp32 sums over IC; the pre-activation is rounded once; the GELU output once (fused
      // epilogue) or twice (fallback: GELU of the rounded pre-activation, |gelu'| <= 1.13)
      if (c.gelu) {
        EXPECT_TRUE(close("matmul pre_gelu", d_pre.floats(), pre, tol(1, c.IC)));
        EXPECT_TRUE(close("matmul gelu out", d_out.floats(), out, tol(2, c.IC, 1.13)));
      } else {
        EXPECT_TRUE(close("matmul out", d_out.floats(), pre, tol(1, c.IC)));
      }
    }
  }
}

TEST_F(CudaKernels, MatmulBackward) {
  struct Case {
    int N, IC, OC;
    bool dx, dw, dbias;
  };
  for (const Case c :
       {Case{14, 13, 11, true, true, true}, Case{14, 13, 11, true, false, false},
        Case{14, 13, 11, false, true, true}, Case{7, 16, 24, true, true, true},
        Case{1024, 768, 3072, true, true, true}, Case{1024, 3072, 768, true, true, true}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << c.N << " IC=" << c.IC << " OC=" << c.OC
                                      << " dx=" << c.dx << " dw=" << c.dw << " dbias=" << c.dbias);
    const auto x = rand_bf(size_t(c.N) * c.IC), w = rand_bf(size_t(c.OC) * c.IC);
    const auto dout = rand_bf(size_t(c.N) * c.OC);
    std::vector<float> dx0(x.size(), 0.0f), dw0(w.size(), 0.0f), db0(size_t(c.OC), 0.0f);
    cpu::matmul_backward(dx0.data(), dw0.data(), db0.data(), dout.data(), x.data(), w.data(), c.N,
                         c.IC, c.OC);
    const auto dx_init = prefill_bf(dx0);
    const auto dw_init = prefill_f32(dw0), db_init = prefill_f32(db0);
    auto ref_dx = dx_init, ref_dw = dw_init, ref_db = db_init;
    cpu::matmul_backward(c.dx ? ref_dx.data() : nullptr, c.dw ? ref_dw.data() : nullptr,
                         c.dbias ? ref_db.data() : nullptr, dout.data(), x.data(), w.data(), c.N,
                         c.IC, c.OC);
    // Both sources of the bias gradient: the column sums and the dW GEMM's epilogue.
    for (const bool epilogue : {false, true}) {
      SCOPED_TRACE(epilogue ? "bias gradient from the GEMM epilogue" : "from the column sums");
      DevBf d_x(x), d_w(w), d_dout(dout), d_dx(dx_init);
      auto d_dw = to_dev(dw_init), d_db = to_dev(db_init);
      const size_t sb = matmul_backward_scratch_bytes(c.N, c.OC);
      auto scratch = scratch_of(sb);
      ctx().set_bias_grad_epilogue(epilogue);
      matmul_backward(ctx(), c.dx ? d_dx.bf() : nullptr, c.dw ? d_dw.get() : nullptr,
                      c.dbias ? d_db.get() : nullptr, d_dout.bf(), d_x.bf(), d_w.bf(), c.N, c.IC,
                      c.OC, scratch.get(), sb, stream_);
      ctx().set_bias_grad_epilogue(false);
      sync();
      // dx: fp32 sums over OC, one rounding; dW, dbias: fp32 sums over the N rows
      EXPECT_TRUE(close("matmul dx", d_dx.floats(), ref_dx, tol(1, c.OC)));
      EXPECT_TRUE(close("matmul dw", d_dw.download(), ref_dw, tol(0, c.N)));
      EXPECT_TRUE(close("matmul dbias", d_db.download(), ref_db, tol(0, c.N)));
    }
  }
}

// [GELU gradient epilogue] dx = gelu'(pre) (dout @ w) written by one GEMM (IC % 8 == 0, aligned:
// CUBLASLT_EPILOGUE_DGELU) or by the GEMM then gelu_backward in place (IC = 13: the fallback),
// over a random prefill that must not show. Against the CPU's product then GELU gradient; and,
// bit for bit, dW and dbias are those of the plain backward (the epilogue touches dx only).
TEST_F(CudaKernels, MatmulBackwardWithTheGeluGradient) {
  struct Case {
    int N, IC, OC;
  };
  for (const Case c : {Case{14, 13, 11}, Case{7, 16, 24}, Case{1024, 3072, 768}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << c.N << " IC=" << c.IC << " OC=" << c.OC);
    const auto pre = rand_bf(size_t(c.N) * c.IC, -3.0f, 3.0f), w = rand_bf(size_t(c.OC) * c.IC);
    const auto dout = rand_bf(size_t(c.N) * c.OC);
    std::vector<float> act(pre.size());
    cpu::gelu_forward(act.data(), pre.data(), int64_t(pre.size()));
    std::vector<float> act_bf(act.size());  // the GPU's act: bf16 values
    for (size_t i = 0; i < act.size(); ++i) act_bf[i] = round_bf16(act[i]);
    std::vector<float> dact(pre.size(), 0.0f), ref_dpre(pre.size()), dw0(w.size(), 0.0f),
        db0(size_t(c.OC), 0.0f);
    cpu::matmul_backward(dact.data(), dw0.data(), db0.data(), dout.data(), act_bf.data(), w.data(),
                         c.N, c.IC, c.OC);
    cpu::gelu_backward(ref_dpre.data(), dact.data(), pre.data(), int64_t(pre.size()));
    DevBf d_pre(pre), d_act(act_bf), d_w(w), d_dout(dout), d_dx(prefill_bf(ref_dpre));
    Dev<float> d_dw(w.size()), d_db(size_t(c.OC)), d_dw2(w.size()), d_db2(size_t(c.OC));
    for (auto* d : {&d_dw, &d_db, &d_dw2, &d_db2})
      CUDA_CHECK(cudaMemsetAsync(d->get(), 0, d->size() * sizeof(float), stream_));
    const size_t sb = matmul_backward_scratch_bytes(c.N, c.OC);
    auto scratch = scratch_of(sb);
    matmul_backward(ctx(), d_dx.bf(), d_dw.get(), d_db.get(), d_dout.bf(), d_act.bf(), d_w.bf(),
                    c.N, c.IC, c.OC, scratch.get(), sb, stream_, /*dx_accumulate=*/false,
                    d_pre.bf());
    matmul_backward(ctx(), nullptr, d_dw2.get(), d_db2.get(), d_dout.bf(), d_act.bf(), d_w.bf(),
                    c.N, c.IC, c.OC, scratch.get(), sb, stream_);
    sync();
    // the product rounded once (fused) or twice (fallback: the rounded product times gelu',
    // |gelu'| <= 1.13); fp32 sums over OC
    EXPECT_TRUE(close("dgelu dx", d_dx.floats(), ref_dpre, tol(2, c.OC, 1.13)));
    EXPECT_TRUE(bit_equal("dgelu dw", d_dw.download().data(), d_dw2.download().data(),
                          w.size() * sizeof(float)));
    EXPECT_TRUE(bit_equal("dgelu dbias", d_db.download().data(), d_db2.download().data(),
                          size_t(c.OC) * sizeof(float)));
    EXPECT_THROW(matmul_backward(ctx(), d_dx.bf(), nullptr, nullptr, d_dout.bf(), d_act.bf(),
                                 d_w.bf(), c.N, c.IC, c.OC, nullptr, 0, stream_,
                                 /*dx_accumulate=*/true, d_pre.bf()),
                 Error);
  }
}

// out = x w^T + bias + residual at training shapes: the residual is the GEMM's C operand (out a
// separate buffer, read once, never copied) or out itself (in place). Both against the CPU.
TEST_F(CudaKernels, MatmulResidualForward) {
  for (const bool alias : {false, true}) {
    for (const bool with_bias : {false, true}) {
      const int N = 1024, IC = 768, OC = 768;
      SCOPED_TRACE(::testing::Message() << "alias=" << alias << " bias=" << with_bias);
      const auto x = rand_bf(size_t(N) * IC), w = rand_bf(size_t(OC) * IC);
      const auto bias = rand_bf(size_t(OC)), res = rand_bf(size_t(N) * OC);
      std::vector<float> ref(res.size());
      cpu::matmul_forward(ref.data(), x.data(), w.data(), with_bias ? bias.data() : nullptr, N, IC,
                          OC);
      for (size_t i = 0; i < ref.size(); ++i) ref[i] += res[i];
      DevBf d_x(x), d_w(w), d_bias(bias), d_res(res), d_out(res.size());
      d_out.poison();
      bf16* out = alias ? d_res.bf() : d_out.bf();
      matmul_residual_forward(ctx(), out, d_x.bf(), d_w.bf(), with_bias ? d_bias.bf() : nullptr,
                              d_res.bf(), N, IC, OC, stream_);
      sync();
      // one rounding (two where cuBLASLt adds the bias separately); fp32 sums over IC
      EXPECT_TRUE(close("residual out", (alias ? d_res : d_out).floats(), ref, tol(2, IC)));
      if (!alias) {
        EXPECT_TRUE(close("residual kept", d_res.floats(), res, 0.0));  // C is only read
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Pointwise

// Sizes cover the scalar-only path (7), the 16-byte path with a scalar tail (1001), a
// misaligned start (offset 1: scalar path throughout) and a realistic size.
struct PointwiseCase {
  int64_t n;
  int offset;
};
const PointwiseCase kPointwise[] = {{7, 0}, {1001, 0}, {1001, 1}, {1024 * 3072, 0}};

TEST_F(CudaKernels, GeluForwardBackward) {
  for (const auto& [n, off] : kPointwise) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " offset=" << off);
    const auto x = rand_bf(size_t(n), -4.0f, 4.0f), dout = rand_bf(static_cast<size_t>(n));
    std::vector<float> out(static_cast<size_t>(n)), dx0(size_t(n), 0.0f);
    cpu::gelu_forward(out.data(), x.data(), n);
    cpu::gelu_backward(dx0.data(), dout.data(), x.data(), n);
    // [Written input gradients]: dx starts prefilled and must come out as the CPU writes it.
    const auto dx_init = prefill_bf(dx0);
    auto ref_dx = dx_init;
    cpu::gelu_backward(ref_dx.data(), dout.data(), x.data(), n);
    DevBf d_x(size_t(n + off)), d_dout(size_t(n + off)), d_out(size_t(n + off)),
        d_dx(size_t(n + off));
    std::vector<float> pad(size_t(off), 0.5f);
    auto padded = [&](const std::vector<float>& v) {
      std::vector<float> r = pad;
      r.insert(r.end(), v.begin(), v.end());
      return r;
    };
    d_x.set(padded(x));
    d_dout.set(padded(dout));
    d_dx.set(padded(dx_init));
    d_out.poison();
    gelu_forward(d_out.bf() + off, d_x.bf() + off, n, stream_);
    gelu_backward(d_dx.bf() + off, d_dout.bf() + off, d_x.bf() + off, n, stream_);
    sync();
    auto strip = [&](std::vector<float> v) { return std::vector<float>(v.begin() + off, v.end()); };
    EXPECT_TRUE(close("gelu out", strip(d_out.floats()), out, tol(1, 1)));
    EXPECT_TRUE(close("gelu dx", strip(d_dx.floats()), ref_dx, tol(1, 1)));
  }
}

// Exact erf GELU (GPT-NeoX), on the same sizes and offsets as the tanh GELU.
TEST_F(CudaKernels, GeluErfForwardBackward) {
  for (const auto& [n, off] : kPointwise) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " offset=" << off);
    const auto x = rand_bf(size_t(n), -4.0f, 4.0f), dout = rand_bf(static_cast<size_t>(n));
    std::vector<float> out(static_cast<size_t>(n)), dx0(size_t(n), 0.0f);
    cpu::gelu_erf_forward(out.data(), x.data(), n);
    cpu::gelu_erf_backward(dx0.data(), dout.data(), x.data(), n);
    const auto dx_init = prefill_bf(dx0);
    auto ref_dx = dx_init;
    cpu::gelu_erf_backward(ref_dx.data(), dout.data(), x.data(), n);
    DevBf d_x(size_t(n + off)), d_dout(size_t(n + off)), d_out(size_t(n + off)),
        d_dx(size_t(n + off));
    std::vector<float> pad(size_t(off), 0.5f);
    auto padded = [&](const std::vector<float>& v) {
      std::vector<float> r = pad;
      r.insert(r.end(), v.begin(), v.end());
      return r;
    };
    d_x.set(padded(x));
    d_dout.set(padded(dout));
    d_dx.set(padded(dx_init));
    d_out.poison();
    gelu_erf_forward(d_out.bf() + off, d_x.bf() + off, n, stream_);
    gelu_erf_backward(d_dx.bf() + off, d_dout.bf() + off, d_x.bf() + off, n, stream_);
    sync();
    auto strip = [&](std::vector<float> v) { return std::vector<float>(v.begin() + off, v.end()); };
    // out: one rounding; dx: one rounding of (prefill + delta)
    EXPECT_TRUE(close("gelu_erf out", strip(d_out.floats()), out, tol(1, 1)));
    EXPECT_TRUE(close("gelu_erf dx", strip(d_dx.floats()), ref_dx, tol(1, 1)));
    // in place: out aliases x
    d_out.set(padded(x));
    gelu_erf_forward(d_out.bf() + off, d_out.bf() + off, n, stream_);
    sync();
    EXPECT_TRUE(close("gelu_erf in place", strip(d_out.floats()), out, tol(1, 1)));
  }
}

TEST_F(CudaKernels, Add) {
  for (const auto& [n, off] : kPointwise) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " offset=" << off);
    const auto a = rand_bf(size_t(n) + off), b = rand_bf(size_t(n) + off);
    std::vector<float> ref(static_cast<size_t>(n));
    cpu::add_forward(ref.data(), a.data() + off, b.data() + off, n);
    DevBf d_a(a), d_b(b), d_out(size_t(n) + off);
    d_out.poison();
    add_forward(d_out.bf() + off, d_a.bf() + off, d_b.bf() + off, n, stream_);
    add_forward(d_a.bf() + off, d_a.bf() + off, d_b.bf() + off, n, stream_);  // out aliases a
    sync();
    const auto got = d_out.floats(), got_alias = d_a.floats();
    EXPECT_TRUE(close("add out", std::vector<float>(got.begin() + off, got.end()), ref, tol(1, 1)));
    EXPECT_TRUE(close("add in place", std::vector<float>(got_alias.begin() + off, got_alias.end()),
                      ref, tol(1, 1)));
  }
}

TEST_F(CudaKernels, SwiGluForwardBackward) {
  for (const auto& [N, F] : {std::pair{7, 13}, std::pair{3, 8}, std::pair{256, 1024}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " F=" << F);
    const auto h = rand_bf(size_t(N) * 2 * F, -3.0f, 3.0f), dout = rand_bf(size_t(N) * F);
    std::vector<float> out(size_t(N) * F), dh0(h.size(), 0.0f);
    cpu::swiglu_forward(out.data(), h.data(), N, F);
    cpu::swiglu_backward(dh0.data(), dout.data(), h.data(), N, F);
    const auto dh_init = prefill_bf(dh0);  // written over, as on CPU
    auto ref_dh = dh_init;
    cpu::swiglu_backward(ref_dh.data(), dout.data(), h.data(), N, F);
    DevBf d_h(h), d_dout(dout), d_out(out.size()), d_dh(dh_init);
    d_out.poison();
    swiglu_forward(d_out.bf(), d_h.bf(), N, F, stream_);
    swiglu_backward(d_dh.bf(), d_dout.bf(), d_h.bf(), N, F, stream_);
    sync();
    EXPECT_TRUE(close("swiglu out", d_out.floats(), out, tol(1, 1)));
    EXPECT_TRUE(close("swiglu dh", d_dh.floats(), ref_dh, tol(1, 1)));
  }
}

TEST_F(CudaKernels, Casts) {
  // offset 0: 16-byte aligned buffers (fp32 -> bf16 8 values per thread); offset 1: one element
  // in, so neither is aligned (one value per thread).
  for (const int off : {0, 1}) {
    for (const int64_t n : {int64_t(7), int64_t(1001), int64_t(1) << 20}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " offset=" << off);
      auto x = rand_f32(size_t(n + off), -100.0f, 100.0f);
      x[size_t(off)] = 1.0f + 1.0f / 256.0f;  // a tie: rounds to even (1.0)
      auto d_x = to_dev(x);
      DevBf d_b(static_cast<size_t>(n + off));
      Dev<float> d_back(static_cast<size_t>(n + off));
      d_b.poison();
      d_back.poison();
      cast_f32_to_bf16(d_b.bf() + off, d_x.get() + off, n, stream_);
      cast_bf16_to_f32(d_back.get() + off, d_b.bf() + off, n, stream_);
      sync();
      const auto bits = d_b.download();
      const auto back = d_back.download();
      size_t bad = 0, bad_back = 0;
      for (int64_t i = off; i < n + off; ++i) {
        bad += bits[size_t(i)] != bf16_bits(x[size_t(i)]);
        bad_back += back[size_t(i)] != bf16_float(bits[size_t(i)]);
      }
      EXPECT_EQ(bad, 0u) << "fp32 -> bf16 must round to nearest even";
      EXPECT_EQ(bad_back, 0u) << "bf16 -> fp32 must be exact";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Rotary embedding

TEST_F(CudaKernels, Rope) {
  struct Case {
    int B, T, H, D, rotary_dim, row_stride, pos0;
    float theta;
  };
  // H heads rotated out of row_stride / D (the rest, e.g. v of a fused qkv row, untouched); the
  // full head (rotary_dim == D) and partial shares (GPT-NeoX: the first rotary_dim channels of
  // each head, the rest untouched), including an odd head dim and a single pair.
  for (const Case c :
       {Case{2, 7, 6, 10, 10, 80, 5, 10000.0f}, Case{1, 3, 1, 2, 2, 2, 0, 10000.0f},
        Case{2, 9, 3, 14, 14, 70, 1000, 500000.0f},
        Case{1, 1024, 40, 128, 128, 48 * 128, 3, 500000.0f}, Case{2, 7, 3, 32, 8, 96, 3, 10000.0f},
        Case{2, 9, 4, 13, 6, 60, 17, 10000.0f}, Case{1, 5, 2, 10, 2, 30, 2, 500000.0f},
        Case{1, 513, 12, 64, 16, 36 * 64, 7, 10000.0f}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " H=" << c.H << " D=" << c.D
                                      << " rotary_dim=" << c.rotary_dim
                                      << " stride=" << c.row_stride << " pos0=" << c.pos0);
    const size_t n = size_t(c.B) * c.T * c.row_stride;
    const auto x = rand_bf(n);
    for (const bool backward : {false, true}) {
      auto ref = x;
      DevBf d_x(x);
      if (backward) {
        cpu::rope_backward(ref.data(), c.B, c.T, c.H, c.D, c.rotary_dim, c.row_stride, c.theta,
                           c.pos0);
        rope_backward(d_x.bf(), c.B, c.T, c.H, c.D, c.rotary_dim, c.row_stride, c.theta, c.pos0,
                      stream_);
      } else {
        cpu::rope_forward(ref.data(), c.B, c.T, c.H, c.D, c.rotary_dim, c.row_stride, c.theta,
                          c.pos0);
        rope_forward(d_x.bf(), c.B, c.T, c.H, c.D, c.rotary_dim, c.row_stride, c.theta, c.pos0,
                     stream_);
      }
      sync();
      const auto got = d_x.floats();
      // rotated part: one rounding; the rest (channels past rotary_dim in each head, channels
      // past the H heads) bit-exact
      std::vector<float> got_rot, ref_rot;
      size_t changed = 0;
      for (size_t i = 0; i < n; ++i) {
        const int j = int(i % size_t(c.row_stride));
        if (j < c.H * c.D && j % c.D < c.rotary_dim) {
          got_rot.push_back(got[i]);
          ref_rot.push_back(ref[i]);
        } else {
          changed += got[i] != x[i];
        }
      }
      EXPECT_TRUE(close(backward ? "rope backward" : "rope forward", got_rot, ref_rot, tol(1, 1)));
      EXPECT_EQ(changed, 0u) << "channels outside the rotary share changed";
    }
  }
}

TEST_F(CudaKernels, RopeRejectsBadRotaryDim) {
  DevBf d_x(size_t(64));
  for (const int rd : {7, 34, 0, -2}) {  // odd, larger than D, zero, negative
    SCOPED_TRACE(::testing::Message() << "rotary_dim=" << rd);
    EXPECT_THROW(rope_forward(d_x.bf(), 1, 2, 1, 32, rd, 32, 10000.0f, 0, stream_), tandem::Error);
    EXPECT_THROW(rope_backward(d_x.bf(), 1, 2, 1, 32, rd, 32, 10000.0f, 0, stream_), tandem::Error);
  }
}

// ---------------------------------------------------------------------------------------------
// Attention

struct AttnCase {
  int B, T, Hq, Hkv, D;
};
const AttnCase kAttn[] = {{2, 7, 1, 1, 12},   {2, 13, 6, 2, 10}, {1, 9, 4, 1, 16},
                          {2, 33, 4, 4, 8},   {1, 1, 2, 1, 6},   {1, 1024, 12, 12, 64},
                          {1, 256, 8, 2, 128}};

TEST_F(CudaKernels, AttentionForward) {
  for (const AttnCase c : kAttn) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " Hq=" << c.Hq
                                      << " Hkv=" << c.Hkv << " D=" << c.D);
    const int S = (c.Hq + 2 * c.Hkv) * c.D;
    const size_t nq = size_t(c.B) * c.T * S, no = size_t(c.B) * c.T * c.Hq * c.D;
    const size_t na = size_t(c.B) * c.Hq * c.T * c.T;
    const auto qkv = rand_bf(nq, -2.0f, 2.0f);
    std::vector<float> out(no), att(na);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), c.B, c.T, c.Hq, c.Hkv, c.D);
    DevBf d_qkv(qkv), d_out(no), d_att(na);
    const size_t sb = attention_scratch_bytes(c.B, c.T, c.Hq, c.Hkv, c.D);
    auto scratch = scratch_of(sb);
    for (const bool keep : {true, false}) {
      d_out.poison();
      d_att.poison();
      attention_forward(ctx(), d_out.bf(), keep ? d_att.bf() : nullptr, d_qkv.bf(), c.B, c.T, c.Hq,
                        c.Hkv, c.D, scratch.get(), sb, stream_);
      sync();
      // out: probabilities rounded, then the output (fp32 sums over T and D)
      EXPECT_TRUE(close(keep ? "attention out" : "attention out (no att)", d_out.floats(), out,
                        tol(2, c.T + c.D)));
      if (keep) {
        const auto got_att = d_att.floats();
        EXPECT_TRUE(close("attention att", got_att, att, tol(1, c.D)));
        size_t nonzero = 0;  // exact zeros above the diagonal
        for (size_t r = 0; r < size_t(c.B) * c.Hq * c.T; ++r)
          for (int t2 = int(r % size_t(c.T)) + 1; t2 < c.T; ++t2)
            nonzero += got_att[r * size_t(c.T) + size_t(t2)] != 0.0f;
        EXPECT_EQ(nonzero, 0u);
      }
    }
  }
}

TEST_F(CudaKernels, AttentionBackward) {
  for (const AttnCase c : kAttn) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " Hq=" << c.Hq
                                      << " Hkv=" << c.Hkv << " D=" << c.D);
    const int S = (c.Hq + 2 * c.Hkv) * c.D;
    const size_t nq = size_t(c.B) * c.T * S, no = size_t(c.B) * c.T * c.Hq * c.D;
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
    DevBf d_qkv(qkv), d_dout(dout), d_out(no), d_att(na);
    const size_t sb = attention_scratch_bytes(c.B, c.T, c.Hq, c.Hkv, c.D);
    auto scratch = scratch_of(sb);
    attention_forward(ctx(), d_out.bf(), d_att.bf(), d_qkv.bf(), c.B, c.T, c.Hq, c.Hkv, c.D,
                      scratch.get(), sb, stream_);
    std::vector<float> runs[2];
    for (int run = 0; run < 2; ++run) {
      DevBf d_dqkv(dqkv_init);
      CUDA_CHECK(cudaMemsetAsync(scratch.get(), 0xFF, sb, stream_));
      attention_backward(ctx(), d_dqkv.bf(), d_dout.bf(), d_qkv.bf(), d_att.bf(), c.B, c.T, c.Hq,
                         c.Hkv, c.D, scratch.get(), sb, stream_);
      sync();
      runs[run] = d_dqkv.floats();
      // P rounded (forward), dS rounded, the GEMM outputs and the accumulation rounded: r = 4
      // (the cancellation in dP - rowsum(P dP) is mild on random data: kappa 1, measured ~0.1
      // of this tolerance); fp32 sums over T, D and G*T.
      EXPECT_TRUE(close("attention dqkv", runs[run], ref, tol(4, c.T + c.D)));
    }
    EXPECT_TRUE(bit_equal("attention dqkv", runs[0].data(), runs[1].data(),
                          runs[0].size() * sizeof(float)));
  }
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy

TEST_F(CudaKernels, CrossEntropy) {
  struct Case {
    int N, V, Vp;
  };
  for (const Case c : {Case{7, 13, 16}, Case{5, 11, 11}, Case{3, 9, 24}, Case{64, 50257, 50304}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << c.N << " V=" << c.V << " Vp=" << c.Vp);
    const size_t n = size_t(c.N) * c.Vp;
    const auto logits = rand_bf(n, -4.0f, 4.0f);
    const auto targets = rand_ids(size_t(c.N), c.V);
    const float dloss = 1.0f / float(c.N);
    std::vector<float> losses(size_t(c.N));
    cpu::crossentropy_forward(losses.data(), logits.data(), targets.data(), c.N, c.V, c.Vp);
    auto dlogits = logits;
    std::vector<float> losses_bwd(size_t(c.N));
    cpu::crossentropy_fused_backward(dlogits.data(), losses_bwd.data(), targets.data(), c.N, c.V,
                                     c.Vp, dloss);
    auto d_tgt = to_dev(targets);
    DevBf d_logits(logits);
    Dev<float> d_losses(size_t(c.N));
    d_losses.poison();
    crossentropy_forward(d_losses.get(), d_logits.bf(), d_tgt.get(), c.N, c.V, c.Vp, stream_);
    sync();
    // fp32 log-sum-exp over V
    EXPECT_TRUE(close("ce losses", d_losses.download(), losses, tol(0, c.V)));
    for (const bool with_losses : {true, false}) {
      d_logits.set(logits);
      d_losses.poison();
      crossentropy_fused_backward(d_logits.bf(), with_losses ? d_losses.get() : nullptr,
                                  d_tgt.get(), c.N, c.V, c.Vp, dloss, stream_);
      sync();
      const auto got = d_logits.floats();
      // The target entries ((p - 1) dloss) dominate the norm, so they and the rest (p dloss)
      // are compared separately: each rounded once.
      std::vector<float> got_t, ref_t, got_o, ref_o;
      size_t pad_bad = 0;
      for (int i = 0; i < c.N; ++i)
        for (int j = 0; j < c.Vp; ++j) {
          const size_t k = size_t(i) * c.Vp + j;
          if (j >= c.V) {
            pad_bad += got[k] != 0.0f;
          } else if (j == targets[size_t(i)]) {
            got_t.push_back(got[k]);
            ref_t.push_back(dlogits[k]);
          } else {
            got_o.push_back(got[k]);
            ref_o.push_back(dlogits[k]);
          }
        }
      EXPECT_EQ(pad_bad, 0u) << "padding columns must become exactly 0";
      EXPECT_TRUE(close("ce dlogits (target)", got_t, ref_t, tol(1, c.V)));
      EXPECT_TRUE(close("ce dlogits (others)", got_o, ref_o, tol(1, c.V)));
      if (with_losses) {
        EXPECT_TRUE(close("ce fused losses", d_losses.download(), losses_bwd, tol(0, c.V)));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Optimizer and reductions

TEST_F(CudaKernels, AdamW) {
  for (const int64_t n : {int64_t(7), int64_t(1001), int64_t(1) << 20}) {
    for (const int step : {1, 7}) {
      for (const bool copy : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " step=" << step << " copy=" << copy);
        const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
        const auto p = rand_f32(static_cast<size_t>(n)), g = rand_f32(static_cast<size_t>(n)),
                   m = rand_f32(size_t(n), -0.1f, 0.1f);
        auto v = rand_f32(size_t(n), 0.0f, 0.01f);
        auto rp = p, rm = m, rv = v;
        cpu::adamw_update(rp.data(), g.data(), rm.data(), rv.data(), n, lr, b1, b2, eps, wd, step,
                          gs);
        auto d_p = to_dev(p), d_g = to_dev(g), d_m = to_dev(m), d_v = to_dev(v);
        DevBf d_pb(static_cast<size_t>(n));
        d_pb.poison();
        adamw_update(d_p.get(), d_g.get(), d_m.get(), d_v.get(), copy ? d_pb.bf() : nullptr, n, lr,
                     b1, b2, eps, wd, adamw_bias_correction(b1, b2, step), gs, stream_);
        sync();
        // elementwise fp32 (FMA contraction differs from the CPU's): a few ulp, K = 16
        EXPECT_TRUE(close("adamw p", d_p.download(), rp, tol(0, 16)));
        EXPECT_TRUE(close("adamw m", d_m.download(), rm, tol(0, 16)));
        EXPECT_TRUE(close("adamw v", d_v.download(), rv, tol(0, 16)));
        if (copy) {
          EXPECT_TRUE(close("adamw p bf16", d_pb.floats(), rp, tol(1, 16)));
        }
      }
    }
  }
}

TEST_F(CudaKernels, SumSquares) {
  for (const int64_t n : {int64_t(1), int64_t(7), int64_t(1001), int64_t(10000019)}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const auto x = rand_f32(static_cast<size_t>(n));
    const double ref = cpu::sum_squares(x.data(), n);
    auto d_x = to_dev(x);
    Dev<float> d_out(1);
    const size_t sb = sum_squares_scratch_bytes(n);
    auto scratch = scratch_of(sb);
    float got[2], acc = 0.0f;
    for (int run = 0; run < 2; ++run) {
      d_out.poison();
      sum_squares(d_out.get(), d_x.get(), n, false, scratch.get(), sb, stream_);
      sync();
      got[run] = d_out.download()[0];
    }
    d_out.upload({2.5f});
    sum_squares(d_out.get(), d_x.get(), n, true, scratch.get(), sb, stream_);
    sync();
    acc = d_out.download()[0];
    // double partials, rounded once to fp32 at the end
    ASSERT_TRUE(std::isfinite(got[0]));
    EXPECT_LE(std::fabs(got[0] - ref) / ref, 2 * kEpsF32) << got[0] << " vs " << ref;
    EXPECT_LE(std::fabs(acc - (ref + 2.5)) / (ref + 2.5), 2 * kEpsF32);
    EXPECT_TRUE(bit_equal("sum_squares", &got[0], &got[1], sizeof(float)));
  }
}

// Parameter-gradient reductions are bit-reproducible run to run.
TEST_F(CudaKernels, DeterministicParameterGradients) {
  const int N = 1024, C = 768, OC = 2304;
  const auto x = rand_bf(size_t(N) * C), dout = rand_bf(size_t(N) * C),
             w = rand_bf(static_cast<size_t>(C));
  const auto dout2 = rand_bf(size_t(N) * OC), w2 = rand_bf(size_t(OC) * C);
  std::vector<float> tmp(x.size()), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
  cpu::layernorm_forward(tmp.data(), mean.data(), rstd.data(), x.data(), w.data(), w.data(), N, C,
                         1e-5f);
  DevBf d_x(x), d_dout(dout), d_w(w), d_dout2(dout2), d_w2(w2);
  auto d_mean = to_dev(mean), d_rstd = to_dev(rstd);
  const size_t sb =
      std::max(layernorm_backward_scratch_bytes(N, C), matmul_backward_scratch_bytes(N, OC));
  auto scratch = scratch_of(sb);
  std::vector<float> res[2];
  for (int run = 0; run < 2; ++run) {
    Dev<float> dw(static_cast<size_t>(C)), db(static_cast<size_t>(C)), dw2(size_t(OC) * C),
        db2(static_cast<size_t>(OC));
    for (auto* d : {&dw, &db, &dw2, &db2}) CUDA_CHECK(cudaMemset(d->get(), 0, d->bytes()));
    layernorm_backward(nullptr, dw.get(), db.get(), d_dout.bf(), d_x.bf(), d_w.bf(), d_mean.get(),
                       d_rstd.get(), N, C, scratch.get(), sb, stream_);
    matmul_backward(ctx(), nullptr, dw2.get(), db2.get(), d_dout2.bf(), d_x.bf(), d_w2.bf(), N, C,
                    OC, scratch.get(), sb, stream_);
    sync();
    for (auto* d : {&dw, &db, &dw2, &db2}) {
      const auto v = d->download();
      res[run].insert(res[run].end(), v.begin(), v.end());
    }
  }
  EXPECT_TRUE(bit_equal("parameter gradients", res[0].data(), res[1].data(),
                        res[0].size() * sizeof(float)));
}

// [Column sums] read rows four columns at a time where the rows are 8-byte aligned, one at a
// time elsewhere, with the same partition and order: the same bits either way. The unaligned
// side reads copies of dout and x shifted by one element.
TEST_F(CudaKernels, ColumnSumsAreTheSameBitsVectorisedOrNot) {
  const int N = 1000, C = 768;  // N not a multiple of the chunk rows: a short last chunk
  const auto x = rand_bf(size_t(N) * C, -1.0f, 2.0f), dout = rand_bf(size_t(N) * C),
             w = rand_bf(static_cast<size_t>(C));
  std::vector<float> tmp(x.size()), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
  cpu::layernorm_forward(tmp.data(), mean.data(), rstd.data(), x.data(), w.data(), w.data(), N, C,
                         1e-5f);
  auto shifted = [](const std::vector<float>& v) {
    std::vector<float> s(v.size() + 1, 0.0f);
    std::copy(v.begin(), v.end(), s.begin() + 1);
    return s;
  };
  DevBf d_x(x), d_dout(dout), d_w(w), d_x1(shifted(x)), d_dout1(shifted(dout));
  auto d_mean = to_dev(mean), d_rstd = to_dev(rstd);
  const size_t sb =
      std::max(layernorm_backward_scratch_bytes(N, C), matmul_backward_scratch_bytes(N, C));
  auto scratch = scratch_of(sb);
  std::vector<float> res[2];
  for (int side = 0; side < 2; ++side) {
    const __nv_bfloat16* dy = side == 0 ? d_dout.bf() : d_dout1.bf() + 1;
    const __nv_bfloat16* xx = side == 0 ? d_x.bf() : d_x1.bf() + 1;
    Dev<float> dw(static_cast<size_t>(C)), db(static_cast<size_t>(C)), dr(static_cast<size_t>(C)),
        dbias(static_cast<size_t>(C));
    for (auto* d : {&dw, &db, &dr, &dbias}) CUDA_CHECK(cudaMemset(d->get(), 0, d->bytes()));
    layernorm_backward(nullptr, dw.get(), db.get(), dy, xx, d_w.bf(), d_mean.get(), d_rstd.get(), N,
                       C, scratch.get(), sb, stream_);
    rmsnorm_backward(nullptr, dr.get(), dy, xx, d_w.bf(), d_rstd.get(), N, C, scratch.get(), sb,
                     stream_);
    matmul_backward(ctx(), nullptr, nullptr, dbias.get(), dy, xx, d_w.bf(), N, C, C, scratch.get(),
                    sb, stream_);
    sync();
    for (auto* d : {&dw, &db, &dr, &dbias}) {
      const auto v = d->download();
      res[side].insert(res[side].end(), v.begin(), v.end());
    }
  }
  EXPECT_TRUE(bit_equal("column sums, aligned and unaligned rows", res[0].data(), res[1].data(),
                        res[0].size() * sizeof(float)));
}

// [Fresh gradients] Written parameter gradients, over outputs poisoned with NaN, against the
// same kernels adding into zeros: the column sums (LayerNorm's dw and db, RMSNorm's dw, a
// linear's dbias) are the same bits, their pass 2 storing what it would add to zero. dW is
// cuBLASLt's product with beta 0 instead of 1, an algorithm of its choosing: within the fp32
// sum over the N rows (tol(0, N)) of the added one, and the NaN never shows. The bias
// gradient from the GEMM's epilogue is copied instead of added: the same bits. The GELU
// gradient epilogue's dW and dbias are the plain backward's.
TEST_F(CudaKernels, WrittenParameterGradientsAreTheAddedOnes) {
  const int N = 1000, C = 768, OC = 2304;
  const auto x = rand_bf(size_t(N) * C, -1.0f, 2.0f), dn = rand_bf(size_t(N) * C),
             w = rand_bf(static_cast<size_t>(C));
  const auto dout = rand_bf(size_t(N) * OC), wl = rand_bf(size_t(OC) * C),
             pre = rand_bf(size_t(N) * C);
  std::vector<float> tmp(x.size()), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
  cpu::layernorm_forward(tmp.data(), mean.data(), rstd.data(), x.data(), w.data(), w.data(), N, C,
                         1e-5f);
  DevBf d_x(x), d_dn(dn), d_w(w), d_dout(dout), d_wl(wl), d_pre(pre), d_dx(x.size());
  auto d_mean = to_dev(mean), d_rstd = to_dev(rstd);
  const size_t sb =
      std::max({layernorm_backward_scratch_bytes(N, C), rmsnorm_backward_scratch_bytes(N, C),
                matmul_backward_scratch_bytes(N, OC)});
  auto scratch = scratch_of(sb);
  // Column sums (LayerNorm dw, db; RMSNorm dw) then, per bias source, dW and dbias.
  struct Out {
    std::vector<float> sums, dw[3], db[3];
  };
  auto run = [&](bool accumulate) {
    Out o;
    Dev<float> lw(static_cast<size_t>(C)), lb(static_cast<size_t>(C)), rw(static_cast<size_t>(C));
    for (auto* d : {&lw, &lb, &rw})
      if (accumulate)
        CUDA_CHECK(cudaMemset(d->get(), 0, d->bytes()));
      else
        d->poison();
    layernorm_backward(nullptr, lw.get(), lb.get(), d_dn.bf(), d_x.bf(), d_w.bf(), d_mean.get(),
                       d_rstd.get(), N, C, scratch.get(), sb, stream_, accumulate);
    rmsnorm_backward(nullptr, rw.get(), d_dn.bf(), d_x.bf(), d_w.bf(), d_rstd.get(), N, C,
                     scratch.get(), sb, stream_, accumulate);
    sync();
    for (auto* d : {&lw, &lb, &rw}) {
      const auto v = d->download();
      o.sums.insert(o.sums.end(), v.begin(), v.end());
    }
    // 0: dbias from the column sums; 1: from the GEMM's epilogue; 2: the GELU gradient epilogue.
    for (int side = 0; side < 3; ++side) {
      Dev<float> dw(size_t(OC) * C), db(static_cast<size_t>(OC));
      for (auto* d : {&dw, &db})
        if (accumulate)
          CUDA_CHECK(cudaMemset(d->get(), 0, d->bytes()));
        else
          d->poison();
      ctx().set_bias_grad_epilogue(side == 1);
      matmul_backward(ctx(), side == 2 ? d_dx.bf() : nullptr, dw.get(), db.get(), d_dout.bf(),
                      d_x.bf(), d_wl.bf(), N, C, OC, scratch.get(), sb, stream_, false,
                      side == 2 ? d_pre.bf() : nullptr, accumulate);
      ctx().set_bias_grad_epilogue(false);
      sync();
      o.dw[side] = dw.download();
      o.db[side] = db.download();
    }
    return o;
  };
  const Out added = run(true), written = run(false);
  EXPECT_TRUE(bit_equal("norm column sums", added.sums.data(), written.sums.data(),
                        added.sums.size() * sizeof(float)));
  for (int side = 0; side < 3; ++side) {
    SCOPED_TRACE(side == 0 ? "column sums" : side == 1 ? "bias epilogue" : "GELU epilogue");
    EXPECT_TRUE(bit_equal("dbias", added.db[side].data(), written.db[side].data(),
                          added.db[side].size() * sizeof(float)));
    EXPECT_TRUE(close("dw written against added", written.dw[side], added.dw[side], tol(0, N)));
  }
  EXPECT_TRUE(bit_equal("dw of the GELU epilogue and of the plain backward", written.dw[2].data(),
                        written.dw[0].data(), written.dw[0].size() * sizeof(float)));
}

TEST_F(CudaKernels, ScratchTooSmallThrows) {
  const int N = 64, C = 32;
  DevBf a(size_t(N) * C);
  Dev<float> dw(static_cast<size_t>(C)), stats(static_cast<size_t>(N));
  const size_t sb = layernorm_backward_scratch_bytes(N, C);
  auto scratch = scratch_of(sb);
  EXPECT_THROW(layernorm_backward(nullptr, dw.get(), nullptr, a.bf(), a.bf(), a.bf(), stats.get(),
                                  stats.get(), N, C, scratch.get(), sb - 4, stream_),
               tandem::Error);
  EXPECT_THROW(
      attention_forward(ctx(), a.bf(), nullptr, a.bf(), 1, 4, 3, 2, 8, scratch.get(), sb, stream_),
      tandem::Error);  // Hq not a multiple of Hkv
}

// ---------------------------------------------------------------------------------------------
// Timing (TANDEM_GPU_BENCH=1): per-op microseconds at GPT-2 124M training shapes, B=16 T=1024.
// No assertions on time.

class Bench : public CudaKernels {
 protected:
  void SetUp() override {
    if (!env_on("TANDEM_GPU_BENCH")) GTEST_SKIP() << "set TANDEM_GPU_BENCH=1 to time the kernels";
    CudaKernels::SetUp();
  }
  // Mean microseconds of fn over `iters` launches after warm-ups, timed with cudaEvents.
  double time_us(const std::function<void()>& fn, int iters = 20) {
    for (int i = 0; i < 3; ++i) fn();
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0, stream_));
    for (int i = 0; i < iters; ++i) fn();
    CUDA_CHECK(cudaEventRecord(e1, stream_));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 1000.0 * ms / iters;
  }
  void report(const char* name, double us, double bytes = 0.0, double flops = 0.0) {
    std::printf("  %-34s %10.1f us", name, us);
    if (bytes > 0) std::printf("  %7.0f GB/s", bytes / us * 1e-3);
    if (flops > 0) std::printf("  %7.0f TFLOP/s", flops / us * 1e-6);
    std::printf("\n");
  }
  // bf16 random values in [-1, 1) on the device (a host block tiled by device copies).
  void fill(const DevBf& d) {
    const size_t block = std::min<size_t>(d.size(), size_t(1) << 20);
    DevBf tmp(rand_bf(block));
    for (size_t off = 0; off < d.size(); off += block)
      CUDA_CHECK(cudaMemcpy(d.get() + off, tmp.get(), std::min(block, d.size() - off) * 2,
                            cudaMemcpyDeviceToDevice));
  }
};

TEST_F(Bench, Gpt2Small) {
  const int B = 16, T = 1024, C = 768, H = 12, D = 64, F = 4 * C, V = 50257, Vp = 50304;
  const int N = B * T, Q = 3 * C;
  const double bf = 2.0;
  std::printf("GPT-2 124M shapes: B=%d T=%d C=%d H=%d V=%d (Vp=%d)\n", B, T, C, H, V, Vp);
  DevBf x(size_t(N) * C), y(size_t(N) * C), dx(size_t(N) * C), wln(static_cast<size_t>(C)),
      bln(static_cast<size_t>(C));
  DevBf qkv(size_t(N) * Q), dqkv(size_t(N) * Q), wqkv(size_t(Q) * C), bqkv(static_cast<size_t>(Q));
  DevBf att(size_t(B) * H * T * T), atty(size_t(N) * C);
  DevBf fch(size_t(N) * F), act(size_t(N) * F), dact(size_t(N) * F), wfc(size_t(F) * C),
      bfc(static_cast<size_t>(F));
  DevBf wte(size_t(Vp) * C), wpe(size_t(T) * C), logits(size_t(N) * Vp);
  for (const DevBf* d : {&x, &y, &dx, &wln, &bln, &qkv, &dqkv, &wqkv, &bqkv, &atty, &fch, &act,
                         &dact, &wfc, &bfc, &wte, &wpe})
    fill(*d);
  Dev<float> mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N)),
      losses(static_cast<size_t>(N)), dwln(static_cast<size_t>(C)), dbln(static_cast<size_t>(C)),
      dwqkv(size_t(Q) * C), dbqkv(static_cast<size_t>(Q)), dwfc(size_t(F) * C),
      dbfc(static_cast<size_t>(F)), dwte(size_t(Vp) * C), dwpe(size_t(T) * C);
  for (auto* d : {&mean, &rstd, &dwln, &dbln, &dwqkv, &dbqkv, &dwfc, &dbfc, &dwte, &dwpe})
    CUDA_CHECK(cudaMemset(d->get(), 0, d->bytes()));
  auto tokens = to_dev(rand_ids(size_t(N), V));
  const size_t sb =
      std::max({attention_scratch_bytes(B, T, H, H, D), layernorm_backward_scratch_bytes(N, C),
                matmul_backward_scratch_bytes(N, F), embedding_backward_scratch_bytes(B, T, V)});
  auto scratch = scratch_of(sb);
  void* s = scratch.get();
  cudaStream_t st = stream_;
  const double nc = double(N) * C;

  report("embedding fwd", time_us([&] {
           embedding_forward(x.bf(), tokens.get(), wte.bf(), wpe.bf(), B, T, C, V, st);
         }),
         3 * nc * bf);
  report("embedding bwd", time_us([&] {
           embedding_backward(dwte.get(), dwpe.get(), y.bf(), tokens.get(), B, T, C, V, s, sb, st);
         }));
  report("layernorm fwd", time_us([&] {
           layernorm_forward(y.bf(), mean.get(), rstd.get(), x.bf(), wln.bf(), bln.bf(), N, C,
                             1e-5f, st);
         }),
         2 * nc * bf);
  report("layernorm bwd", time_us([&] {
           layernorm_backward(dx.bf(), dwln.get(), dbln.get(), y.bf(), x.bf(), wln.bf(), mean.get(),
                              rstd.get(), N, C, s, sb, st);
         }),
         4 * nc * bf);
  report("matmul qkv fwd (bias)", time_us([&] {
           matmul_forward(ctx(), qkv.bf(), nullptr, y.bf(), wqkv.bf(), bqkv.bf(), N, C, Q, st);
         }),
         0, 2.0 * N * C * Q);
  report("matmul qkv bwd (dx, dW, db)", time_us([&] {
           matmul_backward(ctx(), dx.bf(), dwqkv.get(), dbqkv.get(), qkv.bf(), y.bf(), wqkv.bf(), N,
                           C, Q, s, sb, st);
         }),
         0, 4.0 * N * C * Q);
  report("attention fwd", time_us([&] {
           attention_forward(ctx(), atty.bf(), att.bf(), qkv.bf(), B, T, H, H, D, s, sb, st);
         }),
         0, 4.0 * B * H * double(T) * T * D);
  report("attention bwd", time_us([&] {
           attention_backward(ctx(), dqkv.bf(), atty.bf(), qkv.bf(), att.bf(), B, T, H, H, D, s, sb,
                              st);
         }),
         0, 8.0 * B * H * double(T) * T * D);
  report("matmul fc fwd (bias + gelu)", time_us([&] {
           matmul_forward(ctx(), act.bf(), fch.bf(), y.bf(), wfc.bf(), bfc.bf(), N, C, F, st);
         }),
         0, 2.0 * N * C * F);
  report("gelu bwd",
         time_us([&] { gelu_backward(dact.bf(), act.bf(), fch.bf(), int64_t(N) * F, st); }),
         4.0 * N * F * bf);
  report("matmul fc bwd (dx, dW, db)", time_us([&] {
           matmul_backward(ctx(), dx.bf(), dwfc.get(), dbfc.get(), fch.bf(), y.bf(), wfc.bf(), N, C,
                           F, s, sb, st);
         }),
         0, 4.0 * N * C * F);
  // The bias gradient's two sources ([Bias gradient epilogue] in matmul.h) beside dW alone, at
  // the three widths of a GPT-2 block (its fc, qkv and projection products).
  for (const int OC : {F, Q, C}) {
    const auto& dout = OC == C ? y : OC == Q ? qkv : fch;
    auto dw_db = [&] {
      matmul_backward(ctx(), nullptr, dwfc.get(), dbfc.get(), dout.bf(), y.bf(), wfc.bf(), N, C, OC,
                      s, sb, st);
    };
    const std::string w = " OC=" + std::to_string(OC);
    ctx().set_bias_grad_epilogue(true);
    report(("dW + db, GEMM epilogue" + w).c_str(), time_us(dw_db), 0, 2.0 * N * C * OC);
    ctx().set_bias_grad_epilogue(false);
    report(("dW + db, column sums" + w).c_str(), time_us(dw_db), 0, 2.0 * N * C * OC);
    report(("dW alone" + w).c_str(), time_us([&] {
             matmul_backward(ctx(), nullptr, dwfc.get(), nullptr, dout.bf(), y.bf(), wfc.bf(), N, C,
                             OC, s, sb, st);
           }),
           0, 2.0 * N * C * OC);
  }
  report("residual add", time_us([&] { add_forward(y.bf(), y.bf(), x.bf(), int64_t(N) * C, st); }),
         3 * nc * bf);
  report("lm head fwd",
         time_us(
             [&] {
               matmul_forward(ctx(), logits.bf(), nullptr, y.bf(), wte.bf(), nullptr, N, C, Vp, st);
             },
             5),
         0, 2.0 * N * C * Vp);
  report(
      "crossentropy fwd",
      time_us([&] { crossentropy_forward(losses.get(), logits.bf(), tokens.get(), N, V, Vp, st); },
              5),
      double(N) * Vp * bf);
  // the fused backward overwrites the logits: rerun the head first each time
  const double head_us = time_us(
      [&] { matmul_forward(ctx(), logits.bf(), nullptr, y.bf(), wte.bf(), nullptr, N, C, Vp, st); },
      5);
  const double ce_us = time_us(
      [&] {
        matmul_forward(ctx(), logits.bf(), nullptr, y.bf(), wte.bf(), nullptr, N, C, Vp, st);
        crossentropy_fused_backward(logits.bf(), losses.get(), tokens.get(), N, V, Vp, 1.0f / N,
                                    st);
      },
      5);
  report("crossentropy fused bwd", ce_us - head_us, 3.0 * N * Vp * bf);
  report("lm head bwd (dx, dW)",
         time_us(
             [&] {
               matmul_backward(ctx(), dx.bf(), dwte.get(), nullptr, logits.bf(), y.bf(), wte.bf(),
                               N, C, Vp, nullptr, 0, st);
             },
             5),
         0, 4.0 * N * C * Vp);
  {
    const int64_t P = 124475904;  // GPT-2 124M parameters
    Dev<float> p(static_cast<size_t>(P)), g(static_cast<size_t>(P)), m(static_cast<size_t>(P)),
        v(static_cast<size_t>(P)), out(1);
    DevBf pb(static_cast<size_t>(P));
    for (auto* d : {&p, &g, &m, &v}) CUDA_CHECK(cudaMemset(d->get(), 0, d->bytes()));
    report("adamw (124M, bf16 copy)",
           time_us(
               [&] {
                 adamw_update(p.get(), g.get(), m.get(), v.get(), pb.bf(), P, 1e-3f, 0.9f, 0.95f,
                              1e-8f, 0.1f, adamw_bias_correction(0.9f, 0.95f, 3), 1.0f, st);
               },
               5),
           double(P) * (4 * 7 + 2));
    report("cast f32 -> bf16 (124M)",
           time_us([&] { cast_f32_to_bf16(pb.bf(), p.get(), P, st); }, 5), double(P) * 6);
    const size_t ssb = sum_squares_scratch_bytes(P);
    auto ss = scratch_of(ssb);
    report("sum_squares (124M)",
           time_us([&] { sum_squares(out.get(), g.get(), P, false, ss.get(), ssb, st); }, 5),
           double(P) * 4);
  }
}

}  // namespace
}  // namespace tandem::cuda
