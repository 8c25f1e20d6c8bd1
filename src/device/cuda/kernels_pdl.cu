// The switch of programmatic dependent launch ([PDL] in kernels.cuh) and the per-device check
// that decides whether launches use it (and whether the sm_90 paths of the kernels may run).
#include <atomic>

#include "device/cuda/cuda_check.h"
#include "device/cuda/kernels.cuh"

namespace tandem::cuda {

namespace {

std::atomic<bool> g_pdl{true};

// Compiled as every kernel of the library is: its PTX version says whether the kernels carry
// the griddepcontrol instructions (compiled for sm_90+) on the device that runs them.
__global__ void pdl_probe_kernel() {}

constexpr int kMaxDevices = 64;
// Per device: 0 unknown, 1 no, 2 yes.
std::atomic<int> g_capable[kMaxDevices];

bool device_capable(int device) {
  int major = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 9) return false;
  cudaFuncAttributes attr{};
  CUDA_CHECK(cudaFuncGetAttributes(&attr, pdl_probe_kernel));
  return attr.ptxVersion >= 90 && attr.binaryVersion >= 90;
}

}  // namespace

void set_pdl(bool on) {
  g_pdl.store(on, std::memory_order_relaxed);
}

bool pdl_enabled() {
  return g_pdl.load(std::memory_order_relaxed);
}

namespace detail {

bool sm90_kernels() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) return false;
  int known = g_capable[device].load(std::memory_order_relaxed);
  if (known == 0) {
    known = device_capable(device) ? 2 : 1;
    g_capable[device].store(known, std::memory_order_relaxed);
  }
  return known == 2;
}

bool pdl_active() {
  return pdl_enabled() && sm90_kernels();
}

}  // namespace detail

}  // namespace tandem::cuda
