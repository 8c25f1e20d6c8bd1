// The CPU kernel table.
#include "device/cpu/kernel_table.h"

#include <cstring>
#include <initializer_list>
#include <limits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "device/cpu/kernels.h"
#include "device/device.h"

namespace tandem {

namespace {

float* f(void* p) {
  return static_cast<float*>(p);
}
const float* f(const void* p) {
  return static_cast<const float*>(p);
}

// [Fresh gradients] on CPU: the outputs under GradMode::write are cleared, then the kernels add
// into them as always, which is adding into zeros exactly (each output is one layer's
// parameter, small beside the products that fill it).
void fresh(GradMode gm, std::initializer_list<std::pair<float*, int64_t>> outs) {
  if (gm != GradMode::write) return;
  for (const auto& [p, n] : outs)
    if (p != nullptr) std::memset(p, 0, static_cast<size_t>(n) * sizeof(float));
}

class CpuKernels final : public Kernels {
 public:
  DType compute_dtype() const override { return DType::f32; }
  AttentionSaves attention_saves(int) const override { return AttentionSaves::probabilities; }
  size_t scratch_bytes(const KernelShape&) const override { return 0; }
  void set_scratch(void*, size_t) override {}

  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }

  void embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B,
                         int T, int C, int) override {
    cpu::embedding_forward(f(out), tokens, f(wte), f(wpe), B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B,
                          int T, int C, int) override {
    cpu::embedding_backward(dwte, dwpe, f(dout), tokens, B, T, C);
  }
  void layernorm_forward(void* out, float* mean, float* rstd, const void* x, const void* w,
                         const void* b, int N, int C, float eps) override {
    cpu::layernorm_forward(f(out), mean, rstd, f(x), f(w), f(b), N, C, eps);
  }
  void layernorm_backward(void* dx, float* dw, float* db, const void* dout, const void* x,
                          const void* w, const float* mean, const float* rstd, int N, int C,
                          GradMode gm) override {
    fresh(gm, {{dw, C}, {db, C}});
    cpu::layernorm_backward(f(dx), dw, db, f(dout), f(x), f(w), mean, rstd, N, C);
  }
  void rmsnorm_forward(void* out, float* rstd, const void* x, const void* w, int N, int C,
                       float eps) override {
    cpu::rmsnorm_forward(f(out), rstd, f(x), f(w), N, C, eps);
  }
  void rmsnorm_backward(void* dx, float* dw, const void* dout, const void* x, const void* w,
                        const float* rstd, int N, int C, GradMode gm) override {
    fresh(gm, {{dw, C}});
    cpu::rmsnorm_backward(f(dx), dw, f(dout), f(x), f(w), rstd, N, C);
  }
  void linear_forward(void* out, const void* x, const void* w, const void* bias, int N, int IC,
                      int OC) override {
    cpu::matmul_forward(f(out), f(x), f(w), f(bias), N, IC, OC);
  }
  void linear_gelu_forward(void* out, void* pre, const void* x, const void* w, const void* bias,
                           int N, int IC, int OC, GeluKind kind) override {
    cpu::matmul_forward(f(pre), f(x), f(w), f(bias), N, IC, OC);
    if (kind == GeluKind::tanh)
      cpu::gelu_forward(f(out), f(pre), int64_t{N} * OC);
    else
      cpu::gelu_erf_forward(f(out), f(pre), int64_t{N} * OC);
  }
  void linear_backward(void* dx, float* dw, float* dbias, const void* dout, const void* x,
                       const void* w, int N, int IC, int OC, bool dx_accumulate,
                       GradMode gm) override {
    if (!dx_accumulate && dx != nullptr)
      std::memset(dx, 0, static_cast<size_t>(N) * static_cast<size_t>(IC) * sizeof(float));
    fresh(gm, {{dw, int64_t{OC} * IC}, {dbias, OC}});
    cpu::matmul_backward(f(dx), dw, dbias, f(dout), f(x), f(w), N, IC, OC);
  }
  void gelu_backward(void* dx, const void* dout, const void* x, int64_t n, GeluKind kind) override {
    if (kind == GeluKind::tanh)
      cpu::gelu_backward(f(dx), f(dout), f(x), n);
    else
      cpu::gelu_erf_backward(f(dx), f(dout), f(x), n);
  }
  void swiglu_forward(void* out, const void* h, int N, int F) override {
    cpu::swiglu_forward(f(out), f(h), N, F);
  }
  void swiglu_backward(void* dh, const void* dout, const void* h, int N, int F) override {
    cpu::swiglu_backward(f(dh), f(dout), f(h), N, F);
  }
  void rope_forward(void* x, int B, int T, int H, int D, int rotary_dim, int row_stride,
                    float theta, int pos0) override {
    cpu::rope_forward(f(x), B, T, H, D, rotary_dim, row_stride, theta, pos0);
  }
  void rope_backward(void* dx, int B, int T, int H, int D, int rotary_dim, int row_stride,
                     float theta, int pos0) override {
    cpu::rope_backward(f(dx), B, T, H, D, rotary_dim, row_stride, theta, pos0);
  }
  void attention_forward(void* out, void* saved, const void* qkv, int B, int T, int Hq, int Hkv,
                         int D) override {
    cpu::attention_forward(f(out), f(saved), f(qkv), B, T, Hq, Hkv, D);
  }
  void attention_backward(void* dqkv, const void* dout, const void* qkv, const void*,
                          const void* saved, int B, int T, int Hq, int Hkv, int D) override {
    cpu::attention_backward(f(dqkv), f(dout), f(qkv), f(saved), B, T, Hq, Hkv, D);
  }
  void add(void* out, const void* a, const void* b, int64_t n) override {
    cpu::add_forward(f(out), f(a), f(b), n);
  }
  void crossentropy_fused_backward(void* logits, float* losses, const int32_t* targets, int N,
                                   int V, int Vp, float dloss) override {
    cpu::crossentropy_fused_backward(f(logits), losses, targets, N, V, Vp, dloss);
  }
  void crossentropy_forward(float* losses, const void* logits, const int32_t* targets, int N, int V,
                            int Vp) override {
    cpu::crossentropy_forward(losses, f(logits), targets, N, V, Vp);
  }

  void linear_residual_forward(void* out, const void* x, const void* w, const void* bias,
                               const void* residual, int N, int IC, int OC) override {
    const int64_t n = int64_t{N} * OC;
    if (residual == nullptr) {  // nothing to add: the product alone
      cpu::matmul_forward(f(out), f(x), f(w), f(bias), N, IC, OC);
      return;
    }
    if (out != residual) {  // the product, then the sum: the rounding of the two-step path
      cpu::matmul_forward(f(out), f(x), f(w), f(bias), N, IC, OC);
      cpu::add_forward(f(out), f(out), f(residual), n);
      return;
    }
    std::vector<float> y(static_cast<size_t>(n));
    cpu::matmul_forward(y.data(), f(x), f(w), f(bias), N, IC, OC);
    cpu::add_forward(f(out), y.data(), f(residual), n);
  }
  void norm_linear_forward(void* out, const void* x, const void* nw, const void* nb, bool rms,
                           float eps, const void* w, const void* bias, int N, int IC,
                           int OC) override {
    std::vector<float> y(static_cast<size_t>(int64_t{N} * IC)), mean(static_cast<size_t>(N)),
        rstd(static_cast<size_t>(N));
    if (rms)
      cpu::rmsnorm_forward(y.data(), rstd.data(), f(x), f(nw), N, IC, eps);
    else
      cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), f(x), f(nw), f(nb), N, IC, eps);
    cpu::matmul_forward(f(out), y.data(), f(w), f(bias), N, IC, OC);
  }
  void swiglu_linear_residual_forward(void* out, const void* h, const void* w, const void* bias,
                                      const void* residual, int N, int F, int OC) override {
    std::vector<float> a(static_cast<size_t>(int64_t{N} * F));
    cpu::swiglu_forward(a.data(), f(h), N, F);
    linear_residual_forward(out, a.data(), w, bias, residual, N, F, OC);
  }

  void embedding_at(void* out, const int32_t* tokens, const int32_t* pos, const void* wte,
                    const void* wpe, int N, int C, int) override {
    cpu::embedding_at(f(out), tokens, pos, f(wte), f(wpe), N, C);
  }
  void rope_kv_append(void* qkv, void* kcache, void* vcache, const int32_t* slot,
                      const int32_t* pos, int N, int Hq, int Hkv, int D, int rotary_dim,
                      float theta, int P) override {
    cpu::rope_kv_append(f(qkv), f(kcache), f(vcache), slot, pos, N, Hq, Hkv, D, rotary_dim, theta,
                        P);
  }
  void attention_decode(void* out, const void* qkv, const void* kcache, const void* vcache,
                        const int32_t* slot, const int32_t* pos, int N, int Hq, int Hkv, int D,
                        int P) override {
    cpu::attention_decode(f(out), f(qkv), f(kcache), f(vcache), slot, pos, N, Hq, Hkv, D, P);
  }
  void copy_rows(void* dst, const void* src, int rows, int cols, int64_t src_stride) override {
    for (int r = 0; r < rows; ++r)
      std::memcpy(f(dst) + int64_t(r) * cols, f(src) + r * src_stride,
                  size_t(cols) * sizeof(float));
  }
  void advance_positions(int32_t* pos, int N) override {
    for (int n = 0; n < N; ++n) ++pos[n];
  }
  void sample_tokens(int32_t* tokens, const void* logits, const int32_t* pos, int N, int V, int Vp,
                     const SamplingParams& p) override {
    for (int n = 0; n < N; ++n)
      tokens[n] = cpu::sample_row(f(logits) + int64_t(n) * Vp, V, p.row_offset + n, pos[n],
                                  p.temperature, p.top_k, p.top_p, p.seed);
  }
  void sample_candidates(float* vals, int32_t* ids, const void* logits, const int32_t* pos, int N,
                         int V, int Vp, int id_offset, const SamplingParams& p) override {
    TD_CHECK(N >= 0 && V >= 0 && Vp >= V, "sample_candidates: bad shape N={} V={} Vp={}", N, V, Vp);
    const int K = sample_candidates_per_row(p);
    for (int n = 0; n < N; ++n)
      cpu::sample_candidates_row(vals + int64_t(n) * K, ids + int64_t(n) * K, K,
                                 f(logits) + int64_t(n) * Vp, V, id_offset, p.row_offset + n,
                                 pos[n], p);
  }
  void sample_pick(int32_t* tokens, const float* vals, const int32_t* ids, const int32_t* pos,
                   int N, int ranks, int K, const SamplingParams& p) override {
    TD_CHECK(N >= 0 && ranks >= 1 && K >= 1, "sample_pick: bad shape N={} ranks={} K={}", N, ranks,
             K);
    TD_CHECK(K == sample_candidates_per_row(p), "sample_pick: K={} but the rule asks for {}", K,
             sample_candidates_per_row(p));
    for (int n = 0; n < N; ++n)
      tokens[n] = cpu::sample_pick_row(vals + int64_t(n) * K, ids + int64_t(n) * K, int64_t(N) * K,
                                       ranks, K, p.row_offset + n, pos[n], p);
  }
  int sample_pick_max_candidates() const override { return std::numeric_limits<int>::max(); }
};

}  // namespace

std::unique_ptr<Kernels> cpu_kernels() {
  return std::make_unique<CpuKernels>();
}

}  // namespace tandem
