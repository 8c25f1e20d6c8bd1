// CUDA causal self-attention with grouped-query heads, llm.c style: permute qkv into head-major
// q/k/v, scores by a strided-batched cuBLASLt GEMM, a fused scale/causal-mask/softmax kernel,
// probabilities x V by GEMM, unpermute; the backward mirrors it (dP, dV, softmax backward, dQ, dK).
//
// [Attention] Shapes: G = Hq / Hkv query heads share one kv head. Head-major buffers:
// q[B,Hq,T,D], k/v[B,Hkv,T,D]. The query heads of kv head g are consecutive in q, so for batch
// item i = b*Hkv + g the G*T query rows of the group form one contiguous [G*T, D] matrix and GQA
// needs no copies: every GEMM is batched over the B*Hkv groups with
//   Q_i = q + i*G*T*D [G*T, D],  K_i = k + i*T*D [T, D],  V_i likewise,
//   S_i = scores + i*G*T*T [G*T, T] (row r = h_local*T + t: the scores of query t of head h).
// Row-major products are computed as transposed column-major ones ([cuBLASLt layout], matmul.cu):
//   S = scale Q K^T      S^T (T x GT, ld T, fp32)  = op(K: D x T, ld D, T) * (Q^T: D x GT, ld D, N)
//   O = P V              O^T (D x GT, ld D)        = (V^T: D x T, N) * (P^T: T x GT, ld ldp, N)
//   dP = dO V^T          dP^T (T x GT, fp32)       = op(V, T) * (dO^T, N)
//   dV = P^T dO (sum over the group's heads, inside the k = G*T reduction)
//                        dV^T (D x T)              = (dO^T: D x GT, N) * op(P^T: T x GT, T)
//   dQ = dS K            dQ^T (D x GT)             = (K^T, N) * (dS^T: T x GT, ld 2T, N)
//   dK = dS^T Q          dK^T (D x T)              = (Q^T, N) * op(dS^T, T)
// The scores are fp32 (no bf16 rounding of the logits before the softmax); the probabilities
// (saved for the backward) and dS are bf16 GEMM operands. The full T x T square is computed
// (twice the causal work, as llm.c) and the softmax writes exact zeros above the diagonal.
//
// [In-place rows] The softmax backward overwrites each fp32 dP row (4T bytes) with its bf16 dS
// row (2T bytes) at the same row start, so dS has leading dimension 2T and needs no buffer of its
// own (likewise the forward writes P over the scores when no att buffer is given). One warp owns
// a row and walks it in chunks of 32 columns: chunk j0 reads fp32 columns [j0, j0+32), then
// (after __syncwarp) writes bf16 columns [j0, j0+32), i.e. the bytes of fp32 columns
// [j0/2, j0/2+16), all of which this warp has already read in this or an earlier chunk.
//
// Scratch (attention_scratch_bytes): q, k, v, o|dO|dQ, dK, dV head-major bf16 and the fp32
// scores [B,Hq,T,T]; forward and backward share it.
#include <cmath>

#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

using detail::grid_for;
using detail::load_vec;
using detail::store_vec;
using detail::warp_max;
using detail::warp_sum;

constexpr int kThreads = 256;
constexpr int kRowWarps = 8;

size_t align256(size_t x) {
  return (x + 255) / 256 * 256;
}

struct Scratch {
  bf16 *q, *k, *v, *o, *dk, *dv;
  float* scores;
};

Scratch carve(void* base, int B, int T, int Hq, int Hkv, int D, size_t* total) {
  const size_t nq = size_t(B) * Hq * T * D, nkv = size_t(B) * Hkv * T * D;
  const size_t ns = size_t(B) * Hq * T * T;
  char* p = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    char* r = p ? p + off : nullptr;
    off += align256(bytes);
    return r;
  };
  Scratch s{};
  s.q = reinterpret_cast<bf16*>(take(nq * sizeof(bf16)));
  s.k = reinterpret_cast<bf16*>(take(nkv * sizeof(bf16)));
  s.v = reinterpret_cast<bf16*>(take(nkv * sizeof(bf16)));
  s.o = reinterpret_cast<bf16*>(take(nq * sizeof(bf16)));
  s.dk = reinterpret_cast<bf16*>(take(nkv * sizeof(bf16)));
  s.dv = reinterpret_cast<bf16*>(take(nkv * sizeof(bf16)));
  s.scores = reinterpret_cast<float*>(take(ns * sizeof(float)));
  *total = off;
  return s;
}

