// The router's 16-bit fixed-point centroid matrix (runtime/router/centroid_matrix.h): a hand-computed product, the
// product bit for bit against a second implementation of the header's definition (tests/unit/centroid_reference.h)
// on every remainder of rows and dimensions the kernel handles apart, the header's error bound, the overflow bound at
// its extremes, and the degenerate inputs.
#include "runtime/router/centroid_matrix.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "runtime/common/check.h"
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

// μ = (0.75, 1, 0): ‖μ‖ = 1.25, w = nearbyint(μ · 32767/1.25) = (19660 [19660.2], 26214 [26213.6], 0).
// s = (3, 4, 0): σ = 25, a = 32767/5 = 6553.4, q = (19660 [19660.2], 26214 [26213.6], 0).
// A = 19660² + 26214² = 1 073 689 396 (< 2^31); out = A · (1.25/32767) / 6553.4 = 6.250076…, against s·μ = 6.25.
TEST(CentroidMatrix, HandComputedProduct) {
  const CentroidMatrix m({0.75f, 1.f, 0.f}, 1, 3);
  EXPECT_DOUBLE_EQ(m.value(0, 0), 19660 * 1.25 / 32767);
  EXPECT_DOUBLE_EQ(m.value(0, 1), 26214 * 1.25 / 32767);
  EXPECT_EQ(m.value(0, 2), 0.0);
  const float s[3] = {3.f, 4.f, 0.f};
  float out = 0;
  std::vector<int16_t> scratch;
  m.Dots(s, &out, &scratch);
  ASSERT_EQ(scratch.size(), 3u);
  EXPECT_EQ(scratch[0], 19660);
  EXPECT_EQ(scratch[1], 26214);
  EXPECT_EQ(scratch[2], 0);
  const double expected = 1073689396.0 * (1.25 / 32767) / static_cast<double>(32767 / std::sqrt(25.f));
  EXPECT_FLOAT_EQ(out, static_cast<float>(expected));
  EXPECT_NEAR(out, 6.2500764, 1e-6);
  // The header's bound: (0.51/a)·‖μ̂‖₁ + 0.5·r·‖s‖₁ = 0.51/6553.4 · 1.75 + 0.5 · 1.25/32767 · 7 ≈ 2.7e-4.
  EXPECT_LE(std::fabs(out - 6.25), 2.7e-4);
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

// Rows 1..17 (passes of eight, four and one row, and every remainder after them), dimensions with no full register
// of 32 or 64 entries, whole ones only, and both; signatures neither normalised nor non-negative.
TEST(CentroidMatrix, DotsEqualTheReferenceBitForBit) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> u(-0.5f, 2.f);
  for (const int D : {1, 31, 32, 63, 64, 100, 6144, 6145}) {
    for (int K = 1; K <= 17; ++K) {
      const std::vector<float> centroids = RandomCentroids(K, D, rng);
      const CentroidMatrix m(centroids, K, D);
      ASSERT_EQ(m.bytes(), static_cast<size_t>(K) * D * 2);
      for (int k = 0; k < K; ++k) {
        double step;
        const std::vector<int> w = testing::QuantiseRowReference(centroids.data() + k * D, D, &step);
        for (int x = 0; x < D; ++x) ASSERT_EQ(m.value(k, x), step * w[x]) << "k " << k << " x " << x;
      }
      std::vector<float> s(D);
      for (auto& x : s) x = u(rng) < 0.f ? 0.f : u(rng);
      std::vector<float> out(K, -1.f);
      std::vector<int16_t> scratch;
      m.Dots(s.data(), out.data(), &scratch);
      const std::vector<float> expected = testing::CentroidDotsReference(centroids, K, D, s.data());
      for (int k = 0; k < K; ++k) ASSERT_EQ(Bits(out[k]), Bits(expected[k])) << "D " << D << " K " << K << " k " << k;
    }
  }
}

