#include "runtime/kvcache/signature_cache.h"

#include <algorithm>
#include <cstring>

#if defined(__AVX512BW__)
#include <immintrin.h>
#endif

#include "runtime/common/check.h"

namespace eldr {

namespace {

constexpr size_t kSpan = 128;  // entries per 64-byte span

// Where entry x lives: byte and nibble (0 low, 4 high).
inline size_t PackedByte(size_t x) { return x / kSpan * 64 + (x % 64); }
inline int PackedShift(size_t x) { return (x % kSpan) >= 64 ? 4 : 0; }

}  // namespace

SignatureCache::SignatureCache(int num_blocks, int num_layers, int num_experts, int block_size)
    : num_layers_(num_layers),
      num_experts_(num_experts),
      block_size_(block_size),
      row_size_(static_cast<size_t>(num_layers) * num_experts),
      spans_((row_size_ + kSpan - 1) / kSpan),
      row_bytes_(spans_ * 64),
      packed_(static_cast<size_t>(num_blocks) * row_bytes_, 0),
      escape_(num_blocks),
      valid_(num_blocks, 0) {
  ELDR_CHECK(block_size >= 1 && block_size <= 127, "signature cache: block size must be in [1, 127]");
}

void SignatureCache::WriteBlock(BlockId b, const uint16_t* topk_ids, int num_tokens, int top_k) {
  ELDR_CHECK(b >= 0 && b < num_blocks(), "block " << b << " out of range");
  ELDR_CHECK(num_tokens >= 0 && num_tokens <= block_size_, "a block holds at most " << block_size_ << " tokens");
  thread_local std::vector<uint8_t> counts;
  counts.assign(row_size_, 0);
  for (int t = 0; t < num_tokens; ++t) {
    const uint16_t* tok = topk_ids + static_cast<size_t>(t) * num_layers_ * top_k;
    for (int l = 0; l < num_layers_; ++l) {
      for (int j = 0; j < top_k; ++j) ++counts[static_cast<size_t>(l) * num_experts_ + tok[l * top_k + j]];
    }
  }
  uint8_t* r = packed_.data() + static_cast<size_t>(b) * row_bytes_;
  std::memset(r, 0, row_bytes_);
  std::vector<uint32_t>& esc = escape_[b];
  esc.clear();
  for (size_t x = 0; x < row_size_; ++x) {
    const unsigned c = counts[x];
    r[PackedByte(x)] |= static_cast<uint8_t>((c & 15u) << PackedShift(x));
    if (c >= 16) esc.push_back(static_cast<uint32_t>(x) << 3 | (c >> 4));
  }
  valid_[b] = 1;
}

void SignatureCache::DropBlock(BlockId b) {
  std::memset(packed_.data() + static_cast<size_t>(b) * row_bytes_, 0, row_bytes_);
  escape_[b].clear();
  valid_[b] = 0;
}

int SignatureCache::Count(BlockId b, size_t x) const {
  const uint8_t byte = packed_[static_cast<size_t>(b) * row_bytes_ + PackedByte(x)];
  int c = (byte >> PackedShift(x)) & 15;
  for (uint32_t e : escape_[b]) {
    if (e >> 3 == x) c += 16 * static_cast<int>(e & 7u);
  }
  return c;
}

namespace {

// acc[128c .. 128c + 128) += Σ_j (the unpacked span c of rows[j]) for spans c in [first, last). n <= 16.
//
// With AVX-512BW a full group of 16 rows takes, per span, 16 loads, 16 byte adds, 16 masks and 15 byte averages
// (about 50 operations, where masking and shifting each nibble of each row takes 80):
//  - the high nibbles: h_j = x_j & 0xF0 = 16·hi_j, averaged pairwise in a tree of four levels. vpavgb computes
//    (a + b + 1) >> 1 in nine bits, and 16a + 16b + 1 is odd, so a level halves the scale exactly:
//    16·hi → 8·(two his) → 4·(four) → 2·(eight) → Σ_16 hi_j (<= 240, a byte);
//  - the low nibbles: Σ_16 x_j wraps mod 256, and Σ x_j = Σ lo_j + 16·Σ hi_j, so Σ lo_j = Σ x_j − 16·Σ hi_j
//    mod 256, exact because Σ lo_j <= 240.
// Each sum is then widened and added to acc. Fewer rows (the last group of a prompt) take the plain per-row path:
// a mask, a shift and a mask per row into two byte sums. Without AVX-512BW, a scalar loop.
void AddSpanGroup(const uint8_t* const* rows, int n, size_t first, size_t last, uint16_t* __restrict acc) {
  size_t c = first;
#if defined(__AVX512BW__)
  const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8(static_cast<char>(0xF0));
  for (; c < last; ++c) {
    const size_t at = c * 64;
    __m512i lo, hi;
    if (n == 16) {
      __m512i sum = _mm512_setzero_si512();
      auto leaf = [&](int j) {
        // The row pointer is read from memory each time (a load port), not kept in a vector register: 16 of them
        // do not fit the general registers, and moving one back out of a vector register takes a vector ALU port.
        const uint8_t* row = __atomic_load_n(rows + j, __ATOMIC_RELAXED);
        const __m512i x = _mm512_loadu_si512(row + at);
        sum = _mm512_add_epi8(sum, x);
        return _mm512_and_si512(x, high);
      };
      // The tree in order, so that at most five partial averages are live.
      auto pair = [&](int j) {
        const __m512i a = leaf(j);
        return _mm512_avg_epu8(a, leaf(j + 1));
      };
      auto quad = [&](int j) {
        const __m512i a = pair(j);
        return _mm512_avg_epu8(a, pair(j + 2));
      };
      auto oct = [&](int j) {
        const __m512i a = quad(j);
        return _mm512_avg_epu8(a, quad(j + 4));
      };
      const __m512i h = oct(0);
      hi = _mm512_avg_epu8(h, oct(8));
      lo = _mm512_sub_epi8(sum, _mm512_and_si512(_mm512_slli_epi16(hi, 4), high));
    } else {
      lo = hi = _mm512_setzero_si512();
      for (int j = 0; j < n; ++j) {
        const __m512i x = _mm512_loadu_si512(rows[j] + at);
        lo = _mm512_add_epi8(lo, _mm512_and_si512(x, low));
        hi = _mm512_add_epi8(hi, _mm512_and_si512(_mm512_srli_epi16(x, 4), low));
      }
    }
    uint16_t* a = acc + c * kSpan;
    _mm512_storeu_si512(a, _mm512_add_epi16(_mm512_loadu_si512(a), _mm512_cvtepu8_epi16(_mm512_castsi512_si256(lo))));
    _mm512_storeu_si512(
        a + 32, _mm512_add_epi16(_mm512_loadu_si512(a + 32), _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(lo, 1))));
    _mm512_storeu_si512(a + 64,
                        _mm512_add_epi16(_mm512_loadu_si512(a + 64), _mm512_cvtepu8_epi16(_mm512_castsi512_si256(hi))));
    _mm512_storeu_si512(
        a + 96, _mm512_add_epi16(_mm512_loadu_si512(a + 96), _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(hi, 1))));
  }
#endif
  for (; c < last; ++c) {
    for (size_t i = 0; i < 64; ++i) {
      unsigned lo = 0, hi = 0;
      for (int j = 0; j < n; ++j) {
        lo += rows[j][c * 64 + i] & 15u;
        hi += rows[j][c * 64 + i] >> 4;
      }
      acc[c * kSpan + i] = static_cast<uint16_t>(acc[c * kSpan + i] + lo);
      acc[c * kSpan + 64 + i] = static_cast<uint16_t>(acc[c * kSpan + 64 + i] + hi);
    }
  }
}

}  // namespace

