#include "runtime/router/int8_centroids.h"

#include <algorithm>
#include <cmath>

#include "runtime/common/check.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define ELDR_INT8_VNNI 1
#endif

namespace eldr {

namespace {

constexpr int kPad = 64;            // bytes per VNNI step
constexpr int64_t kMaxDim = 66000;  // 255 · 127 · D < 2^31

// out[r] = Σ_i t_i · q[r][i] over n (a multiple of kPad) for rows r of `rows` (2 or 1).
#if defined(ELDR_INT8_VNNI)
void DotRows2(const uint8_t* t, const int8_t* q0, const int8_t* q1, int n, int32_t* out) {
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  for (int i = 0; i < n; i += kPad) {
    // Eight lines ahead: the rows stream from L2, and two streams alone do not keep enough loads in flight.
    _mm_prefetch(reinterpret_cast<const char*>(q0 + i + 512), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(q1 + i + 512), _MM_HINT_T0);
    const __m512i x = _mm512_loadu_si512(t + i);
    a0 = _mm512_dpbusd_epi32(a0, x, _mm512_loadu_si512(q0 + i));
    a1 = _mm512_dpbusd_epi32(a1, x, _mm512_loadu_si512(q1 + i));
  }
  out[0] = _mm512_reduce_add_epi32(a0);
  out[1] = _mm512_reduce_add_epi32(a1);
}
int32_t DotRow(const uint8_t* t, const int8_t* q, int n) {
  __m512i a = _mm512_setzero_si512();
  for (int i = 0; i < n; i += kPad) a = _mm512_dpbusd_epi32(a, _mm512_loadu_si512(t + i), _mm512_loadu_si512(q + i));
  return _mm512_reduce_add_epi32(a);
}
#else
int32_t DotRow(const uint8_t* t, const int8_t* q, int n) {
  int32_t s = 0;
  for (int i = 0; i < n; ++i) s += static_cast<int32_t>(t[i]) * static_cast<int32_t>(q[i]);
  return s;
}
void DotRows2(const uint8_t* t, const int8_t* q0, const int8_t* q1, int n, int32_t* out) {
  out[0] = DotRow(t, q0, n);
  out[1] = DotRow(t, q1, n);
}
#endif

}  // namespace

Int8Centroids::Int8Centroids(const std::vector<float>& centroids, int num_centroids, int dim)
    : num_centroids_(num_centroids), dim_(dim), padded_((dim + kPad - 1) / kPad * kPad) {
  ELDR_CHECK(num_centroids >= 0 && dim >= 0 && centroids.size() == static_cast<size_t>(num_centroids) * dim,
             "Int8Centroids: " << centroids.size() << " values for " << num_centroids << " x " << dim);
  q_.assign(static_cast<size_t>(num_centroids) * padded_, 0);
  scale_.assign(num_centroids, 0.0);
  abs_sum_.assign(num_centroids, 0);
  t_.assign(padded_, 0);
  for (int k = 0; k < num_centroids; ++k) {
    const float* mu = centroids.data() + static_cast<size_t>(k) * dim;
    double amax = 0;
    for (int i = 0; i < dim; ++i) amax = std::max(amax, std::fabs(static_cast<double>(mu[i])));
    if (!(amax > 0)) continue;  // a zero row: every dot is exactly 0
    const double a = amax / 127.0;
    scale_[k] = a;
    int8_t* q = q_.data() + static_cast<size_t>(k) * padded_;
    for (int i = 0; i < dim; ++i) {
      const double v = std::clamp(std::nearbyint(static_cast<double>(mu[i]) / a), -127.0, 127.0);
      q[i] = static_cast<int8_t>(v);
      abs_sum_[k] += std::abs(static_cast<int>(q[i]));
    }
  }
}

bool Int8Centroids::Dots(const float* s, double* dots, double* bounds) {
  if (dim_ >= kMaxDim) return false;
  // max and the sign check in one pass; !(x >= 0) also catches NaN.
  float smax = 0.f;
  bool bad = false;
#if defined(ELDR_INT8_VNNI)
  {
    __m512 m = _mm512_setzero_ps();
    __mmask16 neg = 0;
    for (int i = 0; i < dim_; i += 16) {
      const __mmask16 lanes = dim_ - i >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (dim_ - i)) - 1);
      const __m512 x = _mm512_maskz_loadu_ps(lanes, s + i);
      m = _mm512_max_ps(m, x);
      neg |= _mm512_mask_cmp_ps_mask(lanes, x, _mm512_setzero_ps(), _CMP_NGE_UQ);
    }
    smax = _mm512_reduce_max_ps(m);
    bad = neg != 0;
  }
#else
  for (int i = 0; i < dim_; ++i) {
    smax = std::max(smax, s[i]);
    bad |= !(s[i] >= 0.f);
  }
#endif
  if (bad || !std::isfinite(smax)) return false;
  if (smax == 0.f) {  // the zero signature: every dot is exactly 0
    std::fill(dots, dots + num_centroids_, 0.0);
    if (bounds) std::fill(bounds, bounds + num_centroids_, 0.0);
    return true;
  }
  const float inv = 255.f / smax;
  if (!std::isfinite(inv)) return false;  // a subnormal maximum
  int64_t t_sum = 0;
#if defined(ELDR_INT8_VNNI)
  {
    const __m512 vinv = _mm512_set1_ps(inv), top = _mm512_set1_ps(255.f);
    __m512i total = _mm512_setzero_si512();
    for (int i = 0; i < dim_; i += 16) {
      const __mmask16 lanes = dim_ - i >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (dim_ - i)) - 1);
      const __m512 x = _mm512_maskz_loadu_ps(lanes, s + i);
      const __m512 v = _mm512_min_ps(top, _mm512_roundscale_ps(_mm512_mul_ps(x, vinv), _MM_FROUND_TO_NEAREST_INT));
      const __m512i n = _mm512_cvtps_epi32(v);
      total = _mm512_add_epi32(total, n);
      _mm_mask_storeu_epi8(t_.data() + i, lanes, _mm512_cvtusepi32_epi8(n));
    }
    t_sum = _mm512_reduce_add_epi32(total);  // ≤ 255 · D < 2^31
  }
#else
  for (int i = 0; i < dim_; ++i) {
    const float v = std::min(255.f, std::nearbyint(s[i] * inv));
    t_[i] = static_cast<uint8_t>(v);
    t_sum += t_[i];
  }
#endif
  const double b = static_cast<double>(smax) / 255.0;
  int32_t sums[2];
  int k = 0;
  for (; k + 2 <= num_centroids_; k += 2) {
    const int8_t* q0 = q_.data() + static_cast<size_t>(k) * padded_;
    DotRows2(t_.data(), q0, q0 + padded_, padded_, sums);
    dots[k] = scale_[k] * b * sums[0];
    dots[k + 1] = scale_[k + 1] * b * sums[1];
  }
  if (k < num_centroids_)
    dots[k] = scale_[k] * b * DotRow(t_.data(), q_.data() + static_cast<size_t>(k) * padded_, padded_);
  if (bounds) {
    // The quantisation steps are within 1/2 + 3e-5 of a unit (s_i · inv in float); 1e-3 covers them and the
    // rounding of the products above.
    for (int j = 0; j < num_centroids_; ++j) {
      bounds[j] = scale_[j] * b * (static_cast<double>(t_sum) + static_cast<double>(abs_sum_[j]) + dim_ / 2.0) / 2.0 *
                  (1 + 1e-3);
    }
  }
  return true;
}

}  // namespace eldr
