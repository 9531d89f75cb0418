// Compute operations of the MoE executor (DESIGN.md §4 kernels/, §6 backends). Each operation is a host
// launcher taking a params struct, in the style of DeepEP: the CPU implementation (kernels/cpu, Eigen,
// multithreaded) is the reference every accelerated backend is compared against; kernels/cuda implements
// the same launchers in bf16 on a CUDA stream (kernels/cuda/cuda_ops.h).
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

// Storage type of weight matrices (activations and KV are fp32 on the CPU).
enum class DType { kF32, kBF16 };
inline int DTypeBytes(DType t) { return t == DType::kF32 ? 4 : 2; }

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
  float* q = nullptr;                // [num_tokens, num_q_heads, head_dim]
  float* k = nullptr;                // [num_tokens, num_kv_heads, head_dim]
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
  int32_t* topk_ids = nullptr;     // [num_tokens, top_k]
  float* topk_weights = nullptr;   // [num_tokens, top_k]
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
  float* out = nullptr;                 // [num_tokens, hidden], accumulated into
  bool batch_invariant = false;         // see ExpertFfnParams
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
  int expert = 0;            // in [0, experts->num_experts)
  float* y = nullptr;        // [num_rows, hidden], overwritten
  bool batch_invariant = false;
};
void ExpertFfn(const ExpertFfnParams& p);

// The combine step of MoeExperts: out[t] += Σ_j topk_weights[t, j] · y[t * top_k + j], j ascending, in fp32.
struct MoeCombineParams {
  const float* y = nullptr;             // [num_tokens * top_k, hidden] expert outputs, one row per (token, slot)
  const float* topk_weights = nullptr;  // [num_tokens, top_k]
  int num_tokens = 0, top_k = 0, hidden = 0;
  float* out = nullptr;                 // [num_tokens, hidden], accumulated into
};
void MoeCombine(const MoeCombineParams& p);

// One dense SwiGLU MLP (dense layers, shared experts): out[t] += mlp(x[t]).
struct MlpParams {
  const float* x = nullptr;  // [num_tokens, hidden]
  WeightMatrix gate_proj, up_proj, down_proj;
  int num_tokens = 0;
  float* out = nullptr;      // [num_tokens, hidden], accumulated into
};
void Mlp(const MlpParams& p);

// Paged KV cache of one layer: K and V [num_blocks, block_size, num_kv_heads, head_dim].
struct PagedKv {
  float* k = nullptr;
  float* v = nullptr;
  int num_blocks = 0, block_size = 0, num_kv_heads = 0, head_dim = 0;
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

// Decode attention: one query token per sequence over its whole context in the paged cache (GQA: query
// head h reads KV head h / (num_q_heads / num_kv_heads)).
struct PagedAttentionDecodeParams {
  const float* q = nullptr;               // [num_seqs, num_q_heads, head_dim]
  PagedKv cache;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  const int32_t* context_lens = nullptr;  // [num_seqs] tokens in the cache, the new one included
  int num_seqs = 0, num_q_heads = 0, max_blocks_per_seq = 0;
  float scale = 1.f;
  float* out = nullptr;                   // [num_seqs, num_q_heads, head_dim]
};
void PagedAttentionDecode(const PagedAttentionDecodeParams& p);

// Prefill attention of one sequence: queries at positions [start, start + num_tokens) attend causally to
// the cached context [0, position] (the new tokens' K/V already written).
struct PrefillAttentionParams {
  const float* q = nullptr;              // [num_tokens, num_q_heads, head_dim]
  PagedKv cache;
  const int32_t* block_table = nullptr;  // [num_table_blocks]
  int start = 0, num_tokens = 0, num_q_heads = 0;
  float scale = 1.f;
  float* out = nullptr;                  // [num_tokens, num_q_heads, head_dim]
};
void PrefillAttention(const PrefillAttentionParams& p);

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
