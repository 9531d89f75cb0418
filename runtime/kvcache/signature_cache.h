// The signature cache (DESIGN.md §3): one int8 row of L×E per KV-cache block, co-indexed with the block
// table. Row b holds, for each (layer ℓ, expert e), how many of block b's tokens were routed to e at ℓ.
// A request's counts c_r(ℓ,e) are the sum of the rows of its prompt blocks, so prefix hits, full hits and
// evicted-then-recomputed blocks all give exactly the from-scratch counts.
//
// Thread safety: not thread-safe; owned by the prefill worker next to its BlockManager.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/kvcache/block_manager.h"

namespace eldr {

class SignatureCache {
 public:
  // REQUIRES: block_size <= 127 (a row entry counts at most block_size tokens in an int8).
  SignatureCache(int num_blocks, int num_layers, int num_experts, int block_size);

  // Writes block `b`'s row from the routing of its `num_tokens` tokens: topk_ids [num_tokens, L, top_k].
  void WriteBlock(BlockId b, const uint16_t* topk_ids, int num_tokens, int top_k);
  // Drops block `b`'s row (eviction): zeroes it and marks it invalid.
  void DropBlock(BlockId b);
  bool valid(BlockId b) const { return valid_[b] != 0; }

  // counts [L, E] = Σ over `blocks` of their rows. Only the layers with layer_mask[ℓ] set are summed when
  // a mask is given (the others are left zero): that is all a signature needs.
  // REQUIRES: every block's row is valid.
  void SumCounts(const std::vector<BlockId>& blocks, const std::vector<uint8_t>* layer_mask, float* counts) const;

  const int8_t* row(BlockId b) const { return rows_.data() + static_cast<size_t>(b) * row_size_; }
  size_t row_size() const { return row_size_; }
  int num_blocks() const { return static_cast<int>(valid_.size()); }
  size_t bytes() const { return rows_.size(); }

 private:
  int num_layers_, num_experts_, block_size_;
  size_t row_size_;
  std::vector<int8_t> rows_;    // [num_blocks, L, E]
  std::vector<uint8_t> valid_;  // [num_blocks]
};

// Memory accounting: signature-cache bytes vs KV-cache bytes per block for a model shape.
struct SignatureCacheFootprint {
  int64_t signature_bytes_per_block = 0;  // L_moe * E (int8)
  int64_t kv_bytes_per_block = 0;         // 2 (K and V) * L_attn * kv_heads * head_dim * dtype_bytes * block_size
  double ratio() const {
    return static_cast<double>(signature_bytes_per_block) / static_cast<double>(kv_bytes_per_block);
  }
};
SignatureCacheFootprint ComputeSignatureCacheFootprint(int num_moe_layers, int num_experts, int num_attention_layers,
                                                       int num_kv_heads, int head_dim, int dtype_bytes, int block_size);

}  // namespace eldr
