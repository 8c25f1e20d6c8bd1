// CUDA kernels of the skinny linear forward of decoding, out[N,OC] = x[N,IC] @ w[OC,IC]^T + bias
// for N <= kGemvMaxRows rows, where a GEMM library's tiles would mostly multiply padding and the
// product is bound by reading w; and its fusions with what surrounds a linear layer in a decode
// step (the norm or SwiGLU before it, the residual sum or GELU after it). See [GEMV].
//
// [GEMV] One kernel template, gemv_kernel<NR, MMA, Prologue, Epilogue>, of kGemvWarps warps per
// block and about one block per SM (a persistent grid):
//  - Prologue: the block stages the N rows of the product's input in shared memory as bf16
//    (xs[N][IC]): a copy of x, or the normalised x (each warp n < N first computes row n's mean
//    and rstd with the loop of the norm kernels, so the statistics are those of kernels_norm.cu,
//    then the block normalises and rounds to bf16 as the norm kernel's output would be), or
//    silu(gate) * up rounded to bf16 as swiglu_forward writes it. The input is tiny and read from
//    L2 once per block.
//  - Main loop, on CUDA cores (N = 1, 2) or on tensor cores (N >= 3; [GEMV MMA] below): the
//    block walks tiles of G row groups of kGemvRowsPerWarp rows of w (4 on CUDA cores, 16 on
//    tensor cores). On CUDA cores, the S = kGemvWarps / G warps of a row group split the
//    row's 16-byte chunks between them (warp s takes the runs of 32 chunks s, s + S, ...; lane
//    l the chunk l of each run), so a warp's loads of one row are 512 contiguous bytes,
//    kGemvUnroll chunks per row in flight per lane before any arithmetic; the last, partial
//    step of a row issues its loads masked, so it costs one memory round trip. S grows (a power of
//    two) while the grid would otherwise have fewer row groups than warps (OC of a few thousand
//    rows), so every SM keeps loads in flight. w is read exactly once, with loads that do not
//    allocate in L1; each x chunk read from shared memory serves all the warp's rows. Accumulation
//    is fp32 (bf16 pairs unpacked by shifts).
//  - Prefetch and [PDL] (kernels.cuh): before waiting for the previous kernel, the block asks L2
//    (bulk prefetches, one row per thread) for up to kGemvPrefetchBytes of its first tile, which
//    depends on nothing the previous kernel writes; at the start of each tile, for the same of
//    its next tile. DRAM keeps streaming through the previous kernel's tail, the prologue's
//    latency and the reductions between tiles.
//  - Reduction and epilogue: each warp stores its rows x N sums in shared memory (reduced over
//    its lanes with shuffles on CUDA cores; the mma accumulators as they are on tensor cores);
//    then one thread per output adds the S slices in slice order (deterministic, a function of
//    the shape only) and runs the epilogue: + bias, or + bias + residual, in fp32, rounded once
//    to bf16; or the GELU epilogue, which writes pre = round(acc + bias) and
//    out = round(gelu(pre)), the values of a product then the GELU kernel.
// Nothing depends on the data but the values, so a CUDA graph replays it; no allocation, no sync.
//
// [GEMV MMA] The tensor-core main loop (gemv_kernel<NR, true, ...>): the prologue, the tiles,
// the split into S slices, the prefetch, [PDL], the reduction and the epilogues are those
// above; only the warp's product differs. A warp owns one m16 tile, rows row0..row0 + 15, and
// computes its 16 x N block with mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32: A = 16 rows x
// k16 of w, B = k16 x n8 of the staged rows (column n = row n of x, zero for n >= N), fp32
// accumulators. Fragments, lane = 4 g + t (PTX ISA, "Matrix Fragments for mma.m16n8k16 with
// floating point type"; the layout [Fragments] in kernels_flash.cu relies on too):
//   A: a0 (row g, k 2t, 2t+1), a1 (row g+8, the same k), a2 (row g, k 2t+8, 2t+9), a3 (row
//      g+8, k 2t+8, 2t+9); B: b0 (k 2t, 2t+1 of column g), b1 (k 2t+8, 2t+9 of column g);
//   C: c0, c1 (row g, columns 2t, 2t+1), c2, c3 (row g+8, columns 2t, 2t+1).
// A sum over k does not care which logical k holds which column, as long as A and B agree, so
// no shuffle or ldmatrix is needed: lane (g, t) loads, with the same 16-byte non-allocating
// loads as the CUDA-core loop, chunk c (8 columns) of w rows g and g + 8 and of x row g, and
// feeds two mma: {lo.x, hi.x, lo.y, hi.y} x {x.x, x.y} (columns 8c..8c+3) and the same with
// .z, .w (8c+4..8c+7). The 4 lanes of one g take 4 adjacent chunks (a run: 64 contiguous
// bytes of each of the 16 rows per load instruction); warp s of S takes the runs s, s + S, ...,
// kGemvMmaUnroll runs (16 loads, 256 bytes per lane) in flight before any mma, as the CUDA-core
// loop keeps for N <= 4. A row's last, partial step loads zeros past the row's end in both w
// and x (exact zero products, never 0 * garbage), so IC need only be a multiple of 8; rows
// past OC read row OC - 1 and are never written. The accumulator's order of additions is fixed
// by the shape, so results are deterministic; they differ from the CUDA-core loop's only in
// the order of fp32 additions.
// Why N >= 3 (kGemvMmaMinRows): on CUDA cores each weight costs N FMAs, one unpack and N/4 of
// an x unpack, about 1 + 1.25 N lane instructions; at the copy rate (4.2 TB/s: 2.1e12 weights
// per second) that is 22% of the H200's issue rate (132 SMs x 128 lanes x ~2 GHz) at N = 2,
// 30% at N = 3, 38% at 4 and 70% at 8, where the measured loop reached only 45-71% of the copy
// rate. On tensor cores a run of 16 weights per lane costs 2 loads, 1 shared load and 2 mma
// whatever N is (~0.3 instructions per weight), and the mma work, one m16n8k16 per 256
// weights, is ~34 TFLOP/s at the copy rate: a few percent of the tensor cores. N = 2 is
// memory-bound either way and stays on the proven loop; set_gemv_path (kernels.cuh) forces
// either loop for every N >= 2 (the tests compare them, DecodeBench.Gemv times both).
#include <atomic>

