// CUDA elementwise kernels: GELU (tanh and exact erf), SwiGLU, residual add and the fp32 <-> bf16
// casts, forward and backward. Memory-bound: 16-byte accesses (8 bf16) where the pointers are
// aligned, a scalar pass for the tail, fp32 arithmetic and one rounding per bf16 output.
#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

using detail::grid_for;
using detail::load_vec;
using detail::store_vec;

using detail::gelu_erf_f;
using detail::gelu_f;
using detail::kGeluA;
using detail::kGeluS;
using detail::kInvSqrt2;
using detail::sigmoid_f;

constexpr int kThreads = 256;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // 1/sqrt(2 pi)

__device__ __forceinline__ float gelu_grad(float x) {
  const float u = kGeluS * (x + kGeluA * x * x * x);
  const float th = tanhf(u);
  const float du = kGeluS * (1.0f + 3.0f * kGeluA * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

// The derivative of exact GELU, Phi(x) + x phi(x) (Phi the standard normal CDF, phi its density),
// the same expression as the CPU reference.
__device__ __forceinline__ float gelu_erf_grad(float x) {
  const float cdf = 0.5f * (1.0f + erff(x * kInvSqrt2));
  const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
  return cdf + x * pdf;
}

struct GeluFwd {
  __device__ float operator()(float x, float, float) const { return gelu_f(x); }
};
struct GeluBwd {  // (dout, x) -> gelu'(x) * dout, written ([Written input gradients])
  __device__ float operator()(float dout, float x, float) const { return gelu_grad(x) * dout; }
};
struct GeluErfFwd {
  __device__ float operator()(float x, float, float) const { return gelu_erf_f(x); }
};
struct GeluErfBwd {  // (dout, x) -> gelu_erf'(x) * dout, written
  __device__ float operator()(float dout, float x, float) const { return gelu_erf_grad(x) * dout; }
};
struct Add {
  __device__ float operator()(float a, float b, float) const { return a + b; }
};

// out[i] = op(in0[i], in1[i], in2[i]) for i < n, NIN inputs; out may alias an input (each
// element is read before it is written by the same thread).
template <int NIN, int VEC, class Op>
__global__ void map_kernel(bf16* out, const bf16* in0, const bf16* in1, const bf16* in2, int64_t n,
                           Op op) {
  const int64_t nv = n / VEC;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < nv; v += stride) {
    const int64_t i = v * VEC;
    float a[VEC], b[VEC], c[VEC], o[VEC];
    load_vec<VEC>(in0 + i, a);
    if constexpr (NIN > 1) load_vec<VEC>(in1 + i, b);
    if constexpr (NIN > 2) load_vec<VEC>(in2 + i, c);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      o[j] = op(a[j], NIN > 1 ? b[j] : 0.0f, NIN > 2 ? c[j] : 0.0f);
    }
    store_vec<VEC>(out + i, o);
  }
}

template <int NIN, class Op>
void map(bf16* out, const bf16* in0, const bf16* in1, const bf16* in2, int64_t n, Op op,
         cudaStream_t stream) {
  TD_CHECK(n >= 0, "bad size n={}", n);
  if (n == 0) return;
  int64_t done = 0;
  const bool vec = detail::aligned16(out) && detail::aligned16(in0) &&
                   (NIN < 2 || detail::aligned16(in1)) && (NIN < 3 || detail::aligned16(in2));
  if (vec && n >= 8) {
    done = n / 8 * 8;
    map_kernel<NIN, 8, Op>
        <<<grid_for(n / 8, kThreads, 65535), kThreads, 0, stream>>>(out, in0, in1, in2, done, op);
    CUDA_CHECK_LAUNCH();
  }
  if (done < n) {
    const bf16* i1 = NIN > 1 ? in1 + done : nullptr;
    const bf16* i2 = NIN > 2 ? in2 + done : nullptr;
    map_kernel<NIN, 1, Op><<<grid_for(n - done, kThreads, 65535), kThreads, 0, stream>>>(
        out + done, in0 + done, i1, i2, n - done, op);
    CUDA_CHECK_LAUNCH();
  }
}

// SwiGLU: element e = (row i, column j) of out[N, F]; VEC consecutive columns per thread.
template <int VEC>
__global__ void swiglu_fwd_kernel(bf16* __restrict__ out, const bf16* __restrict__ h, int N,
                                  int F) {
  const int64_t total = int64_t(N) * F / VEC;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total; v += stride) {
    const int64_t e = v * VEC;
    const int64_t i = e / F, j = e % F;
    const bf16* gate = h + i * 2 * F + j;
    float g[VEC], u[VEC], o[VEC];
    load_vec<VEC>(gate, g);
    load_vec<VEC>(gate + F, u);
#pragma unroll
    for (int k = 0; k < VEC; ++k) o[k] = g[k] * sigmoid_f(g[k]) * u[k];
    store_vec<VEC>(out + e, o);
  }
}

