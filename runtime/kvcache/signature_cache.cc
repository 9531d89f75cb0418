#include "runtime/kvcache/signature_cache.h"

#include <algorithm>
#include <cstring>

#include "runtime/common/check.h"

namespace eldr {

SignatureCache::SignatureCache(int num_blocks, int num_layers, int num_experts, int block_size)
    : num_layers_(num_layers),
      num_experts_(num_experts),
      block_size_(block_size),
      row_size_(static_cast<size_t>(num_layers) * num_experts),
      rows_(static_cast<size_t>(num_blocks) * row_size_, 0),
      valid_(num_blocks, 0) {
  ELDR_CHECK(block_size >= 1 && block_size <= 127, "signature cache rows are int8: block size must be in [1, 127]");
}

void SignatureCache::WriteBlock(BlockId b, const uint16_t* topk_ids, int num_tokens, int top_k) {
  ELDR_CHECK(b >= 0 && b < num_blocks(), "block " << b << " out of range");
  ELDR_CHECK(num_tokens >= 0 && num_tokens <= block_size_, "a block holds at most " << block_size_ << " tokens");
  int8_t* r = rows_.data() + static_cast<size_t>(b) * row_size_;
  std::memset(r, 0, row_size_);
  for (int t = 0; t < num_tokens; ++t) {
    const uint16_t* tok = topk_ids + static_cast<size_t>(t) * num_layers_ * top_k;
    for (int l = 0; l < num_layers_; ++l) {
      for (int j = 0; j < top_k; ++j) ++r[static_cast<size_t>(l) * num_experts_ + tok[l * top_k + j]];
    }
  }
  valid_[b] = 1;
}

void SignatureCache::DropBlock(BlockId b) {
  std::memset(rows_.data() + static_cast<size_t>(b) * row_size_, 0, row_size_);
  valid_[b] = 0;
}

void SignatureCache::SumCounts(const std::vector<BlockId>& blocks, const std::vector<uint8_t>* layer_mask,
                               float* counts) const {
  // Rows are int8 with entries <= block_size, so up to 32767 / block_size rows add up exactly in int16,
  // which halves the vector width of the hot loop; int16 partial sums flush into int32 between chunks.
  thread_local std::vector<int32_t> acc;
  thread_local std::vector<int16_t> part;
  acc.assign(row_size_, 0);
  part.assign(row_size_, 0);
  const size_t E = num_experts_;
  const size_t chunk = static_cast<size_t>(32767 / block_size_);
  size_t in_part = 0;
  auto flush = [&] {
    for (size_t x = 0; x < row_size_; ++x) acc[x] += part[x];
    std::fill(part.begin(), part.end(), 0);
    in_part = 0;
  };
  for (BlockId b : blocks) {
    ELDR_CHECK(valid_[b], "block " << b << " has no signature row (not prefilled, or evicted)");
    if (in_part == chunk) flush();
    const int8_t* r = row(b);
    for (int l = 0; l < num_layers_; ++l) {
      if (layer_mask && !(*layer_mask)[l]) continue;
      int16_t* a = part.data() + l * E;
      const int8_t* src = r + l * E;
      for (size_t e = 0; e < E; ++e) a[e] = static_cast<int16_t>(a[e] + src[e]);
    }
    ++in_part;
  }
  flush();
  for (size_t x = 0; x < row_size_; ++x) counts[x] = static_cast<float>(acc[x]);
}

SignatureCacheFootprint ComputeSignatureCacheFootprint(int num_moe_layers, int num_experts, int num_attention_layers,
                                                       int num_kv_heads, int head_dim, int dtype_bytes,
                                                       int block_size) {
  SignatureCacheFootprint f;
  f.signature_bytes_per_block = static_cast<int64_t>(num_moe_layers) * num_experts;
  f.kv_bytes_per_block = 2LL * num_attention_layers * num_kv_heads * head_dim * dtype_bytes * block_size;
  return f;
}

}  // namespace eldr
