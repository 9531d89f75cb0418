// Shared by the .cu files of kernels/cuda: the context's state, scratch layout, device reductions and the
// row-major GEMM helper. Not part of the interface (kernels/cuda/cuda_ops.h).
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"

namespace eldr::kernels::cuda {

struct Context::Impl {
  int device = 0;
  cublasHandle_t cublas = nullptr;
  bool grouped_gemm = true;
  bool device_schedule = true;  // MoeExperts: expert GEMMs scheduled on the device (no host synchronisation)
  bool bf16_mma = false;        // the device has bf16 tensor-core MMA (compute capability 8.0 or later)
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  int64_t scratch_grows = 0;

  // A scratch buffer of at least `bytes`, valid for work enqueued on `stream` until the next call. Growing
  // it waits for `stream` first, as earlier work on it may still read the old buffer.
  void* Scratch(size_t bytes, cudaStream_t stream);
};

inline __nv_bfloat16* AsBf16(Bf16* p) { return reinterpret_cast<__nv_bfloat16*>(p); }
inline const __nv_bfloat16* AsBf16(const Bf16* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }

inline int64_t RoundUp(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }
inline int64_t CeilDiv(int64_t x, int64_t d) { return (x + d - 1) / d; }

// Carves one scratch allocation into 256-byte aligned pieces: Add() in a first pass gives offsets and the
// total; Get() after the allocation turns an offset into a pointer.
class ScratchLayout {
 public:
  size_t Add(size_t bytes) {
    const size_t offset = static_cast<size_t>(RoundUp(static_cast<int64_t>(total_), 256));
    total_ = offset + bytes;
    return offset;
  }
  size_t total() const { return total_; }
  template <typename T>
  static T* Get(void* base, size_t offset) {
    return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
  }

 private:
  size_t total_ = 0;
};

constexpr unsigned kFullMask = 0xffffffffu;

__device__ inline float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ inline float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Block-wide sum, returned to every thread. REQUIRES: blockDim.x a multiple of 32, every thread calls it;
// `shared` has 32 floats. The leading barrier lets consecutive calls reuse `shared`.
__device__ inline float BlockSum(float v, float* shared) {
  v = WarpSum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < num_warps; ++w) total += shared[w];  // same order in every thread: deterministic
  return total;
}

__device__ inline float BlockMax(float v, float* shared) {
  v = WarpMax(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float m = shared[0];
  for (int w = 1; w < num_warps; ++w) m = fmaxf(m, shared[w]);
  return m;
}

// Row-major C[n, m] (row stride ldc) = B[n, k] (row stride ldb) · A[m, k]^T (row stride lda) + beta · C, in
// cuBLAS's column-major terms C^T = op_T(A) · B^T: A and B bf16, C of `c_type` (CUDA_R_32F or CUDA_R_16BF),
// fp32 accumulation. Enqueued on the handle's current stream.
void GemmNT(cublasHandle_t handle, int n, int m, int k, const Bf16* a, int lda, const Bf16* b, int ldb, void* c,
            cudaDataType_t c_type, int ldc, float beta);

// h[r, i] = bf16(silu(gate[r, i]) * up[r, i]) for r < rows, i < cols; all three with row stride `stride`.
void LaunchSwiGlu(const Bf16* gate, const Bf16* up, Bf16* h, int rows, int cols, int64_t stride, cudaStream_t stream);

// y[r, c] = bf16(x[r, c]) for r < rows, c < cols; x dense [rows, cols], y with row stride y_stride.
void LaunchConvertRows(const float* x, Bf16* y, int rows, int cols, int64_t y_stride, cudaStream_t stream);

}  // namespace eldr::kernels::cuda
