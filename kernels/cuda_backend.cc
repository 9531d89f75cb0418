#include "kernels/cuda_backend.h"

#ifdef ELDR_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace eldr::kernels {

bool CudaBackendCompiled() {
#ifdef ELDR_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

Status CudaBackendStatus() {
#ifdef ELDR_HAVE_CUDA
  if (cuda::DeviceCount() > 0) return Status::Ok();
  return Status::FailedPrecondition("no CUDA device (cudaGetDeviceCount found none: no GPU, or no driver)");
#else
  return Status::FailedPrecondition("built without CUDA (reconfigure with ELDR_WITH_CUDA=ON on a machine with nvcc)");
#endif
}

}  // namespace eldr::kernels