#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

using detail::ld;
using detail::load_vec;
using detail::rn;
using detail::store_vec;
using detail::warp_sum;

constexpr int kGemvWarps = 16;
constexpr int kGemvThreads = kGemvWarps * 32;
// Rows of w per warp: 4 on CUDA cores, one m16 tile on tensor cores ([GEMV MMA]).
template <bool MMA>
constexpr int kGemvRowsPerWarp = MMA ? 16 : 4;
// The staged input rows, N * IC bf16, must fit in shared memory with one block per SM.
constexpr size_t kGemvMaxStagedBytes = size_t(200) << 10;
// 16-byte chunks of each row in flight per lane: more where few x rows leave registers free.
template <int NR>
constexpr int kGemvUnroll = NR <= 4 ? 4 : 2;
// Runs of 4 chunks per lane and step on tensor cores: two 16-byte loads per run (rows g and
// g + 8), so 16 loads (256 bytes) per lane in flight, as the CUDA-core path for NR <= 4.
constexpr int kGemvMmaUnroll = 8;
// Rows from which the automatic choice takes tensor cores ([GEMV MMA]).
constexpr int kGemvMmaMinRows = 3;
std::atomic<int> g_gemv_path{int(GemvPath::automatic)};
// Bytes of w a block asks L2 to fetch ahead: its first tile before waiting for the previous
// kernel ([PDL]), then the next tile while it works on one. At most this much per block (132
// blocks: 17 MB of the H200's 50 MB L2), from the tile's first row on.
constexpr int64_t kGemvPrefetchBytes = int64_t(128) << 10;

