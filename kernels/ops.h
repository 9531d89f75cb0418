// Compute operations of the MoE executor (DESIGN.md §4 kernels/, §6 backends). Each operation is a host
// launcher taking a params struct, in the style of DeepEP: the CPU implementation (kernels/cpu, Eigen,
// multithreaded) is the reference every accelerated backend is compared against; kernels/cuda implements
// the same launchers in bf16 on a CUDA stream (kernels/cuda/cuda_ops.h).
//
// The params structs are also those of the compute-backend interface (kernels/backend.h), which the runtime
// calls: through a Backend their pointers are that backend's memory. The free functions here are the CPU
// kernels behind the CPU backend; call them directly only in tests and benchmarks of the kernels.
//
// Tensors are dense, row-major, fp32 on the CPU; every pointer carries its shape in a comment.
// Batch invariance (CPU): every operation computes a token's output from that token's inputs alone, by the same
// arithmetic whatever the number of tokens in the call and the token's place among them (the matrix products
// included: kernels/cpu/ops.cc MatMulT). A sequence therefore gets bit-identical results decoded alone or in a
// batch, and prefilled cold or after a prefix hit.
// Thread safety: launchers are reentrant; they may use several threads internally.
#pragma once

#include <cstdint>
#include <vector>

namespace eldr::kernels {

// Element types: of weight matrices and KV (fp32 or bf16; activations and KV are fp32 on the CPU), and of the
// index and count tensors a compute backend holds (kernels/backend.h buffers).
enum class DType { kF32, kBF16, kI32, kI64, kI8 };
inline int DTypeBytes(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kI8:
      return 1;
  }
  return 0;
}
const char* DTypeName(DType t);

// bf16 <-> fp32 (round to nearest even), shared by host code and tests.
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t b);

// A matrix of weights [rows, cols], row-major, in either storage type.
struct WeightMatrix {
  DType dtype = DType::kF32;
  const void* data = nullptr;  // [rows, cols]
  int64_t rows = 0, cols = 0;
};

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight.
struct RmsNormParams {
  const float* x = nullptr;       // [num_tokens, hidden]
  const float* weight = nullptr;  // [hidden]
  float* out = nullptr;           // [num_tokens, hidden]; may alias x
  int num_tokens = 0, hidden = 0;
  float eps = 1e-6f;
};
void RmsNorm(const RmsNormParams& p);

// Rotary embedding, rotate-half (GPT-NeoX / Hugging Face Llama, Qwen) convention, in place.
struct RopeParams {
  float* q = nullptr;                  // [num_tokens, num_q_heads, head_dim]
  float* k = nullptr;                  // [num_tokens, num_kv_heads, head_dim]
  const int32_t* positions = nullptr;  // [num_tokens]
  int num_tokens = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  float theta = 10000.f;
};
void ApplyRope(const RopeParams& p);

// y = x W^T for a weight matrix W [out_features, in_features].
struct LinearParams {
  const float* x = nullptr;  // [num_tokens, in_features]
  WeightMatrix weight;       // [out_features, in_features]
  float* y = nullptr;        // [num_tokens, out_features]
  int num_tokens = 0;
};
void Linear(const LinearParams& p);

// Router: softmax over the experts, top-k by probability (ties: lower expert id), descending; optionally
// renormalised so the k weights sum to 1 (norm_topk_prob).
struct GateTopKParams {
  const float* logits = nullptr;  // [num_tokens, num_experts]
  int num_tokens = 0, num_experts = 0, top_k = 0;
  bool renormalize = true;
  int32_t* topk_ids = nullptr;    // [num_tokens, top_k]
  float* topk_weights = nullptr;  // [num_tokens, top_k]
};
void GateTopK(const GateTopKParams& p);

// Token → expert grouping (the permute step): the (token, slot) pairs sorted by expert, stably.
struct ExpertGrouping {
  std::vector<int32_t> offsets;         // [num_experts + 1]: expert e's pairs are [offsets[e], offsets[e+1])
  std::vector<int32_t> pairs;           // [num_tokens * top_k]: t * top_k + j, grouped by expert
  std::vector<int32_t> active_experts;  // experts with at least one token, ascending
};
void GroupByExpert(const int32_t* topk_ids /* [num_tokens, top_k] */, int num_tokens, int top_k, int num_experts,
                   ExpertGrouping* out);

// The routed experts of one MoE layer: SwiGLU expert e(x) = down_e(silu(gate_e x) * up_e x).
struct ExpertWeights {
  std::vector<WeightMatrix> gate_proj;  // [num_experts] of [intermediate, hidden]
  std::vector<WeightMatrix> up_proj;    // [num_experts] of [intermediate, hidden]
  std::vector<WeightMatrix> down_proj;  // [num_experts] of [hidden, intermediate]
  int num_experts = 0, hidden = 0, intermediate = 0;
};

