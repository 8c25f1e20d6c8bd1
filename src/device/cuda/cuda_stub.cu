// Placeholder for the CUDA backend: it compiles with nvcc so the build path is exercised,
// and it fails loudly when asked for a device until the real backend lands.
#include <cuda_runtime.h>

namespace tandem::cuda_stub {

// Number of visible GPUs, or -1 when the runtime cannot be queried.
int visible_gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : -1;
}

}  // namespace tandem::cuda_stub
