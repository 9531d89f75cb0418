// A second implementation of the router's centroid product (runtime/router/centroid_matrix.h), written from its
// header's definitions only: the rounding to bfloat16 by comparing the two neighbouring bfloat16 values in double,
// and the product in the header's summation order with plain scalar fused multiply-adds.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace eldr {
namespace testing {

// The bfloat16 nearest to x (ties to the even one), as a float. REQUIRES: finite x.
inline float RoundToBf16Reference(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  const uint32_t down_bits = u & 0xFFFF0000u, up_bits = down_bits + 0x10000u;
  float down, up;
  std::memcpy(&down, &down_bits, sizeof(down));
  std::memcpy(&up, &up_bits, sizeof(up));
  // Past the largest finite bfloat16 the next value up is infinity, which rounding treats as 2^128.
  const double up_value = std::isinf(up) ? std::copysign(std::ldexp(1.0, 128), static_cast<double>(x)) : up;
  const double to_down = std::fabs(static_cast<double>(x) - down), to_up = std::fabs(up_value - x);
  if (to_down != to_up) return to_down < to_up ? down : up;
  return ((down_bits >> 16) & 1u) == 0 ? down : up;
}

// s·μ̂_k for every row k of centroids [K, D] in the header's order: 32 lanes, entry x < 32·⌊D/32⌋ into lane x mod 32,
// lanes summed pairwise (i, 16 + i) in ascending i, then the tail.
inline std::vector<float> CentroidDotsReference(const std::vector<float>& centroids, int K, int D, const float* s) {
  std::vector<float> out(K);
  const int full = D / 32 * 32;
  for (int k = 0; k < K; ++k) {
    const float* mu = centroids.data() + static_cast<size_t>(k) * D;
    float lanes[32] = {};
    for (int x = 0; x < full; ++x) lanes[x % 32] = std::fma(s[x], RoundToBf16Reference(mu[x]), lanes[x % 32]);
    float total = 0.f;
    for (int i = 0; i < 16; ++i) total += lanes[i] + lanes[16 + i];
    float tail = 0.f;
    for (int x = full; x < D; ++x) tail = std::fma(s[x], RoundToBf16Reference(mu[x]), tail);
    out[k] = total + tail;
  }
  return out;
}

}  // namespace testing
}  // namespace eldr
