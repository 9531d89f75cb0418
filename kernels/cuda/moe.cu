// The MoE layer on the GPU: router top-k, token → expert grouping, permute, per-expert SwiGLU through cuBLAS
// (one grouped call per projection), combine; and the signature-count accumulation of the prefill hook.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <vector>

#include "kernels/cuda/internal.cuh"

namespace eldr::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kGateThreads = 128;
constexpr int kMaxGateExperts = 2048;  // dynamic shared memory: 8 bytes per expert + 4 per k

// ---- GateTopK ----

struct Candidate {
  float value;
  int expert;
};

// The order of the top-k: larger logit first, the lower expert id on ties.
__device__ inline bool Better(const Candidate& a, const Candidate& b) {
  return a.value > b.value || (a.value == b.value && a.expert < b.expert);
}

__device__ inline Candidate BlockBest(Candidate c, Candidate* shared /* [32] */) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const Candidate other{__shfl_xor_sync(kFullMask, c.value, offset), __shfl_xor_sync(kFullMask, c.expert, offset)};
    if (Better(other, c)) c = other;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = c;
  __syncthreads();
  Candidate best = shared[0];
  for (int w = 1; w < num_warps; ++w) {
    if (Better(shared[w], best)) best = shared[w];
  }
  return best;
}

// One block per token: softmax statistics by block reductions, then top_k rounds of a block-wide arg-max
// over the experts not yet taken. Selecting on the logits (softmax is monotonic) keeps the ids exact.
__global__ void GateTopKKernel(const float* __restrict__ logits, int num_experts, int top_k, bool renormalize,
                               int32_t* __restrict__ topk_ids, float* __restrict__ topk_weights) {
  extern __shared__ float gate_shared[];
  float* l = gate_shared;                                          // [num_experts]
  int* taken = reinterpret_cast<int*>(gate_shared + num_experts);  // [num_experts]
  int* chosen = taken + num_experts;                               // [top_k]
  __shared__ float reduce[32];
  __shared__ Candidate candidates[32];

  const int64_t t = blockIdx.x;
  const float* row = logits + t * num_experts;
  float mx = -INFINITY;
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    float v = row[e];
    if (isnan(v)) v = -INFINITY;  // a NaN logit is never preferred (and cannot break the arg-max)
    l[e] = v;
    taken[e] = 0;
    mx = fmaxf(mx, v);
  }
  mx = BlockMax(mx, reduce);  // its barriers also publish l and taken
  float s = 0.f;
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) s += expf(l[e] - mx);
  const float sum = BlockSum(s, reduce);

  for (int j = 0; j < top_k; ++j) {
    Candidate best{-INFINITY, INT_MAX};
    for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
      const Candidate c{l[e], e};
      if (!taken[e] && Better(c, best)) best = c;
    }
    best = BlockBest(best, candidates);
    if (threadIdx.x == 0) {
      const int e = best.expert < num_experts ? best.expert : 0;  // INT_MAX only if every value were NaN
      taken[e] = 1;
      chosen[j] = e;
    }
    __syncthreads();  // taken[] of this round before the next round's scan
  }
  if (threadIdx.x == 0) {
    float kept = 0.f;
    for (int j = 0; j < top_k; ++j) kept += expf(l[chosen[j]] - mx) / sum;
    for (int j = 0; j < top_k; ++j) {
      const float prob = expf(l[chosen[j]] - mx) / sum;
      topk_ids[t * top_k + j] = chosen[j];
      topk_weights[t * top_k + j] = renormalize ? prob / kept : prob;
    }
  }
}

// ---- GroupByExpert: counts, exclusive scan, stable scatter ----

__global__ void CountKernel(const int32_t* __restrict__ ids, int n, int num_experts, int32_t* __restrict__ offsets) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int e = ids[i];
    if (e >= 0 && e < num_experts) atomicAdd(&offsets[e + 1], 1);
  }
}

// The inclusive prefix sum of v over the block (blockDim.x a multiple of 32, at most 1024); `warp_sums` is
// shared [32]. Every thread of the block must call it.
__device__ inline int BlockInclusiveSum(int v, int* warp_sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int other = __shfl_up_sync(kFullMask, v, offset);
    if (lane >= offset) v += other;
  }
  __syncthreads();  // an earlier call's reads of warp_sums are done
  if (lane == 31) warp_sums[warp] = v;
  __syncthreads();
  for (int w = 0; w < warp; ++w) v += warp_sums[w];
  return v;
}

constexpr int kScanThreads = 256;

// offsets[e + 1] holds expert e's count and offsets[0] == 0; turns the counts into running offsets. One block
// of kScanThreads, a chunk of experts per pass (a serial loop paid a dependent global load per expert).
__global__ void ScanKernel(int32_t* offsets, int num_experts) {
  __shared__ int warp_sums[32];
  __shared__ int carry;
  if (threadIdx.x == 0) carry = 0;
  for (int base = 0; base < num_experts; base += blockDim.x) {
    const int e = base + static_cast<int>(threadIdx.x);
    const int count = e < num_experts ? offsets[e + 1] : 0;
    const int sum = BlockInclusiveSum(count, warp_sums);  // its barriers also publish `carry`
    const int before = carry;
    if (e < num_experts) offsets[e + 1] = before + sum;
    __syncthreads();  // every thread has read carry
    if (threadIdx.x == blockDim.x - 1) carry = before + sum;
  }
}

