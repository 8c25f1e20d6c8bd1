// The kernel table: every op the model composition needs, implemented once per device
// (device/cpu/kernel_table.cpp in fp32, device/cuda/kernel_table.cu in bf16). The model's
// forward and backward (model/compose.h) are written once against this interface, so a
// new device is a new table, not a new transformer.
//
// Conventions
//  - Tensors are row-major and contiguous, in device memory. `void*` tensors hold the
//    device's compute dtype (compute_dtype(): fp32 on CPU, bf16 on CUDA): activations,
//    gathered parameters and activation gradients. `float*` tensors are fp32 on every
//    device: normalisation statistics, losses and parameter gradients.
//  - Linear weights are [OC, IC] (PyTorch layout): y = x @ w^T + b.
//  - [Backward accumulates] every backward ADDS into the gradients it writes, except
//    [Written input gradients]: the input gradient of linear_backward when dx_accumulate is
//    false, of gelu_backward, swiglu_backward and attention_backward (each element written
//    once: a model gives these gradients no other contributor, so no clear and no read of
//    the old value is spent on them), and the in-place rotary backward; and [Fresh
//    gradients]: the parameter gradients of the linear and norm backwards under
//    GradMode::write. A null gradient output is skipped.
//  - Calls only enqueue work (on CUDA: on the table's stream); nothing waits.
#pragma once

#include <cstddef>
#include <cstdint>

#include <memory>
#include <optional>
#include <string_view>

#include "core/dtype.h"

namespace tandem {

enum class DeviceKind;
class Device;
class Stream;

enum class GeluKind { tanh, erf };  // tanh approximation (GPT-2) or exact (GPT-NeoX)

// What attention keeps for its backward.
enum class AttentionSaves {
  probabilities,  // [B, Hq, T, T] softmax probabilities in the compute dtype
  logsumexp,      // [B, Hq, T] fp32 log-sum-exp of each query row (flash attention)
};

// How a CUDA table computes attention; a typed setting (the CLI maps TANDEM_ATTENTION).
// flash: the mma.sync flash kernels (head size 32, 64 or 128); flash_wgmma: the flash kernels on
// Hopper's warpgroup MMA (compute capability 9.0, head size 64 or 128); automatic takes
// flash_wgmma where it runs, else flash where the head size allows it, else gemm.
enum class AttentionImpl { automatic, flash, gemm, flash_wgmma };

// How the flash backward on Hopper's warpgroup MMA forms dQ (the CLI maps
// TANDEM_FLASH_BACKWARD): one_pass, in the dK/dV kernel's pass, each key tile's share added by
// the L2 in whatever order it arrives (fewer products, faster at head size 128, but dQ is not
// the same bits on every run); two_pass, recomputed by a dQ kernel that owns each query tile
// (the same bits every run); automatic, two_pass. It is a process-wide setting (every CUDA
// table of the process), set before the tables run; other kernels and a build without CUDA
// ignore it.
enum class FlashBackward { automatic, one_pass, two_pass };
// The form automatic runs (the CUDA kernels read it too): two passes, whose dQ is the same
// bits on every run.
constexpr FlashBackward kFlashBackwardAutomatic = FlashBackward::two_pass;
void kernels_set_flash_backward(FlashBackward passes);
// The setting last made (automatic until one is).
FlashBackward kernels_flash_backward();
// "automatic", "one-pass" or "two-pass" (TANDEM_FLASH_BACKWARD's spelling), and back (none for
// any other text).
const char* flash_backward_name(FlashBackward passes);
std::optional<FlashBackward> flash_backward_parse(std::string_view name);
// Whether two settings run the same form (automatic runs kFlashBackwardAutomatic).
bool flash_backward_same_form(FlashBackward a, FlashBackward b);
// Sets the process-wide form for its lifetime and then restores the one before it.
class ScopedFlashBackward {
 public:
  explicit ScopedFlashBackward(FlashBackward passes) : before_(kernels_flash_backward()) {
    kernels_set_flash_backward(passes);
  }
  ~ScopedFlashBackward() { kernels_set_flash_backward(before_); }
  ScopedFlashBackward(const ScopedFlashBackward&) = delete;
  ScopedFlashBackward& operator=(const ScopedFlashBackward&) = delete;

