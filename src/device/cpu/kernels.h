// CPU kernels: fp32 forward and backward of every op of the GPT-2, Llama and GPT-NeoX families.
// They are the numerical reference for the CUDA backend.
//
// Conventions
//  - Row-major contiguous buffers. N = B*T rows; C channels.
//  - Linear weights are [OC, IC] (PyTorch layout): y = x @ w^T + b.
//  - [Backward accumulates] every backward function ADDS into each gradient it writes
//    (parameter gradients and input gradients alike); the caller zeroes them. The
//    exceptions write their input gradient instead ([Written input gradients]): the two
//    in-place rotary functions, gelu_backward, gelu_erf_backward, swiglu_backward and
//    attention_backward, whose input gradient has no other contributor in a model, so a
//    clear and a read of it would be wasted.
//  - A nullptr gradient output means "not needed" and is skipped. Likewise the saved
//    statistics of layernorm_forward (mean, rstd), rmsnorm_forward (rstd) and the
//    probabilities of attention_forward (att) may be null when no backward follows.
#pragma once

#include <cstdint>

namespace tandem {
struct SamplingParams;
}

namespace tandem::cpu {

// out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :] (wpe may be null: no learned positions).
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C);

// LayerNorm over the last dimension; saves mean[N] and rstd[N] for the backward. b may be
// null (no bias); so may db (not needed).
void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int N, int C, float eps);
void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                        const float* w, const float* mean, const float* rstd, int N, int C);

// RMSNorm: out = x * rstd * w with rstd = 1/sqrt(mean(x^2) + eps); saves rstd[N].
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int N, int C,
                     float eps);
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int N, int C);

// out[N,OC] = x[N,IC] @ w[OC,IC]^T + bias[OC] (bias may be null). GEMMs through OpenBLAS.
void matmul_forward(float* out, const float* x, const float* w, const float* bias, int N, int IC,
                    int OC);
void matmul_backward(float* dx, float* dw, float* dbias, const float* dout, const float* x,
                     const float* w, int N, int IC, int OC);

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(float* out, const float* x, int64_t n);
void gelu_backward(float* dx, const float* dout, const float* x, int64_t n);

// GELU, exact: 0.5 x (1 + erf(x / sqrt(2))) (GPT-NeoX / Pythia).
void gelu_erf_forward(float* out, const float* x, int64_t n);
void gelu_erf_backward(float* dx, const float* dout, const float* x, int64_t n);

// SwiGLU on h[N, 2F] = [gate | up]: out[N, F] = silu(gate) * up.
void swiglu_forward(float* out, const float* h, int N, int F);
void swiglu_backward(float* dh, const float* dout, const float* h, int N, int F);

// Rotary embedding, in place, "rotate half" convention restricted to the first rotary_dim
// channels of each head (the GPT-NeoX convention): pairs (i, i + rotary_dim/2) for
// i < rotary_dim/2, angle (pos0 + t) * theta^(-2i/rotary_dim); channels [rotary_dim, D) are
// untouched. rotary_dim must be even with 0 < rotary_dim <= D (rotary_dim == D: full rotary, as
// in Llama). Rotates the first H heads of D channels of every row; rows are row_stride floats
// apart (so q and k of a fused qkv buffer rotate in one call).
void rope_forward(float* x, int B, int T, int H, int D, int rotary_dim, int row_stride, float theta,
                  int pos0);
// The inverse rotation applied to a gradient, in place.
void rope_backward(float* dx, int B, int T, int H, int D, int rotary_dim, int row_stride,
                   float theta, int pos0);

// Causal self-attention with grouped-query heads. qkv[B,T,(Hq+2Hkv)*D] holds q (Hq heads),
// then k and v (Hkv heads each); query head h reads kv head h / (Hq/Hkv). Scale 1/sqrt(D).
// out[B,T,Hq*D]; att[B,Hq,T,T] keeps the softmax probabilities for the backward (entries
// above the diagonal are written as 0).
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int Hq, int Hkv,
                       int D);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int Hq, int Hkv, int D);

// out = a + b over n elements (out may alias a or b).
void add_forward(float* out, const float* a, const float* b, int64_t n);

// Softmax cross-entropy over logits[N, Vp] whose first V columns are real (the padding
// columns are ignored). losses[N] = -log softmax(logits)[target].
void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int N, int V,
                          int Vp);
// Fused softmax + cross-entropy backward, in place: logits become
// dlogits = (softmax(logits) - onehot(target)) * dloss; padding columns become 0. Also
// writes losses[N] (may be null), so the forward need not run separately.
void crossentropy_fused_backward(float* logits, float* losses, const int32_t* targets, int N, int V,
                                 int Vp, float dloss);

// AdamW on n elements, the PyTorch formulation: p *= 1 - lr*wd; then
// p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps), with bc_i = 1 - beta_i^step (step >= 1).
// The gradient is multiplied by grad_scale first (gradient clipping).
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int step, float grad_scale);

// Sum of squares in double, for the global gradient norm.
double sum_squares(const float* x, int64_t n);

// Decoding with a KV cache (the cache of one block: K and V, each [S, Hkv, P, D]); the
// semantics are those of the kernel table (device/kernels.h).
void embedding_at(float* out, const int32_t* tokens, const int32_t* pos, const float* wte,
                  const float* wpe, int N, int C);
void rope_kv_append(float* qkv, float* kcache, float* vcache, const int32_t* slot,
                    const int32_t* pos, int N, int Hq, int Hkv, int D, int rotary_dim, float theta,
                    int P);
void attention_decode(float* out, const float* qkv, const float* kcache, const float* vcache,
                      const int32_t* slot, const int32_t* pos, int N, int Hq, int Hkv, int D,
                      int P);
// One row of SamplingParams' rule over x[V]: the drawn token.
int32_t sample_row(const float* x, int V, int row, int position, float temperature, int top_k,
                   float top_p, uint64_t seed);
// The split rule ([Split sampling] in device/kernels.h) on one row. sample_candidates_row
// writes the K candidates of x[V] (global ids id_offset + i) to vals[K], ids[K];
// sample_pick_row draws from the candidates of `ranks` slices, slice r's at vals[r * stride],
// ids[r * stride]. `row` is the sequence index of the noise key.
void sample_candidates_row(float* vals, int32_t* ids, int K, const float* x, int V, int id_offset,
                           int row, int position, const SamplingParams& p);
int32_t sample_pick_row(const float* vals, const int32_t* ids, int64_t stride, int ranks, int K,
                        int row, int position, const SamplingParams& p);

}  // namespace tandem::cpu