// One block per expert walks all pairs in order, tile by tile; a ballot + warp-count prefix gives each
// matching pair its rank, so the order within an expert is the pair order (stable, as the CPU).
__global__ void ScatterKernel(const int32_t* __restrict__ ids, int n, const int32_t* __restrict__ offsets,
                              int32_t* __restrict__ pairs, int32_t* __restrict__ pair_rows) {
  __shared__ int warp_counts[32];
  const int e = blockIdx.x;
  const int begin = offsets[e];
  if (offsets[e + 1] == begin) return;  // the same for every thread of the block
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  int running = begin;
  for (int tile = 0; tile < n; tile += blockDim.x) {
    const int i = tile + static_cast<int>(threadIdx.x);
    const bool match = i < n && ids[i] == e;
    const unsigned mask = __ballot_sync(kFullMask, match);
    __syncthreads();  // the previous tile's reads of warp_counts are done
    if (lane == 0) warp_counts[warp] = __popc(mask);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < num_warps; ++w) {
      const int c = warp_counts[w];
      if (w < warp) before += c;
      total += c;
    }
    if (match) {
      const int row = running + before + __popc(mask & ((1u << lane) - 1u));
      pairs[row] = i;
      if (pair_rows != nullptr) pair_rows[i] = row;
    }
    running += total;
  }
}

void LaunchGroupByExpert(const int32_t* ids, int num_tokens, int top_k, int num_experts, int32_t* offsets,
                         int32_t* pairs, int32_t* pair_rows, cudaStream_t stream) {
  const int n = num_tokens * top_k;
  ELDR_CUDA_CHECK(cudaMemsetAsync(offsets, 0, sizeof(int32_t) * (num_experts + 1), stream));
  if (n > 0) {
    CountKernel<<<static_cast<unsigned>(std::min<int64_t>(CeilDiv(n, kThreads), 1024)), kThreads, 0, stream>>>(
        ids, n, num_experts, offsets);
    ELDR_CUDA_CHECK_LAUNCH();
  }
  ScanKernel<<<1, kScanThreads, 0, stream>>>(offsets, num_experts);
  ELDR_CUDA_CHECK_LAUNCH();
  if (n > 0) {
    ScatterKernel<<<num_experts, kThreads, 0, stream>>>(ids, n, offsets, pairs, pair_rows);
    ELDR_CUDA_CHECK_LAUNCH();
  }
}

// ---- permute and combine ----

__global__ void PermuteKernel(const float* __restrict__ x, const int32_t* __restrict__ pairs, int top_k, int hidden,
                              __nv_bfloat16* __restrict__ x_permuted, int64_t stride) {
  const int64_t r = blockIdx.x;
  if (pairs[r] < 0) return;  // a hole the device schedule left for an invalid id (pairs preset to -1)
  const float* src = x + static_cast<int64_t>(pairs[r] / top_k) * hidden;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) x_permuted[r * stride + c] = __float2bfloat16(src[c]);
}

// A thread per (token blockIdx.x, column): the top_k rows' loads are independent, so a token's combine is one
// round of memory latency, not one per column chunk (a block per token walked its columns serially).
__global__ void CombineKernel(const __nv_bfloat16* __restrict__ y, int64_t stride,
                              const int32_t* __restrict__ pair_rows, const float* __restrict__ weights, int top_k,
                              int hidden, float* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const int c = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x);
  if (c >= hidden) return;
  float acc = 0.f;
  for (int j = 0; j < top_k; ++j) {
    const int64_t pair = t * top_k + j;
    const int32_t row = pair_rows[pair];
    if (row < 0) continue;  // an invalid id under the device schedule: contributes nothing (kErrorExpert)
    acc += weights[pair] * __bfloat162float(y[static_cast<int64_t>(row) * stride + c]);
  }
  out[t * hidden + c] += acc;
}

// ---- expert GEMM plans ----

// Device pointer arrays of the grouped GEMMs, one entry per active expert in ascending expert order (the
// order the host uses for the sizes): gate_up [3][2 * num_experts] = A, B, C of problems (gate, up) of each
// active expert, interleaved; down [3][num_experts] = A, B, C of each active expert's down projection.
// Built on the device before MoeExperts' one synchronisation, so they are complete before cuBLAS starts.
__global__ void BuildGemmPointersKernel(const int32_t* __restrict__ offsets, int num_experts,
                                        const void* const* __restrict__ weights /* [3][num_experts] */,
                                        const __nv_bfloat16* xp, __nv_bfloat16* g, __nv_bfloat16* u, __nv_bfloat16* h,
                                        __nv_bfloat16* y, int64_t h_stride, int64_t i_stride, void** gate_up,
                                        void** down) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const int cap = 2 * num_experts;
  int a = 0;
  for (int e = 0; e < num_experts; ++e) {
    const int64_t begin = offsets[e];
    if (offsets[e + 1] == begin) continue;
    gate_up[2 * a] = const_cast<void*>(weights[e]);
    gate_up[2 * a + 1] = const_cast<void*>(weights[num_experts + e]);
    gate_up[cap + 2 * a] = const_cast<__nv_bfloat16*>(xp + begin * h_stride);
    gate_up[cap + 2 * a + 1] = const_cast<__nv_bfloat16*>(xp + begin * h_stride);
    gate_up[2 * cap + 2 * a] = g + begin * i_stride;
    gate_up[2 * cap + 2 * a + 1] = u + begin * i_stride;
    down[a] = const_cast<void*>(weights[2 * num_experts + e]);
    down[num_experts + a] = h + begin * i_stride;
    down[2 * num_experts + a] = y + begin * h_stride;
    ++a;
  }
}