// dst[b,h,t,:] = src[(b*T + t)*src_stride + h*D + :]
template <int VEC>
__global__ void rows_to_heads_kernel(bf16* __restrict__ dst, const bf16* __restrict__ src, int B,
                                     int T, int H, int D, int64_t src_stride) {
  const int64_t total = int64_t(B) * H * T * D / VEC;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total; v += stride) {
    const int64_t e = v * VEC;
    const int d = int(e % D);
    const int64_t bht = e / D;
    const int t = int(bht % T);
    const int64_t bh = bht / T;
    const int h = int(bh % H);
    const int64_t b = bh / H;
    float x[VEC];
    load_vec<VEC>(src + (b * T + t) * src_stride + int64_t(h) * D + d, x);
    store_vec<VEC>(dst + e, x);
  }
}

// dst[(b*T + t)*dst_stride + h*D + :] = src[b,h,t,:]
template <int VEC>
__global__ void heads_to_rows_kernel(bf16* __restrict__ dst, const bf16* __restrict__ src, int B,
                                     int T, int H, int D, int64_t dst_stride) {
  const int64_t total = int64_t(B) * T * H * D / VEC;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total; v += stride) {
    const int64_t e = v * VEC;  // index in [B, T, H, D] order: coalesced writes
    const int d = int(e % D);
    const int64_t bth = e / D;
    const int h = int(bth % H);
    const int64_t bt = bth / H;
    const int t = int(bt % T);
    const int64_t b = bt / T;
    float x[VEC];
    load_vec<VEC>(src + ((b * H + h) * T + t) * D + d, x);
    store_vec<VEC>(dst + bt * dst_stride + int64_t(h) * D + d, x);
  }
}

void rows_to_heads(bf16* dst, const bf16* src, int B, int T, int H, int D, int64_t src_stride,
                   cudaStream_t stream) {
  const int64_t total = int64_t(B) * H * T * D;
  if (D % 8 == 0 && src_stride % 8 == 0 && detail::aligned16(dst) && detail::aligned16(src)) {
    rows_to_heads_kernel<8><<<grid_for(total / 8, kThreads, 65535), kThreads, 0, stream>>>(
        dst, src, B, T, H, D, src_stride);
  } else {
    rows_to_heads_kernel<1><<<grid_for(total, kThreads, 65535), kThreads, 0, stream>>>(
        dst, src, B, T, H, D, src_stride);
  }
  CUDA_CHECK_LAUNCH();
}

void heads_to_rows(bf16* dst, const bf16* src, int B, int T, int H, int D, int64_t dst_stride,
                   cudaStream_t stream) {
  const int64_t total = int64_t(B) * H * T * D;
  if (D % 8 == 0 && dst_stride % 8 == 0 && detail::aligned16(dst) && detail::aligned16(src)) {
    heads_to_rows_kernel<8><<<grid_for(total / 8, kThreads, 65535), kThreads, 0, stream>>>(
        dst, src, B, T, H, D, dst_stride);
  } else {
    heads_to_rows_kernel<1><<<grid_for(total, kThreads, 65535), kThreads, 0, stream>>>(
        dst, src, B, T, H, D, dst_stride);
  }
  CUDA_CHECK_LAUNCH();
}

// P[row, :] = softmax of the causal prefix of S[row, :] (already scaled), 0 above the diagonal.
// One warp per row; P may overwrite S in place with ldp = 2T ([In-place rows]).
__global__ void softmax_causal_fwd_kernel(bf16* P, int64_t ldp, const float* S, int T,
                                          int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  const int n = int(row % T) + 1;  // keys 0..t are visible
  const float* s = S + row * T;
  bf16* p = P + row * ldp;
  float m = -INFINITY;
  for (int j = lane; j < n; j += 32) m = fmaxf(m, s[j]);
  m = warp_max(m);
  float sum = 0.0f;
  for (int j = lane; j < n; j += 32) sum += expf(s[j] - m);
  const float inv = 1.0f / warp_sum(sum);
  for (int j0 = 0; j0 < T; j0 += 32) {
    const int j = j0 + lane;
    const float v = j < n ? s[j] : 0.0f;
    __syncwarp();
    if (j < T) p[j] = __float2bfloat16_rn(j < n ? expf(v - m) * inv : 0.0f);
  }
}

