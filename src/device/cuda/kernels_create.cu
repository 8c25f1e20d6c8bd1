// kernels_create (device/kernels.h) for CUDA: a table that owns its cuBLASLt context, for
// users of the table outside the training engine (the decoder).
#include <memory>

#include "device/cuda/cuda_device.h"
#include "device/cuda/kernel_table.h"
#include "device/cuda/kernels.cuh"
#include "device/cuda/matmul.h"

namespace tandem {

std::unique_ptr<Kernels> cuda_kernels_on(Device& device, Stream& stream, AttentionImpl impl,
                                         size_t* extra_bytes) {
  TD_CUDA_CALL(cudaSetDevice(cuda_gpu_of(device)));
  if (extra_bytes != nullptr) *extra_bytes = cuda::MatmulContext::kDefaultWorkspaceBytes;
  return cuda::cuda_kernels_owning(impl, std::make_unique<cuda::MatmulContext>(),
                                   cuda_stream_of(stream));
}

void cuda_set_flash_backward(FlashBackward passes) {
  using cuda::BackwardPasses;
  cuda::flash_attention_set_wgmma_backward_passes(
      passes == FlashBackward::one_pass   ? BackwardPasses::one_pass
      : passes == FlashBackward::two_pass ? BackwardPasses::two_pass
                                          : BackwardPasses::automatic);
}

}  // namespace tandem
