// Device creation and device-kind parsing. The backends live in device/cpu and
// device/cuda; this file only dispatches.
#include "device/device.h"

#include <cstdlib>

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

int device_local_rank() {
  // Open MPI, MPICH/Hydra, Slurm (srun) and PMIx name the node-local rank differently.
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                           "PMIX_LOCAL_RANK", "LOCAL_RANK"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long r = std::strtol(value, &end, 10);
    if (end != value && *end == '\0' && r >= 0 && r < 1 << 20) return static_cast<int>(r);
  }
  return 0;
}

DeviceKind device_kind_parse(const std::string& name) {
  if (name == "cpu") return DeviceKind::cpu;
  if (name == "cuda") return DeviceKind::cuda;
  TD_THROW("unknown device '{}' (expected cpu or cuda)", name);
}

}  // namespace tandem