template <int VEC>
__global__ void swiglu_bwd_kernel(bf16* __restrict__ dh, const bf16* __restrict__ dout,
                                  const bf16* __restrict__ h, int N, int F) {
  const int64_t total = int64_t(N) * F / VEC;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total; v += stride) {
    const int64_t e = v * VEC;
    const int64_t i = e / F, j = e % F;
    const int64_t off = i * 2 * F + j;
    float g[VEC], u[VEC], d[VEC], dg[VEC], du[VEC];
    load_vec<VEC>(h + off, g);
    load_vec<VEC>(h + off + F, u);
    load_vec<VEC>(dout + e, d);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {  // written, not added ([Written input gradients])
      const float sg = sigmoid_f(g[k]);
      // d silu(g)/dg = sg * (1 + g * (1 - sg))
      dg[k] = d[k] * u[k] * sg * (1.0f + g[k] * (1.0f - sg));
      du[k] = d[k] * g[k] * sg;
    }
    store_vec<VEC>(dh + off, dg);
    store_vec<VEC>(dh + off + F, du);
  }
}

__global__ void cast_f32_bf16_kernel(bf16* __restrict__ out, const float* __restrict__ in,
                                     int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __float2bfloat16_rn(in[i]);
}

// The same rounding, 8 values per thread: two 16-byte loads and one 16-byte store (in and out
// 16-byte aligned); the n % 8 last values by the first threads, one each.
__global__ void cast_f32_bf16_vec_kernel(bf16* __restrict__ out, const float* __restrict__ in,
                                         int64_t n) {
  const int64_t nv = n / 8;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t i0 = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const float4* in4 = reinterpret_cast<const float4*>(in);
  for (int64_t i = i0; i < nv; i += stride) {
    const float4 a = in4[2 * i], b = in4[2 * i + 1];
    const float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    detail::store_vec<8>(out + 8 * i, f);
  }
  const int64_t t = nv * 8 + i0;
  if (t < n) out[t] = __float2bfloat16_rn(in[t]);
}

__global__ void cast_bf16_f32_kernel(float* __restrict__ out, const bf16* __restrict__ in,
                                     int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __bfloat162float(in[i]);
}

bool swiglu_vec_ok(const void* a, const void* b, const void* c, int F) {
  return F % 8 == 0 && detail::aligned16(a) && detail::aligned16(b) && detail::aligned16(c);
}

}  // namespace

void gelu_forward(bf16* out, const bf16* x, int64_t n, cudaStream_t stream) {
  map<1>(out, x, nullptr, nullptr, n, GeluFwd{}, stream);
}

void gelu_backward(bf16* dx, const bf16* dout, const bf16* x, int64_t n, cudaStream_t stream) {
  map<2>(dx, dout, x, nullptr, n, GeluBwd{}, stream);
}

void gelu_erf_forward(bf16* out, const bf16* x, int64_t n, cudaStream_t stream) {
  map<1>(out, x, nullptr, nullptr, n, GeluErfFwd{}, stream);
}

void gelu_erf_backward(bf16* dx, const bf16* dout, const bf16* x, int64_t n, cudaStream_t stream) {
  map<2>(dx, dout, x, nullptr, n, GeluErfBwd{}, stream);
}

void add_forward(bf16* out, const bf16* a, const bf16* b, int64_t n, cudaStream_t stream) {
  map<2>(out, a, b, nullptr, n, Add{}, stream);
}

void swiglu_forward(bf16* out, const bf16* h, int N, int F, cudaStream_t stream) {
  TD_CHECK(N >= 0 && F >= 0, "bad shape N={} F={}", N, F);
  const int64_t total = int64_t(N) * F;
  if (total == 0) return;
  if (swiglu_vec_ok(out, h, h, F)) {
    swiglu_fwd_kernel<8>
        <<<grid_for(total / 8, kThreads, 65535), kThreads, 0, stream>>>(out, h, N, F);
  } else {
    swiglu_fwd_kernel<1><<<grid_for(total, kThreads, 65535), kThreads, 0, stream>>>(out, h, N, F);
  }
  CUDA_CHECK_LAUNCH();
}

void swiglu_backward(bf16* dh, const bf16* dout, const bf16* h, int N, int F, cudaStream_t stream) {
  TD_CHECK(N >= 0 && F >= 0, "bad shape N={} F={}", N, F);
  const int64_t total = int64_t(N) * F;
  if (total == 0 || !dh) return;
  if (swiglu_vec_ok(dh, dout, h, F)) {
    swiglu_bwd_kernel<8>
        <<<grid_for(total / 8, kThreads, 65535), kThreads, 0, stream>>>(dh, dout, h, N, F);
  } else {
    swiglu_bwd_kernel<1>
        <<<grid_for(total, kThreads, 65535), kThreads, 0, stream>>>(dh, dout, h, N, F);
  }
  CUDA_CHECK_LAUNCH();
}

void cast_f32_to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t stream) {
  TD_CHECK(n >= 0, "bad size n={}", n);
  if (n == 0) return;
  if (detail::aligned16(out) && detail::aligned16(in)) {
    cast_f32_bf16_vec_kernel<<<grid_for(n / 8, kThreads, 65535), kThreads, 0, stream>>>(out, in, n);
  } else {
    cast_f32_bf16_kernel<<<grid_for(n, kThreads, 65535), kThreads, 0, stream>>>(out, in, n);
  }
  CUDA_CHECK_LAUNCH();
}

void cast_bf16_to_f32(float* out, const bf16* in, int64_t n, cudaStream_t stream) {
  TD_CHECK(n >= 0, "bad size n={}", n);
  if (n == 0) return;
  cast_bf16_f32_kernel<<<grid_for(n, kThreads, 65535), kThreads, 0, stream>>>(out, in, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::cuda
