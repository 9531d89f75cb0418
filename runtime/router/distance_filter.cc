#include "runtime/router/distance_filter.h"

#include <immintrin.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>

namespace eldr {

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A lane of int32 sums at most this many pairs of products (2·kQuant² each) before it is added into int64:
// 15 · 2 · 8191² = 2 012 774 430 < 2^31.
constexpr int kFlushEvery = 15;
static_assert(static_cast<int64_t>(kFlushEvery) * 2 * DistanceFilter::kQuant * DistanceFilter::kQuant <
              (int64_t{1} << 31));

#if defined(__AVX512BW__)
inline __m512i MaddAdd(__m512i acc, __m512i a, __m512i b) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, a, b);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

inline void Flush(__m512i& acc32, __m512i& acc64) {
  acc64 = _mm512_add_epi64(acc64, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(acc32)));
  acc64 = _mm512_add_epi64(acc64, _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(acc32, 1)));
  acc32 = _mm512_setzero_si512();
}

inline int64_t ReduceAdd64(__m512i v) {
  alignas(64) int64_t lanes[8];
  _mm512_store_si512(lanes, v);
  int64_t sum = 0;
  for (int64_t x : lanes) sum += x;
  return sum;
}
#endif

// out[r] = Σ_i s[i] · rows[r·D + i] for r < NR, exactly (integer arithmetic: any order gives the same sum).
template <int NR>
void DotRows(const int16_t* s, const int16_t* rows, int D, int64_t* out) {
  int i = 0;
  int64_t sum[NR] = {};
#if defined(__AVX512BW__)
  __m512i acc32[NR], acc64[NR];
  for (int r = 0; r < NR; ++r) acc32[r] = acc64[r] = _mm512_setzero_si512();
  int pending = 0;
  for (; i + 32 <= D; i += 32) {
    const __m512i x = _mm512_loadu_si512(s + i);
    for (int r = 0; r < NR; ++r) {
      acc32[r] = MaddAdd(acc32[r], x, _mm512_loadu_si512(rows + static_cast<size_t>(r) * D + i));
    }
    if (++pending == kFlushEvery) {
      for (int r = 0; r < NR; ++r) Flush(acc32[r], acc64[r]);
      pending = 0;
    }
  }
  for (int r = 0; r < NR; ++r) {
    Flush(acc32[r], acc64[r]);
    sum[r] = ReduceAdd64(acc64[r]);
  }
#endif
  for (; i < D; ++i) {
    for (int r = 0; r < NR; ++r) sum[r] += static_cast<int32_t>(s[i]) * rows[static_cast<size_t>(r) * D + i];
  }
  for (int r = 0; r < NR; ++r) out[r] = sum[r];
}

// γ_m = m·u / (1 − m·u), u = 2^-24: |fl(Σ x_i y_i) − Σ x_i y_i| <= γ_m Σ |x_i y_i| when every term passes through
// at most m roundings (Higham, Accuracy and Stability of Numerical Algorithms, §3.1; FMA rounds once per step).
double GammaFloat(double m) {
  const double mu = m * 0x1p-24;
  return mu / (1 - mu);
}

constexpr double kUp = 1 + 1e-9;  // covers the double roundings of the norms and scales below

}  // namespace

DistanceFilter::DistanceFilter(const std::vector<float>& centroids, int K, int D) : K_(K), D_(D) {
  // Eigen's row-major product accumulates one packet per row and reduces it; a row count of 1 becomes an inner
  // product and a D that leaves a remainder adds half packets: then the exact rows below would not be the full
  // product's, so the filter stays off.
  if (K < 2 || D < 16 || D % 16 != 0 || centroids.size() != static_cast<size_t>(K) * D) return;
  for (float x : centroids) {
    if (!std::isfinite(x)) return;
  }
  quant_.resize(centroids.size());
  scale_.assign(K, 0);
  norm_.assign(K, 0);
  residual_.assign(K, 0);
  for (int k = 0; k < K; ++k) {
    const float* mu = centroids.data() + static_cast<size_t>(k) * D;
    int16_t* q = quant_.data() + static_cast<size_t>(k) * D;
    double amax = 0, n2 = 0, e2 = 0;
    for (int i = 0; i < D; ++i) amax = std::max(amax, std::fabs(static_cast<double>(mu[i])));
    scale_[k] = amax / kQuant;
    for (int i = 0; i < D; ++i) {
      const double x = mu[i];
      const double v = amax > 0 ? std::clamp(std::nearbyint(x / scale_[k]), -1.0 * kQuant, 1.0 * kQuant) : 0.0;
      q[i] = static_cast<int16_t>(v);
      n2 += x * x;
      e2 += (x - scale_[k] * v) * (x - scale_[k] * v);
    }
    norm_[k] = std::sqrt(n2) * kUp;
    residual_[k] = std::sqrt(e2) * kUp;
  }
  const int packet = Eigen::internal::packet_traits<float>::size;
  gamma_ = GammaFloat(static_cast<double>(D) / packet + 16);
  sig_quant_.assign(D, 0);
  lo_.assign(K, 0);
  hi_.assign(K, 0);
  exact_.assign(K, 0);
  known_.assign(K, 0);
  enabled_ = true;
}