// One problem of an expert GEMM: C rows [count, m] = B rows [count, k] · A [m, k]^T.
struct ExpertGemm {
  const Bf16* a;
  const Bf16* b;
  Bf16* c;
  int count;
};

// Runs `problems` (all with the same m, k and strides) as one grouped cuBLAS call over the device pointer
// arrays `arrays` ([3][capacity]: A, B, C, in the order of `problems`), or one cublasGemmEx each.
void RunExpertGemms(Context::Impl& impl, const std::vector<ExpertGemm>& problems, int m, int k, int lda, int ldb,
                    int ldc, void** arrays, int capacity) {
  if (problems.empty()) return;
  if (!impl.grouped_gemm) {
    for (const ExpertGemm& q : problems)
      GemmNT(impl.cublas, q.count, m, k, q.a, lda, q.b, ldb, q.c, CUDA_R_16BF, ldc, 0.f);
    return;
  }
#if CUBLAS_VERSION >= 120500
  const int num = static_cast<int>(problems.size());
  std::vector<cublasOperation_t> trans_a(num, CUBLAS_OP_T), trans_b(num, CUBLAS_OP_N);
  std::vector<int> ms(num, m), ns(num), ks(num, k), ldas(num, lda), ldbs(num, ldb), ldcs(num, ldc), sizes(num, 1);
  std::vector<float> alphas(num, 1.f), betas(num, 0.f);
  for (int i = 0; i < num; ++i) ns[i] = problems[i].count;
  const cublasStatus_t status = cublasGemmGroupedBatchedEx(
      impl.cublas, trans_a.data(), trans_b.data(), ms.data(), ns.data(), ks.data(), alphas.data(), arrays, CUDA_R_16BF,
      ldas.data(), arrays + capacity, CUDA_R_16BF, ldbs.data(), betas.data(), arrays + 2 * capacity, CUDA_R_16BF,
      ldcs.data(), num, sizes.data(), CUBLAS_COMPUTE_32F);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
    // The library has the entry point but no kernel for this case (GPU or configuration): run one GEMM per
    // expert from now on. Visible through Context::grouped_gemm(); the GPU test fails on it.
    std::fprintf(stderr, "eldr: cublasGemmGroupedBatchedEx is not supported here; using one GEMM per expert\n");
    impl.grouped_gemm = false;
    RunExpertGemms(impl, problems, m, k, lda, ldb, ldc, arrays, capacity);
    return;
  }
  ELDR_CUBLAS_CHECK(status);
#else
  (void)arrays;
  (void)capacity;
  ELDR_CHECK(false, "grouped GEMM requested but cuBLAS is older than 12.5");
#endif
}

// ---- expert GEMMs scheduled on the device ----

// The expert GEMMs of a decode step read far more weight bytes than activations (a tile has at most
// kMoeTileRows rows, an expert's weights are megabytes), so the kernel streams the weights once, in 16-byte loads
// that bypass L1, into bf16 tensor-core MMAs (m16n8k16, fp32 accumulation): a warp computes one tile's 16 rows
// × 8 output columns, a block kTileWarps warps of consecutive columns; gridDim.x walks the tiles (no 65535
// limit), gridDim.y the columns.
constexpr int kTileWarps = 8;
constexpr int kTileWarpCols = 8;  // the n of one m16n8k16 MMA
constexpr int kTileCols = kTileWarps * kTileWarpCols;
constexpr int kTileChunk = 32;  // k per pair of MMAs: 4 lanes × 8 bf16 of each row
constexpr int kTileUnroll = 4;  // chunks per pipeline step: loads in flight per warp
static_assert(kMoeTileRows == 16, "one m16n8k16 MMA covers a tile's rows");

__device__ inline void ReportError(int* error, int bit) {
  if (error != nullptr) atomicOr(error, bit);
}

