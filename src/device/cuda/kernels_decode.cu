// CUDA kernels of decoding with a KV cache: the embedding of one token per row at its own
// position, the fused rotary + cache append, split-K cached attention ("flash decoding"), and the
// small helpers of a decoding step (row gather, position advance). Every grid depends on the
// shapes only, never on the positions (which live in device memory), so a captured CUDA graph
// replays a step for any positions.
//
// [Decode attention] Row n's query heads attend to positions [0, pos[n]] of cache slot slot[n].
// The work is split three ways: grid (split, KV head x head group, row). A block reads its chunk
// of the slot's K and V rows of one KV head ONCE for all the query heads of that head's group (up
// to kDecMaxGroup at a time; larger groups take several head groups, each rereading the chunk).
// Within a block, lanes form groups of LP lanes (LP a power of two, LP * 8 >= D); a lane group
// takes one position at a time, each lane one 16-byte load of 8 channels of K and of V, so a
// warp's loads are whole contiguous rows. The scores (q pre-scaled by log2(e)/sqrt(D)) are
// reduced over the lane group with shuffles, and each lane group keeps an online softmax (running
// max m, sum l, unnormalised acc[8] per head) in fp32; the block merges its lane groups through
// shared memory and writes one partial (m, l, acc[D]) per query head to scratch. A combine
// kernel then merges the partials of a (row, head) in split order and writes the bf16 output.
// The number of splits is a function of (N, Hkv, P) (decode_splits); the chunk of each split is
// computed on the device from pos[n] (decode_chunk: the positions spread evenly over the splits,
// at least kDecMinChunk each), so every block has work for long contexts, and splits past the
// end of a short context return at once; the combine reads only the splits that had work. When
// there is one split (many rows x KV heads, or a tiny cache) the partial kernel normalises and
// writes the bf16 output itself and no combine runs. On sm_90 with at most kDecMaxCluster splits,
// the splits of a (row, head group) run as one thread-block cluster instead: each block leaves
// its partials in its shared memory and block 0 merges them through distributed shared memory
// with the combine kernel's expressions, in split order (the same bits, one launch, no scratch
// traffic). Every kernel here follows [PDL] (kernels.cuh).
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>

#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

using detail::grid_for;
using detail::load_vec;
using detail::store_vec;

constexpr int kThreads = 256;

// --- embedding_at --------------------------------------------------------------------------

// out[i, c] = wte[tok, c] (+ wpe[pos[i], c]); a token outside [0, V) (or a negative position
// with wpe) writes a NaN row.
template <int VEC>
__global__ void embedding_at_kernel(bf16* __restrict__ out, const int32_t* __restrict__ tokens,
                                    const int32_t* __restrict__ pos, const bf16* __restrict__ wte,
                                    const bf16* __restrict__ wpe, int64_t N, int C, int V) {
  detail::pdl_launch_dependents();  // [PDL]: nothing mutable is read or written before the wait
  detail::pdl_wait();
  const int64_t per_row = C / VEC;
  const int64_t total = N * per_row;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total; v += stride) {
    const int64_t i = v / per_row;
    const int c = int(v % per_row) * VEC;
    const int tok = tokens[i];
    const int p = wpe ? pos[i] : 0;
    float o[VEC];
    if (tok < 0 || tok >= V || p < 0) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) o[j] = detail::qnan();
    } else {
      load_vec<VEC>(wte + int64_t(tok) * C + c, o);
      if (wpe) {
        float q[VEC];
        load_vec<VEC>(wpe + int64_t(p) * C + c, q);
#pragma unroll
        for (int j = 0; j < VEC; ++j) o[j] += q[j];
      }
    }
    store_vec<VEC>(out + i * C + c, o);
  }
}

// --- rope_kv_append ------------------------------------------------------------------------

// The angle of frequency i (< rotary_dim / 2) at position p, as rope_kernel (kernels_rope.cu)
// computes it, in double.
__device__ __forceinline__ void rope_angle(int p, int i, int rotary_dim, double theta, float& cs,
                                           float& sn) {
  const double inv_freq = pow(theta, -2.0 * i / double(rotary_dim));
  const double a = double(p) * inv_freq;
  double sd, cd;
  sincos(a, &sd, &cd);
  cs = float(cd);
  sn = float(sd);
}
// The pair (x1, x2) rotated by the angle (cs, sn): each product and sum rounded on its own (no
// contraction), so every kernel that rotates a pair gets the same bits.
__device__ __forceinline__ float rope_first(float x1, float x2, float cs, float sn) {
  return __fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn));
}
__device__ __forceinline__ float rope_second(float x1, float x2, float cs, float sn) {
  return __fadd_rn(__fmul_rn(x1, sn), __fmul_rn(x2, cs));
}

