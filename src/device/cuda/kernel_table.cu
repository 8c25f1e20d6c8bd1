// The CUDA kernel table. Attention is the fused flash attention where the head size allows
// it (32, 64, 128) unless AttentionImpl::gemm asks for the GEMM attention, which saves the
// [B, H, T, T] probabilities; AttentionImpl::flash_wgmma runs the flash kernels on Hopper's
// warpgroup MMA. Linear layers of at most kGemvMaxRows rows (decoding) run the
// weight-streaming GEMV of kernels_gemv.cu where the shape suits it, others cuBLASLt.
#include "device/cuda/kernel_table.h"

#include <algorithm>

#include "core/error.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

bf16* h(void* p) {
  return static_cast<bf16*>(p);
}
const bf16* h(const void* p) {
  return static_cast<const bf16*>(p);
}

// Decoding rows up to which SwiGLU is fused into the down product's prologue.
constexpr int kSwigluPrologueMaxRows = 2;

class CudaKernels final : public Kernels {
 public:
  CudaKernels(AttentionImpl impl, MatmulContext* ctx, cudaStream_t stream)
      : impl_(impl), ctx_(ctx), stream_(stream) {
    // A table that runs kernels (not one for sizing) refuses the wgmma attention where it
    // cannot run, before the first step rather than at its first attention.
    if (ctx_ != nullptr && impl_ == AttentionImpl::flash_wgmma) flash_attention_require_wgmma(64);
    // automatic takes the wgmma kernels where the device runs them (asked once, here, not
    // inside a step that may be under graph capture); the head size is checked per call.
    wgmma_device_ =
        ctx_ != nullptr && impl_ == AttentionImpl::automatic && flash_attention_wgmma_supported(64);
  }

  DType compute_dtype() const override { return DType::bf16; }

  AttentionSaves attention_saves(int D) const override {
    const bool flash_ok = flash_attention_supported(D);
    TD_CHECK(impl_ != AttentionImpl::flash || flash_ok,
             "flash attention needs a head size of 32, 64 or 128, the model's is {}", D);
    TD_CHECK(impl_ != AttentionImpl::flash_wgmma || D == 64 || D == 128,
             "the wgmma flash attention needs a head size of 64 or 128, the model's is {}", D);
    return impl_ != AttentionImpl::gemm && flash_ok ? AttentionSaves::logsumexp
                                                    : AttentionSaves::probabilities;
  }

  size_t scratch_bytes(const KernelShape& s) const override {
    const int N = s.B * s.T;
    size_t b =
        attention_saves(s.D) == AttentionSaves::logsumexp
            ? flash_attention_scratch_bytes(s.B, s.T, s.Hq, s.Hkv, s.D, sizing_flash_kernels(s.D))
            : attention_scratch_bytes(s.B, s.T, s.Hq, s.Hkv, s.D);
    b = std::max(b, layernorm_backward_scratch_bytes(N, s.C));
    b = std::max(b, rmsnorm_backward_scratch_bytes(N, s.C));
    if (s.P > 0) {
      b = std::max(b, attention_decode_scratch_bytes(N, s.Hq, s.Hkv, s.D, s.P));
      // The unfused paths of norm_linear_forward and swiglu_linear_residual_forward stage the
      // normalised rows [N, C] or the SwiGLU rows [N, F] here.
      b = std::max(b, staged_bytes(N, std::max(s.C, s.F)));
    }
    for (int oc : {s.Q, s.C, s.F, s.M, s.Vp}) b = std::max(b, matmul_backward_scratch_bytes(N, oc));
    return std::max(b, embedding_backward_scratch_bytes(s.B, s.T, s.V));
  }
  void set_scratch(void* scratch, size_t bytes) override {
    scratch_ = scratch;
    scratch_bytes_ = bytes;
  }

