// CUDA kernels: bf16 forward and backward of every op of the GPT-2, Llama and GPT-NeoX families,
// with fp32 accumulation. Same shapes, layouts and semantics as the CPU reference
// (device/cpu/kernels.h); read its conventions first. The differences:
//  - Types. Activations, gathered parameters and activation gradients are __nv_bfloat16;
//    saved statistics (mean, rstd), losses, parameter gradients, optimizer state and master
//    weights are float. Arithmetic inside every kernel is fp32.
//  - [Backward accumulates] holds as on CPU: backward functions ADD into bf16 activation
//    gradients (read, add in fp32, round once) and fp32 parameter gradients, except rope
//    (in place), the fused cross-entropy (overwrites logits with dlogits) and the
//    [Written input gradients] of GELU, SwiGLU and attention (written, as on CPU). A null gradient
//    output is skipped; null saved statistics / probabilities mean "no backward follows".
//  - [Streams] Every function takes the stream last, enqueues asynchronous work only, never
//    synchronises and never allocates. Scratch memory, where needed, is passed in by the caller
//    with its size given by the matching *_scratch_bytes(...) helper (checked; too small
//    throws). Shapes are validated on the host (tandem::Error); launch errors are checked after
//    every launch. Token and target ids cannot be validated without a synchronisation: an id
//    outside [0, V) yields NaN outputs (embedding rows, losses) instead of a memory fault.
//  - [Determinism] Every reduction runs in a fixed order that depends on the shapes only (not on
//    the GPU or on timing): parameter gradients (norm weights, biases, embeddings) use two-pass
//    block-partial reductions, the embedding gradient a stable sort of the tokens. Results are
//    bit-reproducible run to run on the same GPU model and cuBLASLt version.
// This header is valid C++ for the host compiler; the device helpers at the end are compiled
// only by nvcc (for the kernels_*.cu files).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "device/cuda/matmul.h"

namespace tandem::cuda {

using bf16 = __nv_bfloat16;

// ---- Embedding (kernels_embedding.cu) -------------------------------------------------------
// out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :] (wpe may be null). wte is [V, C], wpe [>=T, C].
void embedding_forward(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe, int B,
                       int T, int C, int V, cudaStream_t stream);
// dwte[V,C] += scatter of dout rows by token; dwpe[T,C] += sum over the batch (either may be
// null). Deterministic: tokens are stably radix-sorted (CUB) and each token's rows summed in
// order. scratch: embedding_backward_scratch_bytes(B, T, V) bytes (may be null if dwte is).
size_t embedding_backward_scratch_bytes(int B, int T, int V);
void embedding_backward(float* dwte, float* dwpe, const bf16* dout, const int32_t* tokens, int B,
                        int T, int C, int V, void* scratch, size_t scratch_bytes,
                        cudaStream_t stream);

// ---- Normalisation (kernels_norm.cu) --------------------------------------------------------
// LayerNorm over C; mean[N], rstd[N] may be null. w, b are bf16 [C] (b may be null).
void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* x, const bf16* w,
                       const bf16* b, int N, int C, float eps, cudaStream_t stream);
// dx (bf16, may be null) += ..., dw, db (fp32, may be null) += ... (accumulate) or = ...
// ([Fresh gradients] in device/kernels.h); scratch for dw/db:
// layernorm_backward_scratch_bytes(N, C) bytes.
size_t layernorm_backward_scratch_bytes(int N, int C);
void layernorm_backward(bf16* dx, float* dw, float* db, const bf16* dout, const bf16* x,
                        const bf16* w, const float* mean, const float* rstd, int N, int C,
                        void* scratch, size_t scratch_bytes, cudaStream_t stream,
                        bool accumulate = true);
// RMSNorm: out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); rstd[N] may be null.
void rmsnorm_forward(bf16* out, float* rstd, const bf16* x, const bf16* w, int N, int C, float eps,
                     cudaStream_t stream);
size_t rmsnorm_backward_scratch_bytes(int N, int C);
void rmsnorm_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w,
                      const float* rstd, int N, int C, void* scratch, size_t scratch_bytes,
                      cudaStream_t stream, bool accumulate = true);

// ---- Linear layers: matmul_forward / matmul_backward, declared in device/cuda/matmul.h ----