// Block n: threads i < rotary_dim/2 compute the angle of frequency i exactly as rope_kernel
// (kernels_rope.cu) and rotate pair (i, i + rotary_dim/2) of every q and k head, writing the
// rotated k pair into the cache too; the other threads' loops copy the unrotated k channels and
// the v heads into the cache. The three loops touch disjoint elements.
__global__ void rope_kv_append_kernel(bf16* __restrict__ qkv, bf16* __restrict__ kc,
                                      bf16* __restrict__ vc, const int32_t* __restrict__ slot,
                                      const int32_t* __restrict__ pos, int Hq, int Hkv, int D,
                                      int rotary_dim, double theta, int P) {
  detail::pdl_launch_dependents();  // [PDL]: nothing mutable is read or written before the wait
  detail::pdl_wait();
  const int n = blockIdx.x;
  bf16* row = qkv + int64_t(n) * (Hq + 2 * Hkv) * D;
  const int p = pos[n], s = slot[n];
  const bool store = p >= 0 && p < P && s >= 0;
  // Element (h, p, c) of the slot's cache is at cache_row + h * P * D + c.
  const int64_t cache_row = (int64_t(store ? s : 0) * Hkv * P + (store ? p : 0)) * D;
  const int64_t head_stride = int64_t(P) * D;
  const int half = rotary_dim / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float cs, sn;
    rope_angle(p, i, rotary_dim, theta, cs, sn);
    for (int h = 0; h < Hq + Hkv; ++h) {
      bf16* x = row + int64_t(h) * D + i;
      const float x1 = __bfloat162float(x[0]), x2 = __bfloat162float(x[half]);
      const bf16 y1 = __float2bfloat16_rn(rope_first(x1, x2, cs, sn));
      const bf16 y2 = __float2bfloat16_rn(rope_second(x1, x2, cs, sn));
      x[0] = y1;
      x[half] = y2;
      if (h >= Hq && store) {
        bf16* k = kc + cache_row + int64_t(h - Hq) * head_stride + i;
        k[0] = y1;
        k[half] = y2;
      }
    }
  }
  if (!store) return;
  const int rest = D - rotary_dim;
  const bf16* krow = row + int64_t(Hq) * D;
  for (int e = threadIdx.x; e < Hkv * rest; e += blockDim.x) {
    const int h = e / rest, c = rotary_dim + e % rest;
    kc[cache_row + int64_t(h) * head_stride + c] = krow[int64_t(h) * D + c];
  }
  const bf16* vrow = row + int64_t(Hq + Hkv) * D;
  for (int e = threadIdx.x; e < Hkv * D; e += blockDim.x) {
    const int h = e / D, c = e % D;
    vc[cache_row + int64_t(h) * head_stride + c] = vrow[e];
  }
}

// --- attention_decode: see [Decode attention] ------------------------------------------------

constexpr int kDecWarps = 4;
constexpr int kDecThreads = kDecWarps * 32;
constexpr int kDecUnroll = 4;          // positions per lane group per step (loads in flight)
constexpr int kDecMinChunk = 32;       // fewest positions a split takes
constexpr int kDecTargetBlocks = 512;  // blocks wanted per launch (a few per SM)
constexpr int kDecMaxGroup = 8;        // query heads per block
constexpr int kDecCombineThreads = 128;

int decode_splits(int N, int Hkv, int P) {
  const int64_t rows = std::max<int64_t>(1, int64_t(N) * Hkv);
  const int64_t want = (kDecTargetBlocks + rows - 1) / rows;
  const int64_t most = std::max<int64_t>(1, (int64_t(P) + kDecMinChunk - 1) / kDecMinChunk);
  return int(std::clamp<int64_t>(want, 1, most));
}

// Positions per split for a context of len positions.
__device__ __forceinline__ int decode_chunk(int len, int splits) {
  return max(kDecMinChunk, (len + splits - 1) / splits);
}

__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    f[2 * j] = __uint_as_float(w[j] << 16);
    f[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
  }
}

// The inverse of unpack8 for values that are bf16 already (exact).
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    w[j] = (__float_as_uint(f[2 * j]) >> 16) | (__float_as_uint(f[2 * j + 1]) & 0xffff0000u);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

