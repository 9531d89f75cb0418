// RmsNorm and rotary embedding: one pass over fp32 activations.
#include "kernels/cuda/internal.cuh"

namespace eldr::kernels::cuda {

namespace {

constexpr int kNormThreads = 256;

// One block per token. Each thread reads its elements before the reduction's barriers and writes the same
// elements after them, so out may alias x.
__global__ void RmsNormKernel(const float* x, const float* __restrict__ weight, float* out, int hidden, float eps) {
  __shared__ float shared[32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * hidden;
  float ss = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) ss += x[row + i] * x[row + i];
  ss = BlockSum(ss, shared);
  const float inv = rsqrtf(ss / hidden + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[row + i] = x[row + i] * inv * weight[i];
}

// One thread per (token, i < head_dim / 2): rotates the pair (i, i + half) of every head of the token.
__global__ void RopeKernel(float* __restrict__ q, float* __restrict__ k, const int32_t* __restrict__ positions,
                           int num_tokens, int num_q_heads, int num_kv_heads, int head_dim, float theta) {
  const int half = head_dim / 2;
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<int64_t>(num_tokens) * half) return;
  const int64_t t = idx / half;
  const int i = static_cast<int>(idx % half);
  // Double precision as the CPU reference: pos * inv_freq reaches 1e4..1e5 radians at long positions.
  const double inv_freq = pow(static_cast<double>(theta), -2.0 * i / head_dim);
  const double angle = static_cast<double>(positions[t]) * inv_freq;
  const float c = static_cast<float>(cos(angle)), s = static_cast<float>(sin(angle));
  for (int h = 0; h < num_q_heads; ++h) {
    float* v = q + (t * num_q_heads + h) * head_dim;
    const float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
  for (int h = 0; h < num_kv_heads; ++h) {
    float* v = k + (t * num_kv_heads + h) * head_dim;
    const float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
}

}  // namespace

void RmsNorm(const RmsNormParams& p, cudaStream_t stream) {
  ELDR_CHECK(p.num_tokens >= 0 && p.hidden > 0, "bad RmsNorm shape " << p.num_tokens << " x " << p.hidden);
  if (p.num_tokens == 0) return;
  RmsNormKernel<<<p.num_tokens, kNormThreads, 0, stream>>>(p.x, p.weight, p.out, p.hidden, p.eps);
  ELDR_CUDA_CHECK_LAUNCH();
}

void ApplyRope(const RopeParams& p, cudaStream_t stream) {
  ELDR_CHECK(p.head_dim > 0 && p.head_dim % 2 == 0, "RoPE head_dim " << p.head_dim << " must be even");
  ELDR_CHECK(p.num_tokens >= 0 && p.num_q_heads >= 0 && p.num_kv_heads >= 0, "bad RoPE shape");
  const int64_t n = static_cast<int64_t>(p.num_tokens) * (p.head_dim / 2);
  if (n == 0) return;
  constexpr int kThreads = 128;
  RopeKernel<<<static_cast<unsigned>(CeilDiv(n, kThreads)), kThreads, 0, stream>>>(
      p.q, p.k, p.positions, p.num_tokens, p.num_q_heads, p.num_kv_heads, p.head_dim, p.theta);
  ELDR_CUDA_CHECK_LAUNCH();
}

}  // namespace eldr::kernels::cuda