// A 16-byte load of read-only data streamed once: not kept in L1.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    f[2 * j] = __uint_as_float(w[j] << 16);
    f[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
  }
}

// ---- Prologues: stage the NR input rows as bf16 in xs[NR][IC] (IC % 8 == 0) ----

// A copy of x[NR, IC].
struct StageCopy {
  const bf16* x;
  template <int NR>
  __device__ void operator()(uint4* xs, int IC) const {
    const int n8 = NR * (IC / 8);
    const uint4* src = reinterpret_cast<const uint4*>(x);
    for (int i = threadIdx.x; i < n8; i += kGemvThreads) xs[i] = src[i];
  }
};

// LayerNorm (w, b; b may be null) or RMSNorm (w; rms) of each row of x[NR, IC], with the
// statistics and the expressions of the 16-byte paths of layernorm_fwd_kernel and
// rmsnorm_fwd_kernel (kernels_norm.cu), rounded to bf16.
struct StageNorm {
  const bf16* x;
  const bf16* w;
  const bf16* b;
  float eps;
  bool rms;
  template <int NR>
  __device__ void operator()(uint4* xs, int IC) const {
    __shared__ float s_mean[kGemvMaxRows], s_rstd[kGemvMaxRows];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp < NR) {
      const bf16* xr = x + int64_t(warp) * IC;
      float m = 0.0f, ss = 0.0f;
      if (rms) {
        for (int c = lane * 8; c < IC; c += 32 * 8) {
          float v[8];
          load_vec<8>(xr + c, v);
#pragma unroll
          for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
        }
      } else {
        float s = 0.0f;
        for (int c = lane * 8; c < IC; c += 32 * 8) {
          float v[8];
          load_vec<8>(xr + c, v);
#pragma unroll
          for (int j = 0; j < 8; ++j) s += v[j];
        }
        m = warp_sum(s) / float(IC);
        for (int c = lane * 8; c < IC; c += 32 * 8) {
          float v[8];
          load_vec<8>(xr + c, v);
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const float d = v[j] - m;
            ss += d * d;
          }
        }
      }
      const float r = 1.0f / sqrtf(warp_sum(ss) / float(IC) + eps);
      if (lane == 0) {
        s_mean[warp] = m;
        s_rstd[warp] = r;
      }
    }
    __syncthreads();
    const int chunks = IC / 8;
    bf16* xb = reinterpret_cast<bf16*>(xs);
    for (int i = threadIdx.x; i < NR * chunks; i += kGemvThreads) {
      const int n = i / chunks, c = (i - n * chunks) * 8;
      const float m = s_mean[n], r = s_rstd[n];
      float v[8], wv[8], o[8];
      load_vec<8>(x + int64_t(n) * IC + c, v);
      load_vec<8>(w + c, wv);
      if (rms) {
#pragma unroll
        for (int j = 0; j < 8; ++j) o[j] = v[j] * r * wv[j];
      } else {
        float bv[8];
        if (b) load_vec<8>(b + c, bv);
#pragma unroll
        for (int j = 0; j < 8; ++j) o[j] = (v[j] - m) * r * wv[j] + (b ? bv[j] : 0.0f);
      }
      store_vec<8>(xb + int64_t(n) * IC + c, o);
    }
  }
};

// silu(gate) * up of h[NR, 2 IC] = [gate | up], as swiglu_fwd_kernel (kernels_pointwise.cu).
struct StageSwiglu {
  const bf16* h;
  template <int NR>
  __device__ void operator()(uint4* xs, int IC) const {
    const int chunks = IC / 8;
    bf16* xb = reinterpret_cast<bf16*>(xs);
    for (int i = threadIdx.x; i < NR * chunks; i += kGemvThreads) {
      const int n = i / chunks, c = (i - n * chunks) * 8;
      const bf16* gate = h + int64_t(n) * 2 * IC + c;
      float g[8], u[8], o[8];
      load_vec<8>(gate, g);
      load_vec<8>(gate + IC, u);
#pragma unroll
      for (int k = 0; k < 8; ++k) o[k] = g[k] * detail::sigmoid_f(g[k]) * u[k];
      store_vec<8>(xb + int64_t(n) * IC + c, o);
    }
  }
};