// ---- Pointwise (kernels_pointwise.cu) -------------------------------------------------------
// GELU, tanh approximation. out may alias x.
void gelu_forward(bf16* out, const bf16* x, int64_t n, cudaStream_t stream);
void gelu_backward(bf16* dx, const bf16* dout, const bf16* x, int64_t n, cudaStream_t stream);
// GELU, exact: 0.5 x (1 + erf(x / sqrt(2))) (GPT-NeoX / Pythia). out may alias x; dx = ...
void gelu_erf_forward(bf16* out, const bf16* x, int64_t n, cudaStream_t stream);
void gelu_erf_backward(bf16* dx, const bf16* dout, const bf16* x, int64_t n, cudaStream_t stream);
// SwiGLU on h[N, 2F] = [gate | up]: out[N, F] = silu(gate) * up; dh[N, 2F] = ...
void swiglu_forward(bf16* out, const bf16* h, int N, int F, cudaStream_t stream);
void swiglu_backward(bf16* dh, const bf16* dout, const bf16* h, int N, int F, cudaStream_t stream);
// Residual add: out = a + b over n elements (out may alias a or b).
void add_forward(bf16* out, const bf16* a, const bf16* b, int64_t n, cudaStream_t stream);
// Casts (round to nearest even towards bf16; bf16 -> fp32 is exact).
void cast_f32_to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t stream);
void cast_bf16_to_f32(float* out, const bf16* in, int64_t n, cudaStream_t stream);

// ---- Rotary embedding (kernels_rope.cu) -----------------------------------------------------
// In place on the first H heads (D channels each) of B*T rows row_stride elements apart;
// "rotate half" within the first rotary_dim channels of each head (pairs (i, i + rotary_dim/2),
// angle (pos0 + t) * theta^(-2i/rotary_dim) computed in double), channels [rotary_dim, D)
// untouched; rotary_dim even, 0 < rotary_dim <= D (checked on the host). backward = inverse.
void rope_forward(bf16* x, int B, int T, int H, int D, int rotary_dim, int row_stride, float theta,
                  int pos0, cudaStream_t stream);
void rope_backward(bf16* dx, int B, int T, int H, int D, int rotary_dim, int row_stride,
                   float theta, int pos0, cudaStream_t stream);

// ---- Causal self-attention with grouped-query heads (kernels_attention.cu) -----------------
// qkv[B,T,(Hq+2Hkv)*D] as on CPU; out[B,T,Hq*D]; att[B,Hq,T,T] receives the bf16 softmax
// probabilities (0 above the diagonal) for the backward, or is null. GEMMs through ctx;
// scratch: attention_scratch_bytes(B, T, Hq, Hkv, D) bytes, enough for forward and backward.
// See [Attention] in kernels_attention.cu.
size_t attention_scratch_bytes(int B, int T, int Hq, int Hkv, int D);
void attention_forward(MatmulContext& ctx, bf16* out, bf16* att, const bf16* qkv, int B, int T,
                       int Hq, int Hkv, int D, void* scratch, size_t scratch_bytes,
                       cudaStream_t stream);
// dqkv[B,T,(Hq+2Hkv)*D] = gradient through attention (written); att from attention_forward.
void attention_backward(MatmulContext& ctx, bf16* dqkv, const bf16* dout, const bf16* qkv,
                        const bf16* att, int B, int T, int Hq, int Hkv, int D, void* scratch,
                        size_t scratch_bytes, cudaStream_t stream);

