// Fused causal flash attention with grouped-query heads (FlashAttention-2 style): tiles of
// queries and keys are staged in shared memory, the scores of one tile pair live only in
// registers, and the softmax is computed online, so nothing of size T x T ever reaches global
// memory. Tensor cores through mma.sync.m16n8k16 (bf16 operands, fp32 accumulators) fed by
// ldmatrix; everything else (scaling, masking, exponentials, row statistics) is fp32.
//
// [Flash layout] q/k/v are read straight from the fused rows qkv[B,T,(Hq+2Hkv)*D] (row stride
// S = (Hq+2Hkv)*D; query head h at column h*D, kv head g at (Hq+g)*D and (Hq+Hkv+g)*D), out and
// dout are [B,T,Hq*D], lse and the backward's statistics [B,Hq,T]. Query head h reads kv head
// h / G, G = Hq / Hkv. A tile of R rows of one head is R strided rows of D contiguous bf16,
// copied with 16-byte cp.async into shared memory as [R][D + 8] (the 16-byte pad shifts
// consecutive rows by 4 banks, so the 8 row addresses of every ldmatrix phase hit distinct
// banks). Rows past T are zero-filled (cp.async with source size 0), so out-of-range keys and
// values contribute exact zeros and no garbage can turn into NaN.
//
// [Fragments] mma.m16n8k16 with lane = 4*g + c (g = lane/4, c = lane%4), per the PTX ISA:
//   A (16x16, row-major), 4 regs of 2 bf16: a0 (row g, cols 2c,2c+1), a1 (row g+8, same),
//     a2 (row g, cols 2c+8,+9), a3 (row g+8, cols 2c+8,+9);
//   B (16x8, "col"): b0 (k rows 2c,2c+1 of col g), b1 (k rows 2c+8,+9 of col g);
//   C/D (16x8 fp32): c0,c1 (row g, cols 2c,2c+1), c2,c3 (row g+8, cols 2c,2c+1).
// ldmatrix.x4 loads four 8x8 bf16 matrices; lanes 8i..8i+7 give the 8 row addresses of matrix
// i, and register i of lane t receives row t/4, cols 2(t%4),+1 of matrix i (with .trans: row
// 2(t%4),+1, col t/4, i.e. the transpose). Hence, for a [rows][cols] tile in shared memory:
//   - A operand, rows r0..r0+15, cols k0..k0+15: lane address (r0 + lane%16, k0 + 8*(lane/16)).
//   - B operand where B[k][n] = tile[n][k] (K in Q K^T: n = key, k = d): two n8 blocks at once,
//     lane address (n0 + 8*(lane/16) + lane%8, k0 + 8*((lane/8)%2)); regs {0,1} are b0,b1 of
//     keys n0..n0+7, regs {2,3} those of n0+8..n0+15 (ldsm_b).
//   - B operand where B[k][n] = tile[k][n] (V in P V: k = key, n = d), with .trans: lane
//     address (k0 + 8*((lane/8)%2) + lane%8, n0 + 8*(lane/16)); regs {0,1} for d n0..n0+7,
//     {2,3} for n0+8..n0+15 (ldsm_bt).
//   - A operand from an accumulator (P or dS, C layout of two adjacent n8 blocks 2j, 2j+1 of
//     a 16-row strip): a = {C[2j](c0,c1), C[2j](c2,c3), C[2j+1](c0,c1), C[2j+1](c2,c3)}
//     (pack_a), so scores become the next GEMM's operand without leaving registers.
// Every warp owns 16 * M rows (queries in the forward and in dQ, keys in dK/dV) of its block's
// tile, so no data is exchanged between warps except through the shared tiles.
//
// [Warp tiles] M is the number of 16-row m-tiles per warp: 2 for head dims up to 64, 1 for 128
// (two would need more than 255 registers). Each operand fragment read from shared memory feeds
// M products, so at M = 2 a warp issues 0.25-0.38 ldmatrix.x4 per mma instead of 0.5-0.56 at
// M = 1, at the price of registers (237-255: two blocks of 4 warps per SM). Measured on an
// H200 at GPT-2 124M shapes (B 16, T 1024, 12 heads of 64; CudaFlash.Timing): forward 135.6 ->
// 127.9 us, backward 433.7 -> 426.6 us per layer. So shared-memory bandwidth was not what bounds
// these kernels; M = 2 stays the default for its few percent. Each row's sums run over the same
// products in the same order at either M, so M changes no bit of any output (CudaFlash tests
// it); flash_attention_set_warp_tiles(1) selects M = 1 for tests and benchmarks.
//
// [Flash forward] Block: 128 queries of one (b, h), 8 / M warps; loops over the tiles of
// 64 keys up to the diagonal (K/V double-buffered with cp.async). Per key tile each warp
// computes S = Q K^T (16 x 64 per m-tile, fp32), scales by log2(e)/sqrt(D) (exponentials in
// base 2), masks keys > query, updates the running row max m and the row sum l, rescales its O
// accumulator and adds P V with P rounded to bf16. Warps whose rows all precede the tile skip
// it. At the end O / l is written and lse = (m + log2 l) ln 2. Query tiles are issued heaviest
// (last) first so the causal tail of the grid is short.
//
// [Flash backward] Deterministic, no atomics: every output element is owned by one thread.
//   1. prep: dvec[b,h,t] = sum_d dO * O (fp32) and lse2 = lse log2(e), into scratch.
//   2. dK/dV: block of 4 warps owns 64 M keys of one (b, kv head); it loops over the G query
//      heads of the group (fixed order) and over the query tiles at or after the diagonal, with
//      Q, dO, lse2, dvec double-buffered. Each warp (16 M keys) recomputes S^T = K Q^T and
//      dP^T = V dO^T, P^T = exp2(S^T c - lse2), dS^T = P^T (dP^T - dvec), and accumulates
//      dV += P^T dO, dK += dS^T Q in registers; dK is scaled by 1/sqrt(D) at the end, and both
//      are written into dqkv (no clear of dqkv is needed: every element has this one owner).
//   3. dQ: block of 4 warps owns 64 M queries of one (b, h) and loops over the key tiles up to
//      the diagonal (K/V double-buffered): S = Q K^T, dP = dO V^T, dS as above, dQ += dS K.
// P is recomputed in both 2 and 3 (7 GEMMs instead of 5) so that dQ needs no cross-block
// accumulation.
//
// FlashKernels::wgmma runs the same three kernels written on Hopper's warpgroup MMA instead
// (sm90a/kernels_flash_wgmma.cu, head sizes 64 and 128); the checks and the prep stay here.
#include <algorithm>
#include <atomic>
#include <cmath>

