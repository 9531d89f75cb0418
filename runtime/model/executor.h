// The MoE model executor (DESIGN.md §2): prefill of one sequence into paged KV blocks and batched decode
// steps, written once against the compute-backend interface (kernels/backend.h; the CPU backend unless one is
// given). Each call plans on the host (KV slot mapping, padded block tables, replayed routing), copies the plan
// to the backend, runs every operation there on the executor's stream, and copies back only what the host
// needs: each MoE layer's top-k ids (routing output, signature rows, EP dispatch), the logits and the greedy
// tokens. The KV blocks are the ids a BlockManager hands out; the executor owns the K/V tensors, backend
// buffers [layers][num_blocks, block_size, kv_heads, head_dim] in f32.
//
// Gate source: the model's own router (computed), or replayed from a routing trace: the trace's top-k ids
// (and weights, when given) of each token and MoE layer replace the router's choice, so a real model's
// routing pattern runs at its real shape with synthetic weights.
//
// Routed experts: each MoE layer's expert part goes through an ExpertBackend (runtime/model/expert_backend.h),
// by default this process's LocalExpertBackend; an EP decode group's leader sets its dispatching backend.
// Decode steps ask the backend for batch-invariant expert products (a token's result does not depend on
// which other tokens share its experts, so an EP group that splits an expert's tokens over replicas matches a
// single-rank decoder bit for bit); on the CPU every product is batch-invariant anyway.
//
// Weights: ModelWeights are host views, so the compute backend must have host memory (the CPU backend);
// device-resident weights are the GPU issue's work (the constructor says so for another backend).
//
// Thread safety: one thread calls an Executor at a time (the kernels use threads inside).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "runtime/common/status.h"
#include "runtime/kvcache/block_manager.h"
#include "runtime/kvcache/signature_cache.h"
#include "runtime/model/expert_backend.h"
#include "runtime/model/weights.h"

namespace eldr {

// Replayed routing for a run of tokens: ids [num_tokens, L_moe, top_k]; weights of the same shape, or
// null to weight the given experts by the router's own probabilities (renormalised as configured).
struct GateReplay {
  const uint16_t* ids = nullptr;
  const float* weights = nullptr;
};

struct PrefillResult {
  std::vector<float> last_logits;  // [vocab]
  int32_t next_token = 0;          // greedy
  std::vector<uint16_t> topk_ids;  // [num_computed_tokens, L_moe, top_k] routing of the computed tokens
};

struct DecodeSequence {
  int32_t token = 0;                                  // the input token of this step
  int32_t position = 0;                               // its position (= tokens already in the cache)
  const std::vector<BlockId>* block_table = nullptr;  // covers position
  const GateReplay* replay = nullptr;                 // one token's routing, or null (computed)
};

struct DecodeResult {
  std::vector<float> logits;               // [num_seqs, vocab]
  std::vector<int32_t> next_tokens;        // [num_seqs] greedy
  std::vector<int32_t> distinct_experts;   // [L_moe] |∪ top-k| over the batch, per MoE layer
  std::vector<uint16_t> topk_ids;          // [num_seqs, L_moe, top_k]
  int64_t total_distinct_experts() const;  // Σ over layers (DESIGN.md §3)
};

class Executor {
 public:
  // REQUIRES: weights and compute outlive the executor; compute->host_memory() (checked). compute nullptr:
  // kernels::CpuBackend().
  Executor(const ModelWeights& weights, int num_blocks, int block_size, kernels::Backend* compute = nullptr);
  // Bytes of its paged KV cache: K and V of every layer, float32, [blocks, block_size, kv heads, head dim].
  static double KvBytes(const ModelConfig& c, int64_t num_blocks, int block_size) {
    return 2.0 * c.num_hidden_layers * static_cast<double>(num_blocks) * block_size * c.num_key_value_heads *
           c.head_dim * sizeof(float);
  }

  // Computes tokens [num_cached_tokens, tokens.size()) of a sequence whose KV for [0, num_cached_tokens) is
  // already in `block_table` (prefix hit). `replay` covers the computed tokens. When `signatures` is given,
  // the rows of every block prefill fills are written from the routing (num_cached_tokens must then be a
  // multiple of the block size, as prefix hits are whole blocks).
  Result<PrefillResult> Prefill(const std::vector<int32_t>& tokens, const std::vector<BlockId>& block_table,
                                int num_cached_tokens, const GateReplay* replay, SignatureCache* signatures);

  // One decode step for a batch of sequences of different lengths.
  Result<DecodeResult> Decode(const std::vector<DecodeSequence>& batch);

  // The backend of the routed experts; nullptr restores the local one. REQUIRES: it outlives its use.
  void set_expert_backend(ExpertBackend* backend) { expert_backend_ = backend; }

  // KV transfer between a prefill and a decode executor (same model): the K and V of a sequence's first
  // `num_tokens` tokens, all layers, packed as [layers, 2 (K then V), num_tokens, kv_heads, head_dim].
  int64_t KvFloatsPerToken() const;  // 2 * layers * kv_heads * head_dim
  void ExportKv(const std::vector<BlockId>& block_table, int num_tokens, float* packed) const;
  void ImportKv(const std::vector<BlockId>& block_table, int num_tokens, const float* packed);

  const ModelConfig& config() const { return w_.config; }
  kernels::Backend& compute() const { return compute_; }
  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }
  int64_t kv_bytes() const;

 private:
  struct Tokens;
  struct Plan;
  struct Activations;
  // Runs every layer over hidden states x [T, H] (backend memory) in place; the routing goes to
  // topk_out [T, L_moe, k] (host).
  Status Forward(float* x, const std::vector<int32_t>& positions, const Tokens& mode, const GateReplay* replay,
                 uint16_t* topk_out);
  Plan MakePlan(const std::vector<int32_t>& positions, const Tokens& mode, const GateReplay* replay) const;
  void Attention(int layer, float* x, int num_tokens, const Tokens& mode, const Plan& plan, Activations& a);
  Status Ffn(int layer, int moe_layer, float* x, int num_tokens, const Plan& plan, Activations& a, uint16_t* topk_out);
  // logits [T, vocab] of hidden states x [T, H], with scratch h [T, H]; all backend memory.
  void Logits(const float* x, int num_tokens, float* h, float* logits);
  // The KV slot of a sequence's token at `position`, and of its first num_tokens tokens (checked: the table
  // covers them and its blocks are in [0, num_blocks)).
  int64_t SlotOf(const std::vector<BlockId>& block_table, int position) const;
  std::vector<int64_t> Slots(const std::vector<BlockId>& block_table, int num_tokens) const;
  kernels::PagedKv Cache(int layer) const;

  const ModelWeights& w_;
  int num_blocks_, block_size_;
  kernels::Backend& compute_;
  std::unique_ptr<kernels::Stream> stream_;
  LocalExpertBackend local_experts_;
  ExpertBackend* expert_backend_ = nullptr;  // nullptr: local_experts_
  std::vector<std::unique_ptr<kernels::Buffer>> k_cache_,
      v_cache_;  // [layers] of [num_blocks, block_size, kv_heads, head_dim]
};

}  // namespace eldr
