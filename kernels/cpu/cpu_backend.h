// The CPU compute backend (kernels/backend.h) over the reference kernels of kernels/cpu/ops.cc. Internal to
// kernels/: callers use kernels::CpuBackend() or kernels::CreateBackend("cpu").
#pragma once

#include <memory>

#include "kernels/backend.h"

namespace eldr::kernels {

std::unique_ptr<Backend> MakeCpuBackend();

}  // namespace eldr::kernels
