// Whether the CUDA compute backend (kernels/cuda, DESIGN.md §6) can be used in this process. Always built and
// linked, with or without CUDA: code that offers the backend asks here first and reports the Status to the
// user, so that a build without CUDA still links and fails with one clear line.
#pragma once

#include "runtime/common/status.h"

namespace eldr::kernels {

// True when this build contains kernels/cuda (configured with ELDR_HAVE_CUDA).
bool CudaBackendCompiled();

// OK when the build contains kernels/cuda and at least one CUDA device is usable. Otherwise
// FailedPrecondition: "built without CUDA (reconfigure with ELDR_WITH_CUDA=ON on a machine with nvcc)" when
// compiled out, or "no CUDA device ..." when no device (or no driver) is present. Thread safe.
Status CudaBackendStatus();

}  // namespace eldr::kernels
