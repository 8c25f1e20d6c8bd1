// cuBLASLt GEMMs: the MatmulContext (handle, workspace, per-shape algorithm cache), the generic
// column-major strided-batched GEMM, and the linear layer forward (bias and GELU epilogues fused
// where cuBLASLt supports them) and backward (dx and fp32 dW accumulated by beta = 1, or
// written by beta = 0).
//
// [cuBLASLt layout] cuBLASLt is column-major; tandem's tensors are row-major. A row-major matrix
// M[r, c] with row stride ld is, read column-major with the same ld, its transpose M^T (c x r).
// So every row-major product Y = op(P) op(Q) is computed as the column-major product
// Y^T = op(Q)^T op(P)^T, i.e. with the operands swapped, and no data is ever transposed:
//
//  forward   out[N,OC] = x[N,IC] w[OC,IC]^T
//            out^T (OC x N, ld OC) = w (buffer read as IC x OC, ld IC; TRANSA = T -> OC x IC)
//                                  * x^T (buffer read as IC x N, ld IC; TRANSB = N)
//            m = OC, n = N, k = IC. The bias (length m = OC) broadcasts along the n = N columns
//            of out^T, i.e. it is added to every row of out, as wanted.
//  dx        dx[N,IC] += dout[N,OC] w[OC,IC]
//            dx^T (IC x N, ld IC) = w^T (w buffer as IC x OC, ld IC; TRANSA = N)
//                                 * dout^T (dout buffer as OC x N, ld OC; TRANSB = N)
//            m = IC, n = N, k = OC; beta = 1 accumulates into the bf16 dx in place (C = D).
//            A residual sum (matmul_residual_forward) is the same with the residual as C.
//  dW        dw[OC,IC] += dout^T x
//            dw^T (IC x OC, ld IC) = x^T (x buffer as IC x N, ld IC; TRANSA = N)
//                                  * dout (dout buffer as OC x N, ld OC; TRANSB = T -> N x OC)
//            m = IC, n = OC, k = N; C = D are fp32, beta = 1, or 0 where dw is written
//            ([Fresh gradients]) (A, B bf16, CUBLAS_COMPUTE_32F).
// Attention's batched products follow the same rule; kernels_attention.cu spells them out.
#include "device/cuda/matmul.h"

#include <array>
#include <map>
#include <mutex>

#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

cudaDataType_t to_cuda(GemmType t) {
  return t == GemmType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
}
size_t type_bytes(GemmType t) {
  return t == GemmType::bf16 ? 2 : 4;
}

cublasLtEpilogue_t to_lt(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::none:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::gelu_aux:
      return CUBLASLT_EPILOGUE_GELU_AUX;
    case GemmEpilogue::gelu_aux_bias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::dgelu:
      return CUBLASLT_EPILOGUE_DGELU;
    case GemmEpilogue::bgradb:
      return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool has_bias(GemmEpilogue e) {
  return e == GemmEpilogue::bias || e == GemmEpilogue::gelu_aux_bias;
}
bool has_aux(GemmEpilogue e) {
  return e == GemmEpilogue::gelu_aux || e == GemmEpilogue::gelu_aux_bias ||
         e == GemmEpilogue::dgelu;
}

// The alignment (a power of two, at most 256 bytes) that every batch's pointer shares: that of
// the base pointer and of the batch stride. cuBLASLt's heuristic assumes 256 unless told.
int64_t alignment(const void* p, int64_t stride_bytes, int batch) {
  uint64_t a = reinterpret_cast<uintptr_t>(p) | 256u;
  if (batch > 1 && stride_bytes != 0) a |= uint64_t(stride_bytes);
  return int64_t(a & (~a + 1));  // lowest set bit
}

// Everything the choice of algorithm depends on.
using PlanKey = std::array<int64_t, 24>;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool supported = false;
};

void set_batch(cublasLtMatrixLayout_t layout, int batch, int64_t stride) {
  if (batch <= 1) return;
  const int32_t count = batch;
  CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                sizeof(count)));
  CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride, sizeof(stride)));
}

}  // namespace

struct MatmulContext::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  mutable std::mutex mu;
  std::map<PlanKey, Plan> plans;

  Plan& plan_for(const GemmArgs& g);
  ~Impl();
};

MatmulContext::Impl::~Impl() {
  for (auto& [key, p] : plans) {
    if (p.d) cublasLtMatrixLayoutDestroy(p.d);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.op) cublasLtMatmulDescDestroy(p.op);
  }
  if (workspace) cudaFree(workspace);
  if (handle) cublasLtDestroy(handle);
}

