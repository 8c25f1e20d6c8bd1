// Flash attention on Hopper's warpgroup MMA (wgmma, sm_90a): the same algorithm, the same
// deterministic split of the backward and the same inputs and outputs as the mma.sync kernels
// of kernels_flash.cu ([Flash layout], [Flash forward], [Flash backward] there), for head sizes
// 64 and 128. Compiled only for sm_90a (cmake/cuda.cmake builds this folder apart), and selected
// with FlashKernels::wgmma (TANDEM_ATTENTION=wgmma for a whole run).
//
// [Wgmma layout] A tile of R rows of D bf16 lives in shared memory as D/64 column chunks, each
// [R][64] with rows of 128 bytes in the 128-byte swizzle: the 16-byte piece p (0..7) of row r
// is stored at piece p ^ (r % 8). Every chunk starts on a 1024-byte boundary (R is a multiple of
// 8), so 8 rows form one swizzle atom. Such a tile is read by wgmma in two ways:
//   - K-major (the reduction runs along D; Q K^T, K Q^T, dO V^T, V dO^T): a descriptor per
//     16-wide k-step, starting at chunk ks / 4, 32 bytes * (ks % 4) into the row, at the first
//     of the 64 (A) or N (B) rows it reads; 8-row groups 1024 bytes apart (SBO);
//   - N-major, as the B operand transposed (the reduction runs along the rows; P V, dS K, P^T dO,
//     dS^T Q): a descriptor per 16-row k-step at row 16 ks; 8-row groups 1024 bytes apart (SBO)
//     and the second 64-column chunk of D = 128 R * 128 bytes further (LBO).
// Scores and probabilities never leave registers: the accumulator of a warp's 16 rows has the
// A-operand layout of the next product (pack_a), as with mma.sync.
//
// [Wgmma kernels] A block is two warpgroups (256 threads), each owning 64 rows: queries in the
// forward and in dQ, keys in dK/dV. All threads stage the next tile with cp.async while the
// current one is multiplied (double buffering), then fence the async proxy and meet at a
// barrier; a product's result is waited for before it is used. The causal skips are per
// warpgroup (wgmma is a warpgroup instruction), and the masks per element as in the mma.sync
// kernels. Sums run in another order than there, so the outputs agree within bf16 rounding,
// not bitwise.
//
// [Wgmma backward overlap] One block per SM (dK/dV) or two (dQ at head size 64) leave few warps
// to hide a wait, so within a tile each product goes out as its own committed group and the
// warpgroup waits only for the one it needs next (wgmma.wait_group N: all but the newest N
// groups done): S^T and dP^T are issued together and the exponentials of P^T run while dP^T
// is multiplied; dV += P^T dO is issued at once and dS^T is formed while it runs; then dK +=
// dS^T Q. In dQ, P is formed while dP is multiplied. The same products in the same order as
// waiting for each pair: the same bits, fewer idle tensor-core cycles.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "core/error.h"

#include "device/cuda/cuda_check.h"
#include "device/cuda/flash_common.cuh"
#include "device/cuda/flash_wgmma.h"
#include "device/cuda/kernels.cuh"
#include "device/cuda/sm90a/wgmma.cuh"
#include "device/kernels.h"

namespace tandem::cuda {

namespace {

using namespace flash;

constexpr int kGroups = 2;               // warpgroups per block
constexpr int kThreads = 128 * kGroups;  // threads per block
constexpr int kRows = 64 * kGroups;      // rows a block owns (queries or keys)
constexpr size_t kAlignSlack = 1024;     // dynamic shared memory is aligned by hand

// The block's shared memory, rounded up to the 1024-byte boundary the swizzle needs.
__device__ __forceinline__ bf16* smem_base() {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t a = smem_u32(smem_raw);
  return reinterpret_cast<bf16*>(smem_raw + ((1024 - (a & 1023)) & 1023));
}

// Waits for this thread's copies (all but the newest N groups), publishes them to wgmma and to
// the block.
template <int N>
__device__ __forceinline__ void tiles_ready() {
  cp_async_wait<N>();
  fence_proxy_async_smem();
  __syncthreads();
}

// Key/value tile j of nkt (double-buffered in k_s, v_s: tile j in buffer j % 2): stages tile
// j + 1 into the other buffer, then waits for tile j and publishes it.
template <int BC, int D>
__device__ __forceinline__ void next_kv_tile(bf16* k_s, bf16* v_s, int j, int nkt, const bf16* kg,
                                             const bf16* vg, int64_t S, int T, int tid) {
  if (j + 1 < nkt) {
    const int buf = (j + 1) & 1, k1 = (j + 1) * BC;
    const int valid = min(BC, T - k1);
    load_tile_sw<BC, D, kThreads>(k_s + buf * BC * D, kg + k1 * S, S, valid, tid);
    load_tile_sw<BC, D, kThreads>(v_s + buf * BC * D, vg + k1 * S, S, valid, tid);
    cp_async_commit();
    tiles_ready<1>();
  } else {
    tiles_ready<0>();
  }
}

// x = A B^T over D (both operands K-major): A rows row0..row0 + 63 of a tile of RA rows, B all
// RB rows of its tile; issued as one committed group and not waited for ([Wgmma backward
// overlap]). The caller fences before the first of a batch and waits before reading x.
template <int D, int RA, int RB, int N>
__device__ __forceinline__ void kmajor_issue(float (&x)[N][4], const bf16* a, const bf16* b,
                                             int row0) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wgmma_ss(x, desc_k<RA>(a, row0, kk), desc_k<RB>(b, 0, kk), kk);
  wgmma_commit();
}

// ---- Forward ----------------------------------------------------------------------------------

// [Wgmma tiles] Keys per tile BC: 64 at head size 64, 128 at head size 128 by default. At 64
// BC = 64 needs 107 registers, so two blocks (four warpgroups) share an SM and one block's
// softmax overlaps the other's products; BC = 128 needs 160 and one block per SM, whose two
// warpgroups meet at every tile's barrier (GPT-2 124M on an H100: 144.4 against 112.5 us a
// layer). At head size 128 one block runs per SM either way; BC = 128 (210 registers, 234
// pipelined) halves the tiles and widens Q K^T to m64n128 (Llama-1B: 218.4 against 230.1 us).
// flash_attention_set_wgmma_key_tile overrides the choice, for the tests and the benchmarks
// that compare the two.
template <int D, int BC>
struct WgFwdCfg {
  static constexpr int kBc = BC;
  static constexpr int kBlocks = D == 64 && BC == 64 ? 2 : 1;  // blocks per SM (registers)
  // Q [kRows][D], K and V [2][kBc][D]
  static constexpr size_t kSmem = size_t(kRows + 4 * kBc) * D * sizeof(bf16) + kAlignSlack;
};

// Online softmax of a warp's 16 rows over one key tile, as the mma.sync forward does: s (the
// scaled-by-sc2 scores, masked past the diagonal where `diag`) becomes P = exp2(s - m_new) in
// place; m and l advance, and alpha is what rows g and g + 8 of the output are rescaled by.
template <int kBc>
__device__ __forceinline__ void softmax_tile(float (&s)[kBc / 8][4], float (&alpha)[2],
                                             float (&m)[2], float (&l)[2], float sc2, bool diag,
                                             int k0, int qw0, int g, int c) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = s[nt][e] * sc2;
      if (diag && k0 + nt * 8 + 2 * c + (e & 1) > qw0 + g + (e >> 1) * 8) x = -INFINITY;
      s[nt][e] = x;
      mx[e >> 1] = fmaxf(mx[e >> 1], x);
    }
  }
  float base[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float mnew = fmaxf(m[r], quad_max(mx[r]));
    base[r] = mnew == -INFINITY ? 0.0f : mnew;  // a row with nothing visible yet
    alpha[r] = exp2f(m[r] - base[r]);
    m[r] = mnew;
  }
  float ls[2] = {0.0f, 0.0f};
#pragma unroll
  for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = exp2f(s[nt][e] - base[e >> 1]);
      s[nt][e] = p;
      ls[e >> 1] += p;
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + ls[r];
}

