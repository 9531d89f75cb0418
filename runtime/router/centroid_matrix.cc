#include "runtime/router/centroid_matrix.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/common/check.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define ELDR_CENTROIDS_VNNI 1
#include <immintrin.h>
#endif

#if defined(__FAST_MATH__)
#error "centroid_matrix.cc promises the header's float order for σ, which -ffast-math (reassociation) does not keep"
#endif

namespace eldr {
namespace {

constexpr int kLimit = 32767;  // |w|, |q| ≤ 32767: the header's overflow bound needs each factor ≤ 32767 + √D/2
constexpr int kNormLanes = 64;
constexpr int kChunk = 32;  // int16 entries per 512-bit register

int16_t Clamp(double x) { return static_cast<int16_t>(std::clamp(x, -double{kLimit}, double{kLimit})); }

// σ = Σ s_x² in the header's order.
float SquaredNorm(const float* s, int dim) {
  alignas(64) float lanes[kNormLanes] = {};
  const int full = dim / kNormLanes * kNormLanes;
  int x = 0;
#if defined(ELDR_CENTROIDS_VNNI)
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (; x < full; x += kNormLanes) {
    for (int j = 0; j < 4; ++j) {
      const __m512 v = _mm512_loadu_ps(s + x + 16 * j);
      acc[j] = _mm512_fmadd_ps(v, v, acc[j]);
    }
  }
  for (int j = 0; j < 4; ++j) _mm512_store_ps(lanes + 16 * j, acc[j]);
#else
  for (; x < full; ++x) lanes[x % kNormLanes] = std::fma(s[x], s[x], lanes[x % kNormLanes]);
#endif
  float sigma = 0.f;
  for (int i = 0; i < kNormLanes; ++i) sigma += lanes[i];
  for (x = full; x < dim; ++x) sigma = std::fma(s[x], s[x], sigma);
  return sigma;
}

// q_x = nearbyint(s_x · a), clamped.
void Quantise(const float* s, int dim, float a, int16_t* q) {
  int x = 0;
#if defined(ELDR_CENTROIDS_VNNI)
  const __m512 av = _mm512_set1_ps(a);
  const __m512i hi = _mm512_set1_epi32(kLimit), lo = _mm512_set1_epi32(-kLimit);
  for (; x + 16 <= dim; x += 16) {
    // cvtps2dq rounds as MXCSR says (to nearest even, as nearbyint under the default mode below).
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(s + x), av));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + x),
                        _mm512_cvtepi32_epi16(_mm512_max_epi32(_mm512_min_epi32(v, hi), lo)));
  }
#endif
  for (; x < dim; ++x) {
    const float p = s[x] * a;
    q[x] = Clamp(std::nearbyint(p));
  }
}

// Σ_{from ≤ x < dim} q_x·w_x. Every partial sum of the product is a sum over a subset of the entries, which the
// header's Cauchy-Schwarz bound keeps under 2^31, so int32 is exact (and the plain loop vectorises without VNNI).
int32_t DotTail(const int16_t* row, const int16_t* q, int from, int dim) {
  int32_t sum = 0;
  for (int x = from; x < dim; ++x) sum += static_cast<int32_t>(q[x]) * row[x];
  return sum;
}

// out = float((double(A) · r) / a), the header's last step, shared by both paths.
float Finish(int64_t dot, double step, float a) { return static_cast<float>((static_cast<double>(dot) * step) / a); }

#if defined(ELDR_CENTROIDS_VNNI)
// kRows rows at once, so each chunk of q is loaded once for all of them; 16 int32 lanes per row, summed in int64
// (exact in any order).
template <int kRows>
void DotsVnni(const int16_t* rows, const double* steps, int dim, const int16_t* q, float a, float* out) {
  const int full_chunks = dim / kChunk;
  __m512i acc[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_si512();
  for (int c = 0; c < full_chunks; ++c) {
    const __m512i qv = _mm512_loadu_si512(q + static_cast<size_t>(c) * kChunk);
    for (int r = 0; r < kRows; ++r) {
      const int16_t* w = rows + static_cast<size_t>(r) * dim + static_cast<size_t>(c) * kChunk;
      acc[r] = _mm512_dpwssd_epi32(acc[r], qv, _mm512_loadu_si512(w));
    }
  }
  for (int r = 0; r < kRows; ++r) {
    alignas(64) int32_t lanes[16];
    _mm512_store_si512(lanes, acc[r]);
    int64_t dot = 0;
    for (const int32_t lane : lanes) dot += lane;
    const int64_t tail = DotTail(rows + static_cast<size_t>(r) * dim, q, full_chunks * kChunk, dim);
    out[r] = Finish(dot + tail, steps[r], a);
  }
}
#endif

}  // namespace

CentroidMatrix::CentroidMatrix(const std::vector<float>& centroids, int num_rows, int dim)
    : num_rows_(num_rows), dim_(dim) {
  ELDR_CHECK(num_rows >= 0 && dim >= 0 && centroids.size() == static_cast<size_t>(num_rows) * dim,
             "centroids are not [" << num_rows << ", " << dim << "]");
  rows_.assign(centroids.size(), 0);
  steps_.assign(num_rows, 0.0);
  for (int k = 0; k < num_rows; ++k) {
    const float* mu = centroids.data() + static_cast<size_t>(k) * dim;
    double n2 = 0;
    for (int x = 0; x < dim; ++x) {
      ELDR_CHECK(std::isfinite(mu[x]), "centroid " << k << " entry " << x << " is not finite");
      n2 += static_cast<double>(mu[x]) * mu[x];
    }
    const double n = std::sqrt(n2);
    if (!(n > 0)) continue;
    const double scale = kLimit / n;
    for (int x = 0; x < dim; ++x) rows_[static_cast<size_t>(k) * dim + x] = Clamp(std::nearbyint(mu[x] * scale));
    steps_[k] = n / kLimit;
  }
}

double CentroidMatrix::value(int k, int x) const { return steps_[k] * rows_[static_cast<size_t>(k) * dim_ + x]; }

void CentroidMatrix::Dots(const float* s, float* out, std::vector<int16_t>* scratch) const {
  const float sigma = SquaredNorm(s, dim_);
  if (!std::isfinite(sigma) || sigma == 0.f) {
    std::fill(out, out + num_rows_, sigma == 0.f ? 0.f : std::numeric_limits<float>::quiet_NaN());
    return;
  }
  const float a = kLimit / std::sqrt(sigma);
  scratch->resize(dim_);
  Quantise(s, dim_, a, scratch->data());
  const int16_t* q = scratch->data();
  const size_t stride = static_cast<size_t>(dim_);
  int k = 0;
#if defined(ELDR_CENTROIDS_VNNI)
  // Eight rows per pass (four: 7 % slower on this project's VM).
  for (; k + 8 <= num_rows_; k += 8) DotsVnni<8>(rows_.data() + k * stride, &steps_[k], dim_, q, a, out + k);
  for (; k + 4 <= num_rows_; k += 4) DotsVnni<4>(rows_.data() + k * stride, &steps_[k], dim_, q, a, out + k);
  for (; k < num_rows_; ++k) DotsVnni<1>(rows_.data() + k * stride, &steps_[k], dim_, q, a, out + k);
#endif
  for (; k < num_rows_; ++k) out[k] = Finish(DotTail(rows_.data() + k * stride, q, 0, dim_), steps_[k], a);
}

}  // namespace eldr