// Expert e's rows [offsets[e], offsets[e + 1]) become ceil(count / kMoeTileRows) tiles, in expert order;
// tile_expert / tile_row get each tile's expert and first row, *num_tiles their number. Ids outside the experts
// (offsets[E] < n) set kErrorExpert. One block of kScanThreads: a thread per expert of each chunk, placed by a
// prefix sum of the tile counts.
__global__ void BuildTilesKernel(const int32_t* __restrict__ offsets, int num_experts, int n,
                                 int32_t* __restrict__ tile_expert, int32_t* __restrict__ tile_row,
                                 int32_t* __restrict__ num_tiles, int* error) {
  __shared__ int warp_sums[32];
  __shared__ int carry;
  if (threadIdx.x == 0) carry = 0;
  for (int base = 0; base < num_experts; base += blockDim.x) {
    const int e = base + static_cast<int>(threadIdx.x);
    const int begin = e < num_experts ? offsets[e] : 0, end = e < num_experts ? offsets[e + 1] : 0;
    const int tiles = (end - begin + kMoeTileRows - 1) / kMoeTileRows;
    const int sum = BlockInclusiveSum(tiles, warp_sums);  // its barriers also publish `carry`
    const int before = carry;
    for (int i = 0, t = before + sum - tiles; i < tiles; ++i, ++t) {
      tile_expert[t] = e;
      tile_row[t] = begin + i * kMoeTileRows;
    }
    __syncthreads();  // every thread has read carry
    if (threadIdx.x == blockDim.x - 1) carry = before + sum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    *num_tiles = carry;
    if (offsets[num_experts] != n) ReportError(error, kErrorExpert);
  }
}

__device__ inline void MmaBf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                               uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();  // the host takes this path only on a device with bf16 MMA (Context::Impl::bf16_mma)
#endif
}

// C[r, c] = Σ_k B[r, k] · W[c, k] for the rows r of one tile (one expert's, up to kMoeTileRows) and the kTileCols
// columns c of blockIdx.y, W = table[which · E + e] of shape [m, k] (row-major, leading dimension k), fp32
// accumulation, bf16 out. Rows past the expert's count are neither read nor written; an expert without weights
// sets kErrorExpert and writes nothing. kMma (the device has bf16 MMA, k and ldb are multiples of 8 and W, B
// 16-byte aligned): tensor cores, lane (g, q) = (lane / 4, lane % 4) loading 8 consecutive k of W row g and of B
// rows g and g + 8 per chunk. An MMA sums over its 16 k slots whatever k each slot holds, so the slots need only
// agree between A and B: slot 2q + j (and 8 + 2q + j) of lane (·, q) is chunk element 8q + j (8q + 2 + j) in the
// first MMA and 8q + 4 + j (8q + 6 + j) in the second, for A and B alike. Otherwise: each lane computes outputs
// lane + 32 i of the warp's 16 × 8 one bf16 at a time.
template <bool kMma>
__global__ void __launch_bounds__(kTileWarps * 32)
    ExpertTileGemmKernel(const int32_t* __restrict__ tile_expert, const int32_t* __restrict__ tile_row,
                         const int32_t* __restrict__ num_tiles, const int32_t* __restrict__ offsets,
                         const void* const* __restrict__ table, int which, int num_experts, int m, int k,
                         const __nv_bfloat16* __restrict__ b, int64_t ldb, __nv_bfloat16* __restrict__ c, int64_t ldc,
                         int* error) {
  const int t = static_cast<int>(blockIdx.x);
  if (t >= *num_tiles) return;
  const int e = tile_expert[t], row0 = tile_row[t];
  const int rows = min(kMoeTileRows, offsets[e + 1] - row0);
  const auto* w = static_cast<const __nv_bfloat16*>(table[which * num_experts + e]);
  if (w == nullptr) {
    if (threadIdx.x == 0) ReportError(error, kErrorExpert);
    return;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col0 = static_cast<int>(blockIdx.y) * kTileCols + warp * kTileWarpCols;
  if (col0 >= m) return;
  const __nv_bfloat16* brow = b + static_cast<int64_t>(row0) * ldb;
  if constexpr (kMma) {
    const int g = lane >> 2, q = lane & 3;
    const bool w_ok = col0 + g < m, a_lo = g < rows, a_hi = g + 8 < rows;
    // Every load is unconditional, from an address inside the tensors (a row or vector past the end reads the
    // first row or the last vector) and zeroed after, and the next step's loads are issued before this step's
    // MMAs (a register double buffer): kTileUnroll chunks in flight per warp, which the MMAs' in-order issue
    // would otherwise cut to one.
    const auto* wp = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(w_ok ? col0 + g : 0) * k);
    const auto* ap_lo = reinterpret_cast<const uint4*>(brow + (a_lo ? g : 0) * ldb);
    const auto* ap_hi = reinterpret_cast<const uint4*>(brow + (a_hi ? g + 8 : 0) * ldb);
    const int num_vectors = k / 8, num_chunks = (k + kTileChunk - 1) / kTileChunk;
    uint4 wv[kTileUnroll], lo[kTileUnroll], hi[kTileUnroll];
    const auto load = [&](int c0) {
#pragma unroll
      for (int u = 0; u < kTileUnroll; ++u) {
        const int vc = min((c0 + u) * (kTileChunk / 8) + q, num_vectors - 1);
        wv[u] = __ldcs(wp + vc);
        lo[u] = __ldg(ap_lo + vc);
        hi[u] = __ldg(ap_hi + vc);
      }
    };
    const uint4 zero = make_uint4(0, 0, 0, 0);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    load(0);
    for (int c0 = 0; c0 < num_chunks; c0 += kTileUnroll) {
      uint4 w_cur[kTileUnroll], lo_cur[kTileUnroll], hi_cur[kTileUnroll];
#pragma unroll
      for (int u = 0; u < kTileUnroll; ++u) {
        const bool in_k = (c0 + u) * (kTileChunk / 8) + q < num_vectors;
        w_cur[u] = in_k && w_ok ? wv[u] : zero;
        lo_cur[u] = in_k && a_lo ? lo[u] : zero;
        hi_cur[u] = in_k && a_hi ? hi[u] : zero;
      }
      if (c0 + kTileUnroll < num_chunks) load(c0 + kTileUnroll);
#pragma unroll
      for (int u = 0; u < kTileUnroll; ++u) {
        MmaBf16(acc, lo_cur[u].x, hi_cur[u].x, lo_cur[u].y, hi_cur[u].y, w_cur[u].x, w_cur[u].y);
        MmaBf16(acc, lo_cur[u].z, hi_cur[u].z, lo_cur[u].w, hi_cur[u].w, w_cur[u].z, w_cur[u].w);
      }
    }
    // C fragment: acc[0..1] row g, columns 2q, 2q + 1; acc[2..3] row g + 8, the same columns.
    for (int i = 0; i < 4; ++i) {
      const int r = g + (i >= 2 ? 8 : 0), col = col0 + 2 * q + (i & 1);
      if (r < rows && col < m) c[static_cast<int64_t>(row0 + r) * ldc + col] = __float2bfloat16(acc[i]);
    }
  } else {
    for (int i = lane; i < kMoeTileRows * kTileWarpCols; i += 32) {
      const int r = i / kTileWarpCols, col = col0 + i % kTileWarpCols;
      if (r >= rows || col >= m) continue;
      const __nv_bfloat16* wr = w + static_cast<int64_t>(col) * k;
      const __nv_bfloat16* br = brow + r * ldb;
      float acc = 0.f;
      for (int kk = 0; kk < k; ++kk) acc = fmaf(__bfloat162float(br[kk]), __bfloat162float(wr[kk]), acc);
      c[static_cast<int64_t>(row0 + r) * ldc + col] = __float2bfloat16(acc);
    }
  }
}