// ---- Fused causal flash attention with grouped-query heads (kernels_flash.cu) --------------
// The same attention without the [B,H,T,T] probabilities: tiles of queries and keys in shared
// memory, online softmax, tensor cores (mma.sync bf16, fp32 accumulation). qkv[B,T,(Hq+2Hkv)*D]
// row layout as attention_forward; out[B,T,Hq*D]; lse[B,Hq,T] fp32 receives the log-sum-exp of
// each query row's scaled scores (for the backward), or is null. Scale 1/sqrt(D), causal mask,
// any T >= 0. qkv, out, dout and dqkv must be 16-byte aligned. Deterministic (no atomics).
// scratch: flash_attention_scratch_bytes(...) bytes (the forward needs none and ignores it).
// See [Flash forward] and [Flash backward] in kernels_flash.cu.
bool flash_attention_supported(int D);  // D in {32, 64, 128}
// [Warp tiles]: 16-row m-tiles each warp owns in the flash kernels of head dims up to 64, 2 (the
// default) or 1; process-wide, for tests and benchmarks that compare the two.
void flash_attention_set_warp_tiles(int m);
// Which tensor-core instructions the flash kernels use: mma.sync (every GPU of sm_80 and up, the
// default) or Hopper's warpgroup MMA (sm90a/kernels_flash_wgmma.cu: compute capability 9.0,
// head size 64 or 128, a build whose TANDEM_CUDA_ARCH includes 90). Same inputs, outputs and
// determinism; the sums run in another order, so the two agree within bf16 rounding.
enum class FlashKernels { mma, wgmma };
// Whether FlashKernels::wgmma can run head size D on the current device (false, not an error,
// where this build or this GPU lacks it).
bool flash_attention_wgmma_supported(int D);
// Throws, saying which is missing (the build, the GPU or the head size), unless
// flash_attention_wgmma_supported(D).
void flash_attention_require_wgmma(int D);
// Keys per tile of the wgmma forward: 64 or 128, or 0 for the default (64 at head size 64, 128
// at 128); process-wide, for the tests and the benchmarks that compare them ([Wgmma tiles] in
// sm90a/kernels_flash_wgmma.cu).
void flash_attention_set_wgmma_key_tile(int keys);
// Queries per tile of the wgmma dK/dV kernel at head size 128: 64 (the default) or 32 ([Wgmma
// dK/dV tiles] there); process-wide, for the tests and the benchmarks that compare them.
void flash_attention_set_wgmma_dkv_query_tile(int queries);
// Keys per tile of the wgmma dQ kernel at head size 128: 64 (the default) or 128 ([Wgmma dQ
// tiles] there); process-wide, for the tests and the benchmarks that compare them.
void flash_attention_set_wgmma_dq_key_tile(int keys);
// Whether the wgmma forward runs each tile's softmax under the previous tile's P V (on) or
// waits for each product first (off); automatic pipelines where one block has the SM to itself
// (head size 128, or 128-key tiles) and waits where two blocks share it and hide each other's
// softmax. The same bits either way; process-wide, for the test and the benchmark that compare
// them ([Wgmma forward pipeline] in sm90a/kernels_flash_wgmma.cu).
enum class ForwardPipeline { automatic, on, off };
void flash_attention_set_wgmma_forward_pipeline(ForwardPipeline mode);
// How the wgmma forward loads its tiles: by tensor memory access (tma: one thread, an mbarrier
// per buffer, the two warpgroups taking turns at the tensor cores) or with every thread copying
// and the block meeting at each tile (threads); automatic takes tma with 128-key tiles (head
// size 128 by default) and the threads' copies with 64-key ones, or where
// flash_attention_set_wgmma_forward_pipeline forces on or off (those name the threads'
// kernels). The same bits as the pipelined forward either way; process-wide, for the test and
// the benchmarks that compare them ([Wgmma TMA forward] in sm90a/kernels_flash_wgmma.cu).
enum class ForwardLoads { automatic, tma, threads };
void flash_attention_set_wgmma_forward_loads(ForwardLoads loads);
// How the wgmma backward forms dQ ([Wgmma one-pass backward] in
// sm90a/kernels_flash_wgmma.cu): in the dK/dV kernel's pass, each key tile's share added into
// an fp32 accumulator by a bulk reduction (one_pass: five products a tile instead of seven,
// but the adds land in any order, so dQ is not the same bits on every run), or by a second
// kernel that owns each query tile (two_pass: deterministic, what automatic takes). The
// 32-query dK/dV tiles always take two passes. Process-wide, for the tests and the benchmarks
// that compare them.
enum class BackwardPasses { automatic, one_pass, two_pass };
void flash_attention_set_wgmma_backward_passes(BackwardPasses passes);
// The backward's scratch for these kernels (the wgmma ones need a dQ accumulator of
// B * Hq * D fp32 per query, T rounded up to 64, besides the [B, Hq, T] vectors).
size_t flash_attention_scratch_bytes(int B, int T, int Hq, int Hkv, int D,
                                     FlashKernels kernels = FlashKernels::wgmma);
void flash_attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int Hq, int Hkv,
                             int D, void* scratch, size_t scratch_bytes, cudaStream_t stream,
                             FlashKernels kernels = FlashKernels::mma);
// dqkv = gradient through attention (written); out and lse from flash_attention_forward.
void flash_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* lse, int B, int T, int Hq, int Hkv, int D, void* scratch,
                              size_t scratch_bytes, cudaStream_t stream,
                              FlashKernels kernels = FlashKernels::mma);

// ---- Softmax cross-entropy (kernels_loss.cu) ------------------------------------------------
// losses[N] = -log softmax(logits[i, :V])[targets[i]] over logits[N, Vp].
void crossentropy_forward(float* losses, const bf16* logits, const int32_t* targets, int N, int V,
                          int Vp, cudaStream_t stream);