size_t align256(size_t x) {
  return (x + 255) / 256 * 256;
}

// Partials of (row n, query head h, split s): part_ml[((n*Hq + h)*splits + s)*2 + {0, 1}] =
// (m, l) in the log2 domain, part_acc[((n*Hq + h)*splits + s)*D + d] = acc. With a non-null
// `out` (one split) the output acc / l itself, in bf16, instead (NaN for an unusable row).
// CL (sm_90, launched in clusters of the `splits` blocks of one (row, head group)): each block
// keeps its partials in its shared memory, and block 0 of the cluster merges them as the combine
// kernel does (the same expressions in the same order) and writes the output; no scratch.
// ROPE ([Decode rope]): the kernel also does rope_kv_append's work for its heads. Each lane
// rotates its 8 channels of the block's query heads and of the row's key head (the partner of
// channel i, i +- rotary_dim / 2, comes from the lane rotary_dim / 16 away, with a shuffle; the
// angles from shared memory, computed once per block with rope_kv_append_kernel's expressions),
// rounding to bf16 as rope_kv_append stores them. The position pos[n] itself takes the rotated key
// and the value from registers instead of the cache, and the block of head group 0 whose split
// holds it writes them into the cache: no block of this launch reads that cache row. The
// scores, the softmax and the output are then those of rope_kv_append and attention_decode, bit
// for bit; qkv is read only.
struct DecodeRope {
  bf16* kc = nullptr;  // the caches the key and value are appended to
  bf16* vc = nullptr;
  int rotary_dim = 0;  // a multiple of 16 (0: nothing rotates)
  double theta = 0;
};
constexpr int kDecMaxRotaryHalf = 128;  // D <= 256

template <int LP, int GM, bool CL, bool ROPE>
__global__ void __launch_bounds__(kDecThreads)
    attention_decode_partial_kernel(bf16* __restrict__ out, float* __restrict__ part_acc,
                                    float* __restrict__ part_ml, const bf16* __restrict__ qkv,
                                    const bf16* __restrict__ kc, const bf16* __restrict__ vc,
                                    const int32_t* __restrict__ slot,
                                    const int32_t* __restrict__ pos, int Hq, int Hkv, int D, int P,
                                    int splits, float qscale, DecodeRope rope) {
  constexpr int PPW = 32 / LP;         // lane groups per warp
  constexpr int NG = kDecWarps * PPW;  // lane groups per block
  constexpr int STEP = NG * kDecUnroll;
  __shared__ float s_ml[NG][GM][2];
  __shared__ float s_acc[NG][GM][LP * 8];
  __shared__ float s_part[CL ? GM : 1][CL ? LP * 8 : 1];  // CL: this split's partials
  __shared__ float s_pml[CL ? GM : 1][2];
  __shared__ float s_cs[ROPE ? kDecMaxRotaryHalf : 1], s_sn[ROPE ? kDecMaxRotaryHalf : 1];

  detail::pdl_launch_dependents();  // [PDL]: nothing mutable is read or written before the wait
  detail::pdl_wait();
  const int split = blockIdx.x;
  const int n = blockIdx.z;
  const int p_last = pos[n], s = slot[n];
  const int G = Hq / Hkv;
  const int hgroups = (G + GM - 1) / GM;
  const int kvh = blockIdx.y / hgroups, hg = blockIdx.y % hgroups;
  const int h0 = kvh * G + hg * GM;
  const int gcount = min(GM, G - hg * GM);
  if (p_last < 0 || p_last >= P || s < 0) {  // NaN output (written by the combine otherwise)
    // (uniform over a cluster: its blocks share the row; block 0 writes)
    if (CL ? split == 0 : out != nullptr) {
      for (int idx = threadIdx.x; idx < gcount * D; idx += blockDim.x)
        out[(int64_t(n) * Hq + h0) * D + idx] = __float2bfloat16_rn(detail::qnan());
    }
    return;
  }
  const int len = p_last + 1;
  const int chunk = decode_chunk(len, splits);
  const int p0 = split * chunk;
  // A split past the end of the context: nothing to do (a cluster's block still takes part in
  // the merge; its partials are never read).
  if (!CL && p0 >= len) return;  // uniform over the block
  const int p1 = min(len, p0 + chunk);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int grp = warp * PPW + lane / LP;
  const int c = (lane % LP) * 8;
  const bool active = c < D;

  float q[GM][8];
  const bf16* qrow = qkv + int64_t(n) * (Hq + 2 * Hkv) * D;
  // [Decode rope]: the angles, and the lane holding each channel's partner.
  const int half = ROPE ? rope.rotary_dim / 2 : 0;
  const int partner = c < half ? lane + half / 8 : (c < 2 * half ? lane - half / 8 : lane);
  if constexpr (ROPE) {
    for (int i = threadIdx.x; i < half; i += blockDim.x)
      rope_angle(p_last, i, rope.rotary_dim, rope.theta, s_cs[i], s_sn[i]);
    __syncthreads();
  }
  // x (channels c..c+7 of a head, every lane of the warp at once) rotated and rounded to bf16.
  auto rotate = [&](float(&x)[8]) {
    float xp[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) xp[e] = __shfl_sync(0xffffffffu, x[e], partner);
    if (c < 2 * half) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int i = (c < half ? c : c - half) + e;
        const float y = c < half ? rope_first(x[e], xp[e], s_cs[i], s_sn[i])
                                 : rope_second(xp[e], x[e], s_cs[i], s_sn[i]);
        x[e] = __bfloat162float(__float2bfloat16_rn(y));
      }
    }
  };
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    if (active && g < gcount) {
      unpack8(__ldg(reinterpret_cast<const uint4*>(qrow + int64_t(h0 + g) * D + c)), q[g]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) q[g][e] = 0.0f;
    }
    if constexpr (ROPE) rotate(q[g]);  // every lane: the shuffles take the whole warp