// out[t] += Σ_j topk_weights[t, j] · expert_{topk_ids[t, j]}(x[t]); only activated experts are computed
// (grouping, expert SwiGLU as ExpertFfn, weighted combine as MoeCombine).
struct MoeParams {
  const float* x = nullptr;             // [num_tokens, hidden]
  const int32_t* topk_ids = nullptr;    // [num_tokens, top_k]
  const float* topk_weights = nullptr;  // [num_tokens, top_k]
  int num_tokens = 0, top_k = 0;
  const ExpertWeights* experts = nullptr;
  float* out = nullptr;          // [num_tokens, hidden], accumulated into
  bool batch_invariant = false;  // see ExpertFfnParams
};
void MoeExperts(const MoeParams& p);

// One expert's SwiGLU over a set of rows: y[i] = expert(x[i]).
// batch_invariant: every row is computed by itself, so y[i] depends only on x[i] and the weights, bit for bit,
// whatever other rows share the call. An expert-parallel decode group splits an expert's rows over its
// replicas; with this set on both sides its outputs equal a single-rank decoder's exactly. (On the CPU every
// product is batch-invariant now, so the flag changes nothing there; it states what the caller relies on.)
struct ExpertFfnParams {
  const float* x = nullptr;  // [num_rows, hidden]
  int num_rows = 0;
  const ExpertWeights* experts = nullptr;
  int expert = 0;      // in [0, experts->num_experts)
  float* y = nullptr;  // [num_rows, hidden], overwritten
  bool batch_invariant = false;
};
void ExpertFfn(const ExpertFfnParams& p);

// The combine step of MoeExperts: out[t] += Σ_j topk_weights[t, j] · y[t * top_k + j], j ascending, in fp32.
struct MoeCombineParams {
  const float* y = nullptr;             // [num_tokens * top_k, hidden] expert outputs, one row per (token, slot)
  const float* topk_weights = nullptr;  // [num_tokens, top_k]
  int num_tokens = 0, top_k = 0, hidden = 0;
  float* out = nullptr;  // [num_tokens, hidden], accumulated into
};
void MoeCombine(const MoeCombineParams& p);

// One dense SwiGLU MLP (dense layers, shared experts): out[t] += mlp(x[t]).
struct MlpParams {
  const float* x = nullptr;  // [num_tokens, hidden]
  WeightMatrix gate_proj, up_proj, down_proj;
  int num_tokens = 0;
  float* out = nullptr;  // [num_tokens, hidden], accumulated into
};
void Mlp(const MlpParams& p);

// Paged KV cache of one layer: K and V [num_blocks, block_size, num_kv_heads, head_dim] of `dtype`. The CPU
// kernels take fp32 only (and check it); a device backend may keep its cache in bf16 (kernels/backend.h).
struct PagedKv {
  void* k = nullptr;
  void* v = nullptr;
  int num_blocks = 0, block_size = 0, num_kv_heads = 0, head_dim = 0;
  DType dtype = DType::kF32;
};

// Writes k/v of tokens at `positions` of one sequence into its blocks.
struct KvWriteParams {
  PagedKv cache;
  const int32_t* block_table = nullptr;  // [num_table_blocks] the sequence's blocks
  const int32_t* positions = nullptr;    // [num_tokens]
  const float* k = nullptr;              // [num_tokens, num_kv_heads, head_dim]
  const float* v = nullptr;              // [num_tokens, num_kv_heads, head_dim]
  int num_tokens = 0;
};
void WriteKv(const KvWriteParams& p);

// Writes k/v of tokens into the cache slots a host plan gives (vLLM's slot mapping): slot = block * block_size +
// position % block_size. One call serves a prefill (one sequence) and a decode step (one token per sequence).
// REQUIRES: slots distinct and in [0, num_blocks * block_size) (checked: out of range throws).
struct KvSlotWriteParams {
  PagedKv cache;
  const int64_t* slots = nullptr;  // [num_tokens]
  const float* k = nullptr;        // [num_tokens, num_kv_heads, head_dim]
  const float* v = nullptr;        // [num_tokens, num_kv_heads, head_dim]
  int num_tokens = 0;
};
void WriteKvSlots(const KvSlotWriteParams& p);

