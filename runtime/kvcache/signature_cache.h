// The signature cache (DESIGN.md §3): one row of L×E counts per KV-cache block, co-indexed with the block
// table. Row b holds, for each (layer ℓ, expert e), how many of block b's tokens were routed to e at ℓ.
// A request's counts c_r(ℓ,e) are the sum of the rows of its prompt blocks, so prefix hits, full hits and
// evicted-then-recomputed blocks all give exactly the from-scratch counts.
//
// Storage: 4 bits per entry, the count mod 16, plus a per-row list of the entries that reach 16 (with count / 16).
// Entries are packed per span of 128: byte j of span c holds entry 128c + j in its low nibble and 128c + 64 + j
// in its high nibble, so a 64-byte load of a span splits into two runs of 64 consecutive entries with one mask and
// one shift. A count of 16 at block size 16 needs every token of the block on one expert (0.015 % of the entries
// of the bundled DeepSeek-V2-Lite trace), so the lists are nearly always empty, and a row takes L·E/2 bytes: a
// sum over a prompt's rows reads half the bytes of int8 rows (it is bound by them).
//
// Thread safety: not thread-safe; owned by the prefill worker next to its BlockManager.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/common/huge_pages.h"
#include "runtime/kvcache/block_manager.h"

namespace eldr {

class SignatureCache {
 public:
  // REQUIRES: 1 <= block_size <= 127.
  SignatureCache(int num_blocks, int num_layers, int num_experts, int block_size);
  // Host bytes a cache of n blocks holds: a packed row of L x E half-byte counts in 64-byte spans of 128 entries,
  // an escape list and a valid flag per block (the escapes' own entries come later, with counts of 16 and more).
  static double MemoryBytes(int64_t num_blocks, int num_layers, int num_experts) {
    const double spans = std::ceil(static_cast<double>(num_layers) * num_experts / 128.0);
    return static_cast<double>(num_blocks) * (spans * 64 + sizeof(std::vector<uint32_t>) + 1);
  }

  // Writes block `b`'s row from the routing of its `num_tokens` tokens: topk_ids [num_tokens, L, top_k].
  void WriteBlock(BlockId b, const uint16_t* topk_ids, int num_tokens, int top_k);
  // Drops block `b`'s row (eviction): zeroes it and marks it invalid.
  void DropBlock(BlockId b);
  bool valid(BlockId b) const { return valid_[b] != 0; }

  // counts [L, E] = Σ over `blocks` of their rows. Only the layers with layer_mask[ℓ] set are summed when
  // a mask is given (the others are left zero): that is all a signature needs.
  // REQUIRES: every block's row is valid.
  void SumCounts(const std::vector<BlockId>& blocks, const std::vector<uint8_t>* layer_mask, float* counts) const;

  // Block b's count at entry ℓ·E + e.
  int Count(BlockId b, size_t entry) const;
  size_t row_size() const { return row_size_; }  // L·E entries
  int num_blocks() const { return static_cast<int>(valid_.size()); }
  size_t bytes() const { return packed_.size(); }  // the packed rows (the escape lists are extra, nearly empty)

 private:
  int num_layers_, num_experts_, block_size_;
  size_t row_size_;                            // L·E
  size_t spans_;                               // ceil(L·E / 128)
  size_t row_bytes_;                           // spans_ · 64
  HugePageVector<uint8_t> packed_;             // [num_blocks, row_bytes_]
  std::vector<std::vector<uint32_t>> escape_;  // [num_blocks] entry << 3 | count / 16, for counts >= 16
  std::vector<uint8_t> valid_;                 // [num_blocks]
};

// Memory accounting: signature-cache bytes vs KV-cache bytes per block for a model shape.
struct SignatureCacheFootprint {
  int64_t signature_bytes_per_block = 0;  // ceil(L_moe · E / 128) · 64 (4 bits per entry; escape lists not counted)
  int64_t kv_bytes_per_block = 0;         // 2 (K and V) * L_attn * kv_heads * head_dim * dtype_bytes * block_size
  double ratio() const {
    return static_cast<double>(signature_bytes_per_block) / static_cast<double>(kv_bytes_per_block);
  }
};
SignatureCacheFootprint ComputeSignatureCacheFootprint(int num_moe_layers, int num_experts, int num_attention_layers,
                                                       int num_kv_heads, int head_dim, int dtype_bytes, int block_size);

}  // namespace eldr
