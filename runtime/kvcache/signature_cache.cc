#include "runtime/kvcache/signature_cache.h"

#include <algorithm>
#include <cstring>

#if defined(__AVX512BW__)
#include <immintrin.h>
#endif

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

// acc[i] += Σ_j rows[j][i] for i in [begin, end). The byte sums of one group must not overflow (n · max entry
// <= 255). With AVX-512BW each 64-byte column of the group is summed in a register (n loads, n − 1 byte adds),
// widened and added to acc once: the rows are read once and acc is touched once per group, not once per row.
void AddRowGroup(const uint8_t* const* rows, int n, size_t begin, size_t end, uint16_t* __restrict acc) {
  size_t i = begin;
#if defined(__AVX512BW__)
  for (; i + 64 <= end; i += 64) {
    __m512i s = _mm512_loadu_si512(rows[0] + i);
    for (int j = 1; j < n; ++j) s = _mm512_add_epi8(s, _mm512_loadu_si512(rows[j] + i));
    const __m512i lo = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(s));
    const __m512i hi = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(s, 1));
    _mm512_storeu_si512(acc + i, _mm512_add_epi16(_mm512_loadu_si512(acc + i), lo));
    _mm512_storeu_si512(acc + i + 32, _mm512_add_epi16(_mm512_loadu_si512(acc + i + 32), hi));
  }
#endif
  for (; i < end; ++i) {
    unsigned s = 0;
    for (int j = 0; j < n; ++j) s += rows[j][i];
    acc[i] = static_cast<uint16_t>(acc[i] + s);
  }
}

}  // namespace

void SignatureCache::SumCounts(const std::vector<BlockId>& blocks, const std::vector<uint8_t>* layer_mask,
                               float* counts) const {
  // Exact integer sums. Rows are non-negative with entries <= block_size, so a group of 255 / block_size rows
  // (15 at block size 16) adds up exactly in bytes; each group's sum goes into uint16 partial sums, and those into
  // uint32 before they could pass 65535 (prompts of more than 65535 tokens). Masked-out layers are skipped as whole
  // runs of contiguous layers.
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
  thread_local std::vector<uint16_t> acc16;
  thread_local std::vector<uint32_t> acc32;
  acc16.assign(row_size_, 0);
  acc32.clear();  // sized on first use: only prompts of more than 65535 tokens need it
  const int rows_per_group = 255 / block_size_;
  const int64_t tokens_per_group = static_cast<int64_t>(rows_per_group) * block_size_;
  int64_t tokens_in16 = 0;  // an upper bound of the tokens in acc16
  auto flush16 = [&] {
    if (acc32.empty()) acc32.assign(row_size_, 0);
    for (const auto& [b, e] : runs) {
      for (size_t x = b; x < e; ++x) acc32[x] += acc16[x];
      std::fill(acc16.begin() + b, acc16.begin() + e, uint16_t{0});
    }
    tokens_in16 = 0;
  };
  const uint8_t* group[256];
  for (size_t first = 0; first < blocks.size(); first += rows_per_group) {
    const int n = static_cast<int>(std::min<size_t>(rows_per_group, blocks.size() - first));
    for (int j = 0; j < n; ++j) {
      const BlockId b = blocks[first + j];
      ELDR_CHECK(valid_[b], "block " << b << " has no signature row (not prefilled, or evicted)");
      group[j] = reinterpret_cast<const uint8_t*>(row(b));
    }
    if (tokens_in16 + tokens_per_group > 65535) flush16();
    for (const auto& [b, e] : runs) AddRowGroup(group, n, b, e, acc16.data());
    tokens_in16 += tokens_per_group;
  }
  std::fill(counts, counts + row_size_, 0.f);
  if (!acc32.empty()) flush16();
  const uint16_t* a16 = acc16.data();
  const uint32_t* a32 = acc32.empty() ? nullptr : acc32.data();
  for (const auto& [b, e] : runs) {
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
