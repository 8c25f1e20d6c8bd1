// CUDA kernels: token (+ learned position) embedding lookup and its backward. The token-table
// gradient is made deterministic without atomics: a stable CUB radix sort groups equal tokens
// (keeping row order), then one thread per (token, channel) sums that token's rows in order.
#include <cub/device/device_radix_sort.cuh>

#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

using detail::grid_for;
using detail::load_vec;
using detail::store_vec;

constexpr int kThreads = 256;

// out[i, c] = wte[tok, c] (+ wpe[t, c]); a token outside [0, V) writes a NaN row.
template <int VEC>
__global__ void embedding_fwd_kernel(bf16* __restrict__ out, const int32_t* __restrict__ tokens,
                                     const bf16* __restrict__ wte, const bf16* __restrict__ wpe,
                                     int64_t N, int T, int C, int V) {
  const int64_t per_row = C / VEC;
  const int64_t total = N * per_row;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total; v += stride) {
    const int64_t i = v / per_row;
    const int c = int(v % per_row) * VEC;
    const int tok = tokens[i];
    float o[VEC];
    if (tok < 0 || tok >= V) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) o[j] = detail::qnan();
    } else {
      load_vec<VEC>(wte + int64_t(tok) * C + c, o);
      if (wpe) {
        float p[VEC];
        load_vec<VEC>(wpe + int64_t(i % T) * C + c, p);
#pragma unroll
        for (int j = 0; j < VEC; ++j) o[j] += p[j];
      }
    }
    store_vec<VEC>(out + i * C + c, o);
  }
}

// Sort input: keys = tokens with ids outside [0, V) mapped to the sentinel V, values = rows.
__global__ void embedding_sort_prep_kernel(int32_t* __restrict__ keys, int32_t* __restrict__ rows,
                                           const int32_t* __restrict__ tokens, int N, int V) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= N) return;
  const int tok = tokens[i];
  keys[i] = (tok < 0 || tok >= V) ? V : tok;
  rows[i] = i;
}

// Block (pos, channel block): if sorted position pos starts a run of equal tokens, its threads
// sum the run's dout rows (in row order: the sort is stable) and add them to dwte[token]. The
// run's row ids are staged through shared memory a block at a time so the dout loads of one
// thread are independent of each other (a frequent token's long run stays latency-friendly).
__global__ void embedding_bwd_wte_kernel(float* __restrict__ dwte, const bf16* __restrict__ dout,
                                         const int32_t* __restrict__ keys,
                                         const int32_t* __restrict__ rows, int N, int C, int V) {
  __shared__ int32_t s_rows[256];
  const int pos = blockIdx.x;
  const int key = keys[pos];
  if (key >= V || (pos > 0 && keys[pos - 1] == key)) return;  // uniform over the block
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  float acc = 0.0f;
  for (int base = pos;; base += blockDim.x) {
    const int k = base + threadIdx.x;
    const bool in = k < N && keys[k] == key;  // the run is a prefix of each chunk (sorted)
    s_rows[threadIdx.x] = in ? rows[k] : 0;
    const int count = __syncthreads_count(in);
    if (c < C) {
#pragma unroll 4
      for (int j = 0; j < count; ++j) acc += __bfloat162float(dout[int64_t(s_rows[j]) * C + c]);
    }
    __syncthreads();
    if (count < int(blockDim.x)) break;
  }
  if (c < C) dwte[int64_t(key) * C + c] += acc;
}

// dwpe[t, c] += sum over b of dout[b, t, c], b in order.
__global__ void embedding_bwd_wpe_kernel(float* __restrict__ dwpe, const bf16* __restrict__ dout,
                                         int B, int T, int C) {
  const int64_t total = int64_t(T) * C;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    float acc = 0.0f;
    for (int b = 0; b < B; ++b) acc += __bfloat162float(dout[int64_t(b) * total + e]);
    dwpe[e] += acc;
  }
}

