// The backend factory and the CUDA availability checks (kernels/backend.h). Always built: without CUDA it
// still links and answers "built without CUDA".
#include "kernels/backend.h"

#include "kernels/cpu/cpu_backend.h"

#ifdef ELDR_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_backend.h"
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

int CudaDeviceCount() {
#ifdef ELDR_HAVE_CUDA
  return cuda::DeviceCount();
#else
  return 0;
#endif
}

std::string CudaDeviceBusId(int device) {
#ifdef ELDR_HAVE_CUDA
  char id[32] = {};
  if (device < 0 || device >= cuda::DeviceCount() || cudaDeviceGetPCIBusId(id, sizeof(id) - 1, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return id;
#else
  (void)device;
  return "";
#endif
}

Result<std::unique_ptr<Backend>> CreateBackend(const std::string& name, int device) {
  if (name == "cpu") return MakeCpuBackend();
  if (name != "cuda") return Status::InvalidArgument("unknown compute backend '" + name + "' (cpu or cuda)");
  if (Status s = CudaBackendStatus(); !s.ok()) return s;
#ifdef ELDR_HAVE_CUDA
  if (device < 0 || device >= cuda::DeviceCount()) {
    return Status::InvalidArgument("CUDA device " + std::to_string(device) + " does not exist (this host has " +
                                   std::to_string(cuda::DeviceCount()) + ")");
  }
  return MakeCudaBackend(device);
#else
  (void)device;
  return Status::FailedPrecondition("built without CUDA");  // not reached: CudaBackendStatus failed above
#endif
}

}  // namespace eldr::kernels
