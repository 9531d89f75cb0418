// CUDA backend of the compute operations (DESIGN.md §4 kernels/, §6 backends): the launchers of
// kernels/ops.h on device memory, in bf16, each taking a params struct and a stream (DeepEP style). The CPU
// implementation (kernels/cpu) is the oracle: tests/gpu/cuda_ops_test.cc compares every launcher here with it
// at a stated per-operation tolerance.
//
// Precision: weights and the paged KV cache are stored in bf16; activations at the launcher boundaries are
// fp32 (the residual stream keeps full precision, and in decode they are a negligible share of the memory
// traffic); GEMM inputs are rounded to bf16 (round to nearest even, as kernels::FloatToBf16) and accumulate
// in fp32 (cuBLAS, CUBLAS_COMPUTE_32F); reductions (norms, softmax, attention) run in fp32.
//
// Every pointer in a params struct is device memory unless its comment says "host"; every pointer carries
// its shape. Launchers are asynchronous on `stream` unless their comment says otherwise; they throw
// eldr::Error (ELDR_CHECK, ELDR_CUDA_CHECK) on invalid shapes and on CUDA or cuBLAS failures.
//
// This header needs no CUDA header: cudaStream_t is declared here as the runtime declares it. The library is
// built only when ELDR_HAVE_CUDA (its targets see the definition ELDR_HAVE_CUDA=1); code that must also
// build without CUDA asks kernels/backend.h (CudaBackendStatus, CreateBackend) first.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace eldr::kernels::cuda {

// bf16 bits in device memory (__nv_bfloat16 on the device; kernels::FloatToBf16 / Bf16ToFloat on the host).
using Bf16 = uint16_t;

// Number of usable CUDA devices; 0 when there is none or no driver. Never throws.
int DeviceCount();

// Per-device state of the launchers that need more than a stream: a cuBLAS handle and a growable scratch
// buffer. Create it on the thread that uses it, for the device it will run on (the constructor makes that
// device current). Thread safety: none; use one context with one stream at a time (launchers reuse the
// scratch buffer in stream order).
class Context {
 public:
  // `device`: the CUDA device this context runs on, chosen by the caller (serve: the worker's device of its
  // compute plan, runtime/serve/compute_plan.h), never a default: a context on the wrong device would
  // disagree with the KV transport's.
  explicit Context(int device);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const;
  // MoeExperts runs its expert GEMMs as one cublasGemmGroupedBatchedEx call per projection when the cuBLAS
  // library has it (12.5 and later) and this is on (default), else as one cublasGemmEx per active expert.
  // Both give the same results up to fp32 summation order; the switch exists to test and compare them. If
  // cuBLAS answers CUBLAS_STATUS_NOT_SUPPORTED to the grouped call, the context turns it off (grouped_gemm()
  // then reads false) and says so once on stderr.
  static bool GroupedGemmAvailable();
  void set_grouped_gemm(bool on);
  bool grouped_gemm() const;
  // MoeExperts with an error word (MoeParams::error) schedules its expert GEMMs on the device when this is on
  // (default): no host synchronisation, the tiles of each active expert found from the device's counts (see
  // MoeExperts). Off, or without an error word: the cuBLAS path above, which reads the counts on the host.
  void set_device_schedule(bool on);
  bool device_schedule() const;

