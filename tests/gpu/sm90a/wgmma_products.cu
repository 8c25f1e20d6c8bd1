// Single warpgroup products through src/device/cuda/sm90a/wgmma.cuh (see wgmma_products.h).
#include "gpu/sm90a/wgmma_products.h"

#include "device/cuda/cuda_check.h"
#include "device/cuda/sm90a/wgmma.cuh"

namespace tandem::cuda::wgmma_test {

namespace {

using namespace flash;

constexpr int kThreads = 128;  // one warpgroup

// Writes a warpgroup's accumulator d[N/8][4] (64 rows) into row-major c[64][N].
template <int N>
__device__ void store_acc(float* c, const float (&d)[N / 8][4]) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      c[(16 * w + g + 8 * (e >> 1)) * N + 8 * j + 2 * q + (e & 1)] = d[j][e];
}

__device__ bf16* aligned_smem() {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t a = smem_u32(smem_raw);
  return reinterpret_cast<bf16*>(smem_raw + ((1024 - (a & 1023)) & 1023));
}

// A is a tile of 128 rows of which the product reads the second 64, as the flash kernels'
// second warpgroup does.
template <int N, int D>
__global__ void kmajor_kernel(float* c, const bf16* a, const bf16* b) {
  bf16* a_s = aligned_smem();
  bf16* b_s = a_s + 128 * D;
  load_tile_sw<128, D, kThreads>(a_s, a, D, 128, threadIdx.x);
  load_tile_sw<N, D, kThreads>(b_s, b, D, N, threadIdx.x);
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async_smem();
  __syncthreads();
  float d[N / 8][4] = {};
  wgmma_hold(d);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
    wgmma_ss(d, desc_k<128>(a_s, 64, ks), desc_k<N>(b_s, 0, ks), ks);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_hold(d);
  store_acc<N>(c, d);
}

template <int N, int D>
__global__ void nmajor_kernel(float* c, const bf16* p, const bf16* v) {
  bf16* v_s = aligned_smem();
  load_tile_sw<N, D, kThreads>(v_s, v, D, N, threadIdx.x);
  cp_async_commit();
  // P's A fragments straight from global memory, in the accumulator layout of its 64 x N.
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  float pf[N / 8][4];
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      pf[j][e] = __bfloat162float(p[(16 * w + g + 8 * (e >> 1)) * N + 8 * j + 2 * q + (e & 1)]);
  uint32_t pa[N / 16][4];
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) pack_a(pa[kk], pf[2 * kk], pf[2 * kk + 1]);
  cp_async_wait<0>();
  fence_proxy_async_smem();
  __syncthreads();
  float d[D / 8][4] = {};
  wgmma_hold(pa);
  wgmma_hold(d);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) wgmma_rs_nmajor(d, pa[kk], desc_n<N>(v_s, kk));
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_hold(d);
  wgmma_hold(pa);
  store_acc<D>(c, d);
}

template <class Kernel>
void launch(Kernel kernel, size_t smem, cudaStream_t stream, float* c, const bf16* x,
            const bf16* y) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<1, kThreads, smem, stream>>>(c, x, y);
  CUDA_CHECK_LAUNCH();
}

template <int D>
void kmajor_n(float* c, const bf16* a, const bf16* b, int n, cudaStream_t s) {
  const size_t smem = size_t(128 + n) * D * sizeof(bf16) + 1024;
  if (n == 32) launch(kmajor_kernel<32, D>, smem, s, c, a, b);
  if (n == 64) launch(kmajor_kernel<64, D>, smem, s, c, a, b);
  if (n == 128) launch(kmajor_kernel<128, D>, smem, s, c, a, b);
}

template <int D>
void nmajor_n(float* c, const bf16* p, const bf16* v, int n, cudaStream_t s) {
  const size_t smem = size_t(n) * D * sizeof(bf16) + 1024;
  if (n == 32) launch(nmajor_kernel<32, D>, smem, s, c, p, v);
  if (n == 64) launch(nmajor_kernel<64, D>, smem, s, c, p, v);
  if (n == 128) launch(nmajor_kernel<128, D>, smem, s, c, p, v);
}

__global__ void probe_kernel() {}

}  // namespace

void product_kmajor(float* c, const bf16* a, const bf16* b, int n, int d, cudaStream_t stream) {
  d == 64 ? kmajor_n<64>(c, a, b, n, stream) : kmajor_n<128>(c, a, b, n, stream);
}

void product_nmajor(float* c, const bf16* p, const bf16* v, int n, int d, cudaStream_t stream) {
  d == 64 ? nmajor_n<64>(c, p, v, n, stream) : nmajor_n<128>(c, p, v, n, stream);
}

bool runs_here() {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, probe_kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  int device = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
}

}  // namespace tandem::cuda::wgmma_test