Plan& MatmulContext::Impl::plan_for(const GemmArgs& g) {
  const int64_t ab = 2;  // A and B are bf16
  const int64_t db = int64_t(type_bytes(g.d_type));
  const int64_t al_a = alignment(g.A, g.stride_a * ab, g.batch);
  const int64_t al_b = alignment(g.B, g.stride_b * ab, g.batch);
  const int64_t al_d = alignment(g.D, g.stride_d * db, g.batch);
  const int64_t al_bias = has_bias(g.epilogue) ? alignment(g.bias, 0, 1) : 0;
  const int64_t al_aux = has_aux(g.epilogue) ? alignment(g.aux, 0, 1) : 0;
  const int64_t al_c = g.C != nullptr ? alignment(g.C, 0, 1) : al_d;
  const int64_t al_bgrad = g.epilogue == GemmEpilogue::bgradb ? alignment(g.bgrad, 0, 1) : 0;
  const PlanKey key{g.trans_a,
                    g.trans_b,
                    g.m,
                    g.n,
                    g.k,
                    g.lda,
                    g.stride_a,
                    g.ldb,
                    g.stride_b,
                    int64_t(g.d_type),
                    g.ldd,
                    g.stride_d,
                    g.batch,
                    int64_t(g.epilogue),
                    g.aux_ld,
                    al_a,
                    al_b,
                    al_d,
                    al_bias,
                    al_aux,
                    g.beta != 0.0f,
                    al_c,
                    al_bgrad,
                    0};
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;

  Plan p;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const cublasLtEpilogue_t epi = to_lt(g.epilogue);
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (has_bias(g.epilogue)) {
    const cudaDataType_t bt = CUDA_R_16BF;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                                sizeof(g.bias)));
  }
  if (g.epilogue == GemmEpilogue::bgradb) {
    const cudaDataType_t bt = CUDA_R_32F;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bgrad,
                                                sizeof(g.bgrad)));
  }
  if (has_aux(g.epilogue)) {
    const cudaDataType_t at = CUDA_R_16BF;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                                                &at, sizeof(at)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                &g.aux_ld, sizeof(g.aux_ld)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &g.aux, sizeof(g.aux)));
  }
  // op(A) is m x k: stored k x m when transposed. op(B) is k x n: stored n x k when transposed.
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, g.trans_a ? g.k : g.m,
                                          g.trans_a ? g.m : g.k, g.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, g.trans_b ? g.n : g.k,
                                          g.trans_b ? g.k : g.n, g.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, to_cuda(g.d_type), g.m, g.n, g.ldd));
  set_batch(p.a, g.batch, g.stride_a);
  set_batch(p.b, g.batch, g.stride_b);
  set_batch(p.d, g.batch, g.stride_d);

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace_bytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof(ws)));
  const uint32_t aa = uint32_t(al_a), abb = uint32_t(al_b), ad = uint32_t(al_d),
                 ac = uint32_t(al_c);
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &abb, sizeof(abb)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof(ac)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof(ad)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p.supported = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (p.supported) p.algo = result.algo;
  return plans.emplace(key, p).first->second;
}

MatmulContext::MatmulContext(size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
  impl_->workspace_bytes = workspace_bytes;
  if (workspace_bytes > 0) CUDA_CHECK(cudaMalloc(&impl_->workspace, workspace_bytes));
}

MatmulContext::~MatmulContext() = default;

size_t MatmulContext::cached_plans() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->plans.size();
}

