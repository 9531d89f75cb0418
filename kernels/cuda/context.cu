// Context (cuBLAS handle, scratch), device discovery, conversions and the row-major GEMM helper.
#include <algorithm>

#include "kernels/cuda/internal.cuh"

namespace eldr::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// Grid for a grid-stride loop over n elements.
int GridFor(int64_t n) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(CeilDiv(n, kThreads), 1 << 20)));
}

__global__ void ConvertKernel(const float* __restrict__ x, __nv_bfloat16* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = __float2bfloat16(x[i]);  // round to nearest even
  }
}

__global__ void ConvertRowsKernel(const float* __restrict__ x, __nv_bfloat16* __restrict__ y, int cols,
                                  int64_t y_stride) {
  const int64_t r = blockIdx.x;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) y[r * y_stride + c] = __float2bfloat16(x[r * cols + c]);
}

__device__ inline uint64_t SplitMix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void FillUniformKernel(__nv_bfloat16* __restrict__ y, int64_t n, float scale, uint64_t key) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(SplitMix64(key + static_cast<uint64_t>(i)) >> 40) * (1.f / 16777216.f);
    y[i] = __float2bfloat16(scale * (2.f * u - 1.f));
  }
}

}  // namespace

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it, so that later checks do not report this one
    return 0;
  }
  return n;
}

void* Context::Impl::Scratch(size_t bytes, cudaStream_t stream) {
  if (bytes <= scratch_bytes) return scratch;
  if (scratch != nullptr) {
    ELDR_CUDA_CHECK(cudaStreamSynchronize(stream));
    ELDR_CUDA_CHECK(cudaFree(scratch));
    scratch = nullptr;
    scratch_bytes = 0;
  }
  const size_t grown = std::max(bytes, scratch_bytes + scratch_bytes / 2);
  ELDR_CUDA_CHECK(cudaMalloc(&scratch, grown));
  scratch_bytes = grown;
  ++scratch_grows;
  return scratch;
}

void Context::Reserve(size_t bytes, cudaStream_t stream) {
  ELDR_CUDA_CHECK(cudaSetDevice(impl_->device));
  (void)impl_->Scratch(bytes, stream);
}
size_t Context::scratch_bytes() const { return impl_->scratch_bytes; }
int64_t Context::scratch_grows() const { return impl_->scratch_grows; }

Context::Context(int device) : impl_(std::make_unique<Impl>()) {
  ELDR_CHECK(device >= 0 && device < DeviceCount(),
             "CUDA device " << device << " requested, " << DeviceCount() << " present");
  impl_->device = device;
  ELDR_CUDA_CHECK(cudaSetDevice(device));
  ELDR_CUBLAS_CHECK(cublasCreate(&impl_->cublas));
  impl_->grouped_gemm = GroupedGemmAvailable();
  int major = 0;
  ELDR_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  impl_->bf16_mma = major >= 8;
}

Context::~Context() {
  // Destructors never throw: errors here cannot be acted on.
  if (impl_->cublas != nullptr) (void)cublasDestroy(impl_->cublas);
  if (impl_->scratch != nullptr) (void)cudaFree(impl_->scratch);
}

int Context::device() const { return impl_->device; }

bool Context::GroupedGemmAvailable() {
#if CUBLAS_VERSION >= 120500
  return true;
#else
  return false;
#endif
}

void Context::set_grouped_gemm(bool on) {
  ELDR_CHECK(!on || GroupedGemmAvailable(), "cublasGemmGroupedBatchedEx needs cuBLAS 12.5 or later");
  impl_->grouped_gemm = on;
}

bool Context::grouped_gemm() const { return impl_->grouped_gemm; }

void Context::set_device_schedule(bool on) { impl_->device_schedule = on; }
bool Context::device_schedule() const { return impl_->device_schedule; }

void ConvertToBf16(const float* x, Bf16* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  ConvertKernel<<<GridFor(n), kThreads, 0, stream>>>(x, AsBf16(y), n);
  ELDR_CUDA_CHECK_LAUNCH();
}

void FillUniformBf16(Bf16* y, int64_t n, float scale, uint64_t seed, cudaStream_t stream) {
  if (n <= 0) return;
  // The key spreads nearby seeds apart; element i then draws SplitMix64(key + i).
  const uint64_t key = seed * 0xd1342543de82ef95ull + 0x2545f4914f6cdd1dull;
  FillUniformKernel<<<GridFor(n), kThreads, 0, stream>>>(AsBf16(y), n, scale, key);
  ELDR_CUDA_CHECK_LAUNCH();
}

void LaunchConvertRows(const float* x, Bf16* y, int rows, int cols, int64_t y_stride, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  ConvertRowsKernel<<<rows, kThreads, 0, stream>>>(x, AsBf16(y), cols, y_stride);
  ELDR_CUDA_CHECK_LAUNCH();
}

void GemmNT(cublasHandle_t handle, int n, int m, int k, const Bf16* a, int lda, const Bf16* b, int ldb, void* c,
            cudaDataType_t c_type, int ldc, float beta) {
  if (n <= 0 || m <= 0) return;
  const float alpha = 1.f;
  ELDR_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF,
                                 ldb, &beta, c, c_type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace eldr::kernels::cuda