// ---- Epilogues: output (n, row) from its fp32 sum ----

struct EpiBias {
  bf16* out;
  const bf16* bias;
  __device__ void operator()(int n, int row, int OC, float a) const {
    if (bias) a += ld(bias + row);
    out[int64_t(n) * OC + row] = rn(a);
  }
};

// out may alias residual: the element is read before it is written, by the same thread.
struct EpiResidual {
  bf16* out;
  const bf16* bias;
  const bf16* residual;
  __device__ void operator()(int n, int row, int OC, float a) const {
    const int64_t i = int64_t(n) * OC + row;
    if (bias) a += ld(bias + row);
    a += ld(residual + i);
    out[i] = rn(a);
  }
};

struct EpiGelu {
  bf16* out;
  bf16* pre;
  const bf16* bias;
  bool exact;  // GeluKind::erf
  __device__ void operator()(int n, int row, int OC, float a) const {
    const int64_t i = int64_t(n) * OC + row;
    if (bias) a += ld(bias + row);
    const bf16 p = rn(a);
    pre[i] = p;
    const float pf = __bfloat162float(p);
    out[i] = rn(exact ? detail::gelu_erf_f(pf) : detail::gelu_f(pf));
  }
};

// Adds the products of U chunks (k, k + step, ...) of R rows of w (from row w0 on, rows past
// `last` reading row `last` again) with the NR staged rows of x. MASKED: only the chunks below
// `chunks` (all U loads are issued before any arithmetic, so the last, partial step of a row
// costs one memory round trip); the chunks are added in the same order either way.
template <int NR, int R, int U, bool MASKED>
__device__ __forceinline__ void gemv_step(float (&acc)[R][NR], const uint4* __restrict__ w0,
                                          int last, const uint4* xs, int chunks, int k, int step) {
  uint4 wv[U][R];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool in = !MASKED || k + step * u < chunks;
#pragma unroll
    for (int r = 0; r < R; ++r)
      wv[u][r] = in ? ld_stream(w0 + int64_t(min(r, last)) * chunks + k + step * u)
                    : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (MASKED && k + step * u >= chunks) continue;  // the later u are out too
    float wf[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) unpack8(wv[u][r], wf[r]);
#pragma unroll
    for (int n = 0; n < NR; ++n) {
      float xf[8];
      unpack8(xs[n * chunks + k + step * u], xf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r][n] = fmaf(wf[r][e], xf[e], acc[r][n]);
      }
    }
  }
}