bool MatmulContext::try_gemm(const GemmArgs& g, cudaStream_t stream) {
  TD_CHECK(g.m > 0 && g.n > 0 && g.k > 0 && g.batch > 0, "bad GEMM shape m={} n={} k={} batch={}",
           g.m, g.n, g.k, g.batch);
  TD_CHECK(g.A && g.B && g.D, "GEMM with a null operand");
  TD_CHECK(!has_bias(g.epilogue) || g.bias, "bias epilogue without a bias");
  TD_CHECK(!has_aux(g.epilogue) || g.aux, "GELU epilogue without an aux buffer");
  TD_CHECK(g.epilogue != GemmEpilogue::bgradb || g.bgrad, "bias gradient epilogue without bgrad");
  TD_CHECK(g.d_type == GemmType::bf16
               ? g.epilogue != GemmEpilogue::bgradb
               : (g.epilogue == GemmEpilogue::none || g.epilogue == GemmEpilogue::bgradb),
           "epilogue {} does not go with this output type", int(g.epilogue));
  TD_CHECK(g.C == nullptr || g.batch == 1, "a separate C is only used unbatched");
  std::lock_guard<std::mutex> lock(impl_->mu);
  Plan& p = impl_->plan_for(g);
  if (!p.supported) return false;
  // Pointers change from call to call; the plan was chosen for their alignment class.
  if (has_bias(g.epilogue))
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                                sizeof(g.bias)));
  if (has_aux(g.epilogue))
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &g.aux, sizeof(g.aux)));
  if (g.epilogue == GemmEpilogue::bgradb)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bgrad,
                                                sizeof(g.bgrad)));
  const void* c = g.C != nullptr ? g.C : g.D;
  CUBLAS_CHECK(cublasLtMatmul(impl_->handle, p.op, &g.alpha, g.A, p.a, g.B, p.b, &g.beta, c, p.d,
                              g.D, p.d, &p.algo, impl_->workspace, impl_->workspace_bytes, stream));
  return true;
}

void MatmulContext::gemm(const GemmArgs& g, cudaStream_t stream) {
  if (!try_gemm(g, stream)) {
    TD_THROW(
        "cuBLASLt has no algorithm for GEMM transa={} transb={} m={} n={} k={} lda={} ldb={} "
        "ldd={} batch={} d_type={} epilogue={}",
        g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldd, g.batch, int(g.d_type),
        int(g.epilogue));
  }
}

namespace {

// y[N, OC] += bias (broadcast over rows): the fallback when the bias epilogue is unsupported.
__global__ void bias_add_kernel(bf16* __restrict__ y, const bf16* __restrict__ bias, int64_t N,
                                int OC) {
  const int64_t total = N * OC;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride)
    y[e] = __float2bfloat16_rn(__bfloat162float(y[e]) + __bfloat162float(bias[e % OC]));
}

// y = x @ w^T + bias (+ residual, the GEMM's C with beta 1, when not null), fused bias where
// possible. residual may be y itself.
void linear(MatmulContext& ctx, bf16* y, const bf16* x, const bf16* w, const bf16* bias, int N,
            int IC, int OC, cudaStream_t stream, const bf16* residual = nullptr) {
  GemmArgs g;
  g.beta = residual != nullptr ? 1.0f : 0.0f;
  g.C = residual != y ? residual : nullptr;
  g.trans_a = true;
  g.trans_b = false;
  g.m = OC;
  g.n = N;
  g.k = IC;
  g.A = w;
  g.lda = IC;
  g.B = x;
  g.ldb = IC;
  g.D = y;
  g.ldd = OC;
  g.d_type = GemmType::bf16;
  if (bias) {
    g.epilogue = GemmEpilogue::bias;
    g.bias = bias;
    if (ctx.try_gemm(g, stream)) return;
    g.epilogue = GemmEpilogue::none;
    g.bias = nullptr;
  }
  ctx.gemm(g, stream);
  if (bias) {
    bias_add_kernel<<<detail::grid_for(int64_t(N) * OC, 256, 65535), 256, 0, stream>>>(y, bias, N,
                                                                                       OC);
    CUDA_CHECK_LAUNCH();
  }
}

struct BiasGrad {  // V columns from c of row r ([Column sums])
  const bf16* dout;
  int OC;
  template <int V>
  __device__ void operator()(int64_t r, int c, float (&o)[1][V]) const {
    detail::load_vec<V>(dout + r * OC + c, o[0]);
  }
};

}  // namespace

void matmul_forward(MatmulContext& ctx, bf16* out, bf16* pre_gelu, const bf16* x, const bf16* w,
                    const bf16* bias, int N, int IC, int OC, cudaStream_t stream) {
  TD_CHECK(N >= 0 && IC > 0 && OC >= 0, "bad shape N={} IC={} OC={}", N, IC, OC);
  if (N == 0 || OC == 0) return;
  if (!pre_gelu) {
    linear(ctx, out, x, w, bias, N, IC, OC, stream);
    return;
  }
  // GELU epilogue: cuBLASLt needs the aux leading dimension divisible by 8 (and aligned buffers).
  if (OC % 8 == 0 && detail::aligned16(pre_gelu) && detail::aligned16(out)) {
    GemmArgs g;
    g.trans_a = true;
    g.m = OC;
    g.n = N;
    g.k = IC;
    g.A = w;
    g.lda = IC;
    g.B = x;
    g.ldb = IC;
    g.D = out;
    g.ldd = OC;
    g.epilogue = bias ? GemmEpilogue::gelu_aux_bias : GemmEpilogue::gelu_aux;
    g.bias = bias;
    g.aux = pre_gelu;
    g.aux_ld = OC;
    if (ctx.try_gemm(g, stream)) return;
  }
  linear(ctx, pre_gelu, x, w, bias, N, IC, OC, stream);
  gelu_forward(out, pre_gelu, int64_t(N) * OC, stream);
}

