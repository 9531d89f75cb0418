// The element-wise and gather launchers of the executor's plumbing (embedding gather, residual add, greedy
// argmax, MoE combine) and the slot-mapped KV operations (write, pack, unpack), with device-side range checks
// that report through an error word instead of skipping silently (cuda_ops.h "Device errors").
#include <algorithm>
#include <cmath>

#include "kernels/cuda/internal.cuh"

namespace eldr::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__device__ inline void Report(int* error, int bit) {
  if (error != nullptr) atomicOr(error, bit);
}

// One block per token: out[t] = fp32(table[tokens[t]]); an id outside [0, rows) gives a zero row and kErrorToken.
__global__ void EmbeddingGatherKernel(const __nv_bfloat16* __restrict__ table, int64_t rows, int64_t cols,
                                      const int32_t* __restrict__ tokens, float* __restrict__ out, int* error) {
  const int64_t t = blockIdx.x;
  const int32_t id = tokens[t];
  const bool ok = id >= 0 && id < rows;
  if (!ok && threadIdx.x == 0) Report(error, kErrorToken);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    out[t * cols + c] = ok ? __bfloat162float(table[static_cast<int64_t>(id) * cols + c]) : 0.f;
  }
}

__global__ void ResidualAddKernel(const float* __restrict__ x, float* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] += x[i];
  }
}

// (value, index) of the better of two candidates in std::max_element's order over non-NaN values: the larger
// value, the lower index on ties; a NaN candidate (index -1 or value NaN) loses to any other.
__device__ inline void Better(float& v, int& i, float ov, int oi) {
  const bool mine = i >= 0 && !isnan(v), theirs = oi >= 0 && !isnan(ov);
  if (!theirs) return;
  if (!mine || ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// One block per row. std::max_element keeps the first element while it is NaN (NaN < x is false) and never
// moves to a NaN later, so the answer is 0 when x[r, 0] is NaN, else the first index of the largest non-NaN.
__global__ void ArgMaxKernel(const float* __restrict__ x, int cols, int32_t* __restrict__ out) {
  __shared__ float sv[kThreads];
  __shared__ int si[kThreads];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  float v = 0.f;
  int i = -1;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) Better(v, i, row[c], c);
  sv[threadIdx.x] = v;
  si[threadIdx.x] = i;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      float a = sv[threadIdx.x];
      int ai = si[threadIdx.x];
      Better(a, ai, sv[threadIdx.x + s], si[threadIdx.x + s]);
      sv[threadIdx.x] = a;
      si[threadIdx.x] = ai;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = isnan(row[0]) || si[0] < 0 ? 0 : si[0];
}

// One block per token: out[t] += Σ_j w[t, j] · y[t * top_k + j], j ascending, in fp32 (the CPU's order).
__global__ void MoeCombineKernel(const float* __restrict__ y, const float* __restrict__ w, int top_k, int hidden,
                                 float* __restrict__ out) {
  const int64_t t = blockIdx.x;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < top_k; ++j) acc += w[t * top_k + j] * y[(t * top_k + j) * hidden + c];
    out[t * hidden + c] += acc;
  }
}

// One block per token: its K and V rows into cache slot slots[t]; a slot outside [0, num_slots) is not written
// and sets kErrorSlot.
__global__ void WriteKvSlotsKernel(__nv_bfloat16* __restrict__ k_cache, __nv_bfloat16* __restrict__ v_cache,
                                   int64_t num_slots, int64_t row, const int64_t* __restrict__ slots,
                                   const float* __restrict__ k, const float* __restrict__ v, int* error) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) {
    if (threadIdx.x == 0) Report(error, kErrorSlot);
    return;
  }
  for (int64_t c = threadIdx.x; c < row; c += blockDim.x) {
    k_cache[slot * row + c] = __float2bfloat16(k[t * row + c]);
    v_cache[slot * row + c] = __float2bfloat16(v[t * row + c]);
  }
}