#include "device/cuda/cuda_check.h"
#include "device/cuda/flash_common.cuh"
#include "device/cuda/flash_wgmma.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

using namespace flash;

constexpr int kPad = 8;  // bf16 elements of padding per shared-memory row ([Flash layout])

// ---- PTX wrappers -----------------------------------------------------------------------

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// d += a * b, one m16n8k16 bf16 tensor-core product with fp32 accumulation.
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- Fragment addressing ([Fragments]); ld = row stride of the shared tile in elements ----

// A operand: rows r0..r0+15, cols k0..k0+15 of a row-major tile.
__device__ __forceinline__ void ldsm_a(uint32_t (&a)[4], const bf16* tile, int ld, int r0, int k0,
                                       int lane) {
  ldsm_x4(a, tile + (r0 + (lane & 15)) * ld + k0 + (lane >> 4) * 8);
}
// B operands of two n8 blocks, B[k][n] = tile[n][k]: n = n0..n0+15 (tile rows), k = k0..k0+15.
__device__ __forceinline__ void ldsm_b(uint32_t (&b)[4], const bf16* tile, int ld, int n0, int k0,
                                       int lane) {
  ldsm_x4(b, tile + (n0 + ((lane >> 4) & 1) * 8 + (lane & 7)) * ld + k0 + ((lane >> 3) & 1) * 8);
}
// B operands of two n8 blocks, B[k][n] = tile[k][n]: k = k0..k0+15 (tile rows), n = n0..n0+15.
__device__ __forceinline__ void ldsm_bt(uint32_t (&b)[4], const bf16* tile, int ld, int k0, int n0,
                                        int lane) {
  ldsm_x4_trans(b, tile + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * ld + n0 + (lane >> 4) * 8);
}

// Copies ROWS rows of D bf16 (row r at src + r * stride) into the shared tile [ROWS][D + kPad];
// rows r >= valid are zero-filled (valid >= 1, so src itself is always a readable row).
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* src, int64_t stride, int valid,
                                          int tid) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  constexpr int kTotal = ROWS * kChunks;
#pragma unroll
  for (int j = 0; j < (kTotal + THREADS - 1) / THREADS; ++j) {
    const int i = tid + j * THREADS;
    if (kTotal % THREADS == 0 || i < kTotal) {
      const int r = i / kChunks, ch = i % kChunks;
      const bool ok = r < valid;
      cp_async16(dst + r * (D + kPad) + ch * 8, ok ? src + r * stride + ch * 8 : src, ok);
    }
  }
}

// ---- Forward ([Flash forward]) --------------------------------------------------------------

template <int D, int M>
struct FwdCfg {
  static constexpr int kM = M;  // 16-row m-tiles per warp ([Warp tiles])
  static constexpr int kWarps = 8 / kM;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBr = 16 * kM * kWarps;  // queries per block
  static constexpr int kBc = 64;                // keys per tile
  static constexpr int kLd = D + kPad;
  // Q [kBr][kLd], K [2][kBc][kLd], V [2][kBc][kLd]
  static constexpr size_t kSmem = size_t(kBr + 4 * kBc) * kLd * sizeof(bf16);
};