bool DistanceFilter::Prepare(const float* s, const float* centroids) {
  const int D = D_, K = K_;
  // max |s_i|, Σ s_i² (8 double lanes), and whether every entry is finite.
  float amax = 0.f;
  bool finite = true;
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < D; i += 8) {
    for (int l = 0; l < 8; ++l) {
      const float x = s[i + l];
      finite &= std::fabs(x) <= std::numeric_limits<float>::max();
      amax = std::max(amax, std::fabs(x));
      lane[l] += static_cast<double>(x) * x;
    }
  }
  if (!finite || !(amax > 0.f)) return false;
  const double n2 = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  const double s_norm = std::sqrt(n2) * kUp;
  // q_i = round(s_i · inv): |s_i · inv − s_i / scale| <= kQuant · 2^-23 (two float roundings) < 0.001, so
  // |s_i − scale · q_i| <= 0.502 · scale and ‖s − s̃‖ <= 0.502 · scale · √D.
  const double s_scale = static_cast<double>(amax) / kQuant;
  const float inv = static_cast<float>(kQuant / static_cast<double>(amax));
  for (int i = 0; i < D; ++i) {
    const float v = std::clamp(std::nearbyint(s[i] * inv), -1.0f * kQuant, 1.0f * kQuant);
    sig_quant_[i] = static_cast<int16_t>(v);
  }
  const double s_residual = 0.502 * s_scale * std::sqrt(static_cast<double>(D)) * kUp;
  int64_t dots[4];
  int k = 0;
  auto bound = [&](int row, int64_t dot) {
    const double approx = s_scale * scale_[row] * static_cast<double>(dot);
    double rad = gamma_ * s_norm * norm_[row] + s_residual * norm_[row] + (s_norm + s_residual) * residual_[row];
    rad = rad * (1 + 1e-6) + 1e-14 * (1 + std::fabs(approx));
    lo_[row] = 1.0 - (approx + rad);
    hi_[row] = 1.0 - (approx - rad);
  };
  for (; k + 4 <= K; k += 4) {
    DotRows<4>(sig_quant_.data(), quant_.data() + static_cast<size_t>(k) * D, D, dots);
    for (int r = 0; r < 4; ++r) bound(k + r, dots[r]);
  }
  for (; k < K; ++k) {
    DotRows<1>(sig_quant_.data(), quant_.data() + static_cast<size_t>(k) * D, D, dots);
    bound(k, dots[0]);
  }
  std::fill(known_.begin(), known_.end(), 0);
  s_ = s;
  centroids_ = centroids;
  exact_rows_ = 0;
  nearest_ = -1;
  return true;
}

void DistanceFilter::ComputeExact(int k) {
  // Rows k and a neighbour through Eigen's row-major kernel (two rows: a one-row product is an inner product,
  // summed in another order), each bit for bit as in the full K-row product.
  const int a = std::min(k, k + 1 < K_ ? k + 1 : k - 1);
  Eigen::Map<const RowMatrix> M(centroids_ + static_cast<size_t>(a) * D_, 2, D_);
  Eigen::Map<const Eigen::VectorXf> s(s_, D_);
  alignas(64) float pair[16];  // a packet's room: GCC cannot prove Eigen's packet paths dead for a size-2 map
  Eigen::Map<Eigen::VectorXf> dots(pair, 2);
  dots.noalias() = M * s;
  for (int r = 0; r < 2; ++r) {
    exact_[a + r] = 1.0 - static_cast<double>(pair[r]);
    lo_[a + r] = hi_[a + r] = exact_[a + r];
    known_[a + r] = 1;
  }
  exact_rows_ += 2;
}

double DistanceFilter::Value(int k) {
  if (!known_[k]) ComputeExact(k);
  return exact_[k];
}

int DistanceFilter::Nearest() {
  if (nearest_ >= 0) return nearest_;
  // Every row whose lower bound reaches the least upper bound is a candidate; the others are farther for sure.
  double m = std::numeric_limits<double>::infinity();
  for (int k = 0; k < K_; ++k) m = std::min(m, hi_[k]);
  int best = -1;
  double best_d = 0;
  for (int k = 0; k < K_; ++k) {
    if (!(lo_[k] <= m)) continue;
    const double d = Value(k);
    if (best < 0 || d < best_d) {
      best = k;
      best_d = d;
    }
  }
  nearest_ = best;
  return best;
}

bool DistanceFilter::Less(int a, int b) {
  if (hi_[a] < lo_[b]) return true;
  if (lo_[a] >= hi_[b]) return false;
  return Value(a) < Value(b);
}

bool DistanceFilter::AtMost(int k, double x) {
  if (hi_[k] <= x) return true;
  if (lo_[k] > x) return false;
  return Value(k) <= x;
}

}  // namespace eldr
