// Kernel tables for sizing.
#include "device/kernels.h"

#include "core/error.h"
#include "device/cpu/kernel_table.h"
#include "device/device.h"

namespace tandem {

#if defined(TANDEM_HAVE_CUDA)
std::unique_ptr<Kernels> cuda_kernels_for_sizing(AttentionImpl impl);
std::unique_ptr<Kernels> cuda_kernels_on(Device& device, Stream& stream, AttentionImpl impl,
                                         size_t* extra_bytes);
#endif

std::unique_ptr<Kernels> kernels_for_sizing(DeviceKind kind, AttentionImpl impl) {
  if (kind == DeviceKind::cpu) return cpu_kernels();
#if defined(TANDEM_HAVE_CUDA)
  return cuda_kernels_for_sizing(impl);
#else
  TD_THROW("this tandem was built without CUDA (configure with -DTANDEM_CUDA=ON)");
#endif
}

std::unique_ptr<Kernels> kernels_create(Device& device, Stream& stream, AttentionImpl impl,
                                        size_t* extra_bytes) {
  if (device.kind() == DeviceKind::cpu) {
    if (extra_bytes != nullptr) *extra_bytes = 0;
    return cpu_kernels();
  }
#if defined(TANDEM_HAVE_CUDA)
  return cuda_kernels_on(device, stream, impl, extra_bytes);
#else
  (void)stream;
  TD_THROW("this tandem was built without CUDA (configure with -DTANDEM_CUDA=ON)");
#endif
}

}  // namespace tandem