template <int D>
__device__ __forceinline__ void rescale_rows(float (&o)[D / 8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    o[dt][0] *= alpha[0];
    o[dt][1] *= alpha[0];
    o[dt][2] *= alpha[1];
    o[dt][3] *= alpha[1];
  }
}

// Epilogue of the forward: O / l into the row layout, lse = ln(sum exp(scaled scores)).
template <int D>
__device__ __forceinline__ void store_rows(bf16* out, float* lse, const float (&o)[D / 8][4],
                                           const float (&m)[2], const float (&l)[2], int64_t b,
                                           int h, int bh, int T, int Hq, int qw0, int g, int c) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float lsum = quad_sum(l[r]);
    const int q = qw0 + g + 8 * r;
    if (q < T) {
      const float inv = 1.0f / lsum;
      bf16* po = out + (b * T + q) * (int64_t(Hq) * D) + int64_t(h) * D + 2 * c;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt)
        store_bf16x2(po + dt * 8, o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
      if (lse != nullptr && c == 0) lse[int64_t(bh) * T + q] = (m[r] + log2f(lsum)) * kLn2;
    }
  }
}

// What a forward block works on: its shared tiles (Q [kRows][D], K and V [2][kBc][D]), its
// (b, h), its kRows queries (the heaviest tiles first) and this thread's place among them, and
// where the keys and values of its kv head start; the key tiles run up to the diagonal.
template <int D, int kBc>
struct FwdBlock {
  bf16 *q_s, *k_s, *v_s;
  int tid, wg, g, c, bh, b, h, q0, q_end, nkt, qg0, qw0;
  int64_t S;  // the row stride of qkv
  const bf16 *kg, *vg;

  __device__ __forceinline__ FwdBlock(const bf16* qkv, int T, int Hq, int Hkv) {
    q_s = smem_base();
    k_s = q_s + kRows * D;
    v_s = k_s + 2 * kBc * D;
    tid = threadIdx.x;
    const int lane = tid & 31, wl = (tid >> 5) & 3;
    wg = tid >> 7;
    g = lane >> 2;
    c = lane & 3;
    bh = blockIdx.x;
    b = bh / Hq;
    h = bh % Hq;
    const int kvh = h / (Hq / Hkv);
    q0 = (gridDim.y - 1 - blockIdx.y) * kRows;
    S = int64_t(Hq + 2 * Hkv) * D;
    kg = qkv + int64_t(b) * T * S + int64_t(Hq + kvh) * D;
    vg = kg + int64_t(Hkv) * D;
    q_end = min(q0 + kRows, T);
    nkt = (q_end - 1) / kBc + 1;
    qg0 = q0 + 64 * wg;   // this warpgroup's first query
    qw0 = qg0 + 16 * wl;  // this warp's
  }
  // Stages the block's queries (not committed).
  __device__ __forceinline__ void load_q(const bf16* qkv, int T) const {
    load_tile_sw<kRows, D, kThreads>(q_s, qkv + (int64_t(b) * T + q0) * S + int64_t(h) * D, S,
                                     q_end - q0, tid);
  }
};

// The pieces of a forward step. S = Q K^T for the warpgroup's 64 queries, as one group.
template <int D, int kBc>
__device__ __forceinline__ void qk_issue(float (&s)[kBc / 8][4], const bf16* q_s, const bf16* ks,
                                         int wg) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wgmma_ss(s, desc_k<kRows>(q_s, 64 * wg, kk), desc_k<kBc>(ks, 0, kk), kk);
  wgmma_commit();
}
// O += P V as one group: P from registers, V N-major.
template <int kBc, int N>
__device__ __forceinline__ void pv_issue(float (&o)[N][4], uint32_t (&pa)[kBc / 16][4],
                                         const bf16* vs) {
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) wgmma_rs_nmajor(o, pa[kk], desc_n<kBc>(vs, kk));
  wgmma_commit();
}
// O += P V, waited for.
template <int kBc, int N>
__device__ __forceinline__ void pv_last(float (&o)[N][4], uint32_t (&pa)[kBc / 16][4],
                                        const bf16* vs) {
  wgmma_hold(pa);
  wgmma_hold(o);
  wgmma_fence();
  pv_issue<kBc>(o, pa, vs);
  wgmma_wait<0>();
  wgmma_hold(o);
  wgmma_hold(pa);
}
template <int kBc>
__device__ __forceinline__ void pack_p(uint32_t (&pa)[kBc / 16][4], const float (&s)[kBc / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) pack_a(pa[kk], s[2 * kk], s[2 * kk + 1]);
}

// S = Q K^T over key tile k0 (64 x kBc per warpgroup), waited for; then its online softmax (P
// in s) and O rescaled.
template <int D, int kBc>
__device__ __forceinline__ void qk_softmax(float (&s)[kBc / 8][4], float (&o)[D / 8][4],
                                           float (&m)[2], float (&l)[2], const FwdBlock<D, kBc>& f,
                                           const bf16* ks, float sc2, int k0) {
  wgmma_hold(s);
  wgmma_fence();
  qk_issue<D, kBc>(s, f.q_s, ks, f.wg);
  wgmma_wait<0>();
  wgmma_hold(s);
  float alpha[2];
  softmax_tile<kBc>(s, alpha, m, l, sc2, k0 + kBc - 1 > f.qw0, k0, f.qw0, f.g, f.c);
  rescale_rows<D>(o, alpha);
}

// grid (B*Hq, ceil(T / kRows)); sc2 = log2(e) / sqrt(D).
template <int D, int BC>
__global__ void __launch_bounds__(kThreads, WgFwdCfg<D, BC>::kBlocks)
    wg_flash_fwd_kernel(bf16* __restrict__ out, float* __restrict__ lse,
                        const bf16* __restrict__ qkv, int T, int Hq, int Hkv, float sc2) {
  constexpr int kBc = WgFwdCfg<D, BC>::kBc;
  const FwdBlock<D, kBc> f(qkv, T, Hq, Hkv);

  f.load_q(qkv, T);
  load_tile_sw<kBc, D, kThreads>(f.k_s, f.kg, f.S, min(kBc, T), f.tid);
  load_tile_sw<kBc, D, kThreads>(f.v_s, f.vg, f.S, min(kBc, T), f.tid);
  cp_async_commit();

  float o[D / 8][4] = {};  // unnormalised output rows g, g+8
  float s[kBc / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int j = 0; j < f.nkt; ++j) {
    const int buf = j & 1;
    next_kv_tile<kBc, D>(f.k_s, f.v_s, j, f.nkt, f.kg, f.vg, f.S, T, f.tid);
    const int k0 = j * kBc;
    if (f.qg0 < T && k0 <= f.qg0 + 63) {  // some key of the tile is visible to the warpgroup
      const bf16* ks = f.k_s + buf * kBc * D;
      const bf16* vs = f.v_s + buf * kBc * D;
      qk_softmax<D, kBc>(s, o, m, l, f, ks, sc2, k0);
      // O += P V: P from registers, V N-major.
      uint32_t pa[kBc / 16][4];
      pack_p<kBc>(pa, s);
      pv_last<kBc>(o, pa, vs);
    }
    __syncthreads();  // the buffer just read is refilled by the next iteration's prefetch
  }

  store_rows<D>(out, lse, o, m, l, f.b, f.h, f.bh, T, Hq, f.qw0, f.g, f.c);
}