// KV transfer of one layer (prefill → decode): PackKv copies the K and V rows of `slots` into `packed`,
// UnpackKv copies them back into (another cache's) slots. packed holds the cache's dtype, K first:
// [2, num_tokens, num_kv_heads, head_dim]. REQUIRES: slots in [0, num_blocks * block_size) (checked).
struct KvPackParams {
  PagedKv cache;
  const int64_t* slots = nullptr;  // [num_tokens]
  int num_tokens = 0;
  void* packed = nullptr;  // [2, num_tokens, num_kv_heads, head_dim]; written by Pack, read by Unpack
};
void PackKv(const KvPackParams& p);
void UnpackKv(const KvPackParams& p);

// Decode attention: one query token per sequence over its whole context in the paged cache (GQA: query
// head h reads KV head h / (num_q_heads / num_kv_heads)).
struct PagedAttentionDecodeParams {
  const float* q = nullptr;  // [num_seqs, num_q_heads, head_dim]
  PagedKv cache;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  const int32_t* context_lens = nullptr;  // [num_seqs] tokens in the cache, the new one included
  int num_seqs = 0, num_q_heads = 0, max_blocks_per_seq = 0;
  float scale = 1.f;
  float* out = nullptr;  // [num_seqs, num_q_heads, head_dim]
};
void PagedAttentionDecode(const PagedAttentionDecodeParams& p);

// Prefill attention of one sequence: queries at positions [start, start + num_tokens) attend causally to
// the cached context [0, position] (the new tokens' K/V already written).
struct PrefillAttentionParams {
  const float* q = nullptr;  // [num_tokens, num_q_heads, head_dim]
  PagedKv cache;
  const int32_t* block_table = nullptr;  // [num_table_blocks]
  int start = 0, num_tokens = 0, num_q_heads = 0;
  float scale = 1.f;
  float* out = nullptr;  // [num_tokens, num_q_heads, head_dim]
};
void PrefillAttention(const PrefillAttentionParams& p);

// Embedding gather: out[t] = fp32(table[tokens[t]]). REQUIRES: tokens in [0, table.rows) (checked).
struct EmbeddingGatherParams {
  WeightMatrix table;               // [vocab, hidden]
  const int32_t* tokens = nullptr;  // [num_tokens]
  int num_tokens = 0;
  float* out = nullptr;  // [num_tokens, hidden]
};
void EmbeddingGather(const EmbeddingGatherParams& p);

// Residual add: out[i] += x[i].
struct ResidualAddParams {
  const float* x = nullptr;  // [n]
  float* out = nullptr;      // [n]
  int64_t n = 0;
};
void ResidualAdd(const ResidualAddParams& p);

// Greedy sampling: out[r] = the first index of the largest x[r, :] (std::max_element's order: a NaN compares
// false, so a NaN entry is never chosen over an earlier one).
struct ArgMaxParams {
  const float* x = nullptr;  // [num_rows, num_cols]
  int num_rows = 0, num_cols = 0;
  int32_t* out = nullptr;  // [num_rows]
};
void ArgMax(const ArgMaxParams& p);

// Replayed routing (a routing trace's top-k replaces the router's choice, runtime/model/executor.h): for each
// token t with mode[t] != kKeep, topk_ids[t] = replay_ids[t] and topk_weights[t] = replay_weights[t]
// (kIdsAndWeights), or the router's softmax probabilities of those ids, renormalised to sum 1 when
// `renormalize` (kIds). Tokens with mode kKeep keep what GateTopK wrote.
enum ReplayMode : int8_t { kReplayKeep = 0, kReplayIds = 1, kReplayIdsAndWeights = 2 };
struct ReplayTopKParams {
  const float* logits = nullptr;          // [num_tokens, num_experts] the router's logits
  const int8_t* mode = nullptr;           // [num_tokens] ReplayMode
  const int32_t* replay_ids = nullptr;    // [num_tokens, top_k] in [0, num_experts)
  const float* replay_weights = nullptr;  // [num_tokens, top_k]; read where mode is kReplayIdsAndWeights
  int num_tokens = 0, num_experts = 0, top_k = 0;
  bool renormalize = true;
  int32_t* topk_ids = nullptr;    // [num_tokens, top_k]
  float* topk_weights = nullptr;  // [num_tokens, top_k]
};
void ReplayTopK(const ReplayTopKParams& p);

// Signature-cache rows (DESIGN.md §3): row[b, ℓ, e] = #tokens of block b routed to e at ℓ.
struct SignatureCountParams {
  const int32_t* topk_ids = nullptr;  // [num_tokens, top_k] of one layer
  int num_tokens = 0, top_k = 0, block_size = 0;
  // rows + i * row_stride is the [num_experts] row of this layer for the block holding tokens
  // [i * block_size, (i + 1) * block_size); entries are incremented (zero them first).
  int8_t* rows = nullptr;
  int64_t row_stride = 0;
};
void AccumulateSignatureCounts(const SignatureCountParams& p);

}  // namespace eldr::kernels
