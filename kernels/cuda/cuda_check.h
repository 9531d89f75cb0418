// ELDR_CUDA_CHECK / ELDR_CUBLAS_CHECK: unrecoverable CUDA and cuBLAS failures become eldr::Error exceptions
// carrying file, line, rank (runtime/common/check.h) and the library's own name and text for the error.
// For host code of kernels/cuda and its tests; includes the CUDA runtime and cuBLAS headers.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

#include "runtime/common/check.h"

namespace eldr::kernels::cuda {

inline std::string DescribeCudaError(cudaError_t err, const char* expr) {
  return std::string("CUDA error ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ") in " + expr;
}

inline std::string DescribeCublasError(cublasStatus_t status, const char* expr) {
  return std::string("cuBLAS error ") + cublasGetStatusName(status) + " (" + cublasGetStatusString(status) + ") in " +
         expr;
}

}  // namespace eldr::kernels::cuda

// Evaluates `expr` (a cudaError_t) once; throws eldr::Error unless it is cudaSuccess.
#define ELDR_CUDA_CHECK(expr)                                                                                   \
  do {                                                                                                          \
    const cudaError_t eldr_cuda_err_ = (expr);                                                                  \
    if (eldr_cuda_err_ != cudaSuccess) {                                                                        \
      throw ::eldr::Error(__FILE__, __LINE__, ::eldr::kernels::cuda::DescribeCudaError(eldr_cuda_err_, #expr)); \
    }                                                                                                           \
  } while (0)

// Evaluates `expr` (a cublasStatus_t) once; throws eldr::Error unless it is CUBLAS_STATUS_SUCCESS.
#define ELDR_CUBLAS_CHECK(expr)                                                                                        \
  do {                                                                                                                 \
    const cublasStatus_t eldr_cublas_status_ = (expr);                                                                 \
    if (eldr_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                                                \
      throw ::eldr::Error(__FILE__, __LINE__, ::eldr::kernels::cuda::DescribeCublasError(eldr_cublas_status_, #expr)); \
    }                                                                                                                  \
  } while (0)

// After a kernel launch: reports a bad launch configuration at the launch site (execution errors surface at
// the next synchronising call).
#define ELDR_CUDA_CHECK_LAUNCH() ELDR_CUDA_CHECK(cudaGetLastError())