// [Wgmma forward pipeline] The kernel above waits for S = Q K^T, forms P, then waits for
// O += P V, so a warpgroup's tensor-core work stops while its softmax runs. Here a warpgroup
// issues tile j's S together with tile j - 1's P V and forms P_j while P V runs: P_{j-1} stays
// packed in registers until its product is waited for, P_j waits in the fp32 scores, and O is
// rescaled by alpha_j once P_{j-1} V_{j-1} is in it. O sees the same operations in the same
// order (alpha_j, then + P_j V_j), so the output is the same bits. Key tile j and value tile
// j - 1 are read in step j, so they load together: group 0 is Q and K_0, group j >= 1 is
// V_{j-1} and K_j, issued at the end of step j - 2 into the buffers that step j - 2 freed.
template <int D, int BC>
__global__ void __launch_bounds__(kThreads, WgFwdCfg<D, BC>::kBlocks)
    wg_flash_fwd_pipe_kernel(bf16* __restrict__ out, float* __restrict__ lse,
                             const bf16* __restrict__ qkv, int T, int Hq, int Hkv, float sc2) {
  constexpr int kBc = WgFwdCfg<D, BC>::kBc;
  const FwdBlock<D, kBc> f(qkv, T, Hq, Hkv);
  auto load_k = [&](int j) {
    load_tile_sw<kBc, D, kThreads>(f.k_s + (j & 1) * kBc * D, f.kg + int64_t(j) * kBc * f.S, f.S,
                                   min(kBc, T - j * kBc), f.tid);
  };
  auto load_v = [&](int j) {
    load_tile_sw<kBc, D, kThreads>(f.v_s + (j & 1) * kBc * D, f.vg + int64_t(j) * kBc * f.S, f.S,
                                   min(kBc, T - j * kBc), f.tid);
  };

  f.load_q(qkv, T);
  load_k(0);
  cp_async_commit();
  load_v(0);
  if (f.nkt > 1) load_k(1);
  cp_async_commit();

  float o[D / 8][4] = {};  // unnormalised output rows g, g+8
  float s[kBc / 8][4] = {};
  uint32_t pa[kBc / 16][4] = {};  // P of the previous tile, waiting for its P V
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  bool pending = false;  // the warpgroup holds a P whose P V is not issued yet

  for (int j = 0; j < f.nkt; ++j) {
    tiles_ready<1>();  // group j: K_j and V_{j-1}
    const int k0 = j * kBc;
    // Some key of the tile is visible to the warpgroup (a prefix of the tiles, per warpgroup).
    const bool active = f.qg0 < T && k0 <= f.qg0 + 63;
    const bf16* ks = f.k_s + (j & 1) * kBc * D;
    const bf16* vs = f.v_s + ((j + 1) & 1) * kBc * D;  // V_{j-1}
    // Each case runs from its fence to its last wait inside one branch: a product waited for
    // in another branch than the one that issued it makes ptxas serialize every wgmma.
    if (active && pending) {
      wgmma_hold(s);
      wgmma_hold(pa);
      wgmma_hold(o);
      wgmma_fence();
      qk_issue<D, kBc>(s, f.q_s, ks, f.wg);
      pv_issue<kBc>(o, pa, vs);
      wgmma_wait<1>();  // S, the older group
      wgmma_hold(s);
      float alpha[2];
      softmax_tile<kBc>(s, alpha, m, l, sc2, k0 + kBc - 1 > f.qw0, k0, f.qw0, f.g, f.c);
      wgmma_wait<0>();
      wgmma_hold(o);
      wgmma_hold(pa);
      rescale_rows<D>(o, alpha);
      pack_p<kBc>(pa, s);
    } else if (active) {  // the first tile
      qk_softmax<D, kBc>(s, o, m, l, f, ks, sc2, k0);
      pack_p<kBc>(pa, s);
    } else if (pending) {  // past the warpgroup's last visible tile: its P V only
      pv_last<kBc>(o, pa, vs);
    }
    pending = active;
    __syncthreads();  // K_j and V_{j-1} are read: their buffers take group j + 2
    if (j + 1 < f.nkt) load_v(j + 1);
    if (j + 2 < f.nkt) load_k(j + 2);
    cp_async_commit();
  }
  tiles_ready<0>();  // V of the last tile
  if (pending) pv_last<kBc>(o, pa, f.v_s + ((f.nkt - 1) & 1) * kBc * D);

  store_rows<D>(out, lse, o, m, l, f.b, f.h, f.bh, T, Hq, f.qw0, f.g, f.c);
}

// [Wgmma TMA forward] The pipelined forward with its loads and barriers changed: one thread
// issues every tile as tensor-memory-access copies (cp.async.bulk.tensor, the tensor map's
// 128-byte swizzle is [Wgmma layout]) that complete an mbarrier per buffer, instead of all
// threads copying 16 bytes at a time and meeting at the block's barrier every tile. Key and
// value tiles each have three buffers, each with a "full" mbarrier (the copy's bytes landed)
// and an "empty" one (every warp of both warpgroups is done reading it), so the warpgroups
// drift apart: each waits only for the tiles it reads. They take turns to issue their
// products (named barriers 1 and 2; warpgroup 0 first): warpgroup 1's products run on the
// tensor cores while warpgroup 0 forms its P, and the other way round. Thread 0 issues key
// tile j + 1 and value tile j in step j, right after its warpgroup's turn opens: by then the
// other warpgroup has issued its step j - 1, so it has finished step j - 2, and the buffers
// these tiles go to (last read in step j - 2) are free without waiting. Rows past the end of a
// sequence come from the next one (zeros past the last): the causal mask hides those keys
// (their P is 0, whatever they hold) and those queries are never stored. O sees the same
// operations in the same order as in the pipelined kernel: the same bits. Per layer on an H100:
// Llama-3-8B at 8192 tokens 1394 -> 1208 us (394 -> 455 TFLOP/s), Llama-1B 220.6 -> 193.9 us;
// with 64-key tiles at head size 64, where two blocks share an SM and already hide each
// other's softmax, 112.7 against 114.0 us. So ForwardLoads::automatic takes it with 128-key
// tiles (head size 128's default) and the threads' copies with 64-key ones.
template <int D, int BC>
struct WgTmaCfg {
  static constexpr int kBc = BC;
  static constexpr int kStages = 3;
  static constexpr int kBlocks = D == 64 && BC == 64 ? 2 : 1;
  // Q [kRows][D], K and V [kStages][kBc][D]: 225 KiB at D = 128, BC = 128
  static constexpr size_t kSmem =
      size_t(kRows + 2 * kStages * kBc) * D * sizeof(bf16) + kAlignSlack;
};