#pragma unroll
    for (int e = 0; e < 8; ++e) q[g][e] *= qscale;
  }
  // [Decode rope]: the row's key (rotated) and value at p_last, as the cache would hold them.
  uint4 k_new = make_uint4(0, 0, 0, 0), v_new = make_uint4(0, 0, 0, 0);
  if constexpr (ROPE) {
    float kf[8];
    if (active) {
      unpack8(__ldg(reinterpret_cast<const uint4*>(qrow + int64_t(Hq + kvh) * D + c)), kf);
      v_new = __ldg(reinterpret_cast<const uint4*>(qrow + int64_t(Hq + Hkv + kvh) * D + c));
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) kf[e] = 0.0f;
    }
    rotate(kf);
    k_new = pack8(kf);
  }
  float m[GM], l[GM], acc[GM][8];
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
  }

  const int64_t head = (int64_t(s) * Hkv + kvh) * P;  // row of position 0
  const bf16* kp = kc + head * D + c;
  const bf16* vp = vc + head * D + c;
  for (int pb = p0; pb < p1; pb += STEP) {  // uniform over the block
    uint4 kr[kDecUnroll], vr[kDecUnroll];
#pragma unroll
    for (int j = 0; j < kDecUnroll; ++j) {
      const int p = pb + grp + j * NG;
      if (ROPE && active && p == p_last) {  // not in the cache yet ([Decode rope])
        kr[j] = k_new;
        vr[j] = v_new;
      } else if (active && p < p1) {
        kr[j] = __ldg(reinterpret_cast<const uint4*>(kp + int64_t(p) * D));
        vr[j] = __ldg(reinterpret_cast<const uint4*>(vp + int64_t(p) * D));
      } else {
        kr[j] = make_uint4(0, 0, 0, 0);
        vr[j] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int j = 0; j < kDecUnroll; ++j) {
      float kf[8];
      unpack8(kr[j], kf);
      float sc[GM];
#pragma unroll
      for (int g = 0; g < GM; ++g) {
        float t = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) t = fmaf(q[g][e], kf[e], t);
        sc[g] = t;
      }
#pragma unroll
      for (int o = LP / 2; o > 0; o >>= 1) {
#pragma unroll
        for (int g = 0; g < GM; ++g) sc[g] += __shfl_xor_sync(0xffffffffu, sc[g], o);
      }
      if (pb + grp + j * NG < p1) {  // uniform over the lane group
        float vf[8];
        unpack8(vr[j], vf);
#pragma unroll
        for (int g = 0; g < GM; ++g) {
          const float mn = fmaxf(m[g], sc[g]);
          const float corr = exp2f(m[g] - mn), pe = exp2f(sc[g] - mn);
          l[g] = l[g] * corr + pe;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(pe, vf[e], acc[g][e] * corr);
          m[g] = mn;
        }
      }
    }
  }

  if constexpr (ROPE) {  // the append, by one lane group of one block per (row, KV head)
    if (hg == 0 && p0 <= p_last && p_last < p1 && grp == 0 && active) {
      const int64_t at = ((int64_t(s) * Hkv + kvh) * P + p_last) * D + c;
      *reinterpret_cast<uint4*>(rope.kc + at) = k_new;
      *reinterpret_cast<uint4*>(rope.vc + at) = v_new;
    }
  }
  // Merge the lane groups: every lane of a group holds the same m and l.
  if (lane % LP == 0) {
#pragma unroll
    for (int g = 0; g < GM; ++g) {
      s_ml[grp][g][0] = m[g];
      s_ml[grp][g][1] = l[g];
    }
  }
  if (active) {
#pragma unroll
    for (int g = 0; g < GM; ++g) {
#pragma unroll
      for (int e = 0; e < 8; ++e) s_acc[grp][g][c + e] = acc[g][e];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < gcount * D; idx += blockDim.x) {
    const int g = idx / D, d = idx % D;
    float M = -INFINITY;
#pragma unroll
    for (int r = 0; r < NG; ++r) M = fmaxf(M, s_ml[r][g][0]);
    float L = 0.0f, A = 0.0f;
#pragma unroll
    for (int r = 0; r < NG; ++r) {
      const float w = exp2f(s_ml[r][g][0] - M);  // 0 for a lane group that saw no position
      L = fmaf(w, s_ml[r][g][1], L);
      A = fmaf(w, s_acc[r][g][d], A);
    }
    if (!CL && out) {
      out[(int64_t(n) * Hq + h0 + g) * D + d] = __float2bfloat16_rn(A / L);
      continue;
    }
    if (CL) {
      s_part[g][d] = A;
      if (d == 0) {
        s_pml[g][0] = M;
        s_pml[g][1] = L;
      }
      continue;
    }
    const int64_t at = (int64_t(n) * Hq + h0 + g) * splits + split;
    part_acc[at * D + d] = A;
    if (d == 0) {
      part_ml[at * 2] = M;
      part_ml[at * 2 + 1] = L;
    }
  }
  if constexpr (CL) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Block 0 merges the splits that had work, in split order, from the cluster's shared
    // memory: the expressions of attention_decode_combine_kernel.
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's partials are written
    if (split == 0) {
      const int used = (len + chunk - 1) / chunk;
      for (int idx = threadIdx.x; idx < gcount * D; idx += blockDim.x) {
        const int g = idx / D, d = idx % D;
        float M = -INFINITY;
        for (int sp = 0; sp < used; ++sp)
          M = fmaxf(M, cluster.map_shared_rank(&s_pml[g][0], sp)[0]);
        float L = 0.0f, A = 0.0f;
        for (int sp = 0; sp < used; ++sp) {
          const float* ml = cluster.map_shared_rank(&s_pml[g][0], sp);
          const float w = exp2f(ml[0] - M);
          L = fmaf(w, ml[1], L);
          A = fmaf(w, cluster.map_shared_rank(&s_part[g][0], sp)[d], A);
        }
        out[(int64_t(n) * Hq + h0 + g) * D + d] = __float2bfloat16_rn(A / L);
      }
    }
    cluster.sync();  // no block leaves while block 0 reads its shared memory
#else
    __trap();  // launched in clusters only on sm_90+ (detail::sm90_kernels)
#endif
  }
}

