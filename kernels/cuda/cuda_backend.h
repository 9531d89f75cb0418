// The CUDA compute backend (kernels/backend.h) over the launchers of kernels/cuda/cuda_ops.h. Internal to
// kernels/ and built only when ELDR_HAVE_CUDA: callers use kernels::CreateBackend("cuda", device).
#pragma once

#include <memory>

#include "kernels/backend.h"

namespace eldr::kernels {

// REQUIRES: device in [0, cuda::DeviceCount()). Makes `device` current on the calling thread.
std::unique_ptr<Backend> MakeCudaBackend(int device);

}  // namespace eldr::kernels