// In place: logits become dlogits = (softmax - onehot(target)) * dloss (bf16), padding columns
// V..Vp-1 become 0; losses[N] (fp32, may be null) are written too.
void crossentropy_fused_backward(bf16* logits, float* losses, const int32_t* targets, int N, int V,
                                 int Vp, float dloss, cudaStream_t stream);

// ---- Decoding with a KV cache (kernels_decode.cu) -------------------------------------------
// The cache of one block is K and V, each [S, Hkv, P, D] bf16; rows of a decoding batch name
// their slot and position in int32 device arrays (Kernels in device/kernels.h). Grids depend on
// the shapes only, never on the positions, so a captured CUDA graph replays for any positions.
// out[n,:] = wte[tokens[n], :] + wpe[pos[n], :] (wpe may be null), added in fp32, rounded once;
// a token outside [0, V) writes a NaN row.
void embedding_at(bf16* out, const int32_t* tokens, const int32_t* pos, const bf16* wte,
                  const bf16* wpe, int N, int C, int V, cudaStream_t stream);
// Row n of qkv[N, (Hq+2Hkv)*D]: its q and k heads rotated in place at position pos[n] exactly as
// rope_forward (rotary_dim 0 rotates nothing), then k head h and v head h written to
// kcache/vcache at [slot[n], h, pos[n], :]. A row whose pos is outside [0, P) or whose slot is
// negative writes no cache entry.
void rope_kv_append(bf16* qkv, bf16* kcache, bf16* vcache, const int32_t* slot, const int32_t* pos,
                    int N, int Hq, int Hkv, int D, int rotary_dim, float theta, int P,
                    cudaStream_t stream);
// Whether attention_decode may merge its splits inside a thread-block cluster (one launch, on
// sm_90+) instead of with a second kernel; on by default, a switch for the tests (both paths
// give the same bits).
void set_attention_decode_clusters(bool on);
// out[n, Hq*D]: row n's query heads attend to positions [0, pos[n]] of cache slot slot[n] (query
// head h reads KV head h / (Hq/Hkv)), scale 1/sqrt(D). Split-K ("flash decoding"): see [Decode
// attention] in kernels_decode.cu. D a multiple of 8 up to 256; qkv, kcache and vcache 16-byte
// aligned. A row whose pos is outside [0, P) or whose slot is negative gets a NaN output.
// scratch: attention_decode_scratch_bytes(N, Hq, Hkv, D, P) bytes.
bool attention_decode_supported(int D);
size_t attention_decode_scratch_bytes(int N, int Hq, int Hkv, int D, int P);
void attention_decode(bf16* out, const bf16* qkv, const bf16* kcache, const bf16* vcache,
                      const int32_t* slot, const int32_t* pos, int N, int Hq, int Hkv, int D, int P,
                      void* scratch, size_t scratch_bytes, cudaStream_t stream);
// rope_kv_append then attention_decode for the same rows, in one kernel where rotary_dim is a
// multiple of 16 ([Decode rope] in kernels_decode.cu): the same output and cache, bit for bit;
// qkv is left as it was (the two kernels leave it rotated). set_decode_fused_rope(false) runs
// the two kernels always (the tests compare both; on by default).
void rope_append_attention_decode(bf16* out, bf16* qkv, bf16* kcache, bf16* vcache,
                                  const int32_t* slot, const int32_t* pos, int N, int Hq, int Hkv,
                                  int D, int rotary_dim, float theta, int P, void* scratch,
                                  size_t scratch_bytes, cudaStream_t stream);
void set_decode_fused_rope(bool on);
// dst[r * cols + c] = src[r * src_stride + c]: rows of `cols` bf16, src_stride in elements.
void copy_rows(bf16* dst, const bf16* src, int rows, int cols, int64_t src_stride,
               cudaStream_t stream);
// pos[n] += 1 for n < N.
void advance_positions(int32_t* pos, int N, cudaStream_t stream);

// ---- Sampling (kernels_sample.cu) -----------------------------------------------------------
// tokens[n] = the token drawn from logits[n, :V] (row stride Vp) by the rule of SamplingParams
// (device/kernels.h), with the Gumbel noise of core/gumbel.h keyed by (seed, n, pos[n]). One
// block per row; exact radix selects for top-k and top-p. See [Sampling] in kernels_sample.cu.
// row_offset: the sequence index of row 0 in the noise key (SamplingParams::row_offset).
void sample_tokens(int32_t* tokens, const bf16* logits, const int32_t* pos, int N, int V, int Vp,
                   float temperature, int top_k, float top_p, uint64_t seed, cudaStream_t stream,
                   int row_offset = 0);

