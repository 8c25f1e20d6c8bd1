// CUDA kernels of split sampling ([Split sampling] in device/kernels.h): the vocabulary is split
// over ranks, each rank reduces its slice of every row to K candidates (sample_candidates), and
// the rule runs over the union of the ranks' candidates (sample_pick). Both draw exactly the
// CPU table's tokens from the same (bf16-rounded) logits; see [Split kernels] below.
//
// [Split kernels] One block of kSplitThreads per row. With x_i the bf16 logits of the slice and
// z_i = x_i / temperature (IEEE division, as on the host); NaN logits are never candidates.
//  - sample_candidates, K = 1: one pass, the best (value, lowest global id) of x_i (greedy) or
//    of z_i + gumbel_noise(gumbel_row_key(seed, row_offset + n, pos[n]), id_offset + i).
//  - sample_candidates, K = top_k: the key of the K-th largest z by an exact radix select (four
//    passes of 8-bit digits, MSB first, over the order-preserving uint32 key of z, counting
//    duplicates), which also gives how many of the tokens equal to it are taken (the lower ids
//    first); then one pass compacts the taken tokens in id order (block-wide prefix sums of
//    per-thread counts), and the rest of the row is (-inf, -1) padding.
//  - sample_pick, K = 1: one thread per row, the best (value, lowest id) over the ranks.
//  - sample_pick, top_k: the row's ranks * K candidates sorted in shared memory (a bitonic sort
//    of 64-bit keys: z descending, then id ascending; padding last), so the kept sets are
//    prefixes: top-k keeps the prefix at or above the k-th z; top-p sums w = exp(z - max z) in
//    double over the prefix (a per-thread sum of a contiguous segment, then a block prefix sum,
//    in an order fixed by the shape) and cuts at the first end of a run of equal z whose
//    cumulative mass reaches top_p times the total; the draw is the argmax of z + noise over the
//    kept prefix. The CPU sums the same terms in sorted order: the two agree but for a total
//    that lands within a few ulps of a cut, and for the last-bit differences between device
//    and host exp/log (as in kernels_sample.cu).
#include <atomic>
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/gumbel.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

constexpr int kSplitThreads = 1024;
constexpr int kSplitWarps = kSplitThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

