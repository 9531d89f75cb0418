// Paged KV cache (bf16) write, decode attention and prefill attention. One simple kernel body serves both
// attentions: a block of kWarps warps takes one query row; each warp walks every kWarps-th cached position
// with an online softmax (running max, sum and weighted V in fp32), and the warps' partial states are merged
// at the end. The cache layout is kernels::PagedKv's: [num_blocks, block_size, num_kv_heads, head_dim].
#include "kernels/cuda/internal.cuh"

namespace eldr::kernels::cuda {

namespace {

constexpr int kMaxHeadDim = 256;
constexpr int kPerLane = kMaxHeadDim / 32;  // head elements d = lane + 32 i held by a lane
constexpr int kWarps = 4;
constexpr int kAttentionThreads = kWarps * 32;

// Softmax attention of query q [head_dim] over positions [0, len) of one sequence, for one KV head; called by
// the whole block (kAttentionThreads threads). Writes out [head_dim] (zeros when len == 0).
__device__ void AttendOne(const float* __restrict__ q, const __nv_bfloat16* __restrict__ k_cache,
                          const __nv_bfloat16* __restrict__ v_cache, const int32_t* __restrict__ block_table, int len,
                          int block_size, int num_kv_heads, int head_dim, int kv_head, float scale,
                          float* __restrict__ out) {
  __shared__ float q_s[kMaxHeadDim];
  __shared__ float m_s[kWarps], l_s[kWarps];
  __shared__ float acc_s[kWarps][kMaxHeadDim];
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) q_s[d] = q[d];
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = static_cast<int64_t>(num_kv_heads) * head_dim;
  float m = -INFINITY, l = 0.f;
  float acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.f;

  // pos depends on the warp only, so all 32 lanes run the same iterations (full-mask shuffles are valid).
  for (int pos = warp; pos < len; pos += kWarps) {
    const int64_t slot = static_cast<int64_t>(block_table[pos / block_size]) * block_size + pos % block_size;
    const __nv_bfloat16* kp = k_cache + slot * row + static_cast<int64_t>(kv_head) * head_dim;
    const __nv_bfloat16* vp = v_cache + slot * row + static_cast<int64_t>(kv_head) * head_dim;
    float partial = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < head_dim) partial += q_s[d] * __bfloat162float(kp[d]);
    }
    const float s = WarpSum(partial) * scale;
    const float m_new = fmaxf(m, s);
    const float correction = expf(m - m_new);  // 0 at the first position (m = -inf)
    const float p = expf(s - m_new);
    l = l * correction + p;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < head_dim) acc[i] = acc[i] * correction + p * __bfloat162float(vp[d]);
    }
    m = m_new;
  }

  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < head_dim) acc_s[warp][d] = acc[i];
  }
  __syncthreads();

  // Merge: warps that saw no position (m = -inf) contribute nothing.
  float mx = -INFINITY;
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m_s[w]);
  float total = 0.f;
  for (int w = 0; w < kWarps; ++w) {
    if (m_s[w] != -INFINITY) total += l_s[w] * expf(m_s[w] - mx);
  }
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float o = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      if (m_s[w] != -INFINITY) o += acc_s[w][d] * expf(m_s[w] - mx);
    }
    out[d] = total > 0.f ? o / total : 0.f;
  }
}

// One block per (sequence, query head).
__global__ void DecodeKernel(const float* __restrict__ q, const __nv_bfloat16* __restrict__ k_cache,
                             const __nv_bfloat16* __restrict__ v_cache, const int32_t* __restrict__ block_tables,
                             const int32_t* __restrict__ context_lens, int num_q_heads, int max_blocks_per_seq,
                             int block_size, int num_kv_heads, int head_dim, int group, float scale,
                             float* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const int64_t s = i / num_q_heads;
  const int h = static_cast<int>(i % num_q_heads);
  AttendOne(q + i * head_dim, k_cache, v_cache, block_tables + s * max_blocks_per_seq, context_lens[s], block_size,
            num_kv_heads, head_dim, h / group, scale, out + i * head_dim);
}

