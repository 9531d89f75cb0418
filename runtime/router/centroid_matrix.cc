#include "runtime/router/centroid_matrix.h"

#include <cmath>
#include <cstring>

#include "runtime/common/check.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__FAST_MATH__)
#error "centroid_matrix.cc promises a fixed summation order, which -ffast-math (reassociation) does not keep"
#endif

namespace eldr {
namespace {

constexpr int kChunk = 32;  // entries per chunk: 16 lanes × two halves of a 32-bit word

// Storage of a row: chunk c's entries 32c + i and 32c + 16 + i (i < 16) share 32-bit word i of the chunk (low and
// high half), so one 64-byte load widens into the chunk's two runs of 16 consecutive entries with a shift and a mask
// and meets the signature as it lies in memory; the dim mod 32 tail entries follow in order.
size_t StoredIndex(int x, int full_chunks) {
  const int c = x / kChunk;
  if (c >= full_chunks) return static_cast<size_t>(x);
  const int j = x % kChunk;
  return static_cast<size_t>(c) * kChunk + (j % 16) * 2 + j / 16;
}

// The lane sum and tail of the order in the header, shared by both paths.
float FinishRow(const float* lanes, const float* s, const uint16_t* row, int full_chunks, int dim) {
  float total = 0.f;
  for (int i = 0; i < 16; ++i) total += lanes[i] + lanes[16 + i];
  float tail = 0.f;
  for (int x = full_chunks * kChunk; x < dim; ++x) tail = std::fma(s[x], CentroidMatrix::Bf16ToFloat(row[x]), tail);
  return total + tail;
}

#if defined(__AVX512F__)
// kRows rows at once, so each chunk of the signature is loaded once for all of them.
template <int kRows>
void DotsAvx512(const uint16_t* rows, size_t row_stride, int full_chunks, int dim, const float* s, float* out) {
  __m512 low[kRows], high[kRows];
  for (int r = 0; r < kRows; ++r) low[r] = high[r] = _mm512_setzero_ps();
  const __m512i high_mask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int c = 0; c < full_chunks; ++c) {
    const __m512 s_low = _mm512_loadu_ps(s + c * kChunk), s_high = _mm512_loadu_ps(s + c * kChunk + 16);
    for (int r = 0; r < kRows; ++r) {
      const __m512i w = _mm512_loadu_si512(rows + r * row_stride + static_cast<size_t>(c) * kChunk);
      low[r] = _mm512_fmadd_ps(s_low, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), low[r]);
      high[r] = _mm512_fmadd_ps(s_high, _mm512_castsi512_ps(_mm512_and_si512(w, high_mask)), high[r]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    alignas(64) float lanes[kChunk];
    _mm512_store_ps(lanes, low[r]);
    _mm512_store_ps(lanes + 16, high[r]);
    out[r] = FinishRow(lanes, s, rows + r * row_stride, full_chunks, dim);
  }
}
#endif

// The same order without vector instructions (builds without AVX-512).
void DotPortable(const uint16_t* row, int full_chunks, int dim, const float* s, float* out) {
  float lanes[kChunk] = {};
  for (int c = 0; c < full_chunks; ++c) {
    for (int j = 0; j < kChunk; ++j) {
      const float m = CentroidMatrix::Bf16ToFloat(row[StoredIndex(c * kChunk + j, full_chunks)]);
      lanes[j] = std::fma(s[c * kChunk + j], m, lanes[j]);
    }
  }
  *out = FinishRow(lanes, s, row, full_chunks, dim);
}

}  // namespace

uint16_t CentroidMatrix::RoundToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest, ties to even (finite x)
  return static_cast<uint16_t>(u >> 16);
}

float CentroidMatrix::Bf16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

CentroidMatrix::CentroidMatrix(const std::vector<float>& centroids, int num_rows, int dim)
    : num_rows_(num_rows), dim_(dim) {
  ELDR_CHECK(num_rows >= 0 && dim >= 0 && centroids.size() == static_cast<size_t>(num_rows) * dim,
             "centroids are not [" << num_rows << ", " << dim << "]");
  rows_.resize(centroids.size());
  const int full_chunks = dim / kChunk;
  for (int k = 0; k < num_rows; ++k) {
    for (int x = 0; x < dim; ++x) {
      const size_t row = static_cast<size_t>(k) * dim;
      rows_[row + StoredIndex(x, full_chunks)] = RoundToBf16(centroids[row + x]);
    }
  }
}

float CentroidMatrix::value(int k, int x) const {
  return Bf16ToFloat(rows_[static_cast<size_t>(k) * dim_ + StoredIndex(x, dim_ / kChunk)]);
}

void CentroidMatrix::Dots(const float* s, float* out) const {
  const int full_chunks = dim_ / kChunk;
  const size_t stride = static_cast<size_t>(dim_);
  int k = 0;
#if defined(__AVX512F__)
  // Eight rows per pass: at four the same product took 17 % longer on this project's VMs (bench/README).
  for (; k + 8 <= num_rows_; k += 8) DotsAvx512<8>(rows_.data() + k * stride, stride, full_chunks, dim_, s, out + k);
  for (; k + 4 <= num_rows_; k += 4) DotsAvx512<4>(rows_.data() + k * stride, stride, full_chunks, dim_, s, out + k);
  for (; k < num_rows_; ++k) DotsAvx512<1>(rows_.data() + k * stride, stride, full_chunks, dim_, s, out + k);
#endif
  for (; k < num_rows_; ++k) DotPortable(rows_.data() + k * stride, full_chunks, dim_, s, out + k);
}

}  // namespace eldr
