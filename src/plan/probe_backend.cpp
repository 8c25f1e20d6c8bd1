// Dispatch to the probe backend of a device, and the small helpers the probes share. The
// backends themselves live in probe_backend_cpu.cpp and cuda/probe_backend_cuda.cu.
#include "plan/probe_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <utility>

#include "core/error.h"
#include "core/size.h"

namespace tandem {

const char* stream_kind_name(StreamKind kind) {
  switch (kind) {
    case StreamKind::dedicated:
      return "dedicated";
    case StreamKind::shared:
      return "shared";
    case StreamKind::legacy_default:
      return "legacy-default";
    case StreamKind::blocking:
      return "blocking";
    case StreamKind::non_blocking:
      return "non-blocking";
  }
  return "?";
}

void ProbeBackend::gemm_bf16(Stream& s, int n, const void* a, const void* b, void* c) {
  TD_THROW("the {} device has no bf16 GEMM", device().name());
}

void ProbeBackend::matvec_f32(Stream& s, int rows, int cols, const float* w, const float* x,
                              float* y) {
  TD_THROW("the {} device's probes have no matrix-vector product", device().name());
}

void ProbeBackend::offload(Stream& s, const void* src, size_t bytes) {
  TD_THROW("the {} device's probes have no copy off the device", device().name());
}

std::unique_ptr<ProbeBackend> probe_backend_create(Device& device) {
  switch (device.kind()) {
    case DeviceKind::cpu:
      return probe_backend_cpu(device);
    case DeviceKind::cuda:
#if defined(TANDEM_HAVE_CUDA)
      return probe_backend_cuda(device);
#else
      TD_THROW(
          "tandem probe --device cuda needs the CUDA backend, and this tandem was built "
          "without it (configure with -DTANDEM_CUDA=ON, or use --device cpu)");
#endif
  }
  TD_THROW("tandem probe has no backend for device {}", device.name());
}

const char* probe_device_kind(const Device& device) {
  return device.kind() == DeviceKind::cuda ? "cuda" : "cpu";
}

double probe_median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  if (values.size() % 2 == 1) return values[mid];
  const double upper = values[mid];
  const double lower = *std::max_element(values.begin(), values.begin() + mid);
  return 0.5 * (lower + upper);
}

std::string probe_bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  if (u == 0 || bytes == std::floor(bytes)) return fmt::format("{:.0f} {}", bytes, units[u]);
  return fmt::format("{:.3g} {}", bytes, units[u]);
}

size_t probe_parse_bytes(const std::string& text, const std::string& flag) {
  return static_cast<size_t>(parse_size(text, flag));
}

}  // namespace tandem