// grid (B*Hq, ceil(T / kBr)); sc2 = log2(e) / sqrt(D).
template <int D, int M>
__global__ void __launch_bounds__(FwdCfg<D, M>::kThreads, D <= 64 ? 2 : 1)
    flash_fwd_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ qkv,
                     int T, int Hq, int Hkv, float sc2) {
  using C = FwdCfg<D, M>;
  constexpr int kLd = C::kLd, kBc = C::kBc, kM = C::kM;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* k_s = q_s + C::kBr * kLd;
  bf16* v_s = k_s + 2 * kBc * kLd;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int bh = blockIdx.x, b = bh / Hq, h = bh % Hq, kvh = h / (Hq / Hkv);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * C::kBr;  // heaviest tiles first
  const int64_t S = int64_t(Hq + 2 * Hkv) * D;
  const bf16* kg = qkv + int64_t(b) * T * S + int64_t(Hq + kvh) * D;
  const bf16* vg = kg + int64_t(Hkv) * D;
  const int q_end = min(q0 + C::kBr, T);
  const int nkt = (q_end - 1) / kBc + 1;  // key tiles up to the diagonal

  load_tile<C::kBr, D, C::kThreads>(q_s, qkv + (int64_t(b) * T + q0) * S + int64_t(h) * D, S,
                                    q_end - q0, tid);
  load_tile<kBc, D, C::kThreads>(k_s, kg, S, min(kBc, T), tid);
  load_tile<kBc, D, C::kThreads>(v_s, vg, S, min(kBc, T), tid);
  cp_async_commit();

  const int qr0 = warp * 16 * kM;  // this warp's first row of the block's tile
  const int qw0 = q0 + qr0;        // and its query
  float o[kM][D / 8][4] = {};      // unnormalised output rows g, g+8 of each m-tile
  float m[kM][2], l[kM][2];        // running max (base-2 scaled scores); this lane's row sums
#pragma unroll
  for (int i = 0; i < kM; ++i) {
    m[i][0] = m[i][1] = -INFINITY;
    l[i][0] = l[i][1] = 0.0f;
  }

  for (int j = 0; j < nkt; ++j) {
    const int buf = j & 1;
    if (j + 1 < nkt) {  // prefetch the next key tile into the other buffer
      const int k1 = (j + 1) * kBc;
      const int valid = min(kBc, T - k1);
      load_tile<kBc, D, C::kThreads>(k_s + (buf ^ 1) * kBc * kLd, kg + k1 * S, S, valid, tid);
      load_tile<kBc, D, C::kThreads>(v_s + (buf ^ 1) * kBc * kLd, vg + k1 * S, S, valid, tid);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int k0 = j * kBc;
    if (k0 <= qw0 + 16 * kM - 1) {  // some key of the tile is visible to some row of this warp
      const bf16* ks = k_s + buf * kBc * kLd;
      const bf16* vs = v_s + buf * kBc * kLd;
      float s[kM][kBc / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[kM][4];  // Q re-read per tile: cheaper than holding D/4 registers throughout
#pragma unroll
        for (int i = 0; i < kM; ++i) ldsm_a(qa[i], q_s, kLd, qr0 + 16 * i, kk * 16, lane);
#pragma unroll
        for (int np = 0; np < kBc / 16; ++np) {
          uint32_t kb[4];
          ldsm_b(kb, ks, kLd, np * 16, kk * 16, lane);
#pragma unroll
          for (int i = 0; i < kM; ++i) {
            mma(s[i][2 * np], qa[i], kb[0], kb[1]);
            mma(s[i][2 * np + 1], qa[i], kb[2], kb[3]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kM; ++i) {
        const int r0 = qw0 + 16 * i;  // the m-tile's first query
        // Scale to base 2, mask keys after the query (only tiles crossing the diagonal).
        const bool diag = k0 + kBc - 1 > r0;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float x = s[i][nt][e] * sc2;
            if (diag && k0 + nt * 8 + 2 * c + (e & 1) > r0 + g + (e >> 1) * 8) x = -INFINITY;
            s[i][nt][e] = x;
            mx[e >> 1] = fmaxf(mx[e >> 1], x);
          }
        }
        float base[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float mnew = fmaxf(m[i][r], quad_max(mx[r]));
          base[r] = mnew == -INFINITY ? 0.0f : mnew;  // a row with nothing visible yet
          alpha[r] = exp2f(m[i][r] - base[r]);        // 0 on the first visible tile
          m[i][r] = mnew;
        }
        float ls[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float p = exp2f(s[i][nt][e] - base[e >> 1]);
            s[i][nt][e] = p;
            ls[e >> 1] += p;
          }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) l[i][r] = l[i][r] * alpha[r] + ls[r];
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          o[i][dt][0] *= alpha[0];
          o[i][dt][1] *= alpha[0];
          o[i][dt][2] *= alpha[1];
          o[i][dt][3] *= alpha[1];
        }
      }
      // O += P V: P (16 x 64 per m-tile) from registers, V by transposing loads.
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        uint32_t pa[kM][4];
#pragma unroll
        for (int i = 0; i < kM; ++i) pack_a(pa[i], s[i][2 * kk], s[i][2 * kk + 1]);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t vb[4];
          ldsm_bt(vb, vs, kLd, kk * 16, dp * 16, lane);
#pragma unroll
          for (int i = 0; i < kM; ++i) {
            mma(o[i][2 * dp], pa[i], vb[0], vb[1]);
            mma(o[i][2 * dp + 1], pa[i], vb[2], vb[3]);
          }
        }
      }
    }
    __syncthreads();  // the buffer just read is refilled by the next iteration's prefetch
  }

  // Epilogue: O / l into the row layout, lse = ln(sum exp(scaled scores)).
#pragma unroll
  for (int i = 0; i < kM; ++i) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float lsum = quad_sum(l[i][r]);
      const int q = qw0 + 16 * i + g + 8 * r;
      if (q < T) {
        const float inv = 1.0f / lsum;
        bf16* po = out + (int64_t(b) * T + q) * (int64_t(Hq) * D) + int64_t(h) * D + 2 * c;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          *reinterpret_cast<__nv_bfloat162*>(po + dt * 8) =
              __floats2bfloat162_rn(o[i][dt][2 * r] * inv, o[i][dt][2 * r + 1] * inv);
        }
        if (lse != nullptr && c == 0) lse[int64_t(bh) * T + q] = (m[i][r] + log2f(lsum)) * kLn2;
      }
    }
  }
}

// ---- Backward ([Flash backward]) ------------------------------------------------------------

constexpr int kPrepRows = 32;  // positions per block of the backward's prep (8 lanes each)