// The header's bound against the exact product of the float inputs (double), on unit-norm non-negative signatures
// and centroids of the benchmark's size; and the typical gap, far below it because the rounding errors' signs vary.
TEST(CentroidMatrix, GapToTheExactProductWithinTheHeadersBound) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  const int K = 40, D = 6144;
  const std::vector<float> centroids = RandomCentroids(K, D, rng);
  const CentroidMatrix m(centroids, K, D);
  std::vector<double> gaps;
  double worst_bound = 0;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> s(D);
    double n2 = 0;
    for (auto& x : s) n2 += std::pow(x = u(rng) < 0.1f ? 0.f : u(rng), 2);
    for (auto& x : s) x /= static_cast<float>(std::sqrt(n2));
    std::vector<float> out(K);
    std::vector<int16_t> scratch;
    m.Dots(s.data(), out.data(), &scratch);
    float sigma = 0;
    for (const float x : s) sigma += x * x;
    const double a = 32767 / std::sqrt(static_cast<double>(sigma));
    for (int k = 0; k < K; ++k) {
      double exact = 0, mu_hat_l1 = 0, s_l1 = 0, mu_n2 = 0;
      for (int x = 0; x < D; ++x) {
        exact += static_cast<double>(s[x]) * centroids[k * D + x];
        mu_n2 += static_cast<double>(centroids[k * D + x]) * centroids[k * D + x];
        mu_hat_l1 += std::fabs(m.value(k, x));
        s_l1 += std::fabs(s[x]);
      }
      const double bound =
          0.51 / a * mu_hat_l1 + 0.5 * (std::sqrt(mu_n2) / 32767) * s_l1 + std::ldexp(std::fabs(out[k]), -24);
      const double gap = std::fabs(out[k] - exact);
      ASSERT_LE(gap, bound) << "trial " << trial << " k " << k;
      ASSERT_LE(bound, std::sqrt(static_cast<double>(D)) / 32767 * 1.02);  // the header's ≤ √D/32767 for unit norms
      gaps.push_back(gap);
      worst_bound = std::max(worst_bound, bound);
    }
  }
  std::sort(gaps.begin(), gaps.end());
  const double median = gaps[gaps.size() / 2];
  EXPECT_LT(median, 1e-4);  // the header's "~10^-5": against a worst-case bound of ~0.002 here
  RecordProperty("median_gap", std::to_string(median));
  RecordProperty("max_gap", std::to_string(gaps.back()));
  RecordProperty("worst_bound", std::to_string(worst_bound));
}

// Cauchy-Schwarz at equality: s = μ with every entry equal (each product as large as the norms allow) and s = ±e_0
// (one product of 32767²): no overflow, the product is ±1 to float precision; a long dense row too.
TEST(CentroidMatrix, ExtremesOfTheOverflowBound) {
  for (const int D : {1, 2, 6144, 100000}) {
    const std::vector<float> mu(D, 1.f / std::sqrt(static_cast<float>(D)));
    const CentroidMatrix m(mu, 1, D);
    float out = 0;
    std::vector<int16_t> scratch;
    m.Dots(mu.data(), &out, &scratch);
    EXPECT_NEAR(out, 1.0, std::sqrt(static_cast<double>(D)) / 32767) << "D " << D;
    std::vector<float> neg(mu);
    for (auto& x : neg) x = -x;
    m.Dots(neg.data(), &out, &scratch);
    EXPECT_NEAR(out, -1.0, std::sqrt(static_cast<double>(D)) / 32767) << "D " << D;
  }
  std::vector<float> e0(64, 0.f);
  e0[0] = 1.f;
  const CentroidMatrix m(e0, 1, 64);
  float out = 0;
  std::vector<int16_t> scratch;
  m.Dots(e0.data(), &out, &scratch);
  EXPECT_NEAR(out, 1.0, 1e-7);
  e0[0] = -1.f;
  m.Dots(e0.data(), &out, &scratch);
  EXPECT_NEAR(out, -1.0, 1e-7);
}

TEST(CentroidMatrix, DegenerateInputs) {
  const CentroidMatrix m({0.f, 0.f, 0.f, 1.f, 2.f, 3.f}, 2, 3);  // row 0 is zero
  std::vector<int16_t> scratch;
  float out[2] = {-1.f, -1.f};
  const float zero[3] = {0.f, 0.f, 0.f};
  m.Dots(zero, out, &scratch);  // a zero signature is at the same distance from every centroid
  EXPECT_EQ(out[0], 0.f);
  EXPECT_EQ(out[1], 0.f);
  const float s[3] = {1.f, 1.f, 1.f};
  m.Dots(s, out, &scratch);
  EXPECT_EQ(out[0], 0.f);
  EXPECT_NEAR(out[1], 6.0, 6.0 * 1e-3);
  const float nan[3] = {1.f, std::numeric_limits<float>::quiet_NaN(), 0.f};
  m.Dots(nan, out, &scratch);
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1]));
  EXPECT_THROW(CentroidMatrix({1.f, std::numeric_limits<float>::infinity()}, 1, 2), Error);
  const CentroidMatrix empty({}, 0, 0);
  EXPECT_EQ(empty.bytes(), 0u);
}

}  // namespace
}  // namespace eldr