int key_bits(int V) {  // bits to sort keys in [0, V] (V is the sentinel)
  int bits = 1;
  while (bits < 31 && (int64_t(1) << bits) <= V) ++bits;
  return bits;
}

size_t align256(size_t x) {
  return (x + 255) / 256 * 256;
}

size_t cub_temp_bytes(int N, int V) {
  size_t temp = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, temp, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), N, 0, key_bits(V)));
  return temp;
}

}  // namespace

void embedding_forward(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe, int B,
                       int T, int C, int V, cudaStream_t stream) {
  TD_CHECK(B >= 0 && T >= 0 && C >= 0 && V > 0, "bad shape B={} T={} C={} V={}", B, T, C, V);
  const int64_t N = int64_t(B) * T;
  if (N == 0 || C == 0) return;
  const bool vec = C % 8 == 0 && detail::aligned16(out) && detail::aligned16(wte) &&
                   (!wpe || detail::aligned16(wpe));
  if (vec) {
    embedding_fwd_kernel<8><<<grid_for(N * C / 8, kThreads, 65535), kThreads, 0, stream>>>(
        out, tokens, wte, wpe, N, T, C, V);
  } else {
    embedding_fwd_kernel<1><<<grid_for(N * C, kThreads, 65535), kThreads, 0, stream>>>(
        out, tokens, wte, wpe, N, T, C, V);
  }
  CUDA_CHECK_LAUNCH();
}

size_t embedding_backward_scratch_bytes(int B, int T, int V) {
  const int N = B * T;
  if (N <= 0) return 0;
  // keys in, keys out, rows in, rows out, then CUB's temporary storage.
  return 4 * align256(size_t(N) * sizeof(int32_t)) + align256(cub_temp_bytes(N, V));
}

void embedding_backward(float* dwte, float* dwpe, const bf16* dout, const int32_t* tokens, int B,
                        int T, int C, int V, void* scratch, size_t scratch_bytes,
                        cudaStream_t stream) {
  TD_CHECK(B >= 0 && T >= 0 && C >= 0 && V > 0, "bad shape B={} T={} C={} V={}", B, T, C, V);
  TD_CHECK(int64_t(B) * T < (int64_t(1) << 31), "too many rows B*T={}", int64_t(B) * T);
  const int N = B * T;
  if (N == 0 || C == 0) return;
  if (dwte) {
    detail::check_scratch(scratch, scratch_bytes, embedding_backward_scratch_bytes(B, T, V),
                          "embedding_backward");
    char* p = static_cast<char*>(scratch);
    const size_t arr = align256(size_t(N) * sizeof(int32_t));
    auto* keys_in = reinterpret_cast<int32_t*>(p);
    auto* keys_out = reinterpret_cast<int32_t*>(p + arr);
    auto* rows_in = reinterpret_cast<int32_t*>(p + 2 * arr);
    auto* rows_out = reinterpret_cast<int32_t*>(p + 3 * arr);
    void* temp = p + 4 * arr;
    size_t temp_bytes = scratch_bytes - 4 * arr;
    embedding_sort_prep_kernel<<<grid_for(N, kThreads), kThreads, 0, stream>>>(keys_in, rows_in,
                                                                               tokens, N, V);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, rows_in,
                                               rows_out, N, 0, key_bits(V), stream));
    CUDA_CHECK_LAUNCH();
    const int cthreads = C < 256 ? (C + 31) / 32 * 32 : 256;
    const dim3 grid(unsigned(N), unsigned((C + cthreads - 1) / cthreads));
    embedding_bwd_wte_kernel<<<grid, cthreads, 0, stream>>>(dwte, dout, keys_out, rows_out, N, C,
                                                            V);
    CUDA_CHECK_LAUNCH();
  }
  if (dwpe) {
    embedding_bwd_wpe_kernel<<<grid_for(int64_t(T) * C, kThreads, 65535), kThreads, 0, stream>>>(
        dwpe, dout, B, T, C);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace tandem::cuda
