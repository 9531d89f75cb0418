// The router's bfloat16 centroid matrix (runtime/router/centroid_matrix.h): the rounding on hand-computed values,
// the product bit for bit against a second implementation of the header's order (tests/unit/centroid_reference.h)
// on every remainder of rows and dimensions the kernel handles apart, and the rounding's bound on a distance.
#include "runtime/router/centroid_matrix.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "tests/unit/centroid_reference.h"

#if defined(ELDR_EXPECT_PORTABLE_CENTROID_PRODUCT) && defined(__AVX512F__)
#error "centroid_matrix_portable_test must be built without AVX-512 (tests/CMakeLists.txt)"
#endif

namespace eldr {
namespace {

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

TEST(CentroidMatrix, RoundsToNearestEvenBfloat16) {
  EXPECT_EQ(CentroidMatrix::RoundToBf16(1.f), 0x3F80);
  EXPECT_EQ(CentroidMatrix::RoundToBf16(-1.5f), 0xBFC0);
  EXPECT_EQ(CentroidMatrix::RoundToBf16(0.f), 0x0000);
  // 1 + 2^-8 lies halfway between 1 (0x3F80, even) and 1 + 2^-7 (0x3F81): to the even one.
  EXPECT_EQ(CentroidMatrix::RoundToBf16(1.f + std::ldexp(1.f, -8)), 0x3F80);
  // 1 + 3·2^-8 lies halfway between 0x3F81 (odd) and 1 + 2^-6 (0x3F82): to the even one, up.
  EXPECT_EQ(CentroidMatrix::RoundToBf16(1.f + 3 * std::ldexp(1.f, -8)), 0x3F82);
  // Just above the halfway point: up.
  EXPECT_EQ(CentroidMatrix::RoundToBf16(1.f + std::ldexp(1.f, -8) + std::ldexp(1.f, -20)), 0x3F81);
  // The largest float below 2 rounds up into the next binade: 2.
  EXPECT_EQ(CentroidMatrix::RoundToBf16(std::nextafter(2.f, 0.f)), 0x4000);
  EXPECT_EQ(CentroidMatrix::Bf16ToFloat(0x3F81), 1.f + std::ldexp(1.f, -7));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  for (int i = 0; i < 100000; ++i) {
    const float x = std::ldexp(u(rng), static_cast<int>(rng() % 40) - 30);
    const float rounded = CentroidMatrix::Bf16ToFloat(CentroidMatrix::RoundToBf16(x));
    ASSERT_EQ(Bits(rounded), Bits(testing::RoundToBf16Reference(x))) << x;
    ASSERT_LE(std::fabs(rounded - x), std::ldexp(std::fabs(x), -8)) << x;  // 8 significant bits
  }
}

std::vector<float> RandomCentroids(int K, int D, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<float> c(static_cast<size_t>(K) * D);
  for (int k = 0; k < K; ++k) {
    double n2 = 0;
    for (int x = 0; x < D; ++x) n2 += std::pow(c[k * D + x] = u(rng) < 0.3f ? 0.f : u(rng), 2);
    for (int x = 0; x < D; ++x) c[k * D + x] /= n2 > 0 ? static_cast<float>(std::sqrt(n2)) : 1.f;
  }
  return c;
}

// Rows 1..17 (passes of eight, four and one row, and every remainder after them), dimensions with no full chunk,
// whole chunks only, and both.
TEST(CentroidMatrix, DotsEqualTheReferenceOrderBitForBit) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (const int D : {1, 31, 32, 64, 100, 6144, 6145}) {
    for (int K = 1; K <= 17; ++K) {
      const std::vector<float> centroids = RandomCentroids(K, D, rng);
      const CentroidMatrix m(centroids, K, D);
      ASSERT_EQ(m.bytes(), static_cast<size_t>(K) * D * 2);
      for (int k = 0; k < K; ++k) {
        for (int x = 0; x < D; ++x) {
          ASSERT_EQ(Bits(m.value(k, x)), Bits(testing::RoundToBf16Reference(centroids[k * D + x])));
        }
      }
      std::vector<float> s(D);
      for (auto& x : s) x = u(rng) < 0.2f ? 0.f : u(rng);
      std::vector<float> out(K, -1.f);
      m.Dots(s.data(), out.data());
      const std::vector<float> expected = testing::CentroidDotsReference(centroids, K, D, s.data());
      for (int k = 0; k < K; ++k) ASSERT_EQ(Bits(out[k]), Bits(expected[k])) << "D " << D << " K " << K << " k " << k;
    }
  }
}

// |s·μ̂ − s·μ| ≤ 2^-8 Σ|s_x μ_x| from the rounding (header), plus the float sums' own error, which is far below it
// here: the gap to the exact product of the unrounded float centroids, computed in double.
TEST(CentroidMatrix, RoundingMovesADistanceByAtMostTwoToTheMinusEightOfTheProduct) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  const int K = 40, D = 6144;
  const std::vector<float> centroids = RandomCentroids(K, D, rng);
  const CentroidMatrix m(centroids, K, D);
  double worst = 0;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> s(D);
    double n2 = 0;
    for (auto& x : s) n2 += std::pow(x = u(rng) < 0.1f ? 0.f : u(rng), 2);
    for (auto& x : s) x /= static_cast<float>(std::sqrt(n2));
    std::vector<float> out(K);
    m.Dots(s.data(), out.data());
    for (int k = 0; k < K; ++k) {
      double exact = 0, magnitude = 0;
      for (int x = 0; x < D; ++x) {
        exact += static_cast<double>(s[x]) * centroids[k * D + x];
        magnitude += std::fabs(static_cast<double>(s[x]) * centroids[k * D + x]);
      }
      const double gap = std::fabs(out[k] - exact);
      ASSERT_LE(gap, std::ldexp(magnitude, -8) + 1e-6) << "k " << k;
      worst = std::max(worst, gap / magnitude);
    }
  }
  RecordProperty("worst_relative_gap", std::to_string(worst));
}

}  // namespace
}  // namespace eldr