void SignatureCache::SumCounts(const std::vector<BlockId>& blocks, const std::vector<uint8_t>* layer_mask,
                               float* counts) const {
  // Exact integer sums. Nibbles are <= 15, so a group of 16 rows adds up exactly in bytes; each group's sum, and
  // its rows' escapes (16 · count / 16), go into uint16 partial sums, and those into uint32 before they could pass
  // 65535 (prompts of more than 65535 tokens). Only the spans that hold a selected layer are summed, as runs of
  // contiguous spans; entries of unselected layers that share a span are summed too and not reported.
  const size_t E = num_experts_;
  thread_local std::vector<std::pair<size_t, size_t>> runs;   // [begin, end) entries of selected layers
  thread_local std::vector<std::pair<size_t, size_t>> spans;  // [first, last) spans covering the runs
  runs.clear();
  spans.clear();
  for (int l = 0; l < num_layers_; ++l) {
    if (layer_mask && !(*layer_mask)[l]) continue;
    const size_t begin = static_cast<size_t>(l) * E;
    if (!runs.empty() && runs.back().second == begin) {
      runs.back().second = begin + E;
    } else {
      runs.emplace_back(begin, begin + E);
    }
  }
  for (const auto& [b, e] : runs) {
    const size_t first = b / kSpan, last = (e + kSpan - 1) / kSpan;
    if (!spans.empty() && spans.back().second >= first) {
      spans.back().second = std::max(spans.back().second, last);
    } else {
      spans.emplace_back(first, last);
    }
  }
  thread_local std::vector<uint16_t> acc16;
  thread_local std::vector<uint32_t> acc32;
  acc16.assign(spans_ * kSpan, 0);
  acc32.clear();                     // sized on first use: only prompts of more than 65535 tokens need it
  constexpr int kRowsPerGroup = 16;  // AddSpanGroup's full group (16 · 15 <= 255)
  const int64_t tokens_per_group = static_cast<int64_t>(kRowsPerGroup) * block_size_;
  int64_t tokens_in16 = 0;  // an upper bound of any entry of acc16
  auto flush16 = [&] {
    if (acc32.empty()) acc32.assign(row_size_, 0);
    for (const auto& [b, e] : runs) {
      for (size_t x = b; x < e; ++x) acc32[x] += acc16[x];
    }
    std::fill(acc16.begin(), acc16.end(), uint16_t{0});
    tokens_in16 = 0;
  };
  const uint8_t* group[kRowsPerGroup];
  for (size_t first = 0; first < blocks.size(); first += kRowsPerGroup) {
    const int n = static_cast<int>(std::min<size_t>(kRowsPerGroup, blocks.size() - first));
    for (int j = 0; j < n; ++j) {
      const BlockId b = blocks[first + j];
      ELDR_CHECK(valid_[b], "block " << b << " has no signature row (not prefilled, or evicted)");
      group[j] = packed_.data() + static_cast<size_t>(b) * row_bytes_;
    }
    if (tokens_in16 + tokens_per_group > 65535) flush16();
    for (const auto& [c0, c1] : spans) AddSpanGroup(group, n, c0, c1, acc16.data());
    for (int j = 0; j < n; ++j) {
      for (uint32_t e : escape_[blocks[first + j]])
        acc16[e >> 3] = static_cast<uint16_t>(acc16[e >> 3] + 16 * (e & 7u));
    }
    tokens_in16 += tokens_per_group;
  }
  if (!acc32.empty()) flush16();
  const uint16_t* a16 = acc16.data();
  const uint32_t* a32 = acc32.empty() ? nullptr : acc32.data();
  size_t written = 0;  // counts[0, written) are set: the runs are in order, the entries between them are zeroed
  for (const auto& [b, e] : runs) {
    std::fill(counts + written, counts + b, 0.f);
    written = e;
    if (a32) {
      for (size_t x = b; x < e; ++x) counts[x] = static_cast<float>(a32[x]);
    } else {
      for (size_t x = b; x < e; ++x) counts[x] = static_cast<float>(a16[x]);
    }
  }
  std::fill(counts + written, counts + row_size_, 0.f);
}

SignatureCacheFootprint ComputeSignatureCacheFootprint(int num_moe_layers, int num_experts, int num_attention_layers,
                                                       int num_kv_heads, int head_dim, int dtype_bytes,
                                                       int block_size) {
  SignatureCacheFootprint f;
  f.signature_bytes_per_block = (static_cast<int64_t>(num_moe_layers) * num_experts + 127) / 128 * 64;
  f.kv_bytes_per_block = 2LL * num_attention_layers * num_kv_heads * head_dim * dtype_bytes * block_size;
  return f;
}

}  // namespace eldr