// Block (h, n): merges the partials of the splits that had work, in split order.
__global__ void __launch_bounds__(kDecCombineThreads)
    attention_decode_combine_kernel(bf16* __restrict__ out, const float* __restrict__ part_acc,
                                    const float* __restrict__ part_ml,
                                    const int32_t* __restrict__ slot,
                                    const int32_t* __restrict__ pos, int Hq, int D, int P,
                                    int splits) {
  detail::pdl_launch_dependents();  // [PDL]: nothing mutable is read or written before the wait
  detail::pdl_wait();
  const int h = blockIdx.x, n = blockIdx.y;
  bf16* o = out + (int64_t(n) * Hq + h) * D;
  const int p_last = pos[n];
  if (p_last < 0 || p_last >= P || slot[n] < 0) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) o[d] = __float2bfloat16_rn(detail::qnan());
    return;
  }
  const int len = p_last + 1;
  const int used = (len + decode_chunk(len, splits) - 1) / decode_chunk(len, splits);
  const int64_t at = (int64_t(n) * Hq + h) * splits;
  const float* ml = part_ml + at * 2;
  float M = -INFINITY;
  for (int sp = 0; sp < used; ++sp) M = fmaxf(M, ml[2 * sp]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float L = 0.0f, A = 0.0f;
    for (int sp = 0; sp < used; ++sp) {
      const float w = exp2f(ml[2 * sp] - M);
      L = fmaf(w, ml[2 * sp + 1], L);
      A = fmaf(w, part_acc[(at + sp) * D + d], A);
    }
    o[d] = __float2bfloat16_rn(A / L);
  }
}