// d += a * b: one m16n8k16 tensor-core product of bf16 operands with fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// [GEMV MMA] Adds to the warp's 16 x 8 accumulator tile the products of U runs of 4 chunks (the
// runs from chunk `base`, `step` chunks apart) of the warp's 16 rows of w with the staged rows
// of x. Lane (g, t) loads chunk c = base + t (+ step * u) of its rows g (wlo) and g + 8 (whi)
// and of x row g (xrow; zeros for g >= NR), so with the 8 bf16 of a chunk in registers .x .y
// .z .w (2 each, the lower column in the low half), the run is two mma of k16 whose logical
// k columns are the lanes' columns in this order:
//   mma 1: a = {lo.x, hi.x, lo.y, hi.y}, b = {x.x, x.y}; mma 2: the same with .z, .w.
// In mma 1, a0/b0 (logical k 2t, 2t+1) are columns 8c, 8c+1 and a2/b1 (k 2t+8, 2t+9) are
// 8c+2, 8c+3 of both w and x, for the same c in every lane of the same t: A and B see one and
// the same permutation of k, so the product is the sum over the run's 32 columns.
// The two mma of a run add into two accumulator tiles (acc[0], acc[1]), so a step is two
// chains of U dependent mma rather than one of 2U; the warp adds them once at the end.
// MASKED: chunks at or past `chunks` read as zeros in w and x (exact zero products); runs that
// start past the row's end are skipped (uniform over the warp, which mma needs).
template <int NR, int U, bool MASKED>
__device__ __forceinline__ void gemv_mma_step(float (&acc)[2][4], const uint4* __restrict__ wlo,
                                              const uint4* __restrict__ whi, const uint4* xrow,
                                              bool xin, int chunks, int base, int step) {
  const int t = threadIdx.x & 3;
  uint4 lo[U], hi[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int c = base + t + step * u;
    const bool in = !MASKED || c < chunks;
    lo[u] = in ? ld_stream(wlo + c) : make_uint4(0, 0, 0, 0);
    hi[u] = in ? ld_stream(whi + c) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (MASKED && base + step * u >= chunks) break;  // uniform: the later runs are out too
    const int c = base + t + step * u;
    const uint4 xv = xin && (!MASKED || c < chunks) ? xrow[c] : make_uint4(0, 0, 0, 0);
    mma_bf16(acc[0], lo[u].x, hi[u].x, lo[u].y, hi[u].y, xv.x, xv.y);
    mma_bf16(acc[1], lo[u].z, hi[u].z, lo[u].w, hi[u].w, xv.z, xv.w);
  }
}

// The sums of one warp's rows of a tile with the NR staged rows, stored in red (R x NR, R =
// kGemvRowsPerWarp<MMA>) for the block's reduction: the warp's slice s of S of rows row0..,
// rows past OC computed from row OC - 1 (never written).
template <int NR, bool MMA>
__device__ __forceinline__ void gemv_warp_rows(float (*red)[NR], const bf16* __restrict__ w,
                                               const uint4* xs, int IC, int OC, int row0, int s,
                                               int S) {
  constexpr int R = kGemvRowsPerWarp<MMA>;
  const int lane = threadIdx.x & 31;
  const int chunks = IC / 8;
  if constexpr (MMA) {
    constexpr int U = kGemvMmaUnroll;
    float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    const int g = lane >> 2, t = lane & 3;
    if (row0 < OC) {  // uniform over the warp
      const uint4* wlo = reinterpret_cast<const uint4*>(w + int64_t(min(row0 + g, OC - 1)) * IC);
      const uint4* whi =
          reinterpret_cast<const uint4*>(w + int64_t(min(row0 + g + 8, OC - 1)) * IC);
      const bool xin = g < NR;
      const uint4* xrow = xs + (xin ? g : 0) * chunks;
      // Warp s takes the runs of 4 chunks s, s + S, ...: step * U chunks per loop step.
      const int step = 4 * S;
      int base = 4 * s;
      for (; base + step * (U - 1) + 4 <= chunks; base += step * U)
        gemv_mma_step<NR, U, false>(acc, wlo, whi, xrow, xin, chunks, base, step);
      if (base < chunks) gemv_mma_step<NR, U, true>(acc, wlo, whi, xrow, xin, chunks, base, step);
    }
    // C fragment: c0, c1 (row g, columns n = 2t, 2t + 1), c2, c3 (row g + 8, the same).
    const int n0 = 2 * t, n1 = 2 * t + 1;
    if (n0 < NR) {
      red[g][n0] = acc[0][0] + acc[1][0];
      red[g + 8][n0] = acc[0][2] + acc[1][2];
    }
    if (n1 < NR) {
      red[g][n1] = acc[0][1] + acc[1][1];
      red[g + 8][n1] = acc[0][3] + acc[1][3];
    }
  } else {
    constexpr int U = kGemvUnroll<NR>;
    float acc[R][NR];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int n = 0; n < NR; ++n) acc[r][n] = 0.0f;
    }
    if (row0 < OC) {  // uniform over the warp
      // Rows past OC read the last row again (computed, never written).
      const uint4* w0 = reinterpret_cast<const uint4*>(w + int64_t(row0) * IC);
      const int last = OC - 1 - row0;
      const int step = 32 * S;
      int k = s * 32 + lane;
      for (; k + step * (U - 1) < chunks; k += step * U)
        gemv_step<NR, R, U, false>(acc, w0, last, xs, chunks, k, step);
      if (k < chunks) gemv_step<NR, R, U, true>(acc, w0, last, xs, chunks, k, step);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int n = 0; n < NR; ++n) acc[r][n] = warp_sum(acc[r][n]);
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int n = 0; n < NR; ++n) red[r][n] = acc[r][n];
      }
    }
  }
}

