// CPU kernels: the linear layer y = x @ w^T + b (w is [OC, IC], PyTorch layout), forward and
// backward. The GEMMs go through OpenBLAS; the bias gradient is a fixed-order column sum.
#include <cblas.h>

#include "core/error.h"
#include "device/cpu/kernels.h"

#ifdef _OPENMP
#define TD_KPRAGMA(...) _Pragma(#__VA_ARGS__)
#define TD_OMP(...) TD_KPRAGMA(omp __VA_ARGS__)
#else
#define TD_OMP(...)
#endif

namespace tandem::cpu {

namespace {
constexpr int kColBlock = 64;
constexpr int64_t kParallelMin = 16384;
}  // namespace

void matmul_forward(float* out, const float* x, const float* w, const float* bias, int N, int IC,
                    int OC) {
  TD_CHECK(N >= 0 && IC >= 0 && OC >= 0, "bad shape N={} IC={} OC={}", N, IC, OC);
  if (N == 0 || OC == 0) return;
  // out starts as the broadcast bias (or zero), then the GEMM accumulates onto it.
  TD_OMP(parallel for if (int64_t(N) * OC > kParallelMin))
  for (int i = 0; i < N; ++i) {
    float* o = out + int64_t(i) * OC;
    for (int j = 0; j < OC; ++j) o[j] = bias ? bias[j] : 0.0f;
  }
  if (IC == 0) return;
  // One row (a decode step's): the matrix-vector product streams w about twice as fast as a
  // one-row GEMM does on OpenBLAS (docs/design.md, "Decoding").
  if (N == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, OC, IC, 1.0f, w, IC, x, 1, 1.0f, out, 1);
    return;
  }
  // out[N,OC] += x[N,IC] @ w[OC,IC]^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, x, IC, w, IC, 1.0f, out,
              OC);
}

void matmul_backward(float* dx, float* dw, float* dbias, const float* dout, const float* x,
                     const float* w, int N, int IC, int OC) {
  TD_CHECK(N >= 0 && IC >= 0 && OC >= 0, "bad shape N={} IC={} OC={}", N, IC, OC);
  if (N == 0 || OC == 0) return;
  if (dx && IC > 0) {
    // dx[N,IC] += dout[N,OC] @ w[OC,IC]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, w, IC, 1.0f,
                dx, IC);
  }
  if (dw && IC > 0) {
    // dw[OC,IC] += dout[N,OC]^T @ x[N,IC]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, x, IC, 1.0f, dw,
                IC);
  }
  if (dbias) {
    // Column sums of dout, rows in order: parallel over column blocks only (deterministic).
    const int nblocks = (OC + kColBlock - 1) / kColBlock;
    TD_OMP(parallel for if (int64_t(N) * OC > kParallelMin))
    for (int blk = 0; blk < nblocks; ++blk) {
      const int j0 = blk * kColBlock;
      const int j1 = j0 + kColBlock < OC ? j0 + kColBlock : OC;
      for (int i = 0; i < N; ++i) {
        const float* d = dout + int64_t(i) * OC;
        for (int j = j0; j < j1; ++j) dbias[j] += d[j];
      }
    }
  }
}

}  // namespace tandem::cpu