  // Allocates the scratch buffer now, for calls needing up to `bytes` (the *ScratchBytes functions below at the
  // largest batch): those never allocate or free later (growing frees the old buffer, and cudaFree synchronises
  // the whole device). A larger call still grows it.
  void Reserve(size_t bytes, cudaStream_t stream);
  size_t scratch_bytes() const;
  int64_t scratch_grows() const;  // allocations of the scratch buffer so far (Reserve's included)

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// y[i] = bf16(x[i]), round to nearest even (bit-identical to kernels::FloatToBf16 for non-NaN inputs).
void ConvertToBf16(const float* x /* [n] */, Bf16* y /* [n] */, int64_t n, cudaStream_t stream);

// y[i] = scale * u_i with u_i uniform in [-1, 1), a fixed function of (seed, i): seeded synthetic weights
// generated on the device.
void FillUniformBf16(Bf16* y /* [n] */, int64_t n, float scale, uint64_t seed, cudaStream_t stream);

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight.
struct RmsNormParams {
  const float* x = nullptr;       // [num_tokens, hidden]
  const float* weight = nullptr;  // [hidden]
  float* out = nullptr;           // [num_tokens, hidden]; may alias x
  int num_tokens = 0, hidden = 0;
  float eps = 1e-6f;
};
void RmsNorm(const RmsNormParams& p, cudaStream_t stream);

// Rotary embedding, rotate-half convention (as kernels::ApplyRope), in place. Angles in double precision, so
// long positions keep their accuracy.
struct RopeParams {
  float* q = nullptr;                                                   // [num_tokens, num_q_heads, head_dim]
  float* k = nullptr;                                                   // [num_tokens, num_kv_heads, head_dim]
  const int32_t* positions = nullptr;                                   // [num_tokens]
  int num_tokens = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;  // REQUIRES: head_dim even
  float theta = 10000.f;
};
void ApplyRope(const RopeParams& p, cudaStream_t stream);

// y = bf16(x) W^T for a bf16 weight W [out_features, in_features]; fp32 output.
struct LinearParams {
  const float* x = nullptr;      // [num_tokens, in_features]
  const Bf16* weight = nullptr;  // [out_features, in_features]
  float* y = nullptr;            // [num_tokens, out_features]
  int num_tokens = 0, in_features = 0, out_features = 0;
};
void Linear(Context& ctx, const LinearParams& p, cudaStream_t stream);

// Router: softmax over the experts, top-k by probability (ties: lower expert id), descending; optionally
// renormalised so the k weights sum to 1. The selection compares the logits themselves (softmax is monotonic),
// so the ids equal the CPU's exactly; weights are fp32.
struct GateTopKParams {
  const float* logits = nullptr;                   // [num_tokens, num_experts]
  int num_tokens = 0, num_experts = 0, top_k = 0;  // REQUIRES: 1 <= top_k <= num_experts <= 2048
  bool renormalize = true;
  int32_t* topk_ids = nullptr;    // [num_tokens, top_k]
  float* topk_weights = nullptr;  // [num_tokens, top_k]
};
void GateTopK(const GateTopKParams& p, cudaStream_t stream);

// Token → expert grouping (the permute plan), identical to kernels::GroupByExpert: the pairs t * top_k + j
// sorted by expert, stably (ascending pair index within an expert). Expert e is active when
// offsets[e + 1] > offsets[e]. Ids outside [0, num_experts) are left out (offsets[num_experts] then falls
// short of num_tokens * top_k; MoeExperts checks this).
struct GroupByExpertParams {
  const int32_t* topk_ids = nullptr;  // [num_tokens, top_k]
  int num_tokens = 0, top_k = 0, num_experts = 0;
  int32_t* offsets = nullptr;    // [num_experts + 1]: expert e's pairs are pairs[offsets[e], offsets[e + 1])
  int32_t* pairs = nullptr;      // [num_tokens * top_k]: pair index t * top_k + j, grouped by expert
  int32_t* pair_rows = nullptr;  // [num_tokens * top_k] or null: the inverse, pairs[pair_rows[i]] == i
};
void GroupByExpert(const GroupByExpertParams& p, cudaStream_t stream);

// The gather of the permute step: x_permuted[r] = bf16(x[pairs[r] / top_k]).
struct PermuteParams {
  const float* x = nullptr;        // [num_tokens, hidden]
  const int32_t* pairs = nullptr;  // [num_pairs]
  int num_pairs = 0, top_k = 0, hidden = 0;
  Bf16* x_permuted = nullptr;     // [num_pairs, x_permuted_stride]
  int64_t x_permuted_stride = 0;  // elements between rows; 0 means hidden
};
void Permute(const PermuteParams& p, cudaStream_t stream);

// The weighted combine: out[t] += Σ_j topk_weights[t, j] · y_permuted[pair_rows[t * top_k + j]], summed in
// fp32 in the order j = 0 .. top_k - 1 (deterministic).
struct CombineParams {
  const Bf16* y_permuted = nullptr;     // [num_tokens * top_k, y_permuted_stride]
  int64_t y_permuted_stride = 0;        // elements between rows; 0 means hidden
  const int32_t* pair_rows = nullptr;   // [num_tokens * top_k]
  const float* topk_weights = nullptr;  // [num_tokens, top_k]
  int num_tokens = 0, top_k = 0, hidden = 0;
  float* out = nullptr;  // [num_tokens, hidden], accumulated into
};
void Combine(const CombineParams& p, cudaStream_t stream);

// The routed experts of one MoE layer: SwiGLU expert e(x) = down_e(silu(gate_e x) * up_e x). Host vectors
// of device pointers, so experts may live anywhere (one packed tensor, one allocation each); a null pointer
// marks an expert that is not resident, which must then receive no token. REQUIRES: every pointer 16-byte
// aligned (cudaMalloc'd, or slices of a packed [num_experts, rows, cols] tensor whose rows * cols is a
// multiple of 8), as the grouped cuBLAS call needs.
struct ExpertWeights {
  std::vector<const Bf16*> gate_proj;  // [num_experts] of [intermediate, hidden]
  std::vector<const Bf16*> up_proj;    // [num_experts] of [intermediate, hidden]
  std::vector<const Bf16*> down_proj;  // [num_experts] of [hidden, intermediate]
  int num_experts = 0, hidden = 0, intermediate = 0;
  // Optional, device memory [3, num_experts]: the same pointers (gate, then up, then down), resident for the
  // weights' lifetime (UploadExpertTable). When set, MoeExperts's grouped path reads it in place instead of
  // copying the table from pageable host memory on every call.
  const void* const* device_table = nullptr;
};

// Scratch bytes one call of each launcher needs at these shapes (the layouts the launchers themselves use).
size_t LinearScratchBytes(int num_tokens, int in_features);
size_t MlpScratchBytes(int num_tokens, int hidden, int intermediate);
size_t MoeScratchBytes(int num_tokens, int top_k, int num_experts, int hidden, int intermediate);

// Uploads w's pointer table to `device_table` (device memory of 3 * num_experts pointers) and waits for the
// copy, so that `w.device_table = device_table` may be set and the host table freed. Done once per weights.
void UploadExpertTable(const ExpertWeights& w, const void** device_table, cudaStream_t stream);

// out[t] += Σ_j topk_weights[t, j] · expert_{topk_ids[t, j]}(x[t]); only activated experts are computed:
// GroupByExpert, Permute, per-expert GEMMs (gate and up), SwiGLU, per-expert GEMM (down), Combine. The
// intermediate activations (gate, up, SwiGLU output, expert output) are bf16.
// Two ways to run the expert GEMMs:
//  - device schedule (Context::device_schedule() and an `error` word; the default of the CUDA backend): a
//    one-block kernel turns the device's per-expert offsets into tiles of kMoeTileRows consecutive rows of one
//    expert, and a bf16 GEMM kernel written for decode runs them (tensor-core MMAs, fp32 accumulation; a block
//    per tile and 64 output columns, a warp per 16 rows × 8 columns streaming the weights in 16-byte loads;
//    devices without bf16 MMA, or unaligned shapes, take a plain fp32 loop instead); the grid is sized for the most
//    tiles possible (num_tokens·top_k / kMoeTileRows + min(E, num_tokens·top_k)) and the blocks past the device's tile
//    count return at once. Nothing waits for the host, so a layer can be captured in a CUDA graph. Each weight matrix
//    of an active expert is read once per tile of its rows (once per expert at decode batches of up to kMoeTileRows
//    tokens per expert), so a prefill-sized call (hundreds of rows per expert) reads each expert's weights many times:
//    the host schedule's cuBLAS GEMMs suit it better. An id outside [0, num_experts) or an active expert without
//    weights sets kErrorExpert in `error` (its pairs contribute nothing), reported at the caller's next
//    synchronisation.
//  - host schedule (otherwise): synchronises `stream` once, to read the per-expert token counts that size the
//    cuBLAS GEMMs (so it cannot be captured in a CUDA graph); throws eldr::Error when an id is outside
//    [0, num_experts) or an active expert has no weights.
struct MoeParams {
  const float* x = nullptr;             // [num_tokens, hidden]
  const int32_t* topk_ids = nullptr;    // [num_tokens, top_k]
  const float* topk_weights = nullptr;  // [num_tokens, top_k]
  int num_tokens = 0, top_k = 0;
  const ExpertWeights* experts = nullptr;  // host
  float* out = nullptr;                    // [num_tokens, hidden], accumulated into
  int* error = nullptr;                    // device-visible DeviceError word; null: the host schedule
};
inline constexpr int kMoeTileRows = 16;  // rows (token-expert pairs of one expert) per tile of the device schedule
void MoeExperts(Context& ctx, const MoeParams& p, cudaStream_t stream);

// One dense SwiGLU MLP (dense layers, shared experts): out[t] += down(silu(gate x) * up x), with bf16 gate
// and up outputs and an fp32 down projection accumulated into out.
struct MlpParams {
  const float* x = nullptr;         // [num_tokens, hidden]
  const Bf16* gate_proj = nullptr;  // [intermediate, hidden]
  const Bf16* up_proj = nullptr;    // [intermediate, hidden]
  const Bf16* down_proj = nullptr;  // [hidden, intermediate]
  int num_tokens = 0, hidden = 0, intermediate = 0;
  float* out = nullptr;  // [num_tokens, hidden], accumulated into
};
void Mlp(Context& ctx, const MlpParams& p, cudaStream_t stream);

// Paged KV cache of one layer in bf16: K and V [num_blocks, block_size, num_kv_heads, head_dim] (the layout
// of kernels::PagedKv).
struct PagedKv {
  Bf16* k = nullptr;
  Bf16* v = nullptr;
  int num_blocks = 0, block_size = 0, num_kv_heads = 0, head_dim = 0;
};

// Writes bf16(k), bf16(v) of tokens at `positions` of one sequence into its blocks. REQUIRES: positions
// distinct, and every block they reach in [0, num_blocks) (a slot outside is skipped, not written).
struct KvWriteParams {
  PagedKv cache;
  const int32_t* block_table = nullptr;  // [num_table_blocks] the sequence's blocks
  const int32_t* positions = nullptr;    // [num_tokens]
  const float* k = nullptr;              // [num_tokens, num_kv_heads, head_dim]
  const float* v = nullptr;              // [num_tokens, num_kv_heads, head_dim]
  int num_tokens = 0;
};
void WriteKv(const KvWriteParams& p, cudaStream_t stream);

// Decode attention: one query token per sequence over its whole context in the paged cache (GQA: query
// head h reads KV head h / (num_q_heads / num_kv_heads)). One block per (sequence, query head), online
// softmax in fp32. REQUIRES: head_dim <= 256, num_q_heads a multiple of num_kv_heads.
struct PagedAttentionDecodeParams {
  const float* q = nullptr;  // [num_seqs, num_q_heads, head_dim]
  PagedKv cache;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  const int32_t* context_lens = nullptr;  // [num_seqs] tokens in the cache, the new one included
  int num_seqs = 0, num_q_heads = 0, max_blocks_per_seq = 0;
  float scale = 1.f;
  float* out = nullptr;  // [num_seqs, num_q_heads, head_dim]
};
void PagedAttentionDecode(const PagedAttentionDecodeParams& p, cudaStream_t stream);

// Prefill attention of one sequence: queries at positions [start, start + num_tokens) attend causally to
// the cached context [0, position] (the new tokens' K/V already written). Same kernel and requirements as
// PagedAttentionDecode.
struct PrefillAttentionParams {
  const float* q = nullptr;  // [num_tokens, num_q_heads, head_dim]
  PagedKv cache;
  const int32_t* block_table = nullptr;  // [num_table_blocks]
  int start = 0, num_tokens = 0, num_q_heads = 0;
  float scale = 1.f;
  float* out = nullptr;  // [num_tokens, num_q_heads, head_dim]
};
void PrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream);