// Asks L2 for the rows of tile `tile` (rows_per_tile rows from tile * rows_per_tile), at most
// kGemvPrefetchBytes of them: one bulk prefetch of a whole row per thread.
__device__ __forceinline__ void gemv_prefetch_tile(const bf16* w, int IC, int OC, int rows_per_tile,
                                                   int tile) {
  const int first = tile * rows_per_tile;
  const int64_t row_bytes = int64_t(IC) * int64_t(sizeof(bf16));  // a multiple of 16
  const int64_t most = kGemvPrefetchBytes / row_bytes > 0 ? kGemvPrefetchBytes / row_bytes : 1;
  const int rows = int(min(int64_t(min(rows_per_tile, OC - first)), most));
  for (int r = threadIdx.x; r < rows; r += kGemvThreads)
    detail::prefetch_l2(w + int64_t(first + r) * IC, uint32_t(row_bytes));
}

// MMA: the tensor-core main loop ([GEMV MMA]), else the CUDA-core one. S: warps per row group
// (a power of two dividing kGemvWarps). Dynamic shared memory: NR * IC bf16 (the staged input).
template <int NR, bool MMA, class Prologue, class Epilogue>
__global__ void __launch_bounds__(kGemvThreads, 1)
    gemv_kernel(Prologue pro, Epilogue epi, const bf16* __restrict__ w, int IC, int OC, int S) {
  constexpr int R = kGemvRowsPerWarp<MMA>;
  extern __shared__ uint4 xs[];
  __shared__ float red[kGemvWarps][R][NR];
  const int warp = threadIdx.x >> 5;
  const int G = kGemvWarps / S;
  const int g = warp / S, s = warp - g * S;
  const int tiles = int((int64_t(OC) + G * R - 1) / (G * R));

  // [PDL] The weights are constant: fetch the first tile while the previous kernel finishes,
  // then wait for it before the prologue reads its output (and before any epilogue writes).
  detail::pdl_launch_dependents();
  if (int(blockIdx.x) < tiles) gemv_prefetch_tile(w, IC, OC, G * R, blockIdx.x);
  detail::pdl_wait();
  pro.template operator()<NR>(xs, IC);
  __syncthreads();

  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    if (tile + int(gridDim.x) < tiles) gemv_prefetch_tile(w, IC, OC, G * R, tile + gridDim.x);
    gemv_warp_rows<NR, MMA>(red[warp], w, xs, IC, OC, (tile * G + g) * R, s, S);
    __syncthreads();
    for (int i = threadIdx.x; i < G * R * NR; i += kGemvThreads) {
      const int gg = i / (R * NR), r = (i / NR) % R, n = i % NR;
      const int row = (tile * G + gg) * R + r;
      if (row < OC) {
        float a = 0.0f;
        for (int j = 0; j < S; ++j) a += red[gg * S + j][r][n];
        epi(n, row, OC, a);
      }
    }
    __syncthreads();  // red is reused by the next tile
  }
}

// Lets `kernel` use kGemvMaxStagedBytes of dynamic shared memory, once per device; `done` is
// the caller's own flag, one per kernel (instantiations of one signature share a pointer
// type, so the flag cannot live here).
template <class K>
void allow_staged_bytes(K kernel, int device, std::atomic<uint64_t>& done) {
  const uint64_t bit = device < 64 ? uint64_t(1) << device : 0;
  if (bit && (done.load(std::memory_order_relaxed) & bit)) return;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(kGemvMaxStagedBytes)));
  done.fetch_or(bit, std::memory_order_relaxed);
}

