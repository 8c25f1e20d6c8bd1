// CUDA kernels: rotary position embedding ("rotate half" pairs (i, i + rotary_dim/2) within the
// first rotary_dim channels of each head; channels [rotary_dim, D) untouched), in place, and its
// backward (the inverse rotation). One thread per (row, frequency i) computes the angle in double
// exactly as the CPU reference, rounds cos/sin to float once, and rotates that pair in all H heads.
#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void rope_kernel(bf16* __restrict__ x, int64_t rows, int T, int H, int D, int rotary_dim,
                            int64_t row_stride, double theta, int pos0, float sign) {
  const int half = rotary_dim / 2;
  const int64_t total = rows * half;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t r = e / half;
    const int i = int(e % half);
    const int t = int(r % T);
    const double inv_freq = pow(theta, -2.0 * i / double(rotary_dim));
    const double a = double(int64_t(pos0) + t) * inv_freq;
    double sd, cd;
    sincos(a, &sd, &cd);
    const float cs = float(cd), sn = sign * float(sd);
    bf16* row = x + r * row_stride + i;
    for (int h = 0; h < H; ++h) {
      bf16* p = row + int64_t(h) * D;
      const float x1 = __bfloat162float(p[0]), x2 = __bfloat162float(p[half]);
      p[0] = __float2bfloat16_rn(x1 * cs - x2 * sn);
      p[half] = __float2bfloat16_rn(x1 * sn + x2 * cs);
    }
  }
}

void rope_apply(bf16* x, int B, int T, int H, int D, int rotary_dim, int row_stride, float theta,
                int pos0, float sign, cudaStream_t stream) {
  TD_CHECK(B >= 0 && T >= 0 && H >= 0 && D > 0, "bad shape B={} T={} H={} D={}", B, T, H, D);
  TD_CHECK(rotary_dim > 0 && rotary_dim <= D && rotary_dim % 2 == 0,
           "rope needs an even rotary_dim in (0, D={}], got {}", D, rotary_dim);
  TD_CHECK(row_stride >= int64_t(H) * D, "row_stride {} < H*D = {}", row_stride, int64_t(H) * D);
  TD_CHECK(theta > 0.0f && pos0 >= 0, "bad rope theta={} pos0={}", theta, pos0);
  const int64_t rows = int64_t(B) * T;
  if (rows == 0 || H == 0) return;
  rope_kernel<<<detail::grid_for(rows * (rotary_dim / 2), kThreads, 65535), kThreads, 0, stream>>>(
      x, rows, T, H, D, rotary_dim, row_stride, double(theta), pos0, sign);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_forward(bf16* x, int B, int T, int H, int D, int rotary_dim, int row_stride, float theta,
                  int pos0, cudaStream_t stream) {
  rope_apply(x, B, T, H, D, rotary_dim, row_stride, theta, pos0, 1.0f, stream);
}

void rope_backward(bf16* dx, int B, int T, int H, int D, int rotary_dim, int row_stride,
                   float theta, int pos0, cudaStream_t stream) {
  // The rotation is orthogonal: its transpose (the gradient map) is the rotation by -angle; the
  // untouched channels have the identity as their gradient map.
  rope_apply(dx, B, T, H, D, rotary_dim, row_stride, theta, pos0, -1.0f, stream);
}

}  // namespace tandem::cuda