// Order-preserving key of a non-NaN float (-0 and +0 share one), and its inverse.
__device__ __forceinline__ uint32_t z_key(float z) {
  const uint32_t u = __float_as_uint(z == 0.0f ? 0.0f : z);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_z(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// A candidate (value, global id); id -1 is none. The better of two: the larger value, then
// the lower id.
struct Cand {
  float v;
  int id;
};
__device__ __forceinline__ Cand better(Cand a, Cand b) {
  if (a.id < 0) return b;
  if (b.id < 0) return a;
  return (b.v > a.v || (b.v == a.v && b.id < a.id)) ? b : a;
}

// The block's best, given to every thread; s holds kSplitWarps entries.
__device__ Cand block_best(Cand c, Cand* s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Cand other;
    other.v = __shfl_xor_sync(kFull, c.v, o);
    other.id = __shfl_xor_sync(kFull, c.id, o);
    c = better(c, other);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // s may still be read from an earlier call
  if (lane == 0) s[warp] = c;
  __syncthreads();
  Cand r = s[0];
  for (int w = 1; w < kSplitWarps; ++w) r = better(r, s[w]);
  return r;
}

// Exclusive prefix sum of x over the block's threads in thread order; `total` gets the sum. The
// order of the additions depends on the block shape only (doubles sum the same way every run).
// s holds kSplitWarps + 1 entries.
template <class T>
__device__ T block_scan(T x, T* s, T& total) {
  static_assert(kSplitWarps == 32, "the second level is one warp");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T incl = x;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += y;
  }
  T excl = __shfl_up_sync(kFull, incl, 1);
  if (lane == 0) excl = T(0);
  __syncthreads();  // s may still be read from an earlier call
  if (lane == 31) s[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    T wi = s[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const T y = __shfl_up_sync(kFull, wi, o);
      if (lane >= o) wi += y;
    }
    T we = __shfl_up_sync(kFull, wi, 1);
    if (lane == 0) we = T(0);
    s[lane] = we;
    if (lane == 31) s[kSplitWarps] = wi;
  }
  __syncthreads();
  total = s[kSplitWarps];
  return s[warp] + excl;
}

// Calls f(i0, x) for each step over the row: the thread's E consecutive logits from index i0
// (x[e] is valid where i0 + e < V); E = 8 (one 16-byte load) with VEC, else 1. Every thread
// makes the same calls, so f may synchronise the block.
template <bool VEC, class F>
__device__ __forceinline__ void each_step(const bf16* __restrict__ row, int V, F&& f) {
  constexpr int E = VEC ? 8 : 1;
  for (int base = 0; base < V; base += kSplitThreads * E) {
    const int i0 = base + int(threadIdx.x) * E;
    float x[E];
    if constexpr (VEC) {
      if (i0 + E <= V) {
        detail::load_vec<8>(row + i0, x);
      } else {
#pragma unroll
        for (int e = 0; e < E; ++e) x[e] = i0 + e < V ? __bfloat162float(row[i0 + e]) : 0.0f;
      }
    } else {
      x[0] = i0 < V ? __bfloat162float(row[i0]) : 0.0f;
    }
    f(i0, x);
  }
}

// Adds one to hist[bin] for the lanes with bin >= 0, one atomic per distinct bin of the warp.
__device__ __forceinline__ void count_bin(uint32_t* hist, int bin) {
  const unsigned peers = __match_any_sync(kFull, bin);
  if (bin >= 0 && int(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
}

struct CandShared {
  uint32_t hist[256];
  int scan[kSplitWarps + 1];
  Cand best[kSplitWarps];
  uint32_t digit, rest;
  int all;  // at most K valid tokens: take them all
};

template <bool VEC>
__global__ void __launch_bounds__(kSplitThreads)
    candidates_kernel(float* __restrict__ vals, int32_t* __restrict__ ids,
                      const bf16* __restrict__ logits, const int32_t* __restrict__ pos, int V,
                      int64_t Vp, int id_offset, int K, bool top_k_mode, float temperature,
                      uint64_t seed, int row_offset) {
  __shared__ CandShared sh;
  const int n = blockIdx.x;
  const bf16* row = logits + int64_t(n) * Vp;
  float* out_v = vals + int64_t(n) * K;
  int32_t* out_id = ids + int64_t(n) * K;
  constexpr int E = VEC ? 8 : 1;

  if (!top_k_mode) {  // K = 1: greedy, or temperature alone
    const bool greedy = temperature == 0.0f;
    const uint64_t key = greedy ? 0 : gumbel_row_key(seed, row_offset + n, pos[n]);
    Cand b{0.0f, -1};
    each_step<VEC>(row, V, [&](int i0, const float(&x)[E]) {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        if (i0 + e >= V || isnan(x[e])) continue;
        const int id = id_offset + i0 + e;
        b = better(b, Cand{greedy ? x[e] : x[e] / temperature + gumbel_noise(key, id), id});
      }
    });
    b = block_best(b, sh.best);
    if (threadIdx.x == 0) {
      out_v[0] = b.id < 0 ? -INFINITY : b.v;
      out_id[0] = b.id;
    }
    return;
  }

  // The key of the K-th largest z (counting duplicates), and how many tokens equal to it are
  // taken (`rank` after the last pass).
  uint32_t prefix = 0, mask = 0, rank = uint32_t(K);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kSplitThreads) sh.hist[b] = 0;
    __syncthreads();
    each_step<VEC>(row, V, [&](int i0, const float(&x)[E]) {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const bool valid = i0 + e < V && !isnan(x[e]);
        const uint32_t key = valid ? z_key(x[e] / temperature) : 0u;
        count_bin(sh.hist, valid && (key & mask) == prefix ? int((key >> shift) & 255u) : -1);
      }
    });
    __syncthreads();
    if (threadIdx.x == 0) {
      if (shift == 24) {
        uint32_t total = 0;
        for (int b = 0; b < 256; ++b) total += sh.hist[b];
        sh.all = total <= uint32_t(K);
      }
      if (!sh.all) {
        uint32_t cum = 0;
        for (int b = 255; b >= 0; --b) {
          if (cum + sh.hist[b] >= rank) {
            sh.digit = uint32_t(b);
            sh.rest = rank - cum;
            break;
          }
          cum += sh.hist[b];
        }
      }
    }
    __syncthreads();
    if (sh.all) break;
    prefix |= sh.digit << shift;
    mask |= 255u << shift;
    rank = sh.rest;
  }
  const bool all = sh.all != 0;
  const uint32_t kth = prefix;
  const int take_eq = all ? 0 : int(rank);

  // Compaction in id order: token i is taken if key(z_i) > kth, or if it equals kth and fewer
  // than take_eq tokens of lower id equal it.
  int written = 0, eq_seen = 0;  // over the earlier steps, the same in every thread
  each_step<VEC>(row, V, [&](int i0, const float(&x)[E]) {
    if (written >= K) return;  // uniform: every thread sees the same `written`
    uint32_t key[E];
    bool valid[E];
    int n_eq = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      valid[e] = i0 + e < V && !isnan(x[e]);
      key[e] = valid[e] ? z_key(x[e] / temperature) : 0u;
      n_eq += valid[e] && !all && key[e] == kth;
    }
    int eq_total;
    int eq_rank = eq_seen + block_scan(n_eq, sh.scan, eq_total);
    bool take[E];
    int n_take = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      take[e] = false;
      if (!valid[e]) continue;
      if (all || key[e] > kth) {
        take[e] = true;
      } else if (key[e] == kth) {
        take[e] = eq_rank < take_eq;
        ++eq_rank;
      }
      n_take += take[e];
    }
    int take_total;
    int at = written + block_scan(n_take, sh.scan, take_total);