// One block per (new token, query head); token t sees positions [0, start + t].
__global__ void PrefillKernel(const float* __restrict__ q, const __nv_bfloat16* __restrict__ k_cache,
                              const __nv_bfloat16* __restrict__ v_cache, const int32_t* __restrict__ block_table,
                              int start, int num_q_heads, int block_size, int num_kv_heads, int head_dim, int group,
                              float scale, float* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const int t = static_cast<int>(i / num_q_heads);
  const int h = static_cast<int>(i % num_q_heads);
  AttendOne(q + i * head_dim, k_cache, v_cache, block_table, start + t + 1, block_size, num_kv_heads, head_dim,
            h / group, scale, out + i * head_dim);
}

// One block per token: its K and V rows [num_kv_heads * head_dim] into its cache slot.
__global__ void WriteKvKernel(__nv_bfloat16* __restrict__ k_cache, __nv_bfloat16* __restrict__ v_cache, int num_blocks,
                              int block_size, int64_t row, const int32_t* __restrict__ block_table,
                              const int32_t* __restrict__ positions, const float* __restrict__ k,
                              const float* __restrict__ v) {
  const int64_t t = blockIdx.x;
  const int pos = positions[t];
  const int block = block_table[pos / block_size];
  if (block < 0 || block >= num_blocks) return;  // REQUIRES violated: skip rather than write out of bounds
  const int64_t slot = static_cast<int64_t>(block) * block_size + pos % block_size;
  for (int64_t c = threadIdx.x; c < row; c += blockDim.x) {
    k_cache[slot * row + c] = __float2bfloat16(k[t * row + c]);
    v_cache[slot * row + c] = __float2bfloat16(v[t * row + c]);
  }
}

void CheckCache(const PagedKv& c, int num_q_heads) {
  ELDR_CHECK(c.head_dim >= 1 && c.head_dim <= kMaxHeadDim,
             "attention head_dim " << c.head_dim << " outside [1, " << kMaxHeadDim << "]");
  ELDR_CHECK(c.block_size >= 1 && c.num_kv_heads >= 1, "bad paged KV shape");
  ELDR_CHECK(num_q_heads >= c.num_kv_heads && num_q_heads % c.num_kv_heads == 0,
             "num_q_heads " << num_q_heads << " is not a multiple of num_kv_heads " << c.num_kv_heads);
}

}  // namespace

void WriteKv(const KvWriteParams& p, cudaStream_t stream) {
  const PagedKv& c = p.cache;
  ELDR_CHECK(c.block_size >= 1 && c.num_kv_heads >= 1 && c.head_dim >= 1, "bad paged KV shape");
  if (p.num_tokens <= 0) return;
  const int64_t row = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  WriteKvKernel<<<p.num_tokens, 256, 0, stream>>>(AsBf16(c.k), AsBf16(c.v), c.num_blocks, c.block_size, row,
                                                  p.block_table, p.positions, p.k, p.v);
  ELDR_CUDA_CHECK_LAUNCH();
}

void PagedAttentionDecode(const PagedAttentionDecodeParams& p, cudaStream_t stream) {
  const PagedKv& c = p.cache;
  CheckCache(c, p.num_q_heads);
  if (p.num_seqs <= 0) return;
  const int64_t blocks = static_cast<int64_t>(p.num_seqs) * p.num_q_heads;
  DecodeKernel<<<static_cast<unsigned>(blocks), kAttentionThreads, 0, stream>>>(
      p.q, AsBf16(c.k), AsBf16(c.v), p.block_tables, p.context_lens, p.num_q_heads, p.max_blocks_per_seq, c.block_size,
      c.num_kv_heads, c.head_dim, p.num_q_heads / c.num_kv_heads, p.scale, p.out);
  ELDR_CUDA_CHECK_LAUNCH();
}

void PrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream) {
  const PagedKv& c = p.cache;
  CheckCache(c, p.num_q_heads);
  ELDR_CHECK(p.start >= 0, "prefill start " << p.start << " < 0");
  if (p.num_tokens <= 0) return;
  const int64_t blocks = static_cast<int64_t>(p.num_tokens) * p.num_q_heads;
  PrefillKernel<<<static_cast<unsigned>(blocks), kAttentionThreads, 0, stream>>>(
      p.q, AsBf16(c.k), AsBf16(c.v), p.block_table, p.start, p.num_q_heads, c.block_size, c.num_kv_heads, c.head_dim,
      p.num_q_heads / c.num_kv_heads, p.scale, p.out);
  ELDR_CUDA_CHECK_LAUNCH();
}

}  // namespace eldr::kernels::cuda