// ---- Programmatic dependent launch (kernels_pdl.cu) -----------------------------------------
// [PDL] The kernels of a decoding step (embedding_at, rope_kv_append, attention_decode,
// advance_positions, sample_tokens and every GEMV) launch with programmatic stream
// serialisation where the device has compute capability 9.0+ and the kernels were compiled for
// it: a kernel may then start while the one before it finishes. Each such kernel lets its own
// successor launch at once (griddepcontrol.launch_dependents), does only what reads nothing
// mutable (address arithmetic, prefetching its weights into L2), then waits for the previous
// grid's completion and memory (griddepcontrol.wait) before it reads or writes anything else;
// every block of every such kernel waits, so the ordering is transitive along the stream. The
// results are bit for bit those of plain launches. set_pdl(false) turns it off for the whole
// process (tests compare both); on by default.
void set_pdl(bool on);
bool pdl_enabled();

// ---- Split sampling (kernels_sample_split.cu) -----------------------------------------------
// The rule of [Split sampling] in device/kernels.h over a vocabulary split across ranks: this
// rank's logits[n, :V] (row stride Vp, V may be 0) are those of global ids id_offset + i, with
// the noise keyed by (seed, row_offset + n, pos[n]). K is the candidates per row (1 for greedy
// or temperature alone, else top_k). See [Split kernels] in kernels_sample_split.cu.
// vals[N, K], ids[N, K]: the row's candidates in ascending id order, then (-inf, -1) padding.
void sample_candidates(float* vals, int32_t* ids, const bf16* logits, const int32_t* pos, int N,
                       int V, int Vp, int id_offset, int K, float temperature, int top_k,
                       uint64_t seed, int row_offset, cudaStream_t stream);
// tokens[n] = the draw from the candidates vals, ids laid out [ranks][N][K]. With top_k, ranks
// * K is at most kSamplePickMaxCandidates (the row's candidates are sorted in shared memory).
constexpr int kSamplePickMaxCandidates = 16384;
void sample_pick(int32_t* tokens, const float* vals, const int32_t* ids, const int32_t* pos, int N,
                 int ranks, int K, float temperature, int top_k, float top_p, uint64_t seed,
                 int row_offset, cudaStream_t stream);

// ---- Skinny products (kernels_gemv.cu) ------------------------------------------------------
// out[N,OC] = x[N,IC] @ w[OC,IC]^T + bias (bias may be null) for few rows (N <= kGemvMaxRows):
// streams w once with 16-byte loads, fp32 accumulation; see [GEMV] in kernels_gemv.cu.
// gemv_supported says whether the shape and pointers suit it (IC % 8 == 0, N * IC bf16 fit in
// shared memory, x and w 16-byte aligned); otherwise use matmul_forward. The fused variants
// below have the same requirements (their *_supported adds the pointers they read).
constexpr int kGemvMaxRows = 8;
// Which main loop the products of N >= 2 rows use ([GEMV MMA] in kernels_gemv.cu): automatic
// (tensor cores from 3 rows on), or forced onto CUDA cores or tensor cores for the whole
// process (tests compare them; N = 1 always runs on CUDA cores). Automatic by default.
enum class GemvPath { automatic, cuda_cores, tensor_cores };
void set_gemv_path(GemvPath path);
GemvPath gemv_path();
bool gemv_supported(const bf16* x, const bf16* w, int N, int IC, int OC);
void gemv_forward(bf16* out, const bf16* x, const bf16* w, const bf16* bias, int N, int IC, int OC,
                  cudaStream_t stream);
// out = x @ w^T + bias + residual, summed in fp32 and rounded once (out may alias residual).
void gemv_residual_forward(bf16* out, const bf16* x, const bf16* w, const bf16* bias,
                           const bf16* residual, int N, int IC, int OC, cudaStream_t stream);
// pre = x @ w^T + bias (rounded to bf16), out = gelu(pre) (exact: the erf form, else tanh).
void gemv_gelu_forward(bf16* out, bf16* pre, const bf16* x, const bf16* w, const bf16* bias, int N,
                       int IC, int OC, bool exact, cudaStream_t stream);
// out = norm(x) @ w^T + bias, norm the LayerNorm (nw, nb; nb may be null) or the RMSNorm (nw;
// rms) of each row of x[N, IC], with the statistics of layernorm_forward / rmsnorm_forward and
// the normalised values rounded to bf16 as they write them. nw and nb 16-byte aligned.
bool gemv_norm_supported(const bf16* x, const bf16* nw, const bf16* nb, const bf16* w, int N,
                         int IC, int OC);
