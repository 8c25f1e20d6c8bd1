// Device creation and device-kind names. The backends live in device/cpu and
// device/cuda; this file only dispatches.
#include "device/device.h"

#include "core/error.h"

#if defined(TANDEM_HAVE_CUDA)
#include "device/cuda/cuda_device.h"
#endif

namespace tandem {

std::unique_ptr<Device> device_create_cuda(int gpu) {
#if defined(TANDEM_HAVE_CUDA)
  return cuda_device_create(gpu);
#else
  // Built without the CUDA backend (TANDEM_CUDA=OFF): there is no device to create.
  TD_THROW(
      "cannot create CUDA device {}: this tandem was built without the CUDA backend "
      "(configure with -DTANDEM_CUDA=ON, or use --device cpu)",
      gpu);
#endif
}

std::unique_ptr<Device> device_create(DeviceKind kind, int gpu) {
  switch (kind) {
    case DeviceKind::cpu:
      return device_create_cpu();
    case DeviceKind::cuda:
      return device_create_cuda(gpu);
  }
  TD_THROW("unknown device kind {}", static_cast<int>(kind));
}

void Device::capture_begin(Stream& stream) {
  TD_THROW("the {} device cannot capture stream {} into a graph", name(), stream.name());
}
std::unique_ptr<Graph> Device::capture_end(Stream& stream) {
  TD_THROW("the {} device cannot capture stream {} into a graph", name(), stream.name());
}
void Device::graph_launch(Graph&, Stream& stream) {
  TD_THROW("the {} device cannot replay a graph on stream {}", name(), stream.name());
}

DeviceKind device_kind_parse(const std::string& name) {
  if (name == "cpu") return DeviceKind::cpu;
  if (name == "cuda") return DeviceKind::cuda;
  TD_THROW("unknown device '{}' (expected cpu or cuda)", name);
}

const char* device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::cpu:
      return "cpu";
    case DeviceKind::cuda:
      return "cuda";
  }
  TD_THROW("unknown device kind {}", static_cast<int>(kind));
}

}  // namespace tandem
