// Dense projections through cuBLAS (bf16 in, fp32 accumulate): Linear and the dense SwiGLU MLP, and the
// SwiGLU activation kernel shared with the MoE experts.
#include "kernels/cuda/internal.cuh"

namespace eldr::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void SwiGluKernel(const __nv_bfloat16* __restrict__ gate, const __nv_bfloat16* __restrict__ up,
                             __nv_bfloat16* __restrict__ h, int cols, int64_t stride) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * stride;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    const float g = __bfloat162float(gate[row + i]), u = __bfloat162float(up[row + i]);
    h[row + i] = __float2bfloat16(g / (1.f + expf(-g)) * u);
  }
}

}  // namespace

void LaunchSwiGlu(const Bf16* gate, const Bf16* up, Bf16* h, int rows, int cols, int64_t stride, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  SwiGluKernel<<<rows, kThreads, 0, stream>>>(AsBf16(gate), AsBf16(up), AsBf16(h), cols, stride);
  ELDR_CUDA_CHECK_LAUNCH();
}

size_t LinearScratchBytes(int num_tokens, int in_features) {
  return static_cast<size_t>(num_tokens) * RoundUp(in_features, 8) * sizeof(Bf16);
}

namespace {

// Mlp's scratch: x, gate, up and SwiGLU outputs in bf16, rows 16-byte aligned.
struct MlpLayout {
  MlpLayout(int T, int H, int I) : h_stride(RoundUp(H, 8)), i_stride(RoundUp(I, 8)) {
    o_x = layout.Add(static_cast<size_t>(T) * h_stride * sizeof(Bf16));
    o_g = layout.Add(static_cast<size_t>(T) * i_stride * sizeof(Bf16));
    o_u = layout.Add(static_cast<size_t>(T) * i_stride * sizeof(Bf16));
    o_h = layout.Add(static_cast<size_t>(T) * i_stride * sizeof(Bf16));
  }
  int64_t h_stride, i_stride;
  ScratchLayout layout;
  size_t o_x = 0, o_g = 0, o_u = 0, o_h = 0;
};

}  // namespace

size_t MlpScratchBytes(int num_tokens, int hidden, int intermediate) {
  return MlpLayout(num_tokens, hidden, intermediate).layout.total();
}

void Linear(Context& ctx, const LinearParams& p, cudaStream_t stream) {
  ELDR_CHECK(p.num_tokens >= 0 && p.in_features > 0 && p.out_features > 0,
             "bad Linear shape " << p.num_tokens << " x " << p.in_features << " -> " << p.out_features);
  if (p.num_tokens == 0) return;
  Context::Impl& impl = ctx.impl();
  // bf16 copy of x with 16-byte aligned rows (cuBLAS's fast paths want aligned rows).
  const int64_t in_stride = RoundUp(p.in_features, 8);
  Bf16* xb = static_cast<Bf16*>(impl.Scratch(LinearScratchBytes(p.num_tokens, p.in_features), stream));
  LaunchConvertRows(p.x, xb, p.num_tokens, p.in_features, in_stride, stream);
  ELDR_CUBLAS_CHECK(cublasSetStream(impl.cublas, stream));
  GemmNT(impl.cublas, p.num_tokens, p.out_features, p.in_features, p.weight, p.in_features, xb,
         static_cast<int>(in_stride), p.y, CUDA_R_32F, p.out_features, 0.f);
}

void Mlp(Context& ctx, const MlpParams& p, cudaStream_t stream) {
  const int T = p.num_tokens, H = p.hidden, I = p.intermediate;
  ELDR_CHECK(T >= 0 && H > 0 && I > 0, "bad Mlp shape " << T << " x " << H << " (intermediate " << I << ")");
  if (T == 0) return;
  Context::Impl& impl = ctx.impl();
  const MlpLayout m(T, H, I);
  const int64_t h_stride = m.h_stride, i_stride = m.i_stride;
  void* base = impl.Scratch(m.layout.total(), stream);
  Bf16* xb = ScratchLayout::Get<Bf16>(base, m.o_x);
  Bf16* g = ScratchLayout::Get<Bf16>(base, m.o_g);
  Bf16* u = ScratchLayout::Get<Bf16>(base, m.o_u);
  Bf16* h = ScratchLayout::Get<Bf16>(base, m.o_h);

  LaunchConvertRows(p.x, xb, T, H, h_stride, stream);
  ELDR_CUBLAS_CHECK(cublasSetStream(impl.cublas, stream));
  const int hs = static_cast<int>(h_stride), is = static_cast<int>(i_stride);
  GemmNT(impl.cublas, T, I, H, p.gate_proj, H, xb, hs, g, CUDA_R_16BF, is, 0.f);
  GemmNT(impl.cublas, T, I, H, p.up_proj, H, xb, hs, u, CUDA_R_16BF, is, 0.f);
  LaunchSwiGlu(g, u, h, T, I, i_stride, stream);
  GemmNT(impl.cublas, T, H, I, p.down_proj, I, h, is, p.out, CUDA_R_32F, H, 1.f);  // beta 1: out += ...
}

}  // namespace eldr::kernels::cuda