// Tiles of the device schedule for n = num_tokens · top_k pairs over E experts: each active expert has
// ceil(count / kMoeTileRows) <= count / kMoeTileRows + 1 of them, and at most min(E, n) experts are active.
int64_t MaxTiles(int64_t n, int num_experts) { return n / kMoeTileRows + std::min<int64_t>(num_experts, n) + 1; }

// ---- signature counts ----

__global__ void SignatureCountKernel(const int32_t* __restrict__ ids, int num_tokens, int top_k, int block_size,
                                     int num_experts, int num_blocks, int8_t* __restrict__ rows, int64_t row_stride) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<int64_t>(num_blocks) * num_experts) return;
  const int b = static_cast<int>(idx / num_experts), e = static_cast<int>(idx % num_experts);
  const int t_end = min(num_tokens, (b + 1) * block_size);
  int count = 0;
  for (int t = b * block_size; t < t_end; ++t) {
    for (int j = 0; j < top_k; ++j) count += ids[static_cast<int64_t>(t) * top_k + j] == e;
  }
  if (count > 0) {
    int8_t* entry = rows + b * row_stride + e;
    *entry = static_cast<int8_t>(static_cast<int>(*entry) + count);  // wraps as the CPU's ++ on int8
  }
}

}  // namespace

void GateTopK(const GateTopKParams& p, cudaStream_t stream) {
  ELDR_CHECK(p.num_experts >= 1 && p.num_experts <= kMaxGateExperts,
             "GateTopK: num_experts " << p.num_experts << " outside [1, " << kMaxGateExperts << "]");
  ELDR_CHECK(p.top_k >= 1 && p.top_k <= p.num_experts, "top_k " << p.top_k << " out of range");
  if (p.num_tokens <= 0) return;
  const size_t shared = sizeof(float) * p.num_experts + sizeof(int) * (p.num_experts + p.top_k);
  GateTopKKernel<<<p.num_tokens, kGateThreads, shared, stream>>>(p.logits, p.num_experts, p.top_k, p.renormalize,
                                                                 p.topk_ids, p.topk_weights);
  ELDR_CUDA_CHECK_LAUNCH();
}

void GroupByExpert(const GroupByExpertParams& p, cudaStream_t stream) {
  ELDR_CHECK(p.num_tokens >= 0 && p.top_k >= 1 && p.num_experts >= 1, "bad GroupByExpert shape");
  LaunchGroupByExpert(p.topk_ids, p.num_tokens, p.top_k, p.num_experts, p.offsets, p.pairs, p.pair_rows, stream);
}