#pragma unroll
    for (int e = 0; e < E; ++e)
      if (take[e]) {
        out_v[at] = x[e] / temperature;
        out_id[at] = id_offset + i0 + e;
        ++at;
      }
    eq_seen += eq_total;
    written += take_total;
  });
  for (int j = written + int(threadIdx.x); j < K; j += kSplitThreads) {
    out_v[j] = -INFINITY;
    out_id[j] = -1;
  }
}

// K = 1: the best candidate of each row over the ranks.
__global__ void pick_best_kernel(int32_t* __restrict__ tokens, const float* __restrict__ vals,
                                 const int32_t* __restrict__ ids, int N, int ranks) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  Cand b{0.0f, -1};
  for (int r = 0; r < ranks; ++r) {
    const int64_t at = int64_t(r) * N + n;
    const int id = ids[at];
    const float v = vals[at];
    if (id >= 0 && !isnan(v)) b = better(b, Cand{v, id});
  }
  tokens[n] = b.id < 0 ? 0 : b.id;
}

struct PickShared {
  double mass[kSplitWarps + 1];
  int scan[kSplitWarps + 1];
  Cand best[kSplitWarps];
  int cut;
};

constexpr unsigned long long kNoCand = ~0ull;

__device__ __forceinline__ uint32_t hi_key(unsigned long long k) {
  return uint32_t(k >> 32);
}