// dvec[b,h,t] = dO . O and lse2 = lse log2(e). Block of 256 threads per (b, h) (blockIdx.x)
// and runs of 32 consecutive positions t (blockIdx.y, striding by gridDim.y): 8 lanes per
// position, each reading 8 values of dO and of O per 16-byte load (D is a multiple of 8 and the
// rows are 16-byte aligned), so the block writes dvec and lse2 for 32 consecutive t at a time.
__global__ void flash_bwd_prep_kernel(float* __restrict__ lse2, float* __restrict__ dvec,
                                      const bf16* __restrict__ dout, const bf16* __restrict__ out,
                                      const float* __restrict__ lse, int T, int Hq, int D) {
  const int bh = blockIdx.x;
  const int h = bh % Hq;
  const int64_t b = bh / Hq;
  const int lane = threadIdx.x % 8;
  for (int t0 = int(blockIdx.y) * kPrepRows; t0 < T; t0 += int(gridDim.y) * kPrepRows) {
    const int t = t0 + int(threadIdx.x) / 8;
    float acc = 0.0f;
    if (t < T) {
      const int64_t off = ((b * T + t) * Hq + h) * D;
      for (int d = lane * 8; d < D; d += 64) {
        float x[8], y[8];
        detail::load_vec<8>(out + off + d, x);
        detail::load_vec<8>(dout + off + d, y);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc += x[j] * y[j];
      }
    }
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0 && t < T) {
      const int64_t i = int64_t(bh) * T + t;
      dvec[i] = acc;
      lse2[i] = lse[i] * kLog2e;
    }
  }
}

template <int D, int M>
struct DkvCfg {
  static constexpr int kM = M;  // 16-key m-tiles per warp ([Warp tiles])
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBc = 16 * kM * kWarps;           // keys per block
  static constexpr int kBr = D > 64 || M > 1 ? 32 : 64;  // queries per tile (registers)
  static constexpr int kLd = D + kPad;
  // K, V [kBc][kLd]; Q, dO [2][kBr][kLd]; lse2, dvec [2][kBr] fp32
  static constexpr size_t kSmem =
      size_t(2 * kBc + 4 * kBr) * kLd * sizeof(bf16) + size_t(4 * kBr) * sizeof(float);
};