void Permute(const PermuteParams& p, cudaStream_t stream) {
  ELDR_CHECK(p.num_pairs >= 0 && p.top_k >= 1 && p.hidden > 0, "bad Permute shape");
  if (p.num_pairs == 0) return;
  const int64_t stride = p.x_permuted_stride == 0 ? p.hidden : p.x_permuted_stride;
  ELDR_CHECK(stride >= p.hidden, "x_permuted_stride " << stride << " < hidden " << p.hidden);
  PermuteKernel<<<p.num_pairs, kThreads, 0, stream>>>(p.x, p.pairs, p.top_k, p.hidden, AsBf16(p.x_permuted), stride);
  ELDR_CUDA_CHECK_LAUNCH();
}

void Combine(const CombineParams& p, cudaStream_t stream) {
  ELDR_CHECK(p.num_tokens >= 0 && p.top_k >= 1 && p.hidden > 0, "bad Combine shape");
  if (p.num_tokens == 0) return;
  const int64_t stride = p.y_permuted_stride == 0 ? p.hidden : p.y_permuted_stride;
  ELDR_CHECK(stride >= p.hidden, "y_permuted_stride " << stride << " < hidden " << p.hidden);
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(CeilDiv(p.hidden, kThreads)));
  CombineKernel<<<grid, kThreads, 0, stream>>>(AsBf16(p.y_permuted), stride, p.pair_rows, p.topk_weights, p.top_k,
                                               p.hidden, p.out);
  ELDR_CUDA_CHECK_LAUNCH();
}

namespace {

// MoeExperts's scratch. Rows padded to 8 bf16 (16 bytes): every per-expert slice starts 16-byte aligned, as
// grouped cuBLAS needs.
struct MoeLayout {
  MoeLayout(int T, int K, int E, int H, int I) : hs(RoundUp(H, 8)), is(RoundUp(I, 8)) {
    const int64_t n = static_cast<int64_t>(T) * K;
    o_offsets = layout.Add(sizeof(int32_t) * (E + 1));
    o_pairs = layout.Add(sizeof(int32_t) * n);
    o_rows = layout.Add(sizeof(int32_t) * n);
    o_xp = layout.Add(sizeof(Bf16) * n * hs);
    o_g = layout.Add(sizeof(Bf16) * n * is);
    o_u = layout.Add(sizeof(Bf16) * n * is);
    o_h = layout.Add(sizeof(Bf16) * n * is);
    o_y = layout.Add(sizeof(Bf16) * n * hs);
    o_weights = layout.Add(sizeof(void*) * 3 * E);
    o_gate_up = layout.Add(sizeof(void*) * 3 * 2 * E);
    o_down = layout.Add(sizeof(void*) * 3 * E);
    const int64_t tiles = MaxTiles(n, E);
    o_tile_expert = layout.Add(sizeof(int32_t) * tiles);
    o_tile_row = layout.Add(sizeof(int32_t) * tiles);
    o_num_tiles = layout.Add(sizeof(int32_t));
  }
  int64_t hs, is;
  ScratchLayout layout;
  size_t o_offsets, o_pairs, o_rows, o_xp, o_g, o_u, o_h, o_y, o_weights, o_gate_up, o_down, o_tile_expert, o_tile_row,
      o_num_tiles;
};

// [3, num_experts]: gate, then up, then down pointers.
std::vector<const void*> HostTable(const ExpertWeights& w) {
  std::vector<const void*> table(3 * static_cast<size_t>(w.num_experts));
  for (int e = 0; e < w.num_experts; ++e) {
    table[e] = w.gate_proj[e];
    table[w.num_experts + e] = w.up_proj[e];
    table[2 * w.num_experts + e] = w.down_proj[e];
  }
  return table;
}

}  // namespace