 private:
  FlashBackward before_;
};

// [Fresh gradients] How a backward puts its parameter gradients (dw, dbias; a norm's dw, db)
// into their outputs: add (the old value plus this call's sum), or write (this call's sum
// alone; the old contents, which may be anything, are never read). A gradient buffer's first
// writer of a step writes, so the buffer needs no clear before it: a clear costs as much
// memory traffic as the optimizer's read of it. Writing gives the value that adding into
// zeros gives (a sum of -0 may keep its sign).
enum class GradMode { add, write };

// The shape of one micro-batch through one model, for scratch sizing.
struct KernelShape {
  int B = 1, T = 1;
  int C = 1;         // d_model
  int Q = 1, A = 1;  // qkv width, attention output width (Hq * D)
  int F = 1, M = 1;  // d_ff, and the first MLP product's width (d_ff or 2 d_ff)
  int Hq = 1, Hkv = 1, D = 1;
  int V = 1, Vp = 1;  // real and padded vocabulary (Vp: the width of the logits)
  int P = 0;          // decoding: positions of the KV cache (0: no cache)
};

// How the next token is drawn from a row of logits (sample_tokens). The same rule on every
// device: temperature 0 is greedy (the lowest index among equal maxima); otherwise the
// logits are divided by the temperature, top_k keeps the tokens whose logit is at least
// the k-th largest (ties kept), top_p then keeps the smallest set of largest tokens whose
// probability mass (renormalised over what top_k kept) reaches top_p, and the token is
// the argmax over the kept set of logit / temperature + Gumbel noise, the noise of token i
// a function of (seed, row, position, i) alone (core/gumbel.h): an exact draw from the
// kept distribution that needs no sort and no host round trip.
struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  int top_k = 0;             // 0: every token
  float top_p = 1.0f;        // in (0, 1]; 1: no nucleus cut
  uint64_t seed = 1;
  // The sequence index of row 0, for the noise key: row n is sequence row_offset + n, so a
  // batch split over ranks draws what one rank drawing the whole batch would.
  int row_offset = 0;
};

// [Split sampling] With the vocabulary split over ranks (a tensor-parallel head), rank r
// holds the logits of global ids [id_offset, id_offset + V) and nothing gathers them: each
// rank reduces its slice to K candidates per row (sample_candidates), the ranks all-gather
// the candidates, and every rank applies the rule to their union (sample_pick):
//  - greedy (temperature 0): K = 1, (max logit, lowest id among equal maxima);
//  - temperature alone (top_k 0, top_p 1): K = 1, the slice's argmax of z + noise
//    (z = logit / temperature, the noise of the global id), as that value and id;
//  - top_k > 0: K = top_k, the slice's k largest z (ties: lower id first); the pick keeps the
//    z at least the k-th largest of the union, cuts top_p over those as sample_tokens does,
//    and draws the argmax of z + noise.
// The union holds every token of the global top k, so the draw is sample_tokens' draw, but
// for one case: sample_tokens keeps every token tied with the k-th largest z, while a slice
// holding more than k tokens at or above that value hands over only k of them (the lower ids).
// top_p < 1 without top_k is not split (its kept set may need every token of a slice): the
// caller refuses it (sample_split_supported).
bool sample_split_supported(const SamplingParams& p);
// K, the candidates per row of sample_candidates; throws unless sample_split_supported(p).
int sample_candidates_per_row(const SamplingParams& p);

class Kernels {
 public:
  virtual ~Kernels() = default;

  virtual DType compute_dtype() const = 0;
  size_t compute_bytes() const { return dtype_size(compute_dtype()); }
  virtual AttentionSaves attention_saves(int D) const = 0;
  // Scratch bytes every call of this shape may need at once; the caller hands the memory
  // over with set_scratch before the first call.
  virtual size_t scratch_bytes(const KernelShape& s) const = 0;
  virtual void set_scratch(void* scratch, size_t bytes) = 0;

  virtual void zero(void* p, size_t bytes) = 0;