template <int D, int BC>
__global__ void __launch_bounds__(kThreads, WgTmaCfg<D, BC>::kBlocks)
    wg_flash_fwd_tma_kernel(bf16* __restrict__ out, float* __restrict__ lse,
                            const __grid_constant__ CUtensorMap qkv_map, int T, int Hq, int Hkv,
                            float sc2) {
  using C = WgTmaCfg<D, BC>;
  constexpr int kBc = C::kBc, NS = C::kStages;
  constexpr uint32_t kTileBytes = uint32_t(kBc) * D * sizeof(bf16);
  // Q; then full K, full V, empty K, empty V, one per buffer
  __shared__ __align__(8) uint64_t bars[1 + 4 * NS];
  uint64_t* const q_full = bars;
  uint64_t* const k_full = bars + 1;
  uint64_t* const v_full = k_full + NS;
  uint64_t* const k_empty = v_full + NS;
  uint64_t* const v_empty = k_empty + NS;

  bf16* const q_s = smem_base();
  bf16* const k_s = q_s + kRows * D;
  bf16* const v_s = k_s + NS * kBc * D;
  const int tid = threadIdx.x, lane = tid & 31, wl = (tid >> 5) & 3, wg = tid >> 7;
  const int g = lane >> 2, c = lane & 3;
  const int bh = blockIdx.x, b = bh / Hq, h = bh % Hq, kvh = h / (Hq / Hkv);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kRows;
  const int q_end = min(q0 + kRows, T), nkt = (q_end - 1) / kBc + 1;
  const int qg0 = q0 + 64 * wg, qw0 = qg0 + 16 * wl;
  const int row0 = b * T;  // this sequence's first row of qkv
  const int k_col = (Hq + kvh) * D, v_col = (Hq + Hkv + kvh) * D;

  // Tile j of keys (or values) into its buffer, D / 64 boxes of kBc rows.
  auto load_kv = [&](bf16* tiles, uint64_t* full, uint64_t* empty, int col, int j) {
    const int st = j % NS;
    if (j >= NS) mbar_wait(&empty[st], uint32_t((j / NS - 1) & 1));
    mbar_arrive_expect(&full[st], kTileBytes);
    bf16* dst = tiles + st * kBc * D;
#pragma unroll
    for (int cc = 0; cc < D / 64; ++cc)
      tma_load_2d(dst + cc * kBc * 64, &qkv_map, &full[st], col + cc * 64, row0 + j * kBc);
  };
  if (tid == 0) {
    mbar_init(q_full, 1);
    for (int i = 0; i < NS; ++i) {
      mbar_init(&k_full[i], 1);
      mbar_init(&v_full[i], 1);
      mbar_init(&k_empty[i], kThreads / 32);
      mbar_init(&v_empty[i], kThreads / 32);
    }
    mbar_init_fence();
  }
  __syncthreads();
  if (tid == 0) {
    mbar_arrive_expect(q_full, uint32_t(kRows) * D * sizeof(bf16));
#pragma unroll
    for (int cc = 0; cc < D / 64; ++cc)
#pragma unroll
      for (int r = 0; r < kRows; r += kBc)
        tma_load_2d(q_s + cc * kRows * 64 + r * 64, &qkv_map, q_full, h * D + cc * 64,
                    row0 + q0 + r);
    load_kv(k_s, k_full, k_empty, k_col, 0);
  }
  __syncwarp();
  // Each warp's lane 0 tells the issuer that the warp is done with a buffer.
  auto release = [&](uint64_t* empty) {
    __syncwarp();
    if (lane == 0) mbar_arrive(empty);
  };
  // Barrier 1 + w opens warpgroup w's turn. Warpgroup 1 lets warpgroup 0 go first; its last
  // step passes no turn, so every phase of both barriers has 128 threads waiting and 128
  // arriving.
  if (wg == 1) named_arrive<1, kThreads>();
  auto wait_turn = [&] {
    if (wg == 0) {
      named_sync<1, kThreads>();
    } else {
      named_sync<2, kThreads>();
    }
  };
  auto pass_turn = [&](int j) {
    if (wg == 0) {
      named_arrive<2, kThreads>();
    } else if (j + 1 < nkt) {
      named_arrive<1, kThreads>();
    }
  };

  float o[D / 8][4] = {};  // unnormalised output rows g, g+8
  float s[kBc / 8][4] = {};
  uint32_t pa[kBc / 16][4] = {};  // P of the previous tile, waiting for its P V
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  bool pending = false;  // the warpgroup holds a P whose P V is not issued yet
  mbar_wait(q_full, 0);

  for (int j = 0; j < nkt; ++j) {
    const int k0 = j * kBc, sk = j % NS, sv = (j + NS - 1) % NS;
    const bool active = qg0 < T && k0 <= qg0 + 63;
    const bf16* ks = k_s + sk * kBc * D;
    const bf16* vs = v_s + sv * kBc * D;  // V_{j-1}
    if (active) mbar_wait(&k_full[sk], uint32_t((j / NS) & 1));
    if (pending) mbar_wait(&v_full[sv], uint32_t(((j - 1) / NS) & 1));
    wait_turn();
    if (tid == 0) {
      if (j + 1 < nkt) load_kv(k_s, k_full, k_empty, k_col, j + 1);
      load_kv(v_s, v_full, v_empty, v_col, j);
    }
    __syncwarp();
    // Each case runs from its fence to its last wait inside one branch ([Wgmma forward
    // pipeline]).
    if (active && pending) {
      wgmma_hold(s);
      wgmma_hold(pa);
      wgmma_hold(o);
      wgmma_fence();
      qk_issue<D, kBc>(s, q_s, ks, wg);
      pv_issue<kBc>(o, pa, vs);
      pass_turn(j);
      wgmma_wait<1>();  // S, the older group
      wgmma_hold(s);
      release(&k_empty[sk]);
      float alpha[2];
      softmax_tile<kBc>(s, alpha, m, l, sc2, k0 + kBc - 1 > qw0, k0, qw0, g, c);
      wgmma_wait<0>();
      wgmma_hold(o);
      wgmma_hold(pa);
      release(&v_empty[sv]);
      rescale_rows<D>(o, alpha);
      pack_p<kBc>(pa, s);
    } else if (active) {  // the first tile
      wgmma_hold(s);
      wgmma_fence();
      qk_issue<D, kBc>(s, q_s, ks, wg);
      pass_turn(j);
      wgmma_wait<0>();
      wgmma_hold(s);
      release(&k_empty[sk]);
      float alpha[2];
      softmax_tile<kBc>(s, alpha, m, l, sc2, k0 + kBc - 1 > qw0, k0, qw0, g, c);
      rescale_rows<D>(o, alpha);
      pack_p<kBc>(pa, s);
    } else if (pending) {  // past the warpgroup's last visible tile: its P V only
      wgmma_hold(pa);
      wgmma_hold(o);
      wgmma_fence();
      pv_issue<kBc>(o, pa, vs);
      pass_turn(j);
      wgmma_wait<0>();
      wgmma_hold(o);
      wgmma_hold(pa);
      release(&k_empty[sk]);
      release(&v_empty[sv]);
    } else {
      pass_turn(j);
      release(&k_empty[sk]);
      if (j > 0) release(&v_empty[sv]);
    }
    pending = active;
  }
  if (pending) {
    const int st = (nkt - 1) % NS;
    mbar_wait(&v_full[st], uint32_t(((nkt - 1) / NS) & 1));
    pv_last<kBc>(o, pa, v_s + st * kBc * D);
  }

  store_rows<D>(out, lse, o, m, l, int64_t(b), h, bh, T, Hq, qw0, g, c);
}

// ---- Backward: dK, dV -------------------------------------------------------------------------

// [Wgmma dK/dV tiles] Queries per tile BR: 64. At head size 128 that takes 252 registers a
// thread (no spills) and makes S^T and dP^T m64n64 products; 32 queries take 206 registers and
// twice the tiles and barriers, and were 17% slower (Llama-1B on an H100: 747.8 against 638.1
// us a layer for the whole backward). flash_attention_set_wgmma_dkv_query_tile(32) selects
// them at head size 128, for the tests and the benchmarks that compare the two.
// [Wgmma one-pass backward] The dK/dV kernel also forms dQ, so the backward runs five
// products per (query tile, key tile) instead of seven (the dQ kernel recomputes S and dP).
// After dK's product is issued each warpgroup writes its dS^T (the bf16 that product reads) to
// shared memory and the block meets. At head size 128 warpgroup w multiplies dS (64 queries x
// 128 keys, read M-major) by columns 64 w.. of K into 64 x 64 fp32 registers; at 64 (where a
// column half would be an m64n32 product from half a swizzled row) warpgroup w multiplies its
// own 64 keys' dS by their rows of K, all 64 columns. Each thread then holds 32 fp32 of the
// tile's dQ share over this block's keys.
//
// [Wgmma bulk dQ] The shares go to shared memory in the accumulator's own order (a warp's
// 16-byte stores cover 512 contiguous bytes), the next tile's barrier publishes them, and one
// thread sends the whole tile to an fp32 accumulator as one bulk reduction
// (cp.reduce.async.bulk ... add.f32): the tensor-memory-access unit reads it and the L2 adds
// it while the block goes on; the thread waits for that read only at the next tile's dS
// barrier, before the bulk tile is written again. So that one contiguous reduction covers a tile,
// the accumulator is tile-major in that order: tile (b, h, m) is 64 x D fp32 at ((b Hq + h) nqt +
// m) 64 D, element (warpgroup wg, slot j, thread t of the warpgroup, e) at ((wg 8 + j) 128 + t) 4 +
// e holding dQ[16 wl + g + 8 (e / 2)][64 wg + 8 j + 2 c + e % 2] (head size 128; at 64 both
// warpgroups' shares of all 64 columns are added into the one half, wg = 0, by two reductions). A
// last kernel scales it into dqkv's q columns as bf16. The L2 adds the key tiles' shares in
// whatever order they arrive, so dQ is not the same bits on every run (dK and dV are, and are
// the two-pass form's bits: the walk and its sums are the same). Forms that kept dQ
// deterministic lost: adding in key-tile order behind a flag per (b, h, query tile), loaded or
// sent as red.global.add, made the blocks of a kv head wait on each other's adds (Llama-3-8B
// at 8192 tokens on an H100: 10.1 and 5.7 ms a layer against 4.2 in two passes); and every
// thread's own atomic adds stalled the block on them (4.15 ms, against 3.78 for the bulk form
// with a barrier of its own; RESULTS.md, 2026-12-07).
template <int D, int BR, bool ONE_PASS>
struct WgDkvCfg {
  static constexpr int kBr = BR;  // queries per tile (registers: dK, dV, S^T, dP^T)
  // [Wgmma bulk dQ]: every thread's 32 accumulator registers, in their order.
  static constexpr int kBulkFloats = ONE_PASS ? kThreads * 32 : 0;
  // K, V [kRows][D]; Q, dO [2][kBr][D]; dS^T [kRows][kBr] (one pass); lse2, dvec [2][kBr] fp32;
  // the bulk tile (one pass)
  static constexpr size_t kSmem = size_t(2 * kRows + 4 * kBr) * D * sizeof(bf16) +
                                  (ONE_PASS ? size_t(kRows) * kBr * sizeof(bf16) : 0) +
                                  size_t(4 * kBr) * sizeof(float) +
                                  size_t(kBulkFloats) * sizeof(float) + kAlignSlack;
};

