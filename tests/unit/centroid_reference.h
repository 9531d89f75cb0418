// A second implementation of the router's centroid product (runtime/router/centroid_matrix.h), written from its
// header's definition only, with scalar arithmetic: the rows and the signature quantised to 16-bit fixed point, the
// integer products summed in int64 in plain order (integer sums do not depend on it), the header's last step.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace eldr {
namespace testing {

// w_k,x and r_k of the header for one row of D entries.
inline std::vector<int> QuantiseRowReference(const float* mu, int D, double* step) {
  double n2 = 0;
  for (int x = 0; x < D; ++x) n2 += static_cast<double>(mu[x]) * mu[x];
  const double n = std::sqrt(n2);
  std::vector<int> w(D, 0);
  *step = 0;
  if (n == 0) return w;
  for (int x = 0; x < D; ++x)
    w[x] = static_cast<int>(std::clamp(std::nearbyint(mu[x] * (32767 / n)), -32767.0, 32767.0));
  *step = n / 32767;
  return w;
}

// ŝ·μ̂_k for every row k of centroids [K, D].
inline std::vector<float> CentroidDotsReference(const std::vector<float>& centroids, int K, int D, const float* s) {
  float lanes[64] = {};
  const int full = D / 64 * 64;
  for (int x = 0; x < full; ++x) lanes[x % 64] = std::fma(s[x], s[x], lanes[x % 64]);
  float sigma = 0.f;
  for (int i = 0; i < 64; ++i) sigma += lanes[i];
  for (int x = full; x < D; ++x) sigma = std::fma(s[x], s[x], sigma);
  std::vector<float> out(K, 0.f);
  if (sigma == 0.f) return out;
  if (!std::isfinite(sigma)) return std::vector<float>(K, std::numeric_limits<float>::quiet_NaN());
  const float a = 32767 / std::sqrt(sigma);
  std::vector<int> q(D);
  for (int x = 0; x < D; ++x) {
    const float p = s[x] * a;
    q[x] = static_cast<int>(std::clamp(static_cast<double>(std::nearbyint(p)), -32767.0, 32767.0));
  }
  for (int k = 0; k < K; ++k) {
    double step;
    const std::vector<int> w = QuantiseRowReference(centroids.data() + static_cast<size_t>(k) * D, D, &step);
    int64_t dot = 0;
    for (int x = 0; x < D; ++x) dot += static_cast<int64_t>(q[x]) * w[x];
    out[k] = static_cast<float>((static_cast<double>(dot) * step) / a);
  }
  return out;
}

}  // namespace testing
}  // namespace eldr
