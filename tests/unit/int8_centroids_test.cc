// The router's 8-bit centroid products (runtime/router/int8_centroids.h) against the exact product in long double:
// within the stated bound for every k, the bound itself small, hand-computed cases exact, and the refusals.
#include "runtime/router/int8_centroids.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace eldr {
namespace {

long double ExactDot(const float* a, const float* b, int n) {
  long double s = 0;
  for (int i = 0; i < n; ++i) s += static_cast<long double>(a[i]) * static_cast<long double>(b[i]);
  return s;
}

TEST(Int8Centroids, HandComputedValuesOnTheGridAreExact) {
  // Entries on the quantisation grids: row 0 has a = 1/127, q = (127, 0, −127); row 1 a = 0.5/127, q = 127 each;
  // s has b = 1/255, t = (255, 51, 0) (0.2 = 51/255, up to float rounding).
  const std::vector<float> mu = {1.f, 0.f, -1.f, 0.5f, 0.5f, 0.5f};
  Int8Centroids q(mu, 2, 3);
  const std::vector<float> s = {1.f, 0.2f, 0.f};
  double dots[2], bounds[2];
  ASSERT_TRUE(q.Dots(s.data(), dots, bounds));
  EXPECT_NEAR(dots[0], 1.0, 1e-8);  // 1·1 + 0.2·0 + 0·(−1)
  EXPECT_NEAR(dots[1], 0.6, 1e-8);  // 0.5·1 + 0.5·0.2
  for (double b : bounds) EXPECT_GT(b, 0);
}

TEST(Int8Centroids, WithinTheBoundOfTheExactProduct) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (int scenario = 0; scenario < 200; ++scenario) {
    const int K = 1 + static_cast<int>(rng() % 41);
    const int D = 1 + static_cast<int>(rng() % (scenario < 20 ? 7000 : 300));  // tails that are not multiples of 64
    const int kind = scenario % 4;  // 0 uniform, 1 sparse, 2 one hot entry, 3 tiny magnitudes
    std::vector<float> mu(static_cast<size_t>(K) * D), s(D);
    auto draw = [&](bool signed_entry) {
      float v = u(rng);
      if (kind == 1 && u(rng) < 0.7f) v = 0.f;
      if (kind == 3) v *= 1e-30f;
      return signed_entry && u(rng) < 0.3f ? -v : v;
    };
    for (auto& x : mu) x = draw(true);
    for (auto& x : s) x = draw(false);
    if (kind == 2) {
      s[rng() % D] = 1e3f;
      mu[rng() % mu.size()] = -50.f;
    }
    if (K > 1) std::fill(mu.begin(), mu.begin() + D, 0.f);  // a zero row
    Int8Centroids q(mu, K, D);
    std::vector<double> dots(K), bounds(K);
    ASSERT_TRUE(q.Dots(s.data(), dots.data(), bounds.data())) << "scenario " << scenario;
    long double snorm = std::sqrt(ExactDot(s.data(), s.data(), D));
    for (int k = 0; k < K; ++k) {
      const float* m = mu.data() + static_cast<size_t>(k) * D;
      const long double exact = ExactDot(s.data(), m, D);
      ASSERT_LE(std::fabs(static_cast<long double>(dots[k]) - exact), bounds[k])
          << "scenario " << scenario << " k " << k << " D " << D;
      // Not vacuous: a·b·Σt ≤ √D·||s||·||μ||/127 and a·b·Σ|q| ≤ √D·||s||·||μ||/255, so the bound is below
      // √D·||s||·||μ||/64 (plus a·b·D/4, small at these D).
      const long double mnorm = std::sqrt(ExactDot(m, m, D));
      EXPECT_LE(bounds[k], snorm * mnorm * std::sqrt(static_cast<long double>(D)) / 64 + 1e-300L);
    }
  }
}

TEST(Int8Centroids, UnitVectorsAtThePapersScaleAreWithinAHundredthAndErrMuchLess) {
  // D = 48 · 128, K = 40 unit centroids and a unit count·idf-like signature: the bound ~0.01 the header states, the
  // actual error far below it.
  const int K = 40, D = 6144;
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<float> mu(static_cast<size_t>(K) * D), s(D);
  for (int k = 0; k < K; ++k) {
    double n2 = 0;
    for (int i = 0; i < D; ++i) n2 += std::pow(mu[k * D + i] = u(rng), 2);
    for (int i = 0; i < D; ++i) mu[k * D + i] /= static_cast<float>(std::sqrt(n2));
  }
  double n2 = 0;
  for (auto& x : s) n2 += std::pow(x = u(rng) < 0.11f ? 0.f : 3.f * u(rng), 2);
  for (auto& x : s) x /= static_cast<float>(std::sqrt(n2));
  Int8Centroids q(mu, K, D);
  std::vector<double> dots(K), bounds(K);
  ASSERT_TRUE(q.Dots(s.data(), dots.data(), bounds.data()));
  double worst = 0;
  for (int k = 0; k < K; ++k) {
    EXPECT_LT(bounds[k], 0.02);
    worst = std::max(worst, static_cast<double>(std::fabs(dots[k] - ExactDot(s.data(), mu.data() + k * D, D))));
  }
  EXPECT_LT(worst, 1e-3);
}

TEST(Int8Centroids, RefusesWhatItCannotTake) {
  const std::vector<float> mu = {1.f, 2.f, 3.f, 4.f};
  Int8Centroids q(mu, 2, 2);
  double dots[2] = {7, 7};
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const std::vector<float>& s :
       std::vector<std::vector<float>>{{-1.f, 1.f}, {nan, 1.f}, {inf, 1.f}, {1e-40f, 0.f}}) {
    EXPECT_FALSE(q.Dots(s.data(), dots, nullptr));
    EXPECT_EQ(dots[0], 7);  // nothing written
  }
  const std::vector<float> zero = {0.f, 0.f};
  ASSERT_TRUE(q.Dots(zero.data(), dots, nullptr));
  EXPECT_EQ(dots[0], 0);
  EXPECT_EQ(dots[1], 0);
}

}  // namespace
}  // namespace eldr