// dS[row, j] = P (dP - sum_j' P dP) * scale on the causal prefix, 0 above; dS may overwrite dP
// in place with ldds = 2T ([In-place rows]).
__global__ void softmax_causal_bwd_kernel(bf16* dS, int64_t ldds, const float* dP,
                                          const bf16* __restrict__ P, int T, int64_t rows,
                                          float scale) {
  const int64_t row = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const int n = int(row % T) + 1;
  const float* dp = dP + row * T;
  const bf16* p = P + row * T;
  bf16* ds = dS + row * ldds;
  float dot = 0.0f;
  for (int j = lane; j < n; j += 32) dot += __bfloat162float(p[j]) * dp[j];
  dot = warp_sum(dot);
  for (int j0 = 0; j0 < T; j0 += 32) {
    const int j = j0 + lane;
    float pv = 0.0f, dv = 0.0f;
    if (j < n) {
      pv = __bfloat162float(p[j]);
      dv = dp[j];
    }
    __syncwarp();
    if (j < T) ds[j] = __float2bfloat16_rn(j < n ? pv * (dv - dot) * scale : 0.0f);
  }
}

void check_attention_shape(int B, int T, int Hq, int Hkv, int D) {
  TD_CHECK(B >= 0 && T >= 0 && D > 0, "bad attention shape B={} T={} D={}", B, T, D);
  TD_CHECK(Hq > 0 && Hkv > 0 && Hq % Hkv == 0,
           "query heads ({}) must be a positive multiple of kv heads ({})", Hq, Hkv);
}

// S^T-shaped products: out_i (T x G*T col-major, fp32, ld T) = alpha * X_i Y_i^T in row-major
// terms, X = rows of the group (Q or dO: [G*T, D]), Y = [T, D] (K or V).
void gemm_group_by_keys(MatmulContext& ctx, float* out, const bf16* x, const bf16* y, int B, int T,
                        int Hkv, int G, int D, float alpha, cudaStream_t stream) {
  GemmArgs g;
  g.trans_a = true;
  g.trans_b = false;
  g.m = T;
  g.n = G * T;
  g.k = D;
  g.A = y;
  g.lda = D;
  g.stride_a = int64_t(T) * D;
  g.B = x;
  g.ldb = D;
  g.stride_b = int64_t(G) * T * D;
  g.D = out;
  g.d_type = GemmType::f32;
  g.ldd = T;
  g.stride_d = int64_t(G) * T * T;
  g.batch = B * Hkv;
  g.alpha = alpha;
  ctx.gemm(g, stream);
}

// [G*T, T] x [T, D] products: out_i [G*T, D] = W_i Y_i, W (P or dS) with row stride ldw.
void gemm_weights_by_keys(MatmulContext& ctx, bf16* out, const bf16* w, int64_t ldw, const bf16* y,
                          int B, int T, int Hkv, int G, int D, cudaStream_t stream) {
  GemmArgs g;
  g.m = D;
  g.n = G * T;
  g.k = T;
  g.A = y;
  g.lda = D;
  g.stride_a = int64_t(T) * D;
  g.B = w;
  g.ldb = ldw;
  g.stride_b = int64_t(G) * T * ldw;
  g.D = out;
  g.d_type = GemmType::bf16;
  g.ldd = D;
  g.stride_d = int64_t(G) * T * D;
  g.batch = B * Hkv;
  ctx.gemm(g, stream);
}

// [T, G*T] x [G*T, D] products: out_i [T, D] = W_i^T X_i, summing over the group's query rows.
void gemm_weights_t_by_rows(MatmulContext& ctx, bf16* out, const bf16* w, int64_t ldw,
                            const bf16* x, int B, int T, int Hkv, int G, int D,
                            cudaStream_t stream) {
  GemmArgs g;
  g.trans_b = true;
  g.m = D;
  g.n = T;
  g.k = G * T;
  g.A = x;
  g.lda = D;
  g.stride_a = int64_t(G) * T * D;
  g.B = w;
  g.ldb = ldw;
  g.stride_b = int64_t(G) * T * ldw;
  g.D = out;
  g.d_type = GemmType::bf16;
  g.ldd = D;
  g.stride_d = int64_t(T) * D;
  g.batch = B * Hkv;
  ctx.gemm(g, stream);
}

}  // namespace

size_t attention_scratch_bytes(int B, int T, int Hq, int Hkv, int D) {
  check_attention_shape(B, T, Hq, Hkv, D);
  size_t total = 0;
  carve(nullptr, B, T, Hq, Hkv, D, &total);
  return total;
}

