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

namespace {

// dst[i] += src[i] for i < n, in the (wider or equal) type of dst; the sums must not overflow it.
template <typename Src, typename Dst>
void AddWidened(const Src* __restrict src, Dst* __restrict dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<Dst>(dst[i] + src[i]);
}

}  // namespace

void SignatureCache::SumCounts(const std::vector<BlockId>& blocks, const std::vector<uint8_t>* layer_mask,
                               float* counts) const {
  // Exact integer sums, in three widths so the hot loop is one byte-wide add per row byte: rows are
  // non-negative with entries <= block_size, so 255 / block_size rows add up exactly in uint8 (15 at block
  // size 16); each uint8 group flushes into uint16 partial sums, and those into uint32 before they could
  // pass 65535. The loops are plain element-wise adds the compiler vectorises (64 bytes per vpaddb).
  // Masked-out layers are skipped as whole runs of contiguous layers.
  const size_t E = num_experts_;
  thread_local std::vector<std::pair<size_t, size_t>> runs;  // [begin, end) byte ranges of selected layers
  runs.clear();
  for (int l = 0; l < num_layers_; ++l) {
    if (layer_mask && !(*layer_mask)[l]) continue;
    const size_t begin = static_cast<size_t>(l) * E;
    if (!runs.empty() && runs.back().second == begin) {
      runs.back().second = begin + E;
    } else {
      runs.emplace_back(begin, begin + E);
    }
  }
  thread_local std::vector<uint8_t> acc8;
  thread_local std::vector<uint16_t> acc16;
  thread_local std::vector<uint32_t> acc32;
  acc8.assign(row_size_, 0);
  acc16.assign(row_size_, 0);
  acc32.clear();  // sized on first use: only prompts of more than 65535 tokens need it
  const int rows_per_group = 255 / block_size_;
  const int64_t tokens_per_group = static_cast<int64_t>(rows_per_group) * block_size_;
  int in_group = 0;
  int64_t tokens_in16 = 0;
  // Byte stores may alias anything, so every loop works on local copies of its bounds and pointers.
  auto flush8 = [&] {
    for (const auto [b, e] : runs) {
      AddWidened(acc8.data() + b, acc16.data() + b, e - b);
      std::memset(acc8.data() + b, 0, e - b);
    }
    in_group = 0;
    tokens_in16 += tokens_per_group;
  };
  auto flush16 = [&] {
    if (acc32.empty()) acc32.assign(row_size_, 0);
    for (const auto [b, e] : runs) {
      AddWidened(acc16.data() + b, acc32.data() + b, e - b);
      std::memset(acc16.data() + b, 0, (e - b) * sizeof(uint16_t));
    }
    tokens_in16 = 0;
  };
  for (BlockId b : blocks) {
    ELDR_CHECK(valid_[b], "block " << b << " has no signature row (not prefilled, or evicted)");
    if (in_group == rows_per_group) {
      if (tokens_in16 + tokens_per_group > 65535) flush16();
      flush8();
    }
    const uint8_t* r = reinterpret_cast<const uint8_t*>(row(b));
    for (const auto [begin, end] : runs) AddWidened(r + begin, acc8.data() + begin, end - begin);
    ++in_group;
  }
  if (tokens_in16 + tokens_per_group > 65535) flush16();
  flush8();
  std::fill(counts, counts + row_size_, 0.f);
  if (!acc32.empty()) flush16();
  const uint16_t* a16 = acc16.data();
  const uint32_t* a32 = acc32.empty() ? nullptr : acc32.data();
  for (const auto [b, e] : runs) {
    if (a32) {
      for (size_t x = b; x < e; ++x) counts[x] = static_cast<float>(a32[x]);
    } else {
      for (size_t x = b; x < e; ++x) counts[x] = static_cast<float>(a16[x]);
    }
  }
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