std::atomic<bool> g_clusters{true};
std::atomic<bool> g_fused_rope{true};

// The most blocks a cluster of the merge takes (16 is beyond the portable 8: allowed on H100 and
// H200, and checked with cudaOccupancyMaxActiveClusters before each use).
constexpr int kDecMaxCluster = 16;

// The arguments of one partial launch; the dispatchers below pick the template.
struct DecodePartialArgs {
  bf16* out;
  float* part_acc;
  float* part_ml;
  const bf16* qkv;
  const bf16* kc;
  const bf16* vc;
  const int32_t* slot;
  const int32_t* pos;
  int N, Hq, Hkv, D, P, splits;
  const DecodeRope* rope;  // null: attention only
};

// Launches the partial kernel (fused with rope_kv_append's work where `rope` is given: [Decode
// rope]); with `cluster` it tries the one-launch path first (clusters of the `splits` blocks of
// a (row, head group)) and returns false when the device cannot run it, launching nothing.
template <int LP, int GM, bool ROPE>
bool launch_decode_partial(bool cluster, const DecodePartialArgs& a, cudaStream_t stream) {
  const int G = a.Hq / a.Hkv;
  const int hgroups = (G + GM - 1) / GM;
  const dim3 grid(unsigned(a.splits), unsigned(a.Hkv * hgroups), unsigned(a.N));
  const float qscale = float(1.4426950408889634 / std::sqrt(double(a.D)));  // log2(e) / sqrt(D)
  const DecodeRope rope = ROPE ? *a.rope : DecodeRope{};
  if (!cluster) {
    detail::launch_pdl(attention_decode_partial_kernel<LP, GM, false, ROPE>, grid,
                       dim3(kDecThreads), 0, stream, a.out, a.part_acc, a.part_ml, a.qkv, a.kc,
                       a.vc, a.slot, a.pos, a.Hq, a.Hkv, a.D, a.P, a.splits, qscale, rope);
    return true;
  }
  auto kernel = attention_decode_partial_kernel<LP, GM, true, ROPE>;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(a.splits);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kDecThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (a.splits > 8)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess || clusters < 1) {
    (void)cudaGetLastError();  // a refused query is no error of the launch
    return false;
  }
  cfg.numAttrs = detail::pdl_active() ? 2 : 1;
  // out is the kernel's only output here: part_acc and part_ml are not touched.
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a.out, a.part_acc, a.part_ml, a.qkv, a.kc, a.vc,
                                a.slot, a.pos, a.Hq, a.Hkv, a.D, a.P, a.splits, qscale, rope));
  return true;
}

template <int LP, int GM>
bool launch_decode_partial_r(bool cluster, const DecodePartialArgs& a, cudaStream_t stream) {
  if (a.rope != nullptr) return launch_decode_partial<LP, GM, true>(cluster, a, stream);
  return launch_decode_partial<LP, GM, false>(cluster, a, stream);
}

template <int LP>
bool launch_decode_partial_g(bool cluster, const DecodePartialArgs& a, cudaStream_t stream) {
  const int G = a.Hq / a.Hkv;
  if (G <= 1) return launch_decode_partial_r<LP, 1>(cluster, a, stream);
  if (G <= 2) return launch_decode_partial_r<LP, 2>(cluster, a, stream);
  if (G <= 4) return launch_decode_partial_r<LP, 4>(cluster, a, stream);
  return launch_decode_partial_r<LP, kDecMaxGroup>(cluster, a, stream);
}

bool launch_decode_partial_d(bool cluster, const DecodePartialArgs& a, cudaStream_t stream) {
  const int L = a.D / 8;
  if (L <= 4) return launch_decode_partial_g<4>(cluster, a, stream);
  if (L <= 8) return launch_decode_partial_g<8>(cluster, a, stream);
  if (L <= 16) return launch_decode_partial_g<16>(cluster, a, stream);
  return launch_decode_partial_g<32>(cluster, a, stream);
}