// grid (B*Hkv, ceil(T / kBc)): dK, dV of kBc keys of one kv head, summed over its G query heads.
template <int D, int M>
__global__ void __launch_bounds__(DkvCfg<D, M>::kThreads)
    flash_bwd_dkv_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                         const bf16* __restrict__ qkv, const float* __restrict__ lse2,
                         const float* __restrict__ dvec, int T, int Hq, int Hkv, float sc2,
                         float scale) {
  using C = DkvCfg<D, M>;
  constexpr int kLd = C::kLd, kBr = C::kBr, kBc = C::kBc, kM = C::kM;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* k_s = reinterpret_cast<bf16*>(smem);
  bf16* v_s = k_s + kBc * kLd;
  bf16* q_s = v_s + kBc * kLd;                                 // [2][kBr][kLd]
  bf16* o_s = q_s + 2 * kBr * kLd;                             // dO, [2][kBr][kLd]
  float* l_s = reinterpret_cast<float*>(o_s + 2 * kBr * kLd);  // lse2 [2][kBr]
  float* d_s = l_s + 2 * kBr;                                  // dvec [2][kBr]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int b = blockIdx.x / Hkv, kvh = blockIdx.x % Hkv, G = Hq / Hkv;
  const int k0 = blockIdx.y * kBc;  // tile 0 has the most work and goes first
  const int64_t S = int64_t(Hq + 2 * Hkv) * D, SO = int64_t(Hq) * D;
  const bf16* kg = qkv + (int64_t(b) * T + k0) * S + int64_t(Hq + kvh) * D;
  load_tile<kBc, D, C::kThreads>(k_s, kg, S, min(kBc, T - k0), tid);
  load_tile<kBc, D, C::kThreads>(v_s, kg + int64_t(Hkv) * D, S, min(kBc, T - k0), tid);

  // Iterations it = 0..total-1: query head kvh*G + it / per_head, query tile
  // qt_first + it % per_head (the tiles holding queries >= k0).
  const int nqt = (T + kBr - 1) / kBr, qt_first = k0 / kBr;
  const int per_head = nqt - qt_first, total = G * per_head;
  auto load_queries = [&](int it, int buf) {
    const int h = kvh * G + it / per_head;
    const int q0 = (qt_first + it % per_head) * kBr;
    const int valid = min(kBr, T - q0);
    const int64_t row = int64_t(b) * T + q0;
    load_tile<kBr, D, C::kThreads>(q_s + buf * kBr * kLd, qkv + row * S + int64_t(h) * D, S, valid,
                                   tid);
    load_tile<kBr, D, C::kThreads>(o_s + buf * kBr * kLd, dout + row * SO + int64_t(h) * D, SO,
                                   valid, tid);
    const int64_t st = (int64_t(b) * Hq + h) * T + q0;
    for (int i = tid; i < 2 * kBr; i += C::kThreads) {
      const int qi = i % kBr;
      const bool ok = qi < valid;
      const float* src = (i < kBr ? lse2 : dvec) + (ok ? st + qi : 0);
      cp_async4((i < kBr ? l_s : d_s) + buf * kBr + qi, src, ok);
    }
  };
  load_queries(0, 0);
  cp_async_commit();

  const int kr0 = warp * 16 * kM;  // this warp's first row of the block's K/V tiles
  const int kw0 = k0 + kr0;        // and its key
  float dk[kM][D / 8][4] = {}, dv[kM][D / 8][4] = {};
  for (int it = 0; it < total; ++it) {
    const int buf = it & 1;
    if (it + 1 < total) {
      load_queries(it + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int q0 = (qt_first + it % per_head) * kBr;
    if (q0 + kBr - 1 >= kw0) {  // some query of the tile sees some key of this warp
      const bf16* qs = q_s + buf * kBr * kLd;
      const bf16* os = o_s + buf * kBr * kLd;
      const float* ls = l_s + buf * kBr;
      const float* ds = d_s + buf * kBr;
      // S^T = K Q^T and dP^T = V dO^T: 16 keys x kBr queries per m-tile each.
      float st[kM][kBr / 8][4] = {}, dpt[kM][kBr / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t ka[kM][4], va[kM][4];
#pragma unroll
        for (int i = 0; i < kM; ++i) {
          ldsm_a(ka[i], k_s, kLd, kr0 + 16 * i, kk * 16, lane);
          ldsm_a(va[i], v_s, kLd, kr0 + 16 * i, kk * 16, lane);
        }
#pragma unroll
        for (int np = 0; np < kBr / 16; ++np) {
          uint32_t qb[4], ob[4];
          ldsm_b(qb, qs, kLd, np * 16, kk * 16, lane);
          ldsm_b(ob, os, kLd, np * 16, kk * 16, lane);
#pragma unroll
          for (int i = 0; i < kM; ++i) {
            mma(st[i][2 * np], ka[i], qb[0], qb[1]);
            mma(st[i][2 * np + 1], ka[i], qb[2], qb[3]);
            mma(dpt[i][2 * np], va[i], ob[0], ob[1]);
            mma(dpt[i][2 * np + 1], va[i], ob[2], ob[3]);
          }
        }
      }
      // P^T = exp2(S^T sc2 - lse2[q]), 0 where key > q or q >= T; dS^T = P^T (dP^T - dvec[q]).
      const bool mask = q0 < kw0 + 16 * kM - 1 || q0 + kBr > T;
#pragma unroll
      for (int i = 0; i < kM; ++i) {
#pragma unroll
        for (int nt = 0; nt < kBr / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int qi = nt * 8 + 2 * c + (e & 1);
            const int key = kw0 + 16 * i + g + (e >> 1) * 8;
            float p = exp2f(st[i][nt][e] * sc2 - ls[qi]);
            if (mask && (key > q0 + qi || q0 + qi >= T)) p = 0.0f;
            st[i][nt][e] = p;
            dpt[i][nt][e] = p * (dpt[i][nt][e] - ds[qi]);
          }
        }
      }
      // dV += P^T dO, dK += dS^T Q (reduction over the tile's queries).
#pragma unroll
      for (int kq = 0; kq < kBr / 16; ++kq) {
        uint32_t pa[kM][4], sa[kM][4];
#pragma unroll
        for (int i = 0; i < kM; ++i) {
          pack_a(pa[i], st[i][2 * kq], st[i][2 * kq + 1]);
          pack_a(sa[i], dpt[i][2 * kq], dpt[i][2 * kq + 1]);
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t ob[4], qb[4];
          ldsm_bt(ob, os, kLd, kq * 16, dp * 16, lane);
          ldsm_bt(qb, qs, kLd, kq * 16, dp * 16, lane);
#pragma unroll
          for (int i = 0; i < kM; ++i) {
            mma(dv[i][2 * dp], pa[i], ob[0], ob[1]);
            mma(dv[i][2 * dp + 1], pa[i], ob[2], ob[3]);
            mma(dk[i][2 * dp], sa[i], qb[0], qb[1]);
            mma(dk[i][2 * dp + 1], sa[i], qb[2], qb[3]);
          }
        }
      }
    }
    __syncthreads();
  }

  // Epilogue: dqkv's k and v columns of this warp's keys = scale dK, dV, written: this CTA
  // summed every query head of the group ([Written input gradients]).
#pragma unroll
  for (int i = 0; i < kM; ++i) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = kw0 + 16 * i + g + 8 * r;
      if (key < T) {
        bf16* pk = dqkv + (int64_t(b) * T + key) * S + int64_t(Hq + kvh) * D + 2 * c;
        bf16* pv = pk + int64_t(Hkv) * D;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          store_bf16x2(pk + dt * 8, dk[i][dt][2 * r] * scale, dk[i][dt][2 * r + 1] * scale);
          store_bf16x2(pv + dt * 8, dv[i][dt][2 * r], dv[i][dt][2 * r + 1]);
        }
      }
    }
  }
}

template <int D, int M>
struct DqCfg {
  static constexpr int kM = M;  // 16-query m-tiles per warp ([Warp tiles])
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBr = 16 * kM * kWarps;           // queries per block
  static constexpr int kBc = D > 64 || M > 1 ? 32 : 64;  // keys per tile (registers)
  static constexpr int kLd = D + kPad;
  // Q, dO [kBr][kLd]; K, V [2][kBc][kLd]
  static constexpr size_t kSmem = size_t(2 * kBr + 4 * kBc) * kLd * sizeof(bf16);
};