// grid (B*Hkv, ceil(T / kRows)): dK, dV of kRows keys of one kv head, summed over its G query
// heads (in a fixed order), written into dqkv. One pass: also each query tile's dQ over these
// keys, added into dq_acc ([Wgmma one-pass backward], [Wgmma bulk dQ]).
template <int D, int BR, bool ONE_PASS>
__global__ void __launch_bounds__(kThreads, 1)
    wg_flash_bwd_dkv_kernel(bf16* __restrict__ dqkv, float* __restrict__ dq_acc,
                            const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                            const float* __restrict__ lse2, const float* __restrict__ dvec, int T,
                            int Hq, int Hkv, float sc2, float scale) {
  using C = WgDkvCfg<D, BR, ONE_PASS>;
  constexpr int kBr = C::kBr;
  constexpr bool kOnePass = ONE_PASS;
  constexpr int kBulkBytes = C::kBulkFloats * int(sizeof(float));
  static_assert(!kOnePass || BR == 64, "one pass: 64-query tiles");
  bf16* k_s = smem_base();
  bf16* v_s = k_s + kRows * D;
  bf16* q_s = v_s + kRows * D;     // [2][kBr][D]
  bf16* o_s = q_s + 2 * kBr * D;   // dO, [2][kBr][D]
  bf16* ds_s = o_s + 2 * kBr * D;  // dS^T [kRows][kBr], one pass only
  float* l_s = reinterpret_cast<float*>(ds_s + (kOnePass ? kRows * kBr : 0));  // lse2 [2][kBr]
  float* d_s = l_s + 2 * kBr;                                                  // dvec [2][kBr]
  float* b_s = d_s + 2 * kBr;  // [Wgmma bulk dQ] (one pass); 16-byte aligned

  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wl = (tid >> 5) & 3;
  const int g = lane >> 2, c = lane & 3;
  const int b = blockIdx.x / Hkv, kvh = blockIdx.x % Hkv, G = Hq / Hkv;
  const int kt = int(blockIdx.y), k0 = kt * kRows;  // tile 0 has the most work and goes first
  const int64_t S = int64_t(Hq + 2 * Hkv) * D, SO = int64_t(Hq) * D;
  const bf16* kg = qkv + (int64_t(b) * T + k0) * S + int64_t(Hq + kvh) * D;
  load_tile_sw<kRows, D, kThreads>(k_s, kg, S, min(kRows, T - k0), tid);
  load_tile_sw<kRows, D, kThreads>(v_s, kg + int64_t(Hkv) * D, S, min(kRows, T - k0), tid);

  // Iterations it = 0..total-1 over the (query head, query tile) pairs whose tiles hold queries
  // >= k0: head by head, tiles upwards.
  const int nqt = (T + kBr - 1) / kBr, qt_first = k0 / kBr;
  const int per_head = nqt - qt_first, total = G * per_head;
  auto head_of = [&](int it) { return kvh * G + it / per_head; };
  auto tile_of = [&](int it) { return qt_first + it % per_head; };
  auto load_queries = [&](int it, int buf) {
    const int h = head_of(it);
    const int q0 = tile_of(it) * kBr;
    const int valid = min(kBr, T - q0);
    const int64_t row = int64_t(b) * T + q0;
    load_tile_sw<kBr, D, kThreads>(q_s + buf * kBr * D, qkv + row * S + int64_t(h) * D, S, valid,
                                   tid);
    load_tile_sw<kBr, D, kThreads>(o_s + buf * kBr * D, dout + row * SO + int64_t(h) * D, SO, valid,
                                   tid);
    const int64_t st = (int64_t(b) * Hq + h) * T + q0;
    for (int i = tid; i < 2 * kBr; i += kThreads) {
      const int qi = i % kBr;
      const bool ok = qi < valid;
      const float* src = (i < kBr ? lse2 : dvec) + (ok ? st + qi : 0);
      cp_async4((i < kBr ? l_s : d_s) + buf * kBr + qi, src, ok);
    }
  };
  load_queries(0, 0);
  cp_async_commit();

  const int kg0 = k0 + 64 * wg;   // this warpgroup's first key
  const int kw0 = kg0 + 16 * wl;  // this warp's
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  float st[kBr / 8][4] = {}, dpt[kBr / 8][4] = {};
  // One pass: a 64 x 64 share of the tile's dQ. Head size 128: columns 64 wg.. over the block's
  // keys; 64: every column over this warpgroup's keys.
  float dqp[kOnePass ? 8 : 1][4] = {};
  uint32_t pa[kBr / 16][4], sa[kBr / 16][4];
  // [Wgmma bulk dQ] Sends the bulk tile (iteration it's dQ shares, published by a barrier since)
  // to the accumulator: one thread, one reduction at head size 128, two into the same tile at 64.
  auto send_dq = [&](int it) {
    if (tid != 0) return;
    float* tile = dq_acc + ((int64_t(b) * Hq + head_of(it)) * nqt + tile_of(it)) * int64_t(kBr) * D;
    if constexpr (D == 128) {
      bulk_reduce_add_f32(tile, b_s, uint32_t(kBulkBytes));
    } else {
      bulk_reduce_add_f32(tile, b_s, uint32_t(kBulkBytes / 2));
      bulk_reduce_add_f32(tile, b_s + C::kBulkFloats / 2, uint32_t(kBulkBytes / 2));
    }
    bulk_commit();
  };
  for (int it = 0; it < total; ++it) {
    const int buf = it & 1;
    if (it + 1 < total) {
      load_queries(it + 1, buf ^ 1);
      cp_async_commit();
      tiles_ready<1>();
    } else {
      tiles_ready<0>();
    }
    if constexpr (kOnePass)
      if (it > 0) send_dq(it - 1);
    const int q0 = tile_of(it) * kBr;
    if (kg0 < T && q0 + kBr - 1 >= kg0) {  // some query of the tile sees some key of the group
      const bf16* qs = q_s + buf * kBr * D;
      const bf16* os = o_s + buf * kBr * D;
      const float* ls = l_s + buf * kBr;
      const float* ds = d_s + buf * kBr;
      // [Wgmma backward overlap] S^T = K Q^T and dP^T = V dO^T (64 keys x kBr queries per
      // warpgroup each) go out as two groups; the exponentials run while dP^T is multiplied.
      wgmma_hold(st);
      wgmma_hold(dpt);
      wgmma_fence();
      kmajor_issue<D, kRows, kBr>(st, k_s, qs, 64 * wg);
      kmajor_issue<D, kRows, kBr>(dpt, v_s, os, 64 * wg);
      wgmma_wait<1>();
      wgmma_hold(st);
      // P^T = exp2(S^T sc2 - lse2[q]), 0 where key > q or q >= T.
      const bool mask = q0 < kw0 + 15 || q0 + kBr > T;
#pragma unroll
      for (int nt = 0; nt < kBr / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = nt * 8 + 2 * c + (e & 1);
          const int key = kw0 + g + (e >> 1) * 8;
          float p = exp2f(st[nt][e] * sc2 - ls[qi]);
          if (mask && (key > q0 + qi || q0 + qi >= T)) p = 0.0f;
          st[nt][e] = p;
        }
      }
      // dV += P^T dO (reduction over the tile's queries; dO N-major), multiplied while dS^T is
      // formed.
#pragma unroll
      for (int kq = 0; kq < kBr / 16; ++kq) pack_a(pa[kq], st[2 * kq], st[2 * kq + 1]);
      wgmma_hold(pa);
      wgmma_hold(dv);
      wgmma_fence();
#pragma unroll
      for (int kq = 0; kq < kBr / 16; ++kq) wgmma_rs_nmajor(dv, pa[kq], desc_n<kBr>(os, kq));
      wgmma_commit();
      wgmma_wait<1>();
      wgmma_hold(dpt);
      // dS^T = P^T (dP^T - dvec[q]); dK += dS^T Q (Q N-major).
#pragma unroll
      for (int nt = 0; nt < kBr / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = nt * 8 + 2 * c + (e & 1);
          dpt[nt][e] = st[nt][e] * (dpt[nt][e] - ds[qi]);
        }
      }
#pragma unroll
      for (int kq = 0; kq < kBr / 16; ++kq) pack_a(sa[kq], dpt[2 * kq], dpt[2 * kq + 1]);
      if constexpr (kOnePass) {
        // dS^T (the bf16 dK's product reads) into shared memory, keys by queries in the
        // swizzle: dQ's product reads it as its A operand, M-major. Rows g and g + 8 of the
        // warp, 8-query pieces 2 kq and 2 kq + 1 (pack_a's order); piece p of row r sits at
        // p ^ (r % 8) = p ^ g.
        uint32_t* w = reinterpret_cast<uint32_t*>(ds_s) + (64 * wg + 16 * wl + g) * 32 + c;
#pragma unroll
        for (int kq = 0; kq < kBr / 16; ++kq) {
          w[((2 * kq) ^ g) << 2] = sa[kq][0];
          w[8 * 32 + (((2 * kq) ^ g) << 2)] = sa[kq][1];
          w[((2 * kq + 1) ^ g) << 2] = sa[kq][2];
          w[8 * 32 + (((2 * kq + 1) ^ g) << 2)] = sa[kq][3];
        }
      }
      wgmma_hold(sa);
      wgmma_hold(dk);
      wgmma_fence();
#pragma unroll
      for (int kq = 0; kq < kBr / 16; ++kq) wgmma_rs_nmajor(dk, sa[kq], desc_n<kBr>(qs, kq));
      wgmma_commit();
      if constexpr (!kOnePass) {
        wgmma_wait<0>();
        wgmma_hold(dv);
        wgmma_hold(dk);
        wgmma_hold(pa);
        wgmma_hold(sa);
      }
    } else if constexpr (kOnePass) {
      // A warpgroup whose keys no query of the tile sees has dS^T = 0 (a product over all kRows
      // keys then needs no branch between its steps).
      uint32_t* w = reinterpret_cast<uint32_t*>(ds_s) + (64 * wg + 16 * wl + g) * 32 + c;
#pragma unroll
      for (int p = 0; p < kBr / 8; ++p) {
        w[p << 2] = 0;
        w[8 * 32 + (p << 2)] = 0;
      }
    }
    if constexpr (kOnePass) {
      // dQ of the tile's queries = dS K, issued while dK's product may still run: at head size
      // 128 columns 64 wg.. of D over the block's keys (K's column panel wg); at 64 every
      // column over this warpgroup's 64 keys (its rows of dS^T and K). [Wgmma bulk dQ]: the
      // reduction sent at this tile's start has read the bulk tile before the barrier lets
      // any thread write it again.
      if (tid == 0) bulk_wait_read<0>();
      fence_proxy_async_smem();
      __syncthreads();
      wgmma_hold(dqp);
      wgmma_fence();
      if constexpr (D == 128) {
#pragma unroll
        for (int kk = 0; kk < kRows / 16; ++kk)
          wgmma_ss<1>(dqp, desc_n<kRows>(ds_s, kk), desc_n<kRows>(k_s + wg * kRows * 64, kk), kk);
      } else {
#pragma unroll
        for (int kk = 0; kk < 64 / 16; ++kk)
          wgmma_ss<1>(dqp, desc_n<kRows>(ds_s + wg * 64 * kBr, kk),
                      desc_n<kRows>(k_s + wg * 64 * D, kk), kk);
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_hold(dqp);
      wgmma_hold(dv);
      wgmma_hold(dk);
      wgmma_hold(pa);
      wgmma_hold(sa);
      // The share into the bulk tile; the next tile's barrier publishes it and send_dq sends it.
      float4* mine = reinterpret_cast<float4*>(b_s) + (wg * 8) * 128 + (tid & 127);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        mine[j * 128] = make_float4(dqp[j][0], dqp[j][1], dqp[j][2], dqp[j][3]);
      fence_proxy_async_smem();
    } else {
      __syncthreads();
    }
  }

  // The last tile's dQ; the shared memory a bulk reduction still reads outlives it.
  if constexpr (kOnePass) {
    __syncthreads();
    send_dq(total - 1);
    if (tid == 0) bulk_wait<0>();
  }
  // Epilogue: dqkv's k and v columns of this warp's keys = scale dK, dV, written.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = kw0 + g + 8 * r;
    if (key < T) {
      bf16* pk = dqkv + (int64_t(b) * T + key) * S + int64_t(Hq + kvh) * D + 2 * c;
      bf16* pv = pk + int64_t(Hkv) * D;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        store_bf16x2(pk + dt * 8, dk[dt][2 * r] * scale, dk[dt][2 * r + 1] * scale);
        store_bf16x2(pv + dt * 8, dv[dt][2 * r], dv[dt][2 * r + 1]);
      }
    }
  }
}