namespace {

// The device schedule of MoeExperts (cuda_ops.h): nothing here waits for the host.
void MoeExpertsOnDevice(const MoeParams& p, const MoeLayout& m, void* base, bool bf16_mma, cudaStream_t stream) {
  const ExpertWeights& w = *p.experts;
  const int T = p.num_tokens, K = p.top_k, E = w.num_experts, H = w.hidden, I = w.intermediate, n = T * K;
  int32_t* d_offsets = ScratchLayout::Get<int32_t>(base, m.o_offsets);
  int32_t* d_pairs = ScratchLayout::Get<int32_t>(base, m.o_pairs);
  int32_t* d_rows = ScratchLayout::Get<int32_t>(base, m.o_rows);
  Bf16* xp = ScratchLayout::Get<Bf16>(base, m.o_xp);
  Bf16* g = ScratchLayout::Get<Bf16>(base, m.o_g);
  Bf16* u = ScratchLayout::Get<Bf16>(base, m.o_u);
  Bf16* h = ScratchLayout::Get<Bf16>(base, m.o_h);
  Bf16* y = ScratchLayout::Get<Bf16>(base, m.o_y);
  const void** d_weights = ScratchLayout::Get<const void*>(base, m.o_weights);
  int32_t* tile_expert = ScratchLayout::Get<int32_t>(base, m.o_tile_expert);
  int32_t* tile_row = ScratchLayout::Get<int32_t>(base, m.o_tile_row);
  int32_t* num_tiles = ScratchLayout::Get<int32_t>(base, m.o_num_tiles);

  // Pairs an invalid id leaves unassigned stay -1: Permute and Combine skip them.
  ELDR_CUDA_CHECK(cudaMemsetAsync(d_pairs, 0xFF, sizeof(int32_t) * n, stream));
  ELDR_CUDA_CHECK(cudaMemsetAsync(d_rows, 0xFF, sizeof(int32_t) * n, stream));
  LaunchGroupByExpert(p.topk_ids, T, K, E, d_offsets, d_pairs, d_rows, stream);
  const void* const* table = w.device_table;
  if (table == nullptr) {  // no resident table: this call's, from pageable memory (staged before the call returns)
    const std::vector<const void*> host = HostTable(w);
    ELDR_CUDA_CHECK(
        cudaMemcpyAsync(d_weights, host.data(), sizeof(void*) * host.size(), cudaMemcpyHostToDevice, stream));
    table = d_weights;
  }
  BuildTilesKernel<<<1, kScanThreads, 0, stream>>>(d_offsets, E, n, tile_expert, tile_row, num_tiles, p.error);
  ELDR_CUDA_CHECK_LAUNCH();
  Permute({p.x, d_pairs, n, K, H, xp, m.hs}, stream);

  const unsigned tiles = static_cast<unsigned>(MaxTiles(n, E));
  // The MMA path needs bf16 MMA (compute capability 8.0), k and the activation strides (hs, is: multiples of 8)
  // in whole 16-byte vectors and every weight matrix 16-byte aligned (cudaMalloc'd tensors at 8-element offsets).
  bool mma = bf16_mma;
  for (const std::vector<const Bf16*>* proj : {&w.gate_proj, &w.up_proj, &w.down_proj}) {
    for (const Bf16* ptr : *proj) mma = mma && reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
  }
  const auto gemm = [&](int which, int out_cols, int k, const Bf16* in, int64_t ld_in, Bf16* out, int64_t ld_out) {
    const dim3 grid(tiles, static_cast<unsigned>(CeilDiv(out_cols, kTileCols)));
    const auto* b = AsBf16(in);
    auto* c = AsBf16(out);
    if (mma && k % 8 == 0) {
      ExpertTileGemmKernel<true><<<grid, kTileWarps * 32, 0, stream>>>(
          tile_expert, tile_row, num_tiles, d_offsets, table, which, E, out_cols, k, b, ld_in, c, ld_out, p.error);
    } else {
      ExpertTileGemmKernel<false><<<grid, kTileWarps * 32, 0, stream>>>(
          tile_expert, tile_row, num_tiles, d_offsets, table, which, E, out_cols, k, b, ld_in, c, ld_out, p.error);
    }
    ELDR_CUDA_CHECK_LAUNCH();
  };
  gemm(0, I, H, xp, m.hs, g, m.is);  // gate
  gemm(1, I, H, xp, m.hs, u, m.is);  // up
  LaunchSwiGlu(g, u, h, n, I, m.is, stream);
  gemm(2, H, I, h, m.is, y, m.hs);  // down
  Combine({y, m.hs, d_rows, p.topk_weights, T, K, H, p.out}, stream);
}

}  // namespace

size_t MoeScratchBytes(int num_tokens, int top_k, int num_experts, int hidden, int intermediate) {
  return MoeLayout(num_tokens, top_k, num_experts, hidden, intermediate).layout.total();
}