// One block per token: packed [2, num_tokens, row] ↔ the cache rows of slots[t] (unpack: to_cache).
__global__ void PackKvKernel(__nv_bfloat16* __restrict__ k_cache, __nv_bfloat16* __restrict__ v_cache,
                             int64_t num_slots, int64_t row, const int64_t* __restrict__ slots, int64_t num_tokens,
                             __nv_bfloat16* __restrict__ packed, bool to_cache, int* error) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) {
    if (threadIdx.x == 0) Report(error, kErrorSlot);
    return;
  }
  __nv_bfloat16* pk = packed + t * row;
  __nv_bfloat16* pv = packed + (num_tokens + t) * row;
  for (int64_t c = threadIdx.x; c < row; c += blockDim.x) {
    if (to_cache) {
      k_cache[slot * row + c] = pk[c];
      v_cache[slot * row + c] = pv[c];
    } else {
      pk[c] = k_cache[slot * row + c];
      pv[c] = v_cache[slot * row + c];
    }
  }
}

int GridFor(int64_t n) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(CeilDiv(n, kThreads), 1 << 20)));
}

void CheckKvShape(const PagedKv& c) {
  ELDR_CHECK(c.block_size >= 1 && c.num_kv_heads >= 1 && c.head_dim >= 1 && c.num_blocks >= 0, "bad paged KV shape");
}

}  // namespace

void EmbeddingGather(const EmbeddingGatherParams& p, cudaStream_t stream) {
  ELDR_CHECK(p.rows >= 1 && p.cols >= 1, "EmbeddingGather: table of " << p.rows << " x " << p.cols);
  if (p.num_tokens <= 0) return;
  EmbeddingGatherKernel<<<p.num_tokens, kThreads, 0, stream>>>(AsBf16(p.table), p.rows, p.cols, p.tokens, p.out,
                                                               p.error);
  ELDR_CUDA_CHECK_LAUNCH();
}

void ResidualAdd(const ResidualAddParams& p, cudaStream_t stream) {
  if (p.n <= 0) return;
  ResidualAddKernel<<<GridFor(p.n), kThreads, 0, stream>>>(p.x, p.out, p.n);
  ELDR_CUDA_CHECK_LAUNCH();
}

void ArgMax(const ArgMaxParams& p, cudaStream_t stream) {
  ELDR_CHECK(p.num_cols >= 1, "ArgMax: rows of " << p.num_cols << " columns");
  if (p.num_rows <= 0) return;
  ArgMaxKernel<<<p.num_rows, kThreads, 0, stream>>>(p.x, p.num_cols, p.out);
  ELDR_CUDA_CHECK_LAUNCH();
}

void MoeCombine(const MoeCombineParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return;
  MoeCombineKernel<<<p.num_tokens, kThreads, 0, stream>>>(p.y, p.topk_weights, p.top_k, p.hidden, p.out);
  ELDR_CUDA_CHECK_LAUNCH();
}

void WriteKvSlots(const KvSlotWriteParams& p, cudaStream_t stream) {
  const PagedKv& c = p.cache;
  CheckKvShape(c);
  if (p.num_tokens <= 0) return;
  const int64_t row = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  WriteKvSlotsKernel<<<p.num_tokens, kThreads, 0, stream>>>(
      AsBf16(c.k), AsBf16(c.v), static_cast<int64_t>(c.num_blocks) * c.block_size, row, p.slots, p.k, p.v, p.error);
  ELDR_CUDA_CHECK_LAUNCH();
}

void PackKv(const KvPackParams& p, cudaStream_t stream) {
  const PagedKv& c = p.cache;
  CheckKvShape(c);
  if (p.num_tokens <= 0) return;
  const int64_t row = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  PackKvKernel<<<p.num_tokens, kThreads, 0, stream>>>(AsBf16(c.k), AsBf16(c.v),
                                                      static_cast<int64_t>(c.num_blocks) * c.block_size, row, p.slots,
                                                      p.num_tokens, AsBf16(p.packed), p.unpack, p.error);
  ELDR_CUDA_CHECK_LAUNCH();
}

}  // namespace eldr::kernels::cuda