template <int NR, bool MMA, class Prologue, class Epilogue>
void launch_gemv(const Prologue& pro, const Epilogue& epi, const bf16* w, int IC, int OC,
                 cudaStream_t stream) {
  constexpr int R = kGemvRowsPerWarp<MMA>;
  // Chunks of a row that one loop step of a warp covers: 32 lanes x U chunks on CUDA cores, U
  // runs of 4 chunks on tensor cores.
  constexpr int warp_step = MMA ? 4 * kGemvMmaUnroll : 32 * kGemvUnroll<NR>;
  auto kernel = gemv_kernel<NR, MMA, Prologue, Epilogue>;
  const size_t smem = size_t(NR) * IC * sizeof(bf16);
  int device = 0, sms = 0, per_sm = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  static std::atomic<uint64_t> allowed{0};  // one flag per instantiation of launch_gemv
  allow_staged_bytes(kernel, device, allowed);
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kGemvThreads, smem));
  const int64_t max_blocks = int64_t(sms) * (per_sm > 0 ? per_sm : 1);
  // Split rows across more warps while there are fewer row groups than warps and each slice
  // keeps at least one full warp step.
  const int chunks = IC / 8;
  const int64_t row_groups = (int64_t(OC) + R - 1) / R;
  int S = 1;
  while (S < kGemvWarps && row_groups * S < max_blocks * kGemvWarps &&
         chunks >= warp_step * (2 * S))
    S *= 2;
  const int64_t rows_per_tile = int64_t(kGemvWarps / S) * R;
  const int64_t tiles = (int64_t(OC) + rows_per_tile - 1) / rows_per_tile;
  const unsigned blocks = unsigned(tiles < max_blocks ? tiles : max_blocks);
  detail::launch_pdl(kernel, dim3(blocks), dim3(kGemvThreads), smem, stream, pro, epi, w, IC, OC,
                     S);
}

// Tensor cores for N >= kGemvMmaMinRows unless set_gemv_path says otherwise (N = 1 always on
// CUDA cores: an m16n8 product would be 7/8 padding columns, and N = 1 already streams w at
// 84-94% of the copy bandwidth). See [GEMV MMA] for the arithmetic.
template <int NR, class Prologue, class Epilogue>
void launch_gemv_path(const Prologue& pro, const Epilogue& epi, const bf16* w, int IC, int OC,
                      cudaStream_t stream) {
  if constexpr (NR == 1) {
    launch_gemv<1, false>(pro, epi, w, IC, OC, stream);
  } else {
    const auto path = GemvPath(g_gemv_path.load(std::memory_order_relaxed));
    const bool mma =
        path == GemvPath::tensor_cores || (path == GemvPath::automatic && NR >= kGemvMmaMinRows);
    if (mma)
      launch_gemv<NR, true>(pro, epi, w, IC, OC, stream);
    else
      launch_gemv<NR, false>(pro, epi, w, IC, OC, stream);
  }
}

template <class Prologue, class Epilogue>
void dispatch(int N, const Prologue& pro, const Epilogue& epi, const bf16* w, int IC, int OC,
              cudaStream_t stream) {
  switch (N) {
    case 1:
      launch_gemv_path<1>(pro, epi, w, IC, OC, stream);
      break;
    case 2:
      launch_gemv_path<2>(pro, epi, w, IC, OC, stream);
      break;
    case 3:
      launch_gemv_path<3>(pro, epi, w, IC, OC, stream);
      break;
    case 4:
      launch_gemv_path<4>(pro, epi, w, IC, OC, stream);
      break;
    case 5:
      launch_gemv_path<5>(pro, epi, w, IC, OC, stream);
      break;
    case 6:
      launch_gemv_path<6>(pro, epi, w, IC, OC, stream);
      break;
    case 7:
      launch_gemv_path<7>(pro, epi, w, IC, OC, stream);
      break;
    default:
      launch_gemv_path<8>(pro, epi, w, IC, OC, stream);
      break;
  }
}

