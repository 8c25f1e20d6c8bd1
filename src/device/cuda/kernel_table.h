// The CUDA kernel table: the bf16 kernels of device/cuda/kernels.cuh and the cuBLASLt
// products of device/cuda/matmul.h behind the Kernels interface, enqueued on one stream.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "device/cuda/matmul.h"
#include "device/kernels.h"

namespace tandem::cuda {

// A table that enqueues on `stream` and multiplies through `ctx` (both outlive it). With a
// null ctx the table only sizes (kernels_for_sizing).
std::unique_ptr<Kernels> cuda_kernels(AttentionImpl impl, MatmulContext* ctx, cudaStream_t stream);
// The same, owning its context.
std::unique_ptr<Kernels> cuda_kernels_owning(AttentionImpl impl, std::unique_ptr<MatmulContext> ctx,
                                             cudaStream_t stream);

}  // namespace tandem::cuda