  void zero(void* p, size_t bytes) override { CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream())); }

  void embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B,
                         int T, int C, int V) override {
    cuda::embedding_forward(h(out), tokens, h(wte), h(wpe), B, T, C, V, stream());
  }
  void embedding_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B,
                          int T, int C, int V) override {
    cuda::embedding_backward(dwte, dwpe, h(dout), tokens, B, T, C, V, scratch_, scratch_bytes_,
                             stream());
  }
  void layernorm_forward(void* out, float* mean, float* rstd, const void* x, const void* w,
                         const void* b, int N, int C, float eps) override {
    cuda::layernorm_forward(h(out), mean, rstd, h(x), h(w), h(b), N, C, eps, stream());
  }
  void layernorm_backward(void* dx, float* dw, float* db, const void* dout, const void* x,
                          const void* w, const float* mean, const float* rstd, int N, int C,
                          GradMode gm) override {
    cuda::layernorm_backward(h(dx), dw, db, h(dout), h(x), h(w), mean, rstd, N, C, scratch_,
                             scratch_bytes_, stream(), gm == GradMode::add);
  }
  void rmsnorm_forward(void* out, float* rstd, const void* x, const void* w, int N, int C,
                       float eps) override {
    cuda::rmsnorm_forward(h(out), rstd, h(x), h(w), N, C, eps, stream());
  }
  void rmsnorm_backward(void* dx, float* dw, const void* dout, const void* x, const void* w,
                        const float* rstd, int N, int C, GradMode gm) override {
    cuda::rmsnorm_backward(h(dx), dw, h(dout), h(x), h(w), rstd, N, C, scratch_, scratch_bytes_,
                           stream(), gm == GradMode::add);
  }
  void linear_forward(void* out, const void* x, const void* w, const void* bias, int N, int IC,
                      int OC) override {
    if (gemv_supported(h(x), h(w), N, IC, OC)) {
      gemv_forward(h(out), h(x), h(w), h(bias), N, IC, OC, stream());
      return;
    }
    matmul_forward(ctx(), h(out), nullptr, h(x), h(w), h(bias), N, IC, OC, stream());
  }
  void linear_gelu_forward(void* out, void* pre, const void* x, const void* w, const void* bias,
                           int N, int IC, int OC, GeluKind kind) override {
    if (gemv_supported(h(x), h(w), N, IC, OC)) {
      gemv_gelu_forward(h(out), h(pre), h(x), h(w), h(bias), N, IC, OC, kind == GeluKind::erf,
                        stream());
      return;
    }
    if (kind == GeluKind::tanh) {  // fused into the GEMM's epilogue where cuBLASLt can
      matmul_forward(ctx(), h(out), h(pre), h(x), h(w), h(bias), N, IC, OC, stream());
      return;
    }
    matmul_forward(ctx(), h(pre), nullptr, h(x), h(w), h(bias), N, IC, OC, stream());
    gelu_erf_forward(h(out), h(pre), int64_t{N} * OC, stream());
  }
  void linear_residual_forward(void* out, const void* x, const void* w, const void* bias,
                               const void* residual, int N, int IC, int OC) override {
    if (residual == nullptr) {  // nothing to add: the plain product
      linear_forward(out, x, w, bias, N, IC, OC);
      return;
    }
    if (gemv_supported(h(x), h(w), N, IC, OC)) {
      gemv_residual_forward(h(out), h(x), h(w), h(bias), h(residual), N, IC, OC, stream());
      return;
    }
    matmul_residual_forward(ctx(), h(out), h(x), h(w), h(bias), h(residual), N, IC, OC, stream());
  }
  void norm_linear_forward(void* out, const void* x, const void* nw, const void* nb, bool rms,
                           float eps, const void* w, const void* bias, int N, int IC,
                           int OC) override {
    if (gemv_norm_supported(h(x), h(nw), h(nb), h(w), N, IC, OC)) {
      gemv_norm_forward(h(out), h(x), h(nw), h(nb), rms, eps, h(w), h(bias), N, IC, OC, stream());
      return;
    }
    bf16* y = staged(N, IC, "norm_linear_forward");
    if (rms)
      cuda::rmsnorm_forward(y, nullptr, h(x), h(nw), N, IC, eps, stream());
    else
      cuda::layernorm_forward(y, nullptr, nullptr, h(x), h(nw), h(nb), N, IC, eps, stream());
    linear_forward(out, y, w, bias, N, IC, OC);
  }
  void swiglu_linear_residual_forward(void* out, const void* hh, const void* w, const void* bias,
                                      const void* residual, int N, int F, int OC) override {
    // [SwiGLU prologue rows] The fused prologue recomputes SwiGLU of every row in every block
    // of the product: cheap for 1 or 2 rows, but at 8 rows of Llama-2-7B's down product it held
    // the product to 45% of the copy bandwidth against 71% for the plain product of the same
    // rows (DecodeBench.Gemv, 2026-12-03). From 3 rows (the tensor-core main loop) SwiGLU runs
    // once, staged, then the plain product with the residual.
    if (residual != nullptr && N <= kSwigluPrologueMaxRows &&
        gemv_swiglu_supported(h(hh), h(w), N, F, OC)) {
      gemv_swiglu_residual_forward(h(out), h(hh), h(w), h(bias), h(residual), N, F, OC, stream());
      return;
    }
    // SwiGLU staged, then the product (with the residual sum, or alone for a null one).
    bf16* a = staged(N, F, "swiglu_linear_residual_forward");
    cuda::swiglu_forward(a, h(hh), N, F, stream());
    linear_residual_forward(out, a, w, bias, residual, N, F, OC);
  }
  void linear_backward(void* dx, float* dw, float* dbias, const void* dout, const void* x,
                       const void* w, int N, int IC, int OC, bool dx_accumulate,
                       GradMode gm) override {
    matmul_backward(ctx(), h(dx), dw, dbias, h(dout), h(x), h(w), N, IC, OC, scratch_,
                    scratch_bytes_, stream(), dx_accumulate, nullptr, gm == GradMode::add);
  }
  void gelu_backward(void* dx, const void* dout, const void* x, int64_t n, GeluKind kind) override {
    if (kind == GeluKind::tanh)
      cuda::gelu_backward(h(dx), h(dout), h(x), n, stream());
    else
      gelu_erf_backward(h(dx), h(dout), h(x), n, stream());
  }
  void linear_gelu_backward(void* dpre, float* dw, float* dbias, const void* dout, const void* act,
                            const void* pre, const void* w, int N, int IC, int OC, GeluKind kind,
                            GradMode gm) override {
    if (kind == GeluKind::tanh) {  // [GELU gradient epilogue] where cuBLASLt has it
      matmul_backward(ctx(), h(dpre), dw, dbias, h(dout), h(act), h(w), N, IC, OC, scratch_,
                      scratch_bytes_, stream(), /*dx_accumulate=*/false, h(pre),
                      gm == GradMode::add);
      return;
    }
    Kernels::linear_gelu_backward(dpre, dw, dbias, dout, act, pre, w, N, IC, OC, kind, gm);
  }
  void swiglu_forward(void* out, const void* hh, int N, int F) override {
    cuda::swiglu_forward(h(out), h(hh), N, F, stream());
  }
  void swiglu_backward(void* dh, const void* dout, const void* hh, int N, int F) override {
    cuda::swiglu_backward(h(dh), h(dout), h(hh), N, F, stream());
  }
  void rope_forward(void* x, int B, int T, int H, int D, int rotary_dim, int row_stride,
                    float theta, int pos0) override {
    cuda::rope_forward(h(x), B, T, H, D, rotary_dim, row_stride, theta, pos0, stream());
  }
  void rope_backward(void* dx, int B, int T, int H, int D, int rotary_dim, int row_stride,
                     float theta, int pos0) override {
    cuda::rope_backward(h(dx), B, T, H, D, rotary_dim, row_stride, theta, pos0, stream());
  }
  void attention_forward(void* out, void* saved, const void* qkv, int B, int T, int Hq, int Hkv,
                         int D) override {
    if (attention_saves(D) == AttentionSaves::logsumexp)
      flash_attention_forward(h(out), static_cast<float*>(saved), h(qkv), B, T, Hq, Hkv, D,
                              scratch_, scratch_bytes_, stream(), flash_kernels(D));
    else
      cuda::attention_forward(ctx(), h(out), h(saved), h(qkv), B, T, Hq, Hkv, D, scratch_,
                              scratch_bytes_, stream());
  }
  void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                          const void* saved, int B, int T, int Hq, int Hkv, int D) override {
    if (attention_saves(D) == AttentionSaves::logsumexp)
      flash_attention_backward(h(dqkv), h(dout), h(qkv), h(out), static_cast<const float*>(saved),
                               B, T, Hq, Hkv, D, scratch_, scratch_bytes_, stream(),
                               flash_kernels(D));
    else
      cuda::attention_backward(ctx(), h(dqkv), h(dout), h(qkv), h(saved), B, T, Hq, Hkv, D,
                               scratch_, scratch_bytes_, stream());
  }
  void add(void* out, const void* a, const void* b, int64_t n) override {
    add_forward(h(out), h(a), h(b), n, stream());
  }
  void crossentropy_fused_backward(void* logits, float* losses, const int32_t* targets, int N,
                                   int V, int Vp, float dloss) override {
    cuda::crossentropy_fused_backward(h(logits), losses, targets, N, V, Vp, dloss, stream());
  }
  void crossentropy_forward(float* losses, const void* logits, const int32_t* targets, int N, int V,
                            int Vp) override {
    cuda::crossentropy_forward(losses, h(logits), targets, N, V, Vp, stream());
  }

  void embedding_at(void* out, const int32_t* tokens, const int32_t* pos, const void* wte,
                    const void* wpe, int N, int C, int V) override {
    cuda::embedding_at(h(out), tokens, pos, h(wte), h(wpe), N, C, V, stream());
  }
  void rope_kv_append(void* qkv, void* kcache, void* vcache, const int32_t* slot,
                      const int32_t* pos, int N, int Hq, int Hkv, int D, int rotary_dim,
                      float theta, int P) override {
    cuda::rope_kv_append(h(qkv), h(kcache), h(vcache), slot, pos, N, Hq, Hkv, D, rotary_dim, theta,
                         P, stream());
  }
  void attention_decode(void* out, const void* qkv, const void* kcache, const void* vcache,
                        const int32_t* slot, const int32_t* pos, int N, int Hq, int Hkv, int D,
                        int P) override {
    cuda::attention_decode(h(out), h(qkv), h(kcache), h(vcache), slot, pos, N, Hq, Hkv, D, P,
                           scratch_, scratch_bytes_, stream());
  }
  void rope_append_attention_decode(void* out, void* qkv, void* kcache, void* vcache,
                                    const int32_t* slot, const int32_t* pos, int N, int Hq, int Hkv,
                                    int D, int rotary_dim, float theta, int P) override {
    cuda::rope_append_attention_decode(h(out), h(qkv), h(kcache), h(vcache), slot, pos, N, Hq, Hkv,
                                       D, rotary_dim, theta, P, scratch_, scratch_bytes_, stream());
  }
  void copy_rows(void* dst, const void* src, int rows, int cols, int64_t src_stride) override {
    cuda::copy_rows(h(dst), h(src), rows, cols, src_stride, stream());
  }
  void advance_positions(int32_t* pos, int N) override {
    cuda::advance_positions(pos, N, stream());
  }
  void sample_tokens(int32_t* tokens, const void* logits, const int32_t* pos, int N, int V, int Vp,
                     const SamplingParams& p) override {
    cuda::sample_tokens(tokens, h(logits), pos, N, V, Vp, p.temperature, p.top_k, p.top_p, p.seed,
                        stream(), p.row_offset);
  }
  void sample_candidates(float* vals, int32_t* ids, const void* logits, const int32_t* pos, int N,
                         int V, int Vp, int id_offset, const SamplingParams& p) override {
    cuda::sample_candidates(vals, ids, h(logits), pos, N, V, Vp, id_offset,
                            sample_candidates_per_row(p), p.temperature, p.top_k, p.seed,
                            p.row_offset, stream());
  }
  void sample_pick(int32_t* tokens, const float* vals, const int32_t* ids, const int32_t* pos,
                   int N, int ranks, int K, const SamplingParams& p) override {
    TD_CHECK(K == sample_candidates_per_row(p), "sample_pick: K={} but the rule asks for {}", K,
             sample_candidates_per_row(p));
    cuda::sample_pick(tokens, vals, ids, pos, N, ranks, K, p.temperature, p.top_k, p.top_p, p.seed,
                      p.row_offset, stream());
  }
  int sample_pick_max_candidates() const override { return kSamplePickMaxCandidates; }

 private:
  // Bytes of [rows, cols] bf16 staged in the scratch by the unfused decoding paths.
  static size_t staged_bytes(int rows, int cols) { return size_t(rows) * size_t(cols) * 2; }
  bf16* staged(int rows, int cols, const char* op) const {
    detail::check_scratch(scratch_, scratch_bytes_, staged_bytes(rows, cols), op);
    return static_cast<bf16*>(scratch_);
  }

  MatmulContext& ctx() const {
    TD_CHECK(ctx_ != nullptr, "this CUDA kernel table only sizes; it cannot run kernels");
    return *ctx_;
  }
  cudaStream_t stream() const {
    TD_CHECK(ctx_ != nullptr, "this CUDA kernel table only sizes; it cannot run kernels");
    return stream_;
  }

  // [Wgmma flash] automatic: Hopper's warpgroup kernels for head sizes 64 and 128 on a device
  // of compute capability 9.0, the mma.sync kernels otherwise; flash names the latter.
  // A table for sizing (no device) counts the wgmma scratch wherever automatic might take
  // those kernels.
  FlashKernels sizing_flash_kernels(int D) const {
    return ctx_ == nullptr && impl_ == AttentionImpl::automatic ? FlashKernels::wgmma
                                                                : flash_kernels(D);
  }
  FlashKernels flash_kernels(int D) const {
    if (impl_ == AttentionImpl::flash_wgmma) return FlashKernels::wgmma;
    return wgmma_device_ && (D == 64 || D == 128) ? FlashKernels::wgmma : FlashKernels::mma;
  }

  AttentionImpl impl_;
  MatmulContext* ctx_;
  cudaStream_t stream_;
  bool wgmma_device_ = false;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;

 public:
  std::unique_ptr<MatmulContext> owned_ctx;  // cuda_kernels_owning's context
};

}  // namespace

std::unique_ptr<Kernels> cuda_kernels(AttentionImpl impl, MatmulContext* ctx, cudaStream_t stream) {
  return std::make_unique<CudaKernels>(impl, ctx, stream);
}

std::unique_ptr<Kernels> cuda_kernels_owning(AttentionImpl impl, std::unique_ptr<MatmulContext> ctx,
                                             cudaStream_t stream) {
  auto table = std::make_unique<CudaKernels>(impl, ctx.get(), stream);
  table->owned_ctx = std::move(ctx);
  return table;
}

}  // namespace tandem::cuda

namespace tandem {

std::unique_ptr<Kernels> cuda_kernels_for_sizing(AttentionImpl impl) {
  return cuda::cuda_kernels(impl, nullptr, nullptr);
}

}  // namespace tandem