// top_k: the rule over the union of the row's ranks * K candidates, sorted in shared memory
// (S, a power of two >= ranks * K, 64-bit keys).
__global__ void __launch_bounds__(kSplitThreads)
    pick_top_k_kernel(int32_t* __restrict__ tokens, const float* __restrict__ vals,
                      const int32_t* __restrict__ ids, const int32_t* __restrict__ pos, int N,
                      int ranks, int K, int S, int top_k, float top_p, uint64_t seed,
                      int row_offset) {
  extern __shared__ unsigned long long keys[];
  __shared__ PickShared sh;
  const int n = blockIdx.x;
  const int M = ranks * K;

  // Key: (~z_key(z) << 32) | id, so ascending keys are z descending, then id ascending.
  for (int j = threadIdx.x; j < S; j += kSplitThreads) {
    unsigned long long k = kNoCand;
    if (j < M) {
      const int r = j / K, c = j - r * K;
      const int64_t at = (int64_t(r) * N + n) * K + c;
      const int id = ids[at];
      const float v = vals[at];
      if (id >= 0 && !isnan(v))
        k = (static_cast<unsigned long long>(~z_key(v)) << 32) | static_cast<uint32_t>(id);
    }
    keys[j] = k;
  }
  __syncthreads();
  // Bitonic sort, ascending: S / 2 compare-exchanges per stage.
  for (int size = 2; size <= S; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < S / 2; t += kSplitThreads) {
        const int i = 2 * t - (t & (stride - 1));
        const int j = i + stride;
        const bool up = (i & size) == 0;
        const unsigned long long a = keys[i], b = keys[j];
        if ((a > b) == up) {
          keys[i] = b;
          keys[j] = a;
        }
      }
      __syncthreads();
    }

  // The real candidates, then the top-k prefix: z at or above the top_k-th z.
  int mine = 0;
  for (int j = threadIdx.x; j < S; j += kSplitThreads) mine += keys[j] != kNoCand;
  int count;
  block_scan(mine, sh.scan, count);
  int L = count;
  if (top_k < count) {
    const uint32_t kth = hi_key(keys[top_k - 1]);
    mine = 0;
    for (int j = threadIdx.x; j < count; j += kSplitThreads) mine += hi_key(keys[j]) <= kth;
    block_scan(mine, sh.scan, L);
  }

  // top-p over the prefix [0, L): cut after the first run of equal z whose cumulative mass
  // reaches top_p times the total.
  if (top_p < 1.0f && L > 0) {
    const double m = key_z(~hi_key(keys[0]));
    const int seg = (L + kSplitThreads - 1) / kSplitThreads;
    const int lo = min(L, int(threadIdx.x) * seg), hi = min(L, lo + seg);
    double part = 0.0;
    for (int j = lo; j < hi; ++j) part += exp(double(key_z(~hi_key(keys[j]))) - m);
    double total;
    double cum = block_scan(part, sh.mass, total);
    const double target = double(top_p) * total;
    if (threadIdx.x == 0) sh.cut = L - 1;
    __syncthreads();
    for (int j = lo; j < hi; ++j) {
      cum += exp(double(key_z(~hi_key(keys[j]))) - m);
      const bool run_end = j == L - 1 || hi_key(keys[j + 1]) != hi_key(keys[j]);
      if (run_end && cum >= target) {
        atomicMin(&sh.cut, j);
        break;
      }
    }
    __syncthreads();
    L = sh.cut + 1;
  }

  // The draw over the kept prefix.
  const uint64_t key = gumbel_row_key(seed, row_offset + n, pos[n]);
  Cand b{0.0f, -1};
  for (int j = threadIdx.x; j < L; j += kSplitThreads) {
    const int id = int(static_cast<uint32_t>(keys[j]));
    b = better(b, Cand{key_z(~hi_key(keys[j])) + gumbel_noise(key, id), id});
  }
  b = block_best(b, sh.best);
  if (threadIdx.x == 0) tokens[n] = b.id < 0 ? 0 : b.id;
}