// After the one-pass backward: dqkv's q columns = scale dq_acc, read in the tile-major order of
// [Wgmma bulk dQ], four elements (two rows' pairs) a thread.
template <int D>
__global__ void wg_dq_store_kernel(bf16* __restrict__ dqkv, const float* __restrict__ dq_acc,
                                   int64_t n4, int T, int Hq, int Hkv, float scale) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  constexpr int kPerTile = 64 * D / 4;  // float4s a tile
  const int64_t tile = i / kPerTile;
  const int within = int(i % kPerTile);
  const int wg = within / (8 * 128), j = (within / 128) % 8, t = within % 128;
  const int lane = t & 31, g = lane >> 2, c = lane & 3;
  const int nqt = (T + 63) / 64;
  const int m = int(tile % nqt);
  const int64_t bh = tile / nqt;
  const int h = int(bh % Hq);
  const int64_t b = bh / Hq;
  const int q = m * 64 + 16 * (t >> 5) + g;
  const int col = 64 * wg + 8 * j + 2 * c;
  const float4 x = __ldcs(reinterpret_cast<const float4*>(dq_acc) + i);
  const int64_t S = int64_t(Hq + 2 * Hkv) * D;
  bf16* p = dqkv + (b * T + q) * S + int64_t(h) * D + col;
  if (q < T) *reinterpret_cast<uint32_t*>(p) = pack_bf16(x.x * scale, x.y * scale);
  if (q + 8 < T) *reinterpret_cast<uint32_t*>(p + 8 * S) = pack_bf16(x.z * scale, x.w * scale);
}

// ---- Backward: dQ -----------------------------------------------------------------------------

// [Wgmma dQ tiles] Keys per tile BC: 64 by default; at head size 128, 128 (one block per SM
// either way) makes S and dP m64n128 products with half the tiles and barriers, as the forward's
// [Wgmma tiles] (flash_attention_set_wgmma_dq_key_tile chooses, for the tests and the
// benchmarks that compare them).
template <int D, int BC>
struct WgDqCfg {
  static constexpr int kBc = BC;  // keys per tile
  // Q, dO [kRows][D]; K, V [2][kBc][D]
  static constexpr size_t kSmem = size_t(2 * kRows + 4 * kBc) * D * sizeof(bf16) + kAlignSlack;
};