// Signature-cache rows (DESIGN.md §3): row[b][e] += #tokens of block b routed to e, for the blocks
// b = t / block_size of tokens [0, num_tokens) of one layer. One thread per (block, expert) owns its entry,
// so there are no atomics and the result is exact. Ids outside [0, num_experts) are not counted.
struct SignatureCountParams {
  const int32_t* topk_ids = nullptr;  // [num_tokens, top_k] of one layer
  int num_tokens = 0, top_k = 0, block_size = 0, num_experts = 0;
  // rows + i * row_stride is the [num_experts] row of this layer for the block holding tokens
  // [i * block_size, (i + 1) * block_size); entries are incremented (zero them first).
  int8_t* rows = nullptr;
  int64_t row_stride = 0;
};
void AccumulateSignatureCounts(const SignatureCountParams& p, cudaStream_t stream);

// ---- plumbing and slot-mapped KV (sampling_kv.cu) ----
// Device errors: a range check the CPU does by throwing (an out-of-range token id, a KV slot outside the cache)
// cannot throw inside a kernel. These launchers take `error`, a device-visible int (null: not reported): a
// kernel that finds a bad id skips that element and ORs its bit in; the caller reads the word after
// synchronising and throws (the CUDA backend does so in SynchronizeStream / SynchronizeEvent).
enum DeviceError : int { kErrorToken = 1, kErrorSlot = 2, kErrorExpert = 4 };

