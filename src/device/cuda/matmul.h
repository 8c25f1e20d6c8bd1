// cuBLASLt GEMMs for the CUDA backend: a MatmulContext owning the cuBLASLt handle, a workspace
// and a cache of chosen algorithms, a generic column-major strided-batched GEMM (used by the
// linear layers and by attention), and the linear layer forward/backward in tandem's layout.
// See [cuBLASLt layout] in matmul.cu for how row-major tensors map onto column-major GEMMs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace tandem::cuda {

enum class GemmType { bf16, f32 };

enum class GemmEpilogue {
  none,
  bias,           // D = alpha op(A) op(B) + beta C + bias[m] (bias broadcast along the n columns)
  gelu_aux,       // D = gelu(alpha op(A) op(B)); aux = the pre-activation
  gelu_aux_bias,  // D = gelu(alpha op(A) op(B) + bias); aux = the pre-activation
  dgelu,          // D = gelu'(aux) * (alpha op(A) op(B)); aux = the pre-activation (input)
  bgradb,         // D as none, and bgrad[n] = sums of op(B) over k (fp32; D fp32 only here)
};

// One column-major GEMM, batched with constant strides: for every batch i,
//   D_i = alpha * op(A_i) * op(B_i) + beta * C_i
// with op(A_i) m x k, op(B_i) k x n, C_i and D_i m x n; X_i = X + i * stride_x elements. C is
// D (in place) unless given: then it has D's layout and type, and must not overlap D.
// A and B are bf16; D is bf16 or fp32; computation and scaling in fp32 (CUBLAS_COMPUTE_32F).
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;
  const __nv_bfloat16* A = nullptr;
  int64_t lda = 0, stride_a = 0;
  const __nv_bfloat16* B = nullptr;
  int64_t ldb = 0, stride_b = 0;
  void* D = nullptr;
  GemmType d_type = GemmType::bf16;
  int64_t ldd = 0, stride_d = 0;
  const void* C = nullptr;  // the beta term's source when not D (not batched: batch 1)
  int batch = 1;
  float alpha = 1.0f, beta = 0.0f;
  GemmEpilogue epilogue = GemmEpilogue::none;
  const __nv_bfloat16* bias = nullptr;  // [m], same type as D (bf16 only here)
  __nv_bfloat16* aux = nullptr;  // [n][aux_ld] pre-activation: written by gelu_aux*, read by dgelu
  int64_t aux_ld = 0;
  float* bgrad = nullptr;  // [n] the bias gradient bgradb writes (not adds)
};

