// CUDA kernel: the AdamW update on fp32 shards (PyTorch formulation, decoupled weight decay),
// operation for operation the CPU reference's, with the bias corrections computed on the host in
// double; optionally also writes the updated parameters rounded to bf16 (the compute copy).
#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 256;

// One element's update, operation for operation the CPU reference's.
__device__ __forceinline__ void adamw_element(float* __restrict__ p, const float* __restrict__ g,
                                              float* __restrict__ m, float* __restrict__ v,
                                              bf16* __restrict__ p_bf16, int64_t i, float beta1,
                                              float beta2, float eps, float step_size, float decay,
                                              float rsqrt_bc2, float grad_scale) {
  const float gi = g[i] * grad_scale;
  const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
  const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  const float out = p[i] * decay - step_size * mi / (sqrtf(vi) * rsqrt_bc2 + eps);
  p[i] = out;
  if (p_bf16) p_bf16[i] = __float2bfloat16_rn(out);
}

__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g,
                             float* __restrict__ m, float* __restrict__ v,
                             bf16* __restrict__ p_bf16, int64_t n, float beta1, float beta2,
                             float eps, float step_size, float decay, float rsqrt_bc2,
                             float grad_scale) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    adamw_element(p, g, m, v, p_bf16, i, beta1, beta2, eps, step_size, decay, rsqrt_bc2,
                  grad_scale);
  }
}

__global__ void adamw_chunks_kernel(float* __restrict__ p, const float* __restrict__ g,
                                    float* __restrict__ m, float* __restrict__ v,
                                    bf16* __restrict__ p_bf16,
                                    const AdamWChunk* __restrict__ chunks,
                                    const float* __restrict__ norm_sq, float clip,
                                    const AdamWStep* __restrict__ step, float beta1, float beta2,
                                    float eps) {
  // A non-finite global norm (NaN or Inf anywhere in the gradients) skips the update: the
  // parameters, moments and bf16 copy keep their values (the CPU optimizer does the same).
  if (!isfinite(*norm_sq) || !step->apply) return;
  const AdamWChunk chunk = chunks[blockIdx.x];
  float grad_scale = 1.0f;
  if (clip > 0.0f) {
    const double norm = sqrt(double(*norm_sq));
    const double s = double(clip) / (norm + 1e-6);
    grad_scale = float(s < 1.0 ? s : 1.0);
  }
  const AdamWStep st = *step;
  const float decay = 1.0f - st.lr * chunk.weight_decay;
  for (int j = threadIdx.x; j < chunk.n; j += blockDim.x) {
    const int64_t i = chunk.begin + j;
    adamw_element(p, g, m, v, p_bf16, i, beta1, beta2, eps, st.step_size, decay, st.rsqrt_bc2,
                  grad_scale);
  }
}

}  // namespace

void adamw_update_chunks(float* p, const float* g, float* m, float* v, bf16* p_bf16,
                         const AdamWChunk* chunks, int num_chunks, const float* norm_sq, float clip,
                         const AdamWStep* step, float beta1, float beta2, float eps,
                         cudaStream_t stream) {
  TD_CHECK(num_chunks >= 0 && num_chunks <= 2147483647, "bad chunk count {}", num_chunks);
  TD_CHECK(step != nullptr, "AdamW without its step's values");
  if (num_chunks == 0) return;
  adamw_chunks_kernel<<<unsigned(num_chunks), kThreads, 0, stream>>>(
      p, g, m, v, p_bf16, chunks, norm_sq, clip, step, beta1, beta2, eps);
  CUDA_CHECK_LAUNCH();
}

void adamw_update(float* p, const float* g, float* m, float* v, bf16* p_bf16, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, AdamWBiasCorrection bc,
                  float grad_scale, cudaStream_t stream) {
  TD_CHECK(n >= 0, "bad size n={}", n);
  TD_CHECK(bc.bc1 > 0.0f && bc.rsqrt_bc2 > 0.0f, "bad AdamW bias corrections {} {}", bc.bc1,
           bc.rsqrt_bc2);
  if (n == 0) return;
  const float step_size = lr / bc.bc1;
  const float decay = 1.0f - lr * weight_decay;
  adamw_kernel<<<detail::grid_for(n, kThreads, 65535), kThreads, 0, stream>>>(
      p, g, m, v, p_bf16, n, beta1, beta2, eps, step_size, decay, bc.rsqrt_bc2, grad_scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::cuda