void UploadExpertTable(const ExpertWeights& w, const void** device_table, cudaStream_t stream) {
  const std::vector<const void*> table = HostTable(w);
  ELDR_CUDA_CHECK(
      cudaMemcpyAsync(device_table, table.data(), sizeof(void*) * table.size(), cudaMemcpyHostToDevice, stream));
  ELDR_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void MoeExperts(Context& ctx, const MoeParams& p, cudaStream_t stream) {
  ELDR_CHECK(p.experts != nullptr, "MoeExperts without expert weights");
  const ExpertWeights& w = *p.experts;
  const int T = p.num_tokens, K = p.top_k, E = w.num_experts, H = w.hidden, I = w.intermediate;
  ELDR_CHECK(T >= 0 && K >= 1 && E >= 1 && H > 0 && I > 0, "bad MoE shape: tokens " << T << ", top_k " << K
                                                                                    << ", experts " << E << ", hidden "
                                                                                    << H << ", intermediate " << I);
  ELDR_CHECK(static_cast<int>(w.gate_proj.size()) == E && static_cast<int>(w.up_proj.size()) == E &&
                 static_cast<int>(w.down_proj.size()) == E,
             "expert weight tables must have num_experts = " << E << " entries");
  const int n = T * K;
  if (n == 0) return;
  Context::Impl& impl = ctx.impl();
  const bool grouped = impl.grouped_gemm;

  const MoeLayout m(T, K, E, H, I);
  const int64_t hs = m.hs, is = m.is;
  const size_t o_offsets = m.o_offsets, o_pairs = m.o_pairs, o_rows = m.o_rows, o_xp = m.o_xp, o_g = m.o_g, o_u = m.o_u,
               o_h = m.o_h, o_y = m.o_y, o_weights = m.o_weights, o_gate_up = m.o_gate_up, o_down = m.o_down;
  void* base = impl.Scratch(m.layout.total(), stream);
  int32_t* d_offsets = ScratchLayout::Get<int32_t>(base, o_offsets);
  int32_t* d_pairs = ScratchLayout::Get<int32_t>(base, o_pairs);
  int32_t* d_rows = ScratchLayout::Get<int32_t>(base, o_rows);
  Bf16* xp = ScratchLayout::Get<Bf16>(base, o_xp);
  Bf16* g = ScratchLayout::Get<Bf16>(base, o_g);
  Bf16* u = ScratchLayout::Get<Bf16>(base, o_u);
  Bf16* h = ScratchLayout::Get<Bf16>(base, o_h);
  Bf16* y = ScratchLayout::Get<Bf16>(base, o_y);
  const void** d_weights = ScratchLayout::Get<const void*>(base, o_weights);
  void** d_gate_up = ScratchLayout::Get<void*>(base, o_gate_up);
  void** d_down = ScratchLayout::Get<void*>(base, o_down);

  if (impl.device_schedule && p.error != nullptr) {
    MoeExpertsOnDevice(p, m, base, impl.bf16_mma, stream);
    return;
  }
  LaunchGroupByExpert(p.topk_ids, T, K, E, d_offsets, d_pairs, d_rows, stream);
  if (grouped) {
    const void* const* table_on_device = w.device_table;
    if (table_on_device == nullptr) {  // no resident table: copy this call's from pageable memory
      std::vector<const void*> table = HostTable(w);
      // From pageable memory: staged before the call returns, so `table` may go out of scope.
      ELDR_CUDA_CHECK(
          cudaMemcpyAsync(d_weights, table.data(), sizeof(void*) * table.size(), cudaMemcpyHostToDevice, stream));
      table_on_device = d_weights;
    }
    BuildGemmPointersKernel<<<1, 32, 0, stream>>>(d_offsets, E, table_on_device, AsBf16(xp), AsBf16(g), AsBf16(u),
                                                  AsBf16(h), AsBf16(y), hs, is, d_gate_up, d_down);
    ELDR_CUDA_CHECK_LAUNCH();
  }

  // The one synchronisation: the per-expert counts size the GEMMs.
  std::vector<int32_t> offsets(E + 1);
  ELDR_CUDA_CHECK(
      cudaMemcpyAsync(offsets.data(), d_offsets, sizeof(int32_t) * (E + 1), cudaMemcpyDeviceToHost, stream));
  ELDR_CUDA_CHECK(cudaStreamSynchronize(stream));
  ELDR_CHECK(offsets[E] == n,
             "MoeExperts: " << n - offsets[E] << " of " << n << " expert ids outside [0, " << E << ")");
  // Only now is every entry of pairs and pair_rows written (an invalid id leaves holes), so only now gather.
  Permute({p.x, d_pairs, n, K, H, xp, hs}, stream);

  std::vector<ExpertGemm> gate_up, down;
  for (int e = 0; e < E; ++e) {
    const int begin = offsets[e], count = offsets[e + 1] - begin;
    if (count == 0) continue;
    ELDR_CHECK(w.gate_proj[e] != nullptr && w.up_proj[e] != nullptr && w.down_proj[e] != nullptr,
               "expert " << e << " receives " << count << " tokens but has no weights on this device");
    gate_up.push_back({w.gate_proj[e], xp + begin * hs, g + begin * is, count});
    gate_up.push_back({w.up_proj[e], xp + begin * hs, u + begin * is, count});
    down.push_back({w.down_proj[e], h + begin * is, y + begin * hs, count});
  }

  ELDR_CUBLAS_CHECK(cublasSetStream(impl.cublas, stream));
  RunExpertGemms(impl, gate_up, I, H, H, static_cast<int>(hs), static_cast<int>(is), d_gate_up, 2 * E);
  LaunchSwiGlu(g, u, h, n, I, is, stream);
  RunExpertGemms(impl, down, H, I, I, static_cast<int>(is), static_cast<int>(hs), d_down, E);
  Combine({y, hs, d_rows, p.topk_weights, T, K, H, p.out}, stream);
}

void AccumulateSignatureCounts(const SignatureCountParams& p, cudaStream_t stream) {
  ELDR_CHECK(p.num_tokens >= 0 && p.top_k >= 1 && p.block_size >= 1 && p.num_experts >= 1, "bad signature-count shape");
  ELDR_CHECK(p.row_stride >= p.num_experts, "row_stride " << p.row_stride << " < num_experts " << p.num_experts);
  if (p.num_tokens == 0) return;
  const int num_blocks = static_cast<int>(CeilDiv(p.num_tokens, p.block_size));
  const int64_t threads = static_cast<int64_t>(num_blocks) * p.num_experts;
  SignatureCountKernel<<<static_cast<unsigned>(CeilDiv(threads, kThreads)), kThreads, 0, stream>>>(
      p.topk_ids, p.num_tokens, p.top_k, p.block_size, p.num_experts, num_blocks, p.rows, p.row_stride);
  ELDR_CUDA_CHECK_LAUNCH();
}

}  // namespace eldr::kernels::cuda