void attention_forward(MatmulContext& ctx, bf16* out, bf16* att, const bf16* qkv, int B, int T,
                       int Hq, int Hkv, int D, void* scratch, size_t scratch_bytes,
                       cudaStream_t stream) {
  check_attention_shape(B, T, Hq, Hkv, D);
  if (B == 0 || T == 0) return;
  detail::check_scratch(scratch, scratch_bytes, attention_scratch_bytes(B, T, Hq, Hkv, D),
                        "attention_forward");
  size_t total = 0;
  const Scratch s = carve(scratch, B, T, Hq, Hkv, D, &total);
  const int G = Hq / Hkv;
  const int64_t S = int64_t(Hq + 2 * Hkv) * D;
  rows_to_heads(s.q, qkv, B, T, Hq, D, S, stream);
  rows_to_heads(s.k, qkv + int64_t(Hq) * D, B, T, Hkv, D, S, stream);
  rows_to_heads(s.v, qkv + int64_t(Hq + Hkv) * D, B, T, Hkv, D, S, stream);
  gemm_group_by_keys(ctx, s.scores, s.q, s.k, B, T, Hkv, G, D, 1.0f / std::sqrt(float(D)), stream);
  // Probabilities: into att (ld T) when kept for the backward, else over the scores (ld 2T).
  bf16* P = att ? att : reinterpret_cast<bf16*>(s.scores);
  const int64_t ldp = att ? T : 2 * int64_t(T);
  const int64_t rows = int64_t(B) * Hq * T;
  softmax_causal_fwd_kernel<<<grid_for(rows, kRowWarps, int64_t(1) << 31), kRowWarps * 32, 0,
                              stream>>>(P, ldp, s.scores, T, rows);
  CUDA_CHECK_LAUNCH();
  gemm_weights_by_keys(ctx, s.o, P, ldp, s.v, B, T, Hkv, G, D, stream);
  heads_to_rows(out, s.o, B, T, Hq, D, int64_t(Hq) * D, stream);
}

void attention_backward(MatmulContext& ctx, bf16* dqkv, const bf16* dout, const bf16* qkv,
                        const bf16* att, int B, int T, int Hq, int Hkv, int D, void* scratch,
                        size_t scratch_bytes, cudaStream_t stream) {
  check_attention_shape(B, T, Hq, Hkv, D);
  if (B == 0 || T == 0 || !dqkv) return;
  TD_CHECK(att != nullptr, "attention_backward needs the probabilities of the forward");
  detail::check_scratch(scratch, scratch_bytes, attention_scratch_bytes(B, T, Hq, Hkv, D),
                        "attention_backward");
  size_t total = 0;
  const Scratch s = carve(scratch, B, T, Hq, Hkv, D, &total);
  const int G = Hq / Hkv;
  const int64_t S = int64_t(Hq + 2 * Hkv) * D;
  rows_to_heads(s.q, qkv, B, T, Hq, D, S, stream);
  rows_to_heads(s.k, qkv + int64_t(Hq) * D, B, T, Hkv, D, S, stream);
  rows_to_heads(s.v, qkv + int64_t(Hq + Hkv) * D, B, T, Hkv, D, S, stream);
  bf16* dO = s.o;
  rows_to_heads(dO, dout, B, T, Hq, D, int64_t(Hq) * D, stream);
  // dP = dO V^T (fp32, in the scores buffer); dV = P^T dO.
  gemm_group_by_keys(ctx, s.scores, dO, s.v, B, T, Hkv, G, D, 1.0f, stream);
  gemm_weights_t_by_rows(ctx, s.dv, att, T, dO, B, T, Hkv, G, D, stream);
  // dS = P (dP - rowsum(P dP)) / sqrt(D), bf16 over dP ([In-place rows]).
  bf16* dS = reinterpret_cast<bf16*>(s.scores);
  const int64_t ldds = 2 * int64_t(T);
  const int64_t rows = int64_t(B) * Hq * T;
  softmax_causal_bwd_kernel<<<grid_for(rows, kRowWarps, int64_t(1) << 31), kRowWarps * 32, 0,
                              stream>>>(dS, ldds, s.scores, att, T, rows,
                                        1.0f / std::sqrt(float(D)));
  CUDA_CHECK_LAUNCH();
  // dQ = dS K (into dO's buffer: dO is no longer needed), dK = dS^T Q.
  bf16* dQ = s.o;
  gemm_weights_by_keys(ctx, dQ, dS, ldds, s.k, B, T, Hkv, G, D, stream);
  gemm_weights_t_by_rows(ctx, s.dk, dS, ldds, s.q, B, T, Hkv, G, D, stream);
  // Accumulate into the fused gradient rows.
  heads_to_rows(dqkv, dQ, B, T, Hq, D, S, stream);
  heads_to_rows(dqkv + int64_t(Hq) * D, s.dk, B, T, Hkv, D, S, stream);
  heads_to_rows(dqkv + int64_t(Hq + Hkv) * D, s.dv, B, T, Hkv, D, S, stream);
}

}  // namespace tandem::cuda