// grid (B*Hq, ceil(T / kRows)): dQ of kRows queries of one (b, h), written into dqkv.
template <int D, int BC>
__global__ void __launch_bounds__(kThreads, D == 64 ? 2 : 1)  // 126 registers at 64: two blocks
    wg_flash_bwd_dq_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                           const bf16* __restrict__ qkv, const float* __restrict__ lse2,
                           const float* __restrict__ dvec, int T, int Hq, int Hkv, float sc2,
                           float scale) {
  using C = WgDqCfg<D, BC>;
  constexpr int kBc = C::kBc;
  bf16* q_s = smem_base();
  bf16* o_s = q_s + kRows * D;
  bf16* k_s = o_s + kRows * D;  // [2][kBc][D]
  bf16* v_s = k_s + 2 * kBc * D;

  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wl = (tid >> 5) & 3;
  const int g = lane >> 2, c = lane & 3;
  const int bh = blockIdx.x, b = bh / Hq, h = bh % Hq, kvh = h / (Hq / Hkv);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kRows;  // heaviest tiles first
  const int64_t S = int64_t(Hq + 2 * Hkv) * D, SO = int64_t(Hq) * D;
  const bf16* kg = qkv + int64_t(b) * T * S + int64_t(Hq + kvh) * D;
  const bf16* vg = kg + int64_t(Hkv) * D;
  const int q_end = min(q0 + kRows, T);
  const int nkt = (q_end - 1) / kBc + 1;

  const int64_t row0 = int64_t(b) * T + q0;
  load_tile_sw<kRows, D, kThreads>(q_s, qkv + row0 * S + int64_t(h) * D, S, q_end - q0, tid);
  load_tile_sw<kRows, D, kThreads>(o_s, dout + row0 * SO + int64_t(h) * D, SO, q_end - q0, tid);
  load_tile_sw<kBc, D, kThreads>(k_s, kg, S, min(kBc, T), tid);
  load_tile_sw<kBc, D, kThreads>(v_s, vg, S, min(kBc, T), tid);
  cp_async_commit();

  const int qg0 = q0 + 64 * wg;   // this warpgroup's first query
  const int qw0 = qg0 + 16 * wl;  // this warp's
  float lr[2], dr[2];             // lse2 and dvec of rows g, g+8
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int q = qw0 + g + 8 * r;
    lr[r] = q < T ? lse2[int64_t(bh) * T + q] : 0.0f;
    dr[r] = q < T ? dvec[int64_t(bh) * T + q] : 0.0f;
  }
  float dq[D / 8][4] = {};
  float s[kBc / 8][4] = {}, dp[kBc / 8][4] = {};
  for (int j = 0; j < nkt; ++j) {
    const int buf = j & 1;
    next_kv_tile<kBc, D>(k_s, v_s, j, nkt, kg, vg, S, T, tid);
    const int k0 = j * kBc;
    if (qg0 < T && k0 <= qg0 + 63) {
      const bf16* ks = k_s + buf * kBc * D;
      const bf16* vs = v_s + buf * kBc * D;
      // S = Q K^T, dP = dO V^T (64 queries x kBc keys per warpgroup each) as two groups; the
      // exponentials run while dP is multiplied ([Wgmma backward overlap]).
      wgmma_hold(s);
      wgmma_hold(dp);
      wgmma_fence();
      kmajor_issue<D, kRows, kBc>(s, q_s, ks, 64 * wg);
      kmajor_issue<D, kRows, kBc>(dp, o_s, vs, 64 * wg);
      wgmma_wait<1>();
      wgmma_hold(s);
      // P = exp2(S sc2 - lse2), 0 where key > q (over s in place); then dS = P (dP - dvec).
      const bool diag = k0 + kBc - 1 > qw0;
#pragma unroll
      for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float p = exp2f(s[nt][e] * sc2 - lr[e >> 1]);
          if (diag && k0 + nt * 8 + 2 * c + (e & 1) > qw0 + g + (e >> 1) * 8) p = 0.0f;
          s[nt][e] = p;
        }
      }
      wgmma_wait<0>();
      wgmma_hold(dp);
#pragma unroll
      for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] *= dp[nt][e] - dr[e >> 1];
      }
      // dQ += dS K (reduction over the tile's keys; K N-major).
      uint32_t sa[kBc / 16][4];
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) pack_a(sa[kk], s[2 * kk], s[2 * kk + 1]);
      wgmma_hold(sa);
      wgmma_hold(dq);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) wgmma_rs_nmajor(dq, sa[kk], desc_n<kBc>(ks, kk));
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_hold(dq);
      wgmma_hold(sa);
    }
    __syncthreads();
  }

  // Epilogue: dqkv's q columns = scale dQ, written.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int q = qw0 + g + 8 * r;
    if (q < T) {
      bf16* pq = dqkv + (int64_t(b) * T + q) * S + int64_t(h) * D + 2 * c;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt)
        store_bf16x2(pq + dt * 8, dq[dt][2 * r] * scale, dq[dt][2 * r + 1] * scale);
    }
  }
}

// ---- Host side --------------------------------------------------------------------------------

// Compiled as the kernels above: whether the current device loads this file's sm_90a code.
__global__ void wg_probe_kernel() {}

// [Wgmma forward pipeline]: automatic, on or off.
std::atomic<ForwardPipeline> g_fwd_pipeline{ForwardPipeline::automatic};

// [Wgmma TMA forward]: automatic (with 128-key tiles), TMA or the threads' copies.
std::atomic<ForwardLoads> g_fwd_loads{ForwardLoads::automatic};

// cuTensorMapEncodeTiled from the driver, found once through the runtime (no link to libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                cudaEnableDefault, &found));
    TD_CHECK(found == cudaDriverEntryPointSuccess && p != nullptr,
             "the CUDA driver has no cuTensorMapEncodeTiled (the TMA flash forward needs it)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// qkv [B*T rows][(Hq + 2 Hkv) D] as a 2-D tensor map of boxes of 64 columns (128 bytes, the
// swizzle's row) by `rows` rows, in the 128-byte swizzle; rows past the end read as zeros.
CUtensorMap qkv_tensor_map(const bf16* qkv, int B, int T, int Hq, int Hkv, int D, int rows) {
  CUtensorMap map;
  const cuuint64_t cols = cuuint64_t(Hq + 2 * Hkv) * D;
  const cuuint64_t dims[2] = {cols, cuuint64_t(B) * cuuint64_t(T)};
  const cuuint64_t strides[1] = {cols * sizeof(bf16)};
  const cuuint32_t box[2] = {64, cuuint32_t(rows)};
  const cuuint32_t steps[2] = {1, 1};
  const CUresult rc = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(qkv), dims, strides, box, steps,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TD_CHECK(rc == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed ({}) for qkv of {} x {} bf16",
           int(rc), dims[1], cols);
  return map;
}

template <int D, int BC>
void launch_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int Hq, int Hkv,
                    cudaStream_t stream) {
  using C = WgFwdCfg<D, BC>;
  const float sc2 = float(kLog2e / std::sqrt(double(D)));
  const dim3 grid(unsigned(B * Hq), unsigned((T + kRows - 1) / kRows));
  const ForwardPipeline mode = g_fwd_pipeline.load(std::memory_order_relaxed);
  const ForwardLoads loads = g_fwd_loads.load(std::memory_order_relaxed);
  // A pipeline forced on or off names one of the threads' kernels, so the test and the timing
  // that compare those two still run them where the TMA kernel is the default.
  if (loads == ForwardLoads::tma ||
      (loads == ForwardLoads::automatic && mode == ForwardPipeline::automatic && BC == 128)) {
    using W = WgTmaCfg<D, BC>;
    const CUtensorMap map = qkv_tensor_map(qkv, B, T, Hq, Hkv, D, BC);
    set_smem(wg_flash_fwd_tma_kernel<D, BC>, W::kSmem);
    wg_flash_fwd_tma_kernel<D, BC>
        <<<grid, kThreads, W::kSmem, stream>>>(out, lse, map, T, Hq, Hkv, sc2);
  } else if (mode == ForwardPipeline::on ||
             (mode == ForwardPipeline::automatic && C::kBlocks == 1)) {
    set_smem(wg_flash_fwd_pipe_kernel<D, BC>, C::kSmem);
    wg_flash_fwd_pipe_kernel<D, BC>
        <<<grid, kThreads, C::kSmem, stream>>>(out, lse, qkv, T, Hq, Hkv, sc2);
  } else {
    set_smem(wg_flash_fwd_kernel<D, BC>, C::kSmem);
    wg_flash_fwd_kernel<D, BC>
        <<<grid, kThreads, C::kSmem, stream>>>(out, lse, qkv, T, Hq, Hkv, sc2);
  }
  CUDA_CHECK_LAUNCH();
}