// Owns the cuBLASLt handle, a workspace (allocated once, here) and the algorithm cache.
// Algorithms are chosen by cuBLASLt's heuristic once per (shape, layout, types, epilogue,
// pointer alignment) and reused. One context serves one stream at a time: its workspace is
// shared by every GEMM it launches, so GEMMs on two streams concurrently need two contexts.
// The methods may be called from several host threads (a mutex guards the cache). Create it with
// the GPU it serves current (cudaSetDevice) and use it only for that GPU.
class MatmulContext {
 public:
  static constexpr size_t kDefaultWorkspaceBytes = size_t(32) << 20;  // what Hopper kernels like
  explicit MatmulContext(size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~MatmulContext();
  MatmulContext(const MatmulContext&) = delete;
  MatmulContext& operator=(const MatmulContext&) = delete;

  // Launches one GEMM; throws tandem::Error when cuBLASLt has no algorithm for it.
  void gemm(const GemmArgs& args, cudaStream_t stream);
  // Like gemm, but returns false (launching nothing) when no algorithm supports the request;
  // the answer is cached. Used to try a fused epilogue before falling back to separate kernels.
  bool try_gemm(const GemmArgs& args, cudaStream_t stream);
  // Number of distinct GEMM configurations seen (cached plans), for tests.
  size_t cached_plans() const;
  // Whether matmul_backward takes the bias gradient from the dW GEMM's epilogue ([Bias gradient
  // epilogue]) or from the column-sum kernels (the default: see there for why).
  void set_bias_grad_epilogue(bool on) { bias_grad_epilogue_ = on; }
  bool bias_grad_epilogue() const { return bias_grad_epilogue_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool bias_grad_epilogue_ = false;
};

// Linear layer forward, tandem layout: out[N,OC] = x[N,IC] @ w[OC,IC]^T + bias[OC] (bias may be
// null). With pre_gelu non-null, pre_gelu[N,OC] receives x @ w^T + bias and out = gelu(pre_gelu)
// (tanh approximation): fused into the GEMM epilogue (CUBLASLT_EPILOGUE_GELU_AUX_BIAS) where
// cuBLASLt supports it (OC % 8 == 0, 16-byte aligned buffers), else a GEMM then a GELU kernel.
void matmul_forward(MatmulContext& ctx, __nv_bfloat16* out, __nv_bfloat16* pre_gelu,
                    const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                    int N, int IC, int OC, cudaStream_t stream);
// out[N,OC] = x @ w^T + bias + residual[N,OC] (bias may be null; out may alias residual, and
// must not otherwise overlap it): one GEMM with residual as its C (beta 1, the bias in its
// epilogue where cuBLASLt has one), so the residual is read once and never copied.
void matmul_residual_forward(MatmulContext& ctx, __nv_bfloat16* out, const __nv_bfloat16* x,
                             const __nv_bfloat16* w, const __nv_bfloat16* bias,
                             const __nv_bfloat16* residual, int N, int IC, int OC,
                             cudaStream_t stream);

// Linear layer backward, accumulating ([Backward accumulates] in device/cpu/kernels.h):
//   dx[N,IC]  += dout[N,OC] @ w[OC,IC]        (bf16, GEMM with beta = 1)
//   dw[OC,IC] += dout^T @ x                   (fp32 C/D, bf16 A/B, GEMM with beta = 1)
//   dbias[OC] += column sums of dout          (fp32, deterministic two-pass reduction)
// Any of dx, dw, dbias may be null. scratch: matmul_backward_scratch_bytes(N, OC) bytes (only
// used for dbias; may be null when dbias is). dbias comes from the deterministic column sums of
// dout ([Column sums] in kernels.cuh). [Bias gradient epilogue] With
// ctx.bias_grad_epilogue() and dw and dbias both asked for, from the dW GEMM's epilogue instead
// (CUBLASLT_EPILOGUE_BGRADB) into the scratch, then added into dbias (where cuBLASLt has no such
// algorithm, from the column sums). It is off by default: on an H200 cuBLASLt runs it as a
// reduction kernel of its own over dout (96-384 blocks), and at GPT-2 124M shapes (N 16384)
// dW + db took 157.4 / 124.3 / 52.2 us with it against 148.8 / 112.7 / 47.2 us with the column
// sums, for 3072 / 2304 / 768 columns (Bench.Gpt2Small). With
// dx_accumulate false, dx is overwritten (GEMM with beta = 0) instead: saves clearing a buffer that
// holds nothing yet. [GELU gradient epilogue] With gelu_pre[N,IC] non-null (the pre-activation of
// the tanh GELU whose output x is; dx_accumulate must be false), dx = gelu'(gelu_pre) * (dout @ w):
// in the GEMM's epilogue (CUBLASLT_EPILOGUE_DGELU) where cuBLASLt has it (IC % 8 == 0, 16-byte
// aligned buffers), rounded once; else the GEMM, then gelu_backward in place. With
// grad_accumulate false, dw and dbias are written instead ([Fresh gradients] in
// device/kernels.h: the dW GEMM with beta = 0, the column sums' pass 2 storing its sum).
size_t matmul_backward_scratch_bytes(int N, int OC);
void matmul_backward(MatmulContext& ctx, __nv_bfloat16* dx, float* dw, float* dbias,
                     const __nv_bfloat16* dout, const __nv_bfloat16* x, const __nv_bfloat16* w,
                     int N, int IC, int OC, void* scratch, size_t scratch_bytes,
                     cudaStream_t stream, bool dx_accumulate = true,
                     const __nv_bfloat16* gelu_pre = nullptr, bool grad_accumulate = true);

}  // namespace tandem::cuda