bool shape_ok(int N, int IC, int OC, const bf16* w) {
  return N >= 1 && N <= kGemvMaxRows && IC > 0 && IC % 8 == 0 && OC > 0 &&
         size_t(N) * IC * sizeof(bf16) <= kGemvMaxStagedBytes && detail::aligned16(w);
}

void check(bool ok, const char* op, int N, int IC, int OC) {
  TD_CHECK(ok,
           "{}: unsupported N={} IC={} OC={} (needs 1 <= N <= {}, IC % 8 == 0, N * IC bf16 in "
           "shared memory and 16-byte aligned inputs)",
           op, N, IC, OC, kGemvMaxRows);
}

}  // namespace

void set_gemv_path(GemvPath path) {
  g_gemv_path.store(int(path), std::memory_order_relaxed);
}

GemvPath gemv_path() {
  return GemvPath(g_gemv_path.load(std::memory_order_relaxed));
}

bool gemv_supported(const bf16* x, const bf16* w, int N, int IC, int OC) {
  return shape_ok(N, IC, OC, w) && detail::aligned16(x);
}

void gemv_forward(bf16* out, const bf16* x, const bf16* w, const bf16* bias, int N, int IC, int OC,
                  cudaStream_t stream) {
  check(gemv_supported(x, w, N, IC, OC), "gemv_forward", N, IC, OC);
  dispatch(N, StageCopy{x}, EpiBias{out, bias}, w, IC, OC, stream);
}

void gemv_residual_forward(bf16* out, const bf16* x, const bf16* w, const bf16* bias,
                           const bf16* residual, int N, int IC, int OC, cudaStream_t stream) {
  check(gemv_supported(x, w, N, IC, OC), "gemv_residual_forward", N, IC, OC);
  dispatch(N, StageCopy{x}, EpiResidual{out, bias, residual}, w, IC, OC, stream);
}

void gemv_gelu_forward(bf16* out, bf16* pre, const bf16* x, const bf16* w, const bf16* bias, int N,
                       int IC, int OC, bool exact, cudaStream_t stream) {
  check(gemv_supported(x, w, N, IC, OC), "gemv_gelu_forward", N, IC, OC);
  dispatch(N, StageCopy{x}, EpiGelu{out, pre, bias, exact}, w, IC, OC, stream);
}

bool gemv_norm_supported(const bf16* x, const bf16* nw, const bf16* nb, const bf16* w, int N,
                         int IC, int OC) {
  return gemv_supported(x, w, N, IC, OC) && detail::aligned16(nw) && detail::aligned16(nb);
}

void gemv_norm_forward(bf16* out, const bf16* x, const bf16* nw, const bf16* nb, bool rms,
                       float eps, const bf16* w, const bf16* bias, int N, int IC, int OC,
                       cudaStream_t stream) {
  check(gemv_norm_supported(x, nw, nb, w, N, IC, OC), "gemv_norm_forward", N, IC, OC);
  dispatch(N, StageNorm{x, nw, rms ? nullptr : nb, eps, rms}, EpiBias{out, bias}, w, IC, OC,
           stream);
}

bool gemv_swiglu_supported(const bf16* h, const bf16* w, int N, int F, int OC) {
  return gemv_supported(h, w, N, F, OC);
}

void gemv_swiglu_residual_forward(bf16* out, const bf16* h, const bf16* w, const bf16* bias,
                                  const bf16* residual, int N, int F, int OC, cudaStream_t stream) {
  check(gemv_swiglu_supported(h, w, N, F, OC), "gemv_swiglu_residual_forward", N, F, OC);
  dispatch(N, StageSwiglu{h}, EpiResidual{out, bias, residual}, w, F, OC, stream);
}

}  // namespace tandem::cuda