  // out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :] (wpe may be null: no learned positions).
  virtual void embedding_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe,
                                 int B, int T, int C, int V) = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens,
                                  int B, int T, int C, int V) = 0;

  // LayerNorm (b may be null: no bias) and RMSNorm over the last dimension; mean and rstd
  // are saved for the backward (mean null for RMSNorm).
  virtual void layernorm_forward(void* out, float* mean, float* rstd, const void* x, const void* w,
                                 const void* b, int N, int C, float eps) = 0;
  virtual void layernorm_backward(void* dx, float* dw, float* db, const void* dout, const void* x,
                                  const void* w, const float* mean, const float* rstd, int N, int C,
                                  GradMode gm = GradMode::add) = 0;
  virtual void rmsnorm_forward(void* out, float* rstd, const void* x, const void* w, int N, int C,
                               float eps) = 0;
  virtual void rmsnorm_backward(void* dx, float* dw, const void* dout, const void* x, const void* w,
                                const float* rstd, int N, int C, GradMode gm = GradMode::add) = 0;

  // out[N,OC] = x[N,IC] @ w^T + bias (bias may be null).
  virtual void linear_forward(void* out, const void* x, const void* w, const void* bias, int N,
                              int IC, int OC) = 0;
  // pre = x @ w^T + bias and out = gelu(pre), where a device may fuse the two.
  virtual void linear_gelu_forward(void* out, void* pre, const void* x, const void* w,
                                   const void* bias, int N, int IC, int OC, GeluKind kind) = 0;
  // dx (+)= dout @ w; dw (+)= dout^T @ x; dbias (+)= colsum(dout) (gm: add or write).
  virtual void linear_backward(void* dx, float* dw, float* dbias, const void* dout, const void* x,
                               const void* w, int N, int IC, int OC, bool dx_accumulate,
                               GradMode gm = GradMode::add) = 0;

  // dx = gelu'(x) * dout, written; dx may alias dout.
  virtual void gelu_backward(void* dx, const void* dout, const void* x, int64_t n,
                             GeluKind kind) = 0;
  // The backward of a linear layer whose input is act = gelu(pre) (pre as linear_gelu_forward
  // saved it): dpre[N,IC] = gelu'(pre) * (dout @ w) (written), dw (+)= dout^T @ act, dbias
  // (+)= colsum(dout). A device may put the GELU gradient in the product's epilogue; by
  // default (device/kernels.cpp) it is linear_backward into dpre, then gelu_backward in place.
  virtual void linear_gelu_backward(void* dpre, float* dw, float* dbias, const void* dout,
                                    const void* act, const void* pre, const void* w, int N, int IC,
                                    int OC, GeluKind kind, GradMode gm = GradMode::add);
  // SwiGLU on h[N, 2F] = [gate | up]: out[N, F] = silu(gate) * up.
  virtual void swiglu_forward(void* out, const void* h, int N, int F) = 0;
  virtual void swiglu_backward(void* dh, const void* dout, const void* h, int N, int F) = 0;

  // Rotary embedding in place, "rotate half" within the first rotary_dim channels of each
  // of the first H heads (pairs (i, i + rotary_dim/2), angle (pos0 + t) *
  // theta^(-2i/rotary_dim)); rows are row_stride elements apart.
  virtual void rope_forward(void* x, int B, int T, int H, int D, int rotary_dim, int row_stride,
                            float theta, int pos0) = 0;
  virtual void rope_backward(void* dx, int B, int T, int H, int D, int rotary_dim, int row_stride,
                             float theta, int pos0) = 0;

  // Causal self-attention with grouped-query heads over qkv[B,T,(Hq+2Hkv)*D] (q, then k and
  // v); out[B,T,Hq*D]; `saved` is what attention_saves(D) says.
  virtual void attention_forward(void* out, void* saved, const void* qkv, int B, int T, int Hq,
                                 int Hkv, int D) = 0;
  virtual void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                                  const void* saved, int B, int T, int Hq, int Hkv, int D) = 0;

  // out = a + b over n elements (out may alias a or b).
  virtual void add(void* out, const void* a, const void* b, int64_t n) = 0;

  // Fused softmax + cross-entropy backward, in place: logits become
  // (softmax(logits) - onehot(target)) * dloss, padding columns 0; losses[N] written.
  virtual void crossentropy_fused_backward(void* logits, float* losses, const int32_t* targets,
                                           int N, int V, int Vp, float dloss) = 0;
  virtual void crossentropy_forward(float* losses, const void* logits, const int32_t* targets,
                                    int N, int V, int Vp) = 0;

  // out[N,OC] = x[N,IC] @ w^T + bias + residual[N,OC] (bias may be null; out may alias
  // residual): a linear layer and the residual sum after it, which a device may fuse. A
  // null residual adds nothing (a tensor-parallel rank other than the lead: out = x @ w^T
  // + bias, its partial sum).
  virtual void linear_residual_forward(void* out, const void* x, const void* w, const void* bias,
                                       const void* residual, int N, int IC, int OC) = 0;

  // --- Decoding with a KV cache (infer/decoder.h) ---
  // Fusions for decoding, where no statistics are saved:
  // out[N,OC] = norm(x)[N,IC] @ w^T + bias, norm the LayerNorm (nw, nb; nb may be null) or
  // the RMSNorm (nw; rms true) of each row of x, with eps.
  virtual void norm_linear_forward(void* out, const void* x, const void* nw, const void* nb,
                                   bool rms, float eps, const void* w, const void* bias, int N,
                                   int IC, int OC) = 0;
  // out[N,OC] = swiglu(h)[N,F] @ w^T + bias + residual, swiglu(h) = silu(h[:, :F]) * h[:, F:]
  // of h[N, 2F] (bias and residual may be null; out may alias residual).
  virtual void swiglu_linear_residual_forward(void* out, const void* h, const void* w,
                                              const void* bias, const void* residual, int N, int F,
                                              int OC) = 0;
  // The cache of one block is K and V, each [S, Hkv, P, D] in the compute dtype: S
  // sequence slots of P positions. Rows of a decoding batch name their slot and position
  // in int32 device arrays, so a captured CUDA graph replays with new positions.

  // out[n,:] = wte[tokens[n], :] + wpe[pos[n], :] (wpe may be null) for N rows.
  virtual void embedding_at(void* out, const int32_t* tokens, const int32_t* pos, const void* wte,
                            const void* wpe, int N, int C, int V) = 0;
  // For each row n of qkv[N, (Hq+2Hkv)*D]: rotates q and k in place at position pos[n]
  // (as rope_forward; rotary_dim 0 rotates nothing), then writes k and v into the cache at
  // [slot[n], h, pos[n], :].
  virtual void rope_kv_append(void* qkv, void* kcache, void* vcache, const int32_t* slot,
                              const int32_t* pos, int N, int Hq, int Hkv, int D, int rotary_dim,
                              float theta, int P) = 0;
  // out[n, Hq*D]: row n's query heads (from qkv) attend to positions [0, pos[n]] of cache
  // slot slot[n] (a query head h reads KV head h / (Hq / Hkv)); scale 1/sqrt(D).
  virtual void attention_decode(void* out, const void* qkv, const void* kcache, const void* vcache,
                                const int32_t* slot, const int32_t* pos, int N, int Hq, int Hkv,
                                int D, int P) = 0;
  // rope_kv_append, then attention_decode, for single-token decode rows: the same output and
  // cache. A device may do both in one kernel, leaving qkv unrotated (qkv is not read after).
  virtual void rope_append_attention_decode(void* out, void* qkv, void* kcache, void* vcache,
                                            const int32_t* slot, const int32_t* pos, int N, int Hq,
                                            int Hkv, int D, int rotary_dim, float theta, int P) {
    rope_kv_append(qkv, kcache, vcache, slot, pos, N, Hq, Hkv, D, rotary_dim, theta, P);
    attention_decode(out, qkv, kcache, vcache, slot, pos, N, Hq, Hkv, D, P);
  }
  // Row r < rows of `cols` compute elements: dst[r * cols + c] = src[r * src_stride + c]
  // (src_stride in elements).
  virtual void copy_rows(void* dst, const void* src, int rows, int cols, int64_t src_stride) = 0;
  // pos[n] += 1 for n < N.
  virtual void advance_positions(int32_t* pos, int N) = 0;
  // tokens[n] = the token drawn from logits[n, :V] (row stride Vp) by the rule of
  // SamplingParams, with pos[n] (the position the drawn token will take) in the noise key.
  virtual void sample_tokens(int32_t* tokens, const void* logits, const int32_t* pos, int N, int V,
                             int Vp, const SamplingParams& p) = 0;
  // The split rule ([Split sampling] above), K = sample_candidates_per_row(p). Writes
  // vals[N, K] (fp32) and ids[N, K] (global ids): row n's candidates from logits[n, :V] (row
  // stride Vp; V may be 0), the logit of local index i being that of global id id_offset + i;
  // a row's candidates in ascending id order, then (-inf, -1) padding where the slice has
  // fewer than K (greedy and temperature alone: the value is the logit, and the logit /
  // temperature plus the noise of the global id, keyed by (seed, row_offset + n, pos[n])).
  virtual void sample_candidates(float* vals, int32_t* ids, const void* logits, const int32_t* pos,
                                 int N, int V, int Vp, int id_offset, const SamplingParams& p) = 0;
  // tokens[n] = the draw from row n's candidates of every rank, laid out [ranks][N][K] (what an
  // all-gather of each rank's vals and ids gives); padding is ignored.
  virtual void sample_pick(int32_t* tokens, const float* vals, const int32_t* ids,
                           const int32_t* pos, int N, int ranks, int K,
                           const SamplingParams& p) = 0;
  // The most candidates per row (ranks * K) sample_pick takes on this device.
  virtual int sample_pick_max_candidates() const = 0;
};

// A table of this device's kinds for sizing only (compute dtype, what attention saves,
// scratch bytes): no stream and no device resources behind it; running a kernel through
// it throws. Throws for CUDA when tandem was built without CUDA.
std::unique_ptr<Kernels> kernels_for_sizing(DeviceKind kind, AttentionImpl impl);

// A table of the device's kind whose calls enqueue on `stream` (CUDA: it owns a cuBLASLt
// context; CPU: calls run on the calling thread, so make them inside Device::submit on that
// stream). Device memory it holds beyond the scratch: `extra_bytes`.
std::unique_ptr<Kernels> kernels_create(Device& device, Stream& stream, AttentionImpl impl,
                                        size_t* extra_bytes = nullptr);

}  // namespace tandem