// out[t] = fp32(table[tokens[t]]); an id outside [0, rows) gives a zero row and kErrorToken.
struct EmbeddingGatherParams {
  const Bf16* table = nullptr;  // [rows, cols]
  int64_t rows = 0, cols = 0;
  const int32_t* tokens = nullptr;  // [num_tokens]
  int num_tokens = 0;
  float* out = nullptr;  // [num_tokens, cols]
  int* error = nullptr;
};
void EmbeddingGather(const EmbeddingGatherParams& p, cudaStream_t stream);

// out[i] += x[i].
struct ResidualAddParams {
  const float* x = nullptr;  // [n]
  float* out = nullptr;      // [n]
  int64_t n = 0;
};
void ResidualAdd(const ResidualAddParams& p, cudaStream_t stream);

// out[r] = std::max_element's index over x[r, :], exactly as the CPU (kernels/ops.h ArgMax): 0 when x[r, 0] is
// NaN, else the first index of the largest non-NaN value (a later NaN is never chosen).
struct ArgMaxParams {
  const float* x = nullptr;  // [num_rows, num_cols]
  int num_rows = 0, num_cols = 0;
  int32_t* out = nullptr;  // [num_rows]
};
void ArgMax(const ArgMaxParams& p, cudaStream_t stream);

// out[t] += Σ_j topk_weights[t, j] · y[t * top_k + j], j ascending, in fp32 (the CPU's order: bit-equal sums).
struct MoeCombineParams {
  const float* y = nullptr;             // [num_tokens * top_k, hidden]
  const float* topk_weights = nullptr;  // [num_tokens, top_k]
  int num_tokens = 0, top_k = 0, hidden = 0;
  float* out = nullptr;  // [num_tokens, hidden]
};
void MoeCombine(const MoeCombineParams& p, cudaStream_t stream);

