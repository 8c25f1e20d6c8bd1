// The CUDA device: device memory, streams, events and submission on one GPU, plus the
// hooks that kernels and the NCCL communicator need (native handles, stream failure).
//
// [CUDA streams] Every stream of stream_create is created with cudaStreamNonBlocking, so it
// never synchronises with the legacy default stream, and nothing in tandem uses that stream
// except `tandem probe overlap`, on purpose (see [CUDA probe streams]): the synchronous
// copies run on an internal non-blocking stream of their own and wait for it alone (like
// the CPU device's copies, they do not wait for other streams). Priority 0 gets the
// device's least (normal) priority, priority 1 (communication) the greatest, so a
// collective's kernels are scheduled ahead of queued compute blocks. Each stream carries
// its name to profilers through NVTX.
//
// [CUDA probe streams] The overlap probe (docs/diagnosis.md) reproduces a training run on AMD
// GPUs whose communication stream serialised behind compute because of the kind of stream each
// ran on, so it also needs the two kinds tandem itself never uses: a blocking stream
// (cudaStreamDefault flags, what cudaStreamCreate makes), whose work waits for earlier work
// of the legacy default stream and the other way round, and the legacy default stream
// itself ("stream 0", cudaStreamLegacy). Both are streams of the device like any other:
// event_record, stream_wait, stream_sync, cuda_stream_of and the NCCL communicator take
// them, and they carry their name to profilers through NVTX. A handle to the legacy stream
// neither creates nor destroys it; all handles of one device share one failure state (it
// is one stream), and its priority is CUDA's and cannot be chosen.
//
// [CUDA submit] submit(stream, work) calls work() at once, on the calling host thread,
// with the device current; work must only enqueue asynchronous GPU work on
// cuda_stream_of(stream) (kernel launches, cudaMemcpyAsync, library calls given that
// stream) and return. An exception thrown by work propagates out of submit.
//
// [CUDA stream failure] Collectives fail asynchronously (the NCCL watchdog notices a
// timeout long after the host enqueued the collective). The communicator marks the
// stream failed through cuda_stream_fail(); failure is sticky and spreads to every stream
// that waited (stream_wait) on an event recorded on a failed stream, so stream_sync,
// event_wait, event_query and event_elapsed_ms rethrow the original error, as on CPU
// ([CPU stream errors] in cpu_device.cpp). Errors of the GPU itself (a faulting kernel)
// are returned by CUDA at the next synchronising call and thrown from there.
//
// [CUDA threads] Every method makes the device's GPU current on the calling thread
// (cudaSetDevice) before its CUDA calls, so any host thread may use the device.
#pragma once

#include <cuda_runtime.h>

#include <exception>
#include <memory>
#include <string>

#include "core/error.h"
#include "device/cuda/cuda_check.h"
#include "device/device.h"

namespace tandem {

// CUDA_CHECK of device/cuda/cuda_check.h (tandem::Error naming the call, file:line, rank
// and the CUDA error), which first clears the thread's last error when the failure is not
// sticky, so that a later CUDA_CHECK_LAUNCH (cudaGetLastError) does not report it again.
#define TD_CUDA_CALL(call)                                                        \
  do {                                                                            \
    const cudaError_t td_cuda_rc_ = (call);                                       \
    if (td_cuda_rc_ != cudaSuccess) {                                             \
      (void)cudaGetLastError();                                                   \
      ::tandem::cuda::detail::throw_cuda(td_cuda_rc_, #call, __FILE__, __LINE__); \
    }                                                                             \
  } while (0)

// The CUDA device on GPU `gpu` (throws when there is no such GPU).
std::unique_ptr<Device> cuda_device_create(int gpu);

// See [CUDA probe streams]. A blocking stream with the given priority (as in
// Device::stream_create), and a handle to the device's legacy default stream named `name`
// (the name its latest handle gave it, for profilers). Both throw for a non-CUDA device.
std::unique_ptr<Stream> cuda_stream_create_blocking(Device& device, const std::string& name,
                                                    int priority);
std::unique_ptr<Stream> cuda_stream_legacy_default(Device& device, const std::string& name);

// The native handle of a stream of a CUDA device (throws for a CPU stream).
cudaStream_t cuda_stream_of(Stream& stream);
// The GPU index of a CUDA device (throws for a CPU device).
int cuda_gpu_of(const Device& device);

// Shared failure state of one CUDA stream; see [CUDA stream failure]. Holders (the NCCL
// watchdog) keep it alive independently of the stream object.
class CudaStreamHealth;
std::shared_ptr<CudaStreamHealth> cuda_stream_health(Stream& stream);
// Marks the stream failed with `error` (the first failure wins; later ones are ignored).
void cuda_stream_fail(CudaStreamHealth& health, std::exception_ptr error);

}  // namespace tandem
