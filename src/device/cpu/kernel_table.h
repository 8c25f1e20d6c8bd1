// The CPU kernel table: the fp32 kernels of device/cpu/kernels.h behind the Kernels
// interface. Every call runs at once on the calling thread (a CPU stream's worker).
#pragma once

#include <memory>

#include "device/kernels.h"

namespace tandem {

std::unique_ptr<Kernels> cpu_kernels();

}  // namespace tandem