__global__ void advance_positions_kernel(int32_t* __restrict__ pos, int N) {
  detail::pdl_launch_dependents();  // [PDL]: nothing mutable is read or written before the wait
  detail::pdl_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < N) pos[i] += 1;
}

}  // namespace

void set_attention_decode_clusters(bool on) {
  g_clusters.store(on, std::memory_order_relaxed);
}

void set_decode_fused_rope(bool on) {
  g_fused_rope.store(on, std::memory_order_relaxed);
}

void embedding_at(bf16* out, const int32_t* tokens, const int32_t* pos, const bf16* wte,
                  const bf16* wpe, int N, int C, int V, cudaStream_t stream) {
  TD_CHECK(N >= 0 && C >= 0 && V > 0, "embedding_at: bad shape N={} C={} V={}", N, C, V);
  if (N == 0 || C == 0) return;
  const bool vec = C % 8 == 0 && detail::aligned16(out) && detail::aligned16(wte) &&
                   (!wpe || detail::aligned16(wpe));
  if (vec) {
    detail::launch_pdl(embedding_at_kernel<8>, dim3(grid_for(int64_t(N) * C / 8, kThreads, 65535)),
                       dim3(kThreads), 0, stream, out, tokens, pos, wte, wpe, N, C, V);
  } else {
    detail::launch_pdl(embedding_at_kernel<1>, dim3(grid_for(int64_t(N) * C, kThreads, 65535)),
                       dim3(kThreads), 0, stream, out, tokens, pos, wte, wpe, N, C, V);
  }
}

void rope_kv_append(bf16* qkv, bf16* kcache, bf16* vcache, const int32_t* slot, const int32_t* pos,
                    int N, int Hq, int Hkv, int D, int rotary_dim, float theta, int P,
                    cudaStream_t stream) {
  TD_CHECK(N >= 0 && Hq > 0 && Hkv > 0 && D > 0 && P > 0,
           "rope_kv_append: bad shape N={} Hq={} Hkv={} D={} P={}", N, Hq, Hkv, D, P);
  TD_CHECK(rotary_dim >= 0 && rotary_dim <= D && rotary_dim % 2 == 0,
           "rope_kv_append needs an even rotary_dim in [0, D={}], got {}", D, rotary_dim);
  TD_CHECK(rotary_dim == 0 || theta > 0.0f, "rope_kv_append: bad rope theta={}", theta);
  if (N == 0) return;
  detail::launch_pdl(rope_kv_append_kernel, dim3(unsigned(N)), dim3(128), 0, stream, qkv, kcache,
                     vcache, slot, pos, Hq, Hkv, D, rotary_dim, double(theta), P);
}

bool attention_decode_supported(int D) {
  return D > 0 && D % 8 == 0 && D <= 256;
}

size_t attention_decode_scratch_bytes(int N, int Hq, int Hkv, int D, int P) {
  if (N <= 0 || Hq <= 0 || Hkv <= 0 || D <= 0 || P <= 0) return 0;
  const size_t parts = size_t(N) * size_t(Hq) * size_t(decode_splits(N, Hkv, P));
  return align256(parts * size_t(D) * sizeof(float)) + align256(parts * 2 * sizeof(float));
}