// Lets pick_top_k_kernel use the shared memory of kSamplePickMaxCandidates keys, once per
// device.
void allow_pick_shared(int bytes) {
  static std::atomic<uint64_t> done{0};
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = device < 64 ? uint64_t(1) << device : 0;
  if (bit && (done.load(std::memory_order_relaxed) & bit)) return;
  CUDA_CHECK(
      cudaFuncSetAttribute(pick_top_k_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.fetch_or(bit, std::memory_order_relaxed);
}

void check_rule(const char* op, float temperature, int top_k) {
  TD_CHECK(temperature >= 0.0f && std::isfinite(temperature),
           "{}: temperature {} is not a finite number >= 0", op, temperature);
  TD_CHECK(top_k >= 0, "{}: top_k {} < 0", op, top_k);
}

int expected_k(float temperature, int top_k) {
  return temperature == 0.0f || top_k == 0 ? 1 : top_k;
}

}  // namespace

void sample_candidates(float* vals, int32_t* ids, const bf16* logits, const int32_t* pos, int N,
                       int V, int Vp, int id_offset, int K, float temperature, int top_k,
                       uint64_t seed, int row_offset, cudaStream_t stream) {
  TD_CHECK(N >= 0 && V >= 0 && Vp >= V && id_offset >= 0,
           "sample_candidates: bad shape N={} V={} Vp={} id_offset={}", N, V, Vp, id_offset);
  check_rule("sample_candidates", temperature, top_k);
  TD_CHECK(K == expected_k(temperature, top_k), "sample_candidates: K={} but the rule asks for {}",
           K, expected_k(temperature, top_k));
  if (N == 0) return;
  const bool top_k_mode = temperature != 0.0f && top_k > 0;
  const bool vec = V > 0 && Vp % 8 == 0 && detail::aligned16(logits);
  if (vec)
    candidates_kernel<true><<<unsigned(N), kSplitThreads, 0, stream>>>(
        vals, ids, logits, pos, V, Vp, id_offset, K, top_k_mode, temperature, seed, row_offset);
  else
    candidates_kernel<false><<<unsigned(N), kSplitThreads, 0, stream>>>(
        vals, ids, logits, pos, V, Vp, id_offset, K, top_k_mode, temperature, seed, row_offset);
  CUDA_CHECK_LAUNCH();
}

void sample_pick(int32_t* tokens, const float* vals, const int32_t* ids, const int32_t* pos, int N,
                 int ranks, int K, float temperature, int top_k, float top_p, uint64_t seed,
                 int row_offset, cudaStream_t stream) {
  TD_CHECK(N >= 0 && ranks >= 1 && K >= 1, "sample_pick: bad shape N={} ranks={} K={}", N, ranks,
           K);
  check_rule("sample_pick", temperature, top_k);
  TD_CHECK(top_p > 0.0f && top_p <= 1.0f, "sample_pick: top_p {} is not in (0, 1]", top_p);
  TD_CHECK(temperature == 0.0f || top_k > 0 || top_p >= 1.0f,
           "sample_pick: top_p {} without top_k is not split over ranks", top_p);
  TD_CHECK(K == expected_k(temperature, top_k), "sample_pick: K={} but the rule asks for {}", K,
           expected_k(temperature, top_k));
  if (N == 0) return;
  if (temperature == 0.0f || top_k == 0) {
    pick_best_kernel<<<detail::grid_for(N, 256), 256, 0, stream>>>(tokens, vals, ids, N, ranks);
    CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t M = int64_t(ranks) * K;
  TD_CHECK(M <= kSamplePickMaxCandidates,
           "sample_pick: top_k {} over {} ranks is {} candidates per row; the CUDA table takes at "
           "most {} (top_k <= {} at this rank count)",
           top_k, ranks, M, kSamplePickMaxCandidates, kSamplePickMaxCandidates / ranks);
  int S = 1;
  while (S < M) S <<= 1;
  const int bytes = S * int(sizeof(unsigned long long));
  allow_pick_shared(kSamplePickMaxCandidates * int(sizeof(unsigned long long)));
  pick_top_k_kernel<<<unsigned(N), kSplitThreads, size_t(bytes), stream>>>(
      tokens, vals, ids, pos, N, ranks, K, S, top_k, top_p, seed, row_offset);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::cuda