// grid (B*Hq, ceil(T / kBr)): dQ of kBr queries of one (b, h).
template <int D, int M>
__global__ void __launch_bounds__(DqCfg<D, M>::kThreads)
    flash_bwd_dq_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                        const bf16* __restrict__ qkv, const float* __restrict__ lse2,
                        const float* __restrict__ dvec, int T, int Hq, int Hkv, float sc2,
                        float scale) {
  using C = DqCfg<D, M>;
  constexpr int kLd = C::kLd, kBr = C::kBr, kBc = C::kBc, kM = C::kM;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* o_s = q_s + kBr * kLd;
  bf16* k_s = o_s + kBr * kLd;  // [2][kBc][kLd]
  bf16* v_s = k_s + 2 * kBc * kLd;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int bh = blockIdx.x, b = bh / Hq, h = bh % Hq, kvh = h / (Hq / Hkv);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;  // heaviest tiles first
  const int64_t S = int64_t(Hq + 2 * Hkv) * D, SO = int64_t(Hq) * D;
  const bf16* kg = qkv + int64_t(b) * T * S + int64_t(Hq + kvh) * D;
  const bf16* vg = kg + int64_t(Hkv) * D;
  const int q_end = min(q0 + kBr, T);
  const int nkt = (q_end - 1) / kBc + 1;

  const int64_t row0 = int64_t(b) * T + q0;
  load_tile<kBr, D, C::kThreads>(q_s, qkv + row0 * S + int64_t(h) * D, S, q_end - q0, tid);
  load_tile<kBr, D, C::kThreads>(o_s, dout + row0 * SO + int64_t(h) * D, SO, q_end - q0, tid);
  load_tile<kBc, D, C::kThreads>(k_s, kg, S, min(kBc, T), tid);
  load_tile<kBc, D, C::kThreads>(v_s, vg, S, min(kBc, T), tid);
  cp_async_commit();

  const int qr0 = warp * 16 * kM;  // this warp's first row of the block's Q/dO tiles
  const int qw0 = q0 + qr0;        // and its query
  float lr[kM][2], dr[kM][2];      // lse2 and dvec of rows g, g+8 of each m-tile
#pragma unroll
  for (int i = 0; i < kM; ++i) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int q = qw0 + 16 * i + g + 8 * r;
      lr[i][r] = q < T ? lse2[int64_t(bh) * T + q] : 0.0f;
      dr[i][r] = q < T ? dvec[int64_t(bh) * T + q] : 0.0f;
    }
  }
  uint32_t qa[kM][D / 16][4], oa[kM][D / 16][4];
  float dq[kM][D / 8][4] = {};
  for (int j = 0; j < nkt; ++j) {
    const int buf = j & 1;
    if (j + 1 < nkt) {
      const int k1 = (j + 1) * kBc;
      const int valid = min(kBc, T - k1);
      load_tile<kBc, D, C::kThreads>(k_s + (buf ^ 1) * kBc * kLd, kg + k1 * S, S, valid, tid);
      load_tile<kBc, D, C::kThreads>(v_s + (buf ^ 1) * kBc * kLd, vg + k1 * S, S, valid, tid);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int i = 0; i < kM; ++i) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          ldsm_a(qa[i][kk], q_s, kLd, qr0 + 16 * i, kk * 16, lane);
          ldsm_a(oa[i][kk], o_s, kLd, qr0 + 16 * i, kk * 16, lane);
        }
      }
    }
    const int k0 = j * kBc;
    if (k0 <= qw0 + 16 * kM - 1) {
      const bf16* ks = k_s + buf * kBc * kLd;
      const bf16* vs = v_s + buf * kBc * kLd;
      // S = Q K^T, dP = dO V^T: 16 queries x kBc keys per m-tile each.
      float s[kM][kBc / 8][4] = {}, dp[kM][kBc / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < kBc / 16; ++np) {
          uint32_t kb[4], vb[4];
          ldsm_b(kb, ks, kLd, np * 16, kk * 16, lane);
          ldsm_b(vb, vs, kLd, np * 16, kk * 16, lane);
#pragma unroll
          for (int i = 0; i < kM; ++i) {
            mma(s[i][2 * np], qa[i][kk], kb[0], kb[1]);
            mma(s[i][2 * np + 1], qa[i][kk], kb[2], kb[3]);
            mma(dp[i][2 * np], oa[i][kk], vb[0], vb[1]);
            mma(dp[i][2 * np + 1], oa[i][kk], vb[2], vb[3]);
          }
        }
      }
      // dS = P (dP - dvec), P = exp2(S sc2 - lse2), 0 where key > q (over s in place).
#pragma unroll
      for (int i = 0; i < kM; ++i) {
        const int r0 = qw0 + 16 * i;  // the m-tile's first query
        const bool diag = k0 + kBc - 1 > r0;
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float p = exp2f(s[i][nt][e] * sc2 - lr[i][e >> 1]);
            if (diag && k0 + nt * 8 + 2 * c + (e & 1) > r0 + g + (e >> 1) * 8) p = 0.0f;
            s[i][nt][e] = p * (dp[i][nt][e] - dr[i][e >> 1]);
          }
        }
      }
      // dQ += dS K (reduction over the tile's keys).
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        uint32_t sa[kM][4];
#pragma unroll
        for (int i = 0; i < kM; ++i) pack_a(sa[i], s[i][2 * kk], s[i][2 * kk + 1]);
#pragma unroll
        for (int dt = 0; dt < D / 16; ++dt) {
          uint32_t kb[4];
          ldsm_bt(kb, ks, kLd, kk * 16, dt * 16, lane);
#pragma unroll
          for (int i = 0; i < kM; ++i) {
            mma(dq[i][2 * dt], sa[i], kb[0], kb[1]);
            mma(dq[i][2 * dt + 1], sa[i], kb[2], kb[3]);
          }
        }
      }
    }
    __syncthreads();
  }

  // Epilogue: dqkv's q columns = scale dQ, written.
#pragma unroll
  for (int i = 0; i < kM; ++i) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int q = qw0 + 16 * i + g + 8 * r;
      if (q < T) {
        bf16* pq = dqkv + (int64_t(b) * T + q) * S + int64_t(h) * D + 2 * c;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt)
          store_bf16x2(pq + dt * 8, dq[i][dt][2 * r] * scale, dq[i][dt][2 * r + 1] * scale);
      }
    }
  }
}

// ---- Host side ------------------------------------------------------------------------------