// [Wgmma tiles] of the forward: 64, 128, or 0 for the head size's default.
std::atomic<int> g_fwd_key_tile{0};

// [Wgmma dK/dV tiles] queries per tile at head size 128.
std::atomic<int> g_dkv_query_tile{64};

// [Wgmma dQ tiles] keys per tile at head size 128.
std::atomic<int> g_dq_key_tile{64};

// [Wgmma one-pass backward]: automatic, one pass or two passes.
std::atomic<BackwardPasses> g_bwd_passes{BackwardPasses::automatic};
// What automatic takes: the public setting's automatic form (device/kernels.h).
constexpr bool kOnePassByDefault = kFlashBackwardAutomatic == FlashBackward::one_pass;

// The dK/dV kernel on grid (B*Hkv, key tiles); one pass: with dQ into dq_acc.
template <int D, int BR, bool ONE_PASS>
void launch_dkv(dim3 grid, bf16* dqkv, float* dq_acc, const bf16* dout, const bf16* qkv,
                const float* lse2, const float* dvec, int T, int Hq, int Hkv, float sc2,
                float scale, cudaStream_t stream) {
  using C = WgDkvCfg<D, BR, ONE_PASS>;
  set_smem(wg_flash_bwd_dkv_kernel<D, BR, ONE_PASS>, C::kSmem);
  wg_flash_bwd_dkv_kernel<D, BR, ONE_PASS><<<grid, kThreads, C::kSmem, stream>>>(
      dqkv, dq_acc, dout, qkv, lse2, dvec, T, Hq, Hkv, sc2, scale);
  CUDA_CHECK_LAUNCH();
}

template <int D, int BR, int BC>
void launch_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse2,
                     const float* dvec, int B, int T, int Hq, int Hkv, void* dq_scratch,
                     cudaStream_t stream) {
  const float scale = float(1.0 / std::sqrt(double(D)));
  const float sc2 = float(kLog2e / std::sqrt(double(D)));
  const unsigned tiles = unsigned((T + kRows - 1) / kRows);
  const dim3 grid(unsigned(B * Hkv), tiles);
  if constexpr (BR == 64) {
    const BackwardPasses passes = g_bwd_passes.load(std::memory_order_relaxed);
    if (passes == BackwardPasses::one_pass ||
        (passes == BackwardPasses::automatic && kOnePassByDefault)) {
      // [Wgmma bulk dQ]: the accumulator cleared, added into, then scaled into dqkv.
      float* acc = static_cast<float*>(dq_scratch);
      CUDA_CHECK(cudaMemsetAsync(acc, 0, dq_acc_bytes(B, T, Hq, D), stream));
      launch_dkv<D, BR, true>(grid, dqkv, acc, dout, qkv, lse2, dvec, T, Hq, Hkv, sc2, scale,
                              stream);
      const int64_t n4 = int64_t(B) * Hq * ((T + 63) / 64) * (64 * D / 4);
      constexpr int kStoreThreads = 256;
      wg_dq_store_kernel<D>
          <<<unsigned((n4 + kStoreThreads - 1) / kStoreThreads), kStoreThreads, 0, stream>>>(
              dqkv, acc, n4, T, Hq, Hkv, scale);
      CUDA_CHECK_LAUNCH();
      return;
    }
  }
  (void)dq_scratch;  // two passes need no accumulator
  launch_dkv<D, BR, false>(grid, dqkv, nullptr, dout, qkv, lse2, dvec, T, Hq, Hkv, sc2, scale,
                           stream);
  using Q = WgDqCfg<D, BC>;
  set_smem(wg_flash_bwd_dq_kernel<D, BC>, Q::kSmem);
  wg_flash_bwd_dq_kernel<D, BC><<<dim3(unsigned(B * Hq), tiles), kThreads, Q::kSmem, stream>>>(
      dqkv, dout, qkv, lse2, dvec, T, Hq, Hkv, sc2, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool flash_wgmma_device() {
  // Per device, asked once: 0 unknown, 1 no, 2 yes.
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices];
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) return false;
  int k = known[device].load(std::memory_order_relaxed);
  if (k == 0) {
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    bool yes = major == 9 && minor == 0;  // sm_90a code runs on compute capability 9.0 only
    cudaFuncAttributes attr{};
    if (yes && cudaFuncGetAttributes(&attr, wg_probe_kernel) != cudaSuccess) {
      (void)cudaGetLastError();  // no image for this device: clear the error, answer no
      yes = false;
    }
    k = yes && attr.binaryVersion >= 90 ? 2 : 1;
    known[device].store(k, std::memory_order_relaxed);
  }
  return k == 2;
}

void flash_wgmma_set_forward_key_tile(int keys) {
  g_fwd_key_tile.store(keys, std::memory_order_relaxed);
}

void flash_wgmma_set_dkv_query_tile(int queries) {
  g_dkv_query_tile.store(queries, std::memory_order_relaxed);
}

void flash_wgmma_set_dq_key_tile(int keys) {
  g_dq_key_tile.store(keys, std::memory_order_relaxed);
}

void flash_wgmma_set_forward_pipeline(ForwardPipeline mode) {
  g_fwd_pipeline.store(mode, std::memory_order_relaxed);
}

void flash_wgmma_set_forward_loads(ForwardLoads loads) {
  g_fwd_loads.store(loads, std::memory_order_relaxed);
}

void flash_wgmma_set_backward_passes(BackwardPasses passes) {
  g_bwd_passes.store(passes, std::memory_order_relaxed);
}

void flash_wgmma_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int Hq, int Hkv,
                         int D, cudaStream_t stream) {
  const int keys = g_fwd_key_tile.load(std::memory_order_relaxed);
  const bool wide = keys == 0 ? D == 128 : keys == 128;
  if (D == 64 && wide) {
    launch_forward<64, 128>(out, lse, qkv, B, T, Hq, Hkv, stream);
  } else if (D == 64) {
    launch_forward<64, 64>(out, lse, qkv, B, T, Hq, Hkv, stream);
  } else if (wide) {
    launch_forward<128, 128>(out, lse, qkv, B, T, Hq, Hkv, stream);
  } else {
    launch_forward<128, 64>(out, lse, qkv, B, T, Hq, Hkv, stream);
  }
}

void flash_wgmma_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse2,
                          const float* dvec, int B, int T, int Hq, int Hkv, int D, void* dq_scratch,
                          cudaStream_t stream) {
  const bool short_dkv = g_dkv_query_tile.load(std::memory_order_relaxed) == 32;
  const bool wide_dq = g_dq_key_tile.load(std::memory_order_relaxed) == 128;
  if (D == 64) {
    launch_backward<64, 64, 64>(dqkv, dout, qkv, lse2, dvec, B, T, Hq, Hkv, dq_scratch, stream);
  } else if (short_dkv && wide_dq) {
    launch_backward<128, 32, 128>(dqkv, dout, qkv, lse2, dvec, B, T, Hq, Hkv, dq_scratch, stream);
  } else if (short_dkv) {
    launch_backward<128, 32, 64>(dqkv, dout, qkv, lse2, dvec, B, T, Hq, Hkv, dq_scratch, stream);
  } else if (wide_dq) {
    launch_backward<128, 64, 128>(dqkv, dout, qkv, lse2, dvec, B, T, Hq, Hkv, dq_scratch, stream);
  } else {
    launch_backward<128, 64, 64>(dqkv, dout, qkv, lse2, dvec, B, T, Hq, Hkv, dq_scratch, stream);
  }
}

}  // namespace tandem::cuda