void gemv_norm_forward(bf16* out, const bf16* x, const bf16* nw, const bf16* nb, bool rms,
                       float eps, const bf16* w, const bf16* bias, int N, int IC, int OC,
                       cudaStream_t stream);
// out = swiglu(h) @ w^T + bias + residual for h[N, 2F] (swiglu(h) = silu(h[:, :F]) * h[:, F:],
// rounded to bf16 as swiglu_forward writes it); sums as gemv_residual_forward.
bool gemv_swiglu_supported(const bf16* h, const bf16* w, int N, int F, int OC);
void gemv_swiglu_residual_forward(bf16* out, const bf16* h, const bf16* w, const bf16* bias,
                                  const bf16* residual, int N, int F, int OC, cudaStream_t stream);

// ---- Optimizer (kernels_optim.cu) -----------------------------------------------------------
// Bias corrections of AdamW step `step` (>= 1), computed on the host in double exactly as the
// CPU reference does: bc1 = 1 - beta1^step, rsqrt_bc2 = 1 / sqrt(1 - beta2^step).
struct AdamWBiasCorrection {
  float bc1;
  float rsqrt_bc2;
};
inline AdamWBiasCorrection adamw_bias_correction(float beta1, float beta2, int step) {
  return {float(1.0 - std::pow(double(beta1), step)),
          float(1.0 / std::sqrt(1.0 - std::pow(double(beta2), step)))};
}
// AdamW on n fp32 elements, the CPU formula (device/cpu/kernels.h): g *= grad_scale;
// m, v updated; p = p * (1 - lr*wd) - lr/bc1 * m / (sqrt(v) * rsqrt_bc2 + eps). When p_bf16 is
// non-null the updated parameters are also written there rounded to bf16.
void adamw_update(float* p, const float* g, float* m, float* v, bf16* p_bf16, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, AdamWBiasCorrection bc,
                  float grad_scale, cudaStream_t stream);

// The AdamW update of a whole shard in one launch: the shard is cut into chunks of at most
// kAdamWChunk elements that each lie inside one parameter (so one weight-decay rate applies);
// elements outside every chunk (flat-buffer padding) are left alone. The clipping factor is
// computed on the device from the squared global gradient norm, as the CPU does on the host:
// grad_scale = clip > 0 ? min(1, clip / (sqrt(norm_sq) + 1e-6)) : 1 (in double). p_bf16, when
// non-null, receives the updated parameters rounded to bf16 at the same indices.
struct AdamWChunk {
  int64_t begin;       // first element, an index into p, g, m, v, p_bf16
  int32_t n;           // elements, at most kAdamWChunk
  float weight_decay;  // the parameter's rate (0 for norms and biases)
};
constexpr int kAdamWChunk = 16384;
// What changes from step to step, read by the kernel from device memory so that a captured
// step replays with each step's values ([Step graph], docs/design.md): the learning rate,
// lr / bc1 and the bias correction 1 / sqrt(bc2).
// apply 0: the kernel changes nothing (an update op with no step pending, in a replayed graph).
struct AdamWStep {
  float lr, step_size, rsqrt_bc2;
  int apply;
};
inline AdamWStep adamw_step(float lr, AdamWBiasCorrection bc) {
  return {lr, lr / bc.bc1, bc.rsqrt_bc2, 1};
}
// step: device memory, read when the kernel runs.
void adamw_update_chunks(float* p, const float* g, float* m, float* v, bf16* p_bf16,
                         const AdamWChunk* chunks, int num_chunks, const float* norm_sq, float clip,
                         const AdamWStep* step, float beta1, float beta2, float eps,
                         cudaStream_t stream);

// ---- Reductions (kernels_reduce.cu) ---------------------------------------------------------
// *out = sum x[i]^2 (or *out += ... with accumulate), deterministic: fixed-size block partials
// in double, then one block sums them in order. scratch: sum_squares_scratch_bytes(n) bytes.
size_t sum_squares_scratch_bytes(int64_t n);
void sum_squares(float* out, const float* x, int64_t n, bool accumulate, void* scratch,
                 size_t scratch_bytes, cudaStream_t stream);

// out[i] += in[i] over n fp32 elements (gradient accumulation across micro-steps).
void add_f32(float* out, const float* in, int64_t n, cudaStream_t stream);
// out[i] += fp32(in[i]) over n elements (a gradient shard reduced in bf16, added to the fp32
// shard; the widening is exact, the addition rounds once in fp32).
void add_bf16_to_f32(float* out, const bf16* in, int64_t n, cudaStream_t stream);
// *acc += sum x[i] over n fp32 values, in double, in a fixed order (one block): the loss sum.
void sum_to_double(double* acc, const float* x, int n, cudaStream_t stream);
// Keeps the stream busy for ms milliseconds (a spinning one-thread kernel): delays producers on
// purpose in tests and probes.
void sleep_kernel(double ms, cudaStream_t stream);