void check_flash_shape(int B, int T, int Hq, int Hkv, int D) {
  TD_CHECK(B >= 0 && T >= 0, "bad flash attention shape B={} T={}", B, T);
  TD_CHECK(flash_attention_supported(D), "flash attention does not support head dim {}", D);
  TD_CHECK(Hq > 0 && Hkv > 0 && Hq % Hkv == 0,
           "query heads ({}) must be a positive multiple of kv heads ({})", Hq, Hkv);
  TD_CHECK(int64_t(B) * Hq < (int64_t(1) << 31) && T <= (1 << 21),
           "flash attention shape B={} T={} Hq={} is too large", B, T, Hq);
}

template <int D, int M>
void launch_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int Hq, int Hkv,
                    cudaStream_t stream) {
  using C = FwdCfg<D, M>;
  const float sc2 = float(kLog2e / std::sqrt(double(D)));
  set_smem(flash_fwd_kernel<D, M>, C::kSmem);
  const dim3 grid(unsigned(B * Hq), unsigned((T + C::kBr - 1) / C::kBr));
  flash_fwd_kernel<D, M><<<grid, C::kThreads, C::kSmem, stream>>>(out, lse, qkv, T, Hq, Hkv, sc2);
  CUDA_CHECK_LAUNCH();
}

template <int D, int M>
void launch_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse2,
                     const float* dvec, int B, int T, int Hq, int Hkv, cudaStream_t stream) {
  const float scale = float(1.0 / std::sqrt(double(D)));
  const float sc2 = float(kLog2e / std::sqrt(double(D)));
  {
    using C = DkvCfg<D, M>;
    set_smem(flash_bwd_dkv_kernel<D, M>, C::kSmem);
    const dim3 grid(unsigned(B * Hkv), unsigned((T + C::kBc - 1) / C::kBc));
    flash_bwd_dkv_kernel<D, M><<<grid, C::kThreads, C::kSmem, stream>>>(dqkv, dout, qkv, lse2, dvec,
                                                                        T, Hq, Hkv, sc2, scale);
    CUDA_CHECK_LAUNCH();
  }
  {
    using C = DqCfg<D, M>;
    set_smem(flash_bwd_dq_kernel<D, M>, C::kSmem);
    const dim3 grid(unsigned(B * Hq), unsigned((T + C::kBr - 1) / C::kBr));
    flash_bwd_dq_kernel<D, M><<<grid, C::kThreads, C::kSmem, stream>>>(dqkv, dout, qkv, lse2, dvec,
                                                                       T, Hq, Hkv, sc2, scale);
    CUDA_CHECK_LAUNCH();
  }
}

// [Warp tiles] of head dims up to 64: 2 unless a test or a benchmark asked for 1.
std::atomic<int> g_warp_tiles{2};

// Whether the kernels of head dims up to 64 run two m-tiles per warp ([Warp tiles]); head dim
// 128 always runs one (two would need more than 255 registers).
bool two_warp_tiles() {
  return g_warp_tiles.load(std::memory_order_relaxed) == 2;
}

}  // namespace

void flash_attention_require_wgmma(int D) {
#if TANDEM_HAVE_SM90A
  TD_CHECK(D == 64 || D == 128, "the wgmma flash kernels support head sizes 64 and 128, not {}", D);
  TD_CHECK(flash_wgmma_device(),
           "the wgmma flash kernels need a GPU of compute capability 9.0 (H100, H200)");
#else
  (void)D;
  TD_CHECK(false, "the wgmma flash kernels are not in this build (TANDEM_CUDA_ARCH lacks 90)");
#endif
}

bool flash_attention_supported(int D) {
  return D == 32 || D == 64 || D == 128;
}

void flash_attention_set_warp_tiles(int m) {
  TD_CHECK(m == 1 || m == 2, "flash attention warp tiles must be 1 or 2, got {}", m);
  g_warp_tiles.store(m, std::memory_order_relaxed);
}

bool flash_attention_wgmma_supported(int D) {
#if TANDEM_HAVE_SM90A
  return (D == 64 || D == 128) && flash_wgmma_device();
#else
  (void)D;
  return false;
#endif
}

void flash_attention_set_wgmma_key_tile(int keys) {
  TD_CHECK(keys == 0 || keys == 64 || keys == 128,
           "the wgmma key tile must be 64 or 128 (0: the head size's default), got {}", keys);
#if TANDEM_HAVE_SM90A
  flash_wgmma_set_forward_key_tile(keys);
#endif
}

void flash_attention_set_wgmma_dkv_query_tile(int queries) {
  TD_CHECK(queries == 32 || queries == 64, "the wgmma dK/dV query tile must be 32 or 64, got {}",
           queries);
#if TANDEM_HAVE_SM90A
  flash_wgmma_set_dkv_query_tile(queries);
#endif
}

void flash_attention_set_wgmma_dq_key_tile(int keys) {
  TD_CHECK(keys == 64 || keys == 128, "the wgmma dQ key tile must be 64 or 128, got {}", keys);
#if TANDEM_HAVE_SM90A
  flash_wgmma_set_dq_key_tile(keys);
#endif
}

void flash_attention_set_wgmma_forward_pipeline(ForwardPipeline mode) {
#if TANDEM_HAVE_SM90A
  flash_wgmma_set_forward_pipeline(mode);
#else
  (void)mode;
#endif
}

void flash_attention_set_wgmma_forward_loads(ForwardLoads loads) {
#if TANDEM_HAVE_SM90A
  flash_wgmma_set_forward_loads(loads);
#else
  (void)loads;
#endif
}