void matmul_residual_forward(MatmulContext& ctx, bf16* out, const bf16* x, const bf16* w,
                             const bf16* bias, const bf16* residual, int N, int IC, int OC,
                             cudaStream_t stream) {
  TD_CHECK(N >= 0 && IC > 0 && OC >= 0, "bad shape N={} IC={} OC={}", N, IC, OC);
  if (N == 0 || OC == 0) return;
  TD_CHECK(residual != nullptr, "matmul_residual_forward: null residual");
  linear(ctx, out, x, w, bias, N, IC, OC, stream, residual);
}

size_t matmul_backward_scratch_bytes(int N, int OC) {
  return detail::colsum_scratch_bytes(N, OC, 1);
}

void matmul_backward(MatmulContext& ctx, bf16* dx, float* dw, float* dbias, const bf16* dout,
                     const bf16* x, const bf16* w, int N, int IC, int OC, void* scratch,
                     size_t scratch_bytes, cudaStream_t stream, bool dx_accumulate,
                     const bf16* gelu_pre, bool grad_accumulate) {
  TD_CHECK(N >= 0 && IC > 0 && OC >= 0, "bad shape N={} IC={} OC={}", N, IC, OC);
  if (N == 0 || OC == 0) return;
  bool bias_done = false;  // the dW GEMM's epilogue made the bias gradient
  TD_CHECK(gelu_pre == nullptr || (dx != nullptr && !dx_accumulate),
           "matmul_backward: the GELU gradient epilogue writes dx (dx_accumulate false)");
  if (dx) {
    GemmArgs g;
    g.m = IC;
    g.n = N;
    g.k = OC;
    g.A = w;
    g.lda = IC;
    g.B = dout;
    g.ldb = OC;
    g.D = dx;
    g.ldd = IC;
    g.d_type = GemmType::bf16;
    g.beta = dx_accumulate ? 1.0f : 0.0f;
    bool done = false;
    if (gelu_pre && IC % 8 == 0 && detail::aligned16(gelu_pre) && detail::aligned16(dx)) {
      GemmArgs e = g;  // [GELU gradient epilogue]
      e.epilogue = GemmEpilogue::dgelu;
      e.aux = const_cast<bf16*>(gelu_pre);  // read only: DGELU takes the aux as its input
      e.aux_ld = IC;
      done = ctx.try_gemm(e, stream);
    }
    if (!done) {
      ctx.gemm(g, stream);
      if (gelu_pre) gelu_backward(dx, dx, gelu_pre, int64_t(N) * IC, stream);
    }
  }
  if (dw) {
    GemmArgs g;
    g.trans_b = true;
    g.m = IC;
    g.n = OC;
    g.k = N;
    g.A = x;
    g.lda = IC;
    g.B = dout;
    g.ldb = OC;
    g.D = dw;
    g.ldd = IC;
    g.d_type = GemmType::f32;
    g.beta = grad_accumulate ? 1.0f : 0.0f;
    if (dbias && scratch && ctx.bias_grad_epilogue()) {  // [Bias gradient epilogue]
      detail::check_scratch(scratch, scratch_bytes, size_t(OC) * sizeof(float), "matmul_backward");
      GemmArgs e = g;
      e.epilogue = GemmEpilogue::bgradb;
      e.bgrad = static_cast<float*>(scratch);
      bias_done = ctx.try_gemm(e, stream);
      if (bias_done && grad_accumulate) add_f32(dbias, e.bgrad, OC, stream);
      if (bias_done && !grad_accumulate)
        CUDA_CHECK(cudaMemcpyAsync(dbias, e.bgrad, size_t(OC) * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream));
    }
    if (!bias_done) ctx.gemm(g, stream);
  }
  if (dbias && !bias_done) {
    detail::colsum<1>(dbias, nullptr, N, OC, scratch, scratch_bytes, "matmul_backward",
                      BiasGrad{dout, OC}, stream, detail::aligned8(dout), grad_accumulate);
  }
}

}  // namespace tandem::cuda
