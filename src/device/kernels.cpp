// Kernel tables for sizing.
#include "device/kernels.h"

#include <atomic>

#include "core/error.h"
#include "device/cpu/kernel_table.h"
#include "device/device.h"

namespace tandem {

#if defined(TANDEM_HAVE_CUDA)
std::unique_ptr<Kernels> cuda_kernels_for_sizing(AttentionImpl impl);
std::unique_ptr<Kernels> cuda_kernels_on(Device& device, Stream& stream, AttentionImpl impl,
                                         size_t* extra_bytes);
void cuda_set_flash_backward(FlashBackward passes);
#endif

void Kernels::linear_gelu_backward(void* dpre, float* dw, float* dbias, const void* dout,
                                   const void* act, const void* pre, const void* w, int N, int IC,
                                   int OC, GeluKind kind, GradMode gm) {
  linear_backward(dpre, dw, dbias, dout, act, w, N, IC, OC, false, gm);
  gelu_backward(dpre, dpre, pre, int64_t{N} * IC, kind);  // in place
}

bool sample_split_supported(const SamplingParams& p) {
  return p.temperature == 0.0f || p.top_k > 0 || p.top_p >= 1.0f;
}

int sample_candidates_per_row(const SamplingParams& p) {
  TD_CHECK(sample_split_supported(p),
           "sampling with top_p {} and no top_k cannot run on a vocabulary split over ranks "
           "(its kept set may need every logit of a slice); set top_k as well",
           p.top_p);
  if (p.temperature == 0.0f || p.top_k == 0) return 1;
  return p.top_k;
}

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

namespace {
std::atomic<FlashBackward> g_flash_backward{FlashBackward::automatic};
}  // namespace

FlashBackward kernels_flash_backward() {
  return g_flash_backward.load();
}

const char* flash_backward_name(FlashBackward passes) {
  switch (passes) {
    case FlashBackward::one_pass:
      return "one-pass";
    case FlashBackward::two_pass:
      return "two-pass";
    case FlashBackward::automatic:
      break;
  }
  return "automatic";
}

bool flash_backward_same_form(FlashBackward a, FlashBackward b) {
  const auto form = [](FlashBackward f) {
    return f == FlashBackward::automatic ? kFlashBackwardAutomatic : f;
  };
  return form(a) == form(b);
}

std::optional<FlashBackward> flash_backward_parse(std::string_view name) {
  for (FlashBackward f :
       {FlashBackward::automatic, FlashBackward::one_pass, FlashBackward::two_pass})
    if (name == flash_backward_name(f)) return f;
  return std::nullopt;
}

void kernels_set_flash_backward(FlashBackward passes) {
  g_flash_backward.store(passes);
#if defined(TANDEM_HAVE_CUDA)
  cuda_set_flash_backward(passes);
#else
  (void)passes;  // no flash kernels without CUDA
#endif
}

}  // namespace tandem