void flash_attention_set_wgmma_backward_passes(BackwardPasses passes) {
#if TANDEM_HAVE_SM90A
  flash_wgmma_set_backward_passes(passes);
#else
  (void)passes;
#endif
}

namespace {
// One of the backward's [B, Hq, T] fp32 vectors (lse2, dvec) in the scratch, 256-aligned.
size_t vector_bytes(int B, int T, int Hq) {
  return align256(size_t(B) * Hq * T * sizeof(float));
}
}  // namespace

size_t flash_attention_scratch_bytes(int B, int T, int Hq, int Hkv, int D, FlashKernels kernels) {
  check_flash_shape(B, T, Hq, Hkv, D);
  // lse2 and dvec of the backward, [B, Hq, T] fp32 each; the forward needs none.
  size_t bytes = 2 * vector_bytes(B, T, Hq);
#if TANDEM_HAVE_SM90A
  // The wgmma backward's dQ accumulator ([Wgmma one-pass backward]), whichever
  // BackwardPasses is set, so a change of it never outgrows the scratch.
  if (kernels == FlashKernels::wgmma && (D == 64 || D == 128)) bytes += dq_acc_bytes(B, T, Hq, D);
#else
  (void)kernels;
#endif
  return bytes;
}

void flash_attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int Hq, int Hkv,
                             int D, void* scratch, size_t scratch_bytes, cudaStream_t stream,
                             FlashKernels kernels) {
  check_flash_shape(B, T, Hq, Hkv, D);
  if (B == 0 || T == 0) return;
  TD_CHECK(out != nullptr && qkv != nullptr, "flash_attention_forward: null out or qkv");
  TD_CHECK(detail::aligned16(out) && detail::aligned16(qkv),
           "flash_attention_forward: out and qkv must be 16-byte aligned");
  (void)scratch;  // the forward needs no scratch (accepted for symmetry with the backward)
  (void)scratch_bytes;
  if (kernels == FlashKernels::wgmma) {
    flash_attention_require_wgmma(D);
#if TANDEM_HAVE_SM90A
    flash_wgmma_forward(out, lse, qkv, B, T, Hq, Hkv, D, stream);
#endif
    return;
  }
  const bool two = two_warp_tiles();
  switch (D) {
    case 32:
      two ? launch_forward<32, 2>(out, lse, qkv, B, T, Hq, Hkv, stream)
          : launch_forward<32, 1>(out, lse, qkv, B, T, Hq, Hkv, stream);
      break;
    case 64:
      two ? launch_forward<64, 2>(out, lse, qkv, B, T, Hq, Hkv, stream)
          : launch_forward<64, 1>(out, lse, qkv, B, T, Hq, Hkv, stream);
      break;
    default:
      launch_forward<128, 1>(out, lse, qkv, B, T, Hq, Hkv, stream);
      break;
  }
}

void flash_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* lse, int B, int T, int Hq, int Hkv, int D, void* scratch,
                              size_t scratch_bytes, cudaStream_t stream, FlashKernels kernels) {
  check_flash_shape(B, T, Hq, Hkv, D);
  if (kernels == FlashKernels::wgmma) flash_attention_require_wgmma(D);
  if (B == 0 || T == 0 || dqkv == nullptr) return;
  TD_CHECK(dout != nullptr && qkv != nullptr && out != nullptr && lse != nullptr,
           "flash_attention_backward needs dout, qkv and the forward's out and lse");
  TD_CHECK(detail::aligned16(dqkv) && detail::aligned16(dout) && detail::aligned16(qkv) &&
               detail::aligned16(out),
           "flash_attention_backward: dqkv, dout, qkv and out must be 16-byte aligned");
  detail::check_scratch(scratch, scratch_bytes,
                        flash_attention_scratch_bytes(B, T, Hq, Hkv, D, kernels),
                        "flash_attention_backward");
  // Scratch: lse2, dvec, then (wgmma) the one-pass dQ accumulator.
  char* base = static_cast<char*>(scratch);
  const size_t vec = vector_bytes(B, T, Hq);
  float* lse2 = reinterpret_cast<float*>(base);
  float* dvec = reinterpret_cast<float*>(base + vec);
  const dim3 prep_grid(unsigned(B * Hq),
                       unsigned(std::min(65535, (T + kPrepRows - 1) / kPrepRows)));
  flash_bwd_prep_kernel<<<prep_grid, kPrepRows * 8, 0, stream>>>(lse2, dvec, dout, out, lse, T, Hq,
                                                                 D);
  CUDA_CHECK_LAUNCH();
  if (kernels == FlashKernels::wgmma) {
#if TANDEM_HAVE_SM90A
    flash_wgmma_backward(dqkv, dout, qkv, lse2, dvec, B, T, Hq, Hkv, D, base + 2 * vec, stream);
#endif
    return;
  }
  const bool two = two_warp_tiles();
  switch (D) {
    case 32:
      two ? launch_backward<32, 2>(dqkv, dout, qkv, lse2, dvec, B, T, Hq, Hkv, stream)
          : launch_backward<32, 1>(dqkv, dout, qkv, lse2, dvec, B, T, Hq, Hkv, stream);
      break;
    case 64:
      two ? launch_backward<64, 2>(dqkv, dout, qkv, lse2, dvec, B, T, Hq, Hkv, stream)
          : launch_backward<64, 1>(dqkv, dout, qkv, lse2, dvec, B, T, Hq, Hkv, stream);
      break;
    default:
      launch_backward<128, 1>(dqkv, dout, qkv, lse2, dvec, B, T, Hq, Hkv, stream);
      break;
  }
}

}  // namespace tandem::cuda