// ---- Internals shared by the kernels_*.cu files ---------------------------------------------
namespace detail {

// [Column sums] Deterministic parameter-gradient reductions over rows: pass 1 splits the N rows
// into `chunks` fixed chunks of `rows` rows (a function of N only) and writes one fp32 partial
// per (output, chunk, column) in a fixed order; pass 2 (colsum_finalize) adds, for each column,
// the partials of all chunks in chunk order into the gradient (or, not accumulating, into zero:
// [Fresh gradients] in device/kernels.h).
struct ColsumPlan {
  int rows;    // rows per chunk
  int chunks;  // ceil(N / rows)
};
ColsumPlan colsum_plan(int N);
size_t colsum_scratch_bytes(int N, int C, int nout);
// out_o[c] = (accumulate ? out_o[c] : 0) + sum_chunk partials[o][chunk][c] for o < nout (an
// out_o may be null: skipped).
void colsum_finalize(float* out0, float* out1, const float* partials, int nout, int chunks, int C,
                     cudaStream_t stream, bool accumulate);
// Throws unless scratch holds `needed` bytes.
void check_scratch(const void* scratch, size_t have, size_t needed, const char* op);

// Whether the current device has compute capability 9.0+ and runs kernels compiled for sm_90+
// (so their griddepcontrol instructions and cluster paths are there).
bool sm90_kernels();
// Whether launches on the current device use [PDL]: the switch is on and sm90_kernels().
bool pdl_active();

inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}
inline bool aligned8(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 7u) == 0;
}

// Number of blocks for a grid-stride loop over n items with `threads` threads per block.
inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = int64_t(1) << 20) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return unsigned(b < max_blocks ? b : max_blocks);
}

}  // namespace detail

}  // namespace tandem::cuda

#if defined(__CUDACC__)
#include <utility>

#include "device/cuda/cuda_check.h"

// Device helpers (nvcc only).
namespace tandem::cuda::detail {

// [PDL] Launches kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream
// serialisation where pdl_active(). The kernel must call pdl_launch_dependents() and pdl_wait()
// as [PDL] says.
template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  const bool pdl = pdl_active();
  cfg.attrs = pdl ? attr : nullptr;
  cfg.numAttrs = pdl ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Lets the next kernel of the stream launch (a no-op without [PDL] or before sm_90).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Waits until the previous grids of the stream have completed and their writes are visible
// (returns at once when the kernel was launched without [PDL]).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Asks for `bytes` (a multiple of 16) of global memory from p (16-byte aligned) to be brought
// into L2, asynchronously; a hint only (nothing before sm_90).
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(__cvta_generic_to_global(p)),
               "r"(bytes)
               : "memory");
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float ld(const bf16* p) {
  return __bfloat162float(*p);
}
__device__ __forceinline__ bf16 rn(float v) {
  return __float2bfloat16_rn(v);
}