// bf16(k), bf16(v) of each token into cache slot slots[t] (slot = block * block_size + position % block_size);
// a slot outside [0, num_blocks * block_size) is not written and sets kErrorSlot.
struct KvSlotWriteParams {
  PagedKv cache;
  const int64_t* slots = nullptr;  // [num_tokens]
  const float* k = nullptr;        // [num_tokens, num_kv_heads, head_dim]
  const float* v = nullptr;        // [num_tokens, num_kv_heads, head_dim]
  int num_tokens = 0;
  int* error = nullptr;
};
void WriteKvSlots(const KvSlotWriteParams& p, cudaStream_t stream);

// KV transfer of one layer: packed [2 (K, V), num_tokens, num_kv_heads, head_dim] bf16 ← the cache rows of `slots`
// (unpack false), or → them (unpack true). A slot outside the cache is skipped and sets kErrorSlot.
struct KvPackParams {
  PagedKv cache;
  const int64_t* slots = nullptr;  // [num_tokens]
  int num_tokens = 0;
  Bf16* packed = nullptr;  // [2, num_tokens, num_kv_heads, head_dim]
  bool unpack = false;
  int* error = nullptr;
};
void PackKv(const KvPackParams& p, cudaStream_t stream);

}  // namespace eldr::kernels::cuda