namespace {

void attention_decode_launch(bf16* out, const bf16* qkv, const bf16* kcache, const bf16* vcache,
                             const int32_t* slot, const int32_t* pos, int N, int Hq, int Hkv, int D,
                             int P, void* scratch, size_t scratch_bytes, const DecodeRope* rope,
                             cudaStream_t stream) {
  TD_CHECK(N >= 0 && Hq > 0 && Hkv > 0 && P > 0,
           "attention_decode: bad shape N={} Hq={} Hkv={} D={} P={}", N, Hq, Hkv, D, P);
  TD_CHECK(Hq % Hkv == 0, "attention_decode: Hq={} is not a multiple of Hkv={}", Hq, Hkv);
  TD_CHECK(attention_decode_supported(D),
           "attention_decode needs a head size that is a multiple of 8 up to 256, got {}", D);
  TD_CHECK(detail::aligned16(qkv) && detail::aligned16(kcache) && detail::aligned16(vcache),
           "attention_decode needs 16-byte aligned qkv and cache buffers");
  TD_CHECK(N <= 65535 && Hq <= 65535, "attention_decode: too many rows N={} or heads Hq={}", N, Hq);
  if (N == 0) return;
  detail::check_scratch(scratch, scratch_bytes, attention_decode_scratch_bytes(N, Hq, Hkv, D, P),
                        "attention_decode");
  const int splits = decode_splits(N, Hkv, P);
  const size_t parts = size_t(N) * size_t(Hq) * size_t(splits);
  auto* part_acc = static_cast<float*>(scratch);
  auto* part_ml = reinterpret_cast<float*>(static_cast<char*>(scratch) +
                                           align256(parts * size_t(D) * sizeof(float)));
  // One split: the partial kernel writes the output. Up to kDecMaxCluster splits on sm_90: one
  // launch, the splits merged inside their cluster (where the device can run such clusters).
  bf16* direct = splits == 1 ? out : nullptr;
  DecodePartialArgs a{out, part_acc, part_ml, qkv, kcache, vcache, slot, pos,
                      N,   Hq,       Hkv,     D,   P,      splits, rope};
  if (!direct && splits <= kDecMaxCluster && g_clusters.load(std::memory_order_relaxed) &&
      detail::sm90_kernels() && launch_decode_partial_d(true, a, stream))
    return;
  a.out = direct;
  launch_decode_partial_d(false, a, stream);
  if (direct) return;
  detail::launch_pdl(attention_decode_combine_kernel, dim3(unsigned(Hq), unsigned(N)),
                     dim3(kDecCombineThreads), 0, stream, out, part_acc, part_ml, slot, pos, Hq, D,
                     P, splits);
}

}  // namespace

void attention_decode(bf16* out, const bf16* qkv, const bf16* kcache, const bf16* vcache,
                      const int32_t* slot, const int32_t* pos, int N, int Hq, int Hkv, int D, int P,
                      void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  attention_decode_launch(out, qkv, kcache, vcache, slot, pos, N, Hq, Hkv, D, P, scratch,
                          scratch_bytes, nullptr, stream);
}

void rope_append_attention_decode(bf16* out, bf16* qkv, bf16* kcache, bf16* vcache,
                                  const int32_t* slot, const int32_t* pos, int N, int Hq, int Hkv,
                                  int D, int rotary_dim, float theta, int P, void* scratch,
                                  size_t scratch_bytes, cudaStream_t stream) {
  TD_CHECK(rotary_dim >= 0 && rotary_dim <= D && rotary_dim % 2 == 0,
           "rope_append_attention_decode needs an even rotary_dim in [0, D={}], got {}", D,
           rotary_dim);
  TD_CHECK(rotary_dim == 0 || theta > 0.0f, "rope_append_attention_decode: bad rope theta={}",
           theta);
  if (rotary_dim % 16 != 0 || !g_fused_rope.load(std::memory_order_relaxed)) {
    rope_kv_append(qkv, kcache, vcache, slot, pos, N, Hq, Hkv, D, rotary_dim, theta, P, stream);
    attention_decode(out, qkv, kcache, vcache, slot, pos, N, Hq, Hkv, D, P, scratch, scratch_bytes,
                     stream);
    return;
  }
  const DecodeRope rope{kcache, vcache, rotary_dim, double(theta)};
  attention_decode_launch(out, qkv, kcache, vcache, slot, pos, N, Hq, Hkv, D, P, scratch,
                          scratch_bytes, &rope, stream);
}

void copy_rows(bf16* dst, const bf16* src, int rows, int cols, int64_t src_stride,
               cudaStream_t stream) {
  TD_CHECK(rows >= 0 && cols >= 0 && src_stride >= 0,
           "copy_rows: bad shape rows={} cols={} "
           "src_stride={}",
           rows, cols, src_stride);
  if (rows == 0 || cols == 0) return;
  TD_CHECK(rows == 1 || src_stride >= cols, "copy_rows: src_stride {} < cols {} for {} rows",
           src_stride, cols, rows);
  const size_t width = size_t(cols) * sizeof(bf16);
  if (rows == 1) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, width, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  CUDA_CHECK(cudaMemcpy2DAsync(dst, width, src, size_t(src_stride) * sizeof(bf16), width,
                               size_t(rows), cudaMemcpyDeviceToDevice, stream));
}

void advance_positions(int32_t* pos, int N, cudaStream_t stream) {
  TD_CHECK(N >= 0, "advance_positions: bad N={}", N);
  if (N == 0) return;
  detail::launch_pdl(advance_positions_kernel, dim3(unsigned((N + 255) / 256)), dim3(256), 0,
                     stream, pos, N);
}

}  // namespace tandem::cuda