// VEC consecutive bf16 <-> fp32: VEC = 8 is one 16-byte access (the pointer must be 16-byte
// aligned), VEC = 4 (loads only) one 8-byte access (8-byte aligned), VEC = 1 a scalar one.
template <int VEC>
__device__ __forceinline__ void load_vec(const bf16* p, float (&f)[VEC]) {
  static_assert(VEC == 1 || VEC == 4 || VEC == 8, "VEC is 1, 4 or 8");
  if constexpr (VEC == 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      f[2 * j] = __uint_as_float(w[j] << 16);
      f[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
  } else if constexpr (VEC == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const uint32_t w[2] = {u.x, u.y};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      f[2 * j] = __uint_as_float(w[j] << 16);
      f[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
  } else {
    f[0] = __bfloat162float(*p);
  }
}
template <int VEC>
__device__ __forceinline__ void store_vec(bf16* p, const float (&f)[VEC]) {
  static_assert(VEC == 1 || VEC == 8, "VEC is 1 or 8");
  if constexpr (VEC == 8) {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
      w[j] = *reinterpret_cast<const uint32_t*>(&h);
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    *p = __float2bfloat16_rn(f[0]);
  }
}

// The forward activations, shared by the elementwise kernels and the fused GEMV epilogues and
// prologues so both round the same values: GELU with the tanh approximation, exact GELU
// x Phi(x) (Phi the standard normal CDF), and the sigmoid of SiLU (the CPU expressions).
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;  // 1/sqrt(2)
__device__ __forceinline__ float gelu_f(float x) {
  const float u = kGeluS * (x + kGeluA * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_erf_f(float x) {
  return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
}
__device__ __forceinline__ float sigmoid_f(float g) {
  return 1.0f / (1.0f + expf(-g));
}

// A NaN to write where an input cannot be used (an id out of range).
__device__ __forceinline__ float qnan() {
  return __int_as_float(0x7fc00000);
}

// Pass 1 of [Column sums]: block (32, 8) covers 32 * V columns of one chunk; thread (x, y) walks
// rows y, y+8, ... of the chunk for columns (blockIdx.x*32 + x) * V .. + V-1; the 8 row-phases
// are then summed in order through shared memory. F: __device__ void operator()(int64_t row,
// int col, float (&contrib)[NOUT][V]) const, for the V columns from col (V = 4 only where
// colsum's caller said the functor's rows may be read 8 bytes at a time).
template <int NOUT, int V, class F>
__global__ void colsum_partial_kernel(float* __restrict__ partials, int N, int C, int rows,
                                      int chunks, F f) {
  __shared__ float sm[NOUT][8][32 * V + 1];
  const int c = (blockIdx.x * 32 + threadIdx.x) * V;
  const int chunk = blockIdx.y;
  const int64_t r0 = int64_t(chunk) * rows;
  int64_t r1 = r0 + rows;
  if (r1 > N) r1 = N;
  float acc[NOUT][V];
#pragma unroll
  for (int o = 0; o < NOUT; ++o)
#pragma unroll
    for (int v = 0; v < V; ++v) acc[o][v] = 0.0f;
  if (c < C) {
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      float contrib[NOUT][V];
      f(r, c, contrib);
#pragma unroll
      for (int o = 0; o < NOUT; ++o)
#pragma unroll
        for (int v = 0; v < V; ++v) acc[o][v] += contrib[o][v];
    }
  }
#pragma unroll
  for (int o = 0; o < NOUT; ++o)
#pragma unroll
    for (int v = 0; v < V; ++v) sm[o][threadIdx.y][threadIdx.x * V + v] = acc[o][v];
  __syncthreads();
  // 256 threads write the block's NOUT x 32V sums, each summing its column's 8 phases in order.
  const int tid = threadIdx.y * 32 + threadIdx.x;
  for (int i = tid; i < NOUT * 32 * V; i += 256) {
    const int o = i / (32 * V), j = i % (32 * V);
    const int col = blockIdx.x * 32 * V + j;
    if (col >= C) continue;
    float s = 0.0f;
#pragma unroll
    for (int y = 0; y < 8; ++y) s += sm[o][y][j];
    partials[(int64_t(o) * chunks + chunk) * C + col] = s;
  }
}

// Both passes of [Column sums] for N rows and C columns: out_o[c] += sum_r f(r, c)[o] (= where
// not accumulate). vec4:
// the functor's inputs start 8-byte aligned, so where C % 4 == 0 its rows are read four
// columns (8 bytes) at a time; the sums are the same either way (same partition, same order).
template <int NOUT, class F>
void colsum(float* out0, float* out1, int N, int C, void* scratch, size_t scratch_bytes,
            const char* op, F f, cudaStream_t stream, bool vec4, bool accumulate = true) {
  static_assert(NOUT == 1 || NOUT == 2, "one or two outputs");
  if (N <= 0 || C <= 0) return;
  check_scratch(scratch, scratch_bytes, colsum_scratch_bytes(N, C, NOUT), op);
  const ColsumPlan plan = colsum_plan(N);
  float* partials = static_cast<float*>(scratch);
  if (vec4 && C % 4 == 0) {
    const dim3 grid(unsigned((C + 127) / 128), unsigned(plan.chunks));
    colsum_partial_kernel<NOUT, 4, F>
        <<<grid, dim3(32, 8), 0, stream>>>(partials, N, C, plan.rows, plan.chunks, f);
  } else {
    const dim3 grid(unsigned((C + 31) / 32), unsigned(plan.chunks));
    colsum_partial_kernel<NOUT, 1, F>
        <<<grid, dim3(32, 8), 0, stream>>>(partials, N, C, plan.rows, plan.chunks, f);
  }
  CUDA_CHECK_LAUNCH();
  colsum_finalize(out0, out1, partials, NOUT, plan.chunks, C, stream, accumulate);
}

}  // namespace tandem::cuda::detail
#endif  // __CUDACC__
