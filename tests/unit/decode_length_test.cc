// DecodeLengthPrior (runtime/router/decode_length.h): the mean residual decode length of the calibration members
// longer than what a request has generated, by hand and against a brute-force mean.
#include "runtime/router/decode_length.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace eldr {
namespace {

TEST(DecodeLengthPrior, HandComputedResiduals) {
  // Cluster 0 ran 30, 40 and 300 tokens; cluster 1 ran 10; cluster 2 has no member.
  const DecodeLengthPrior p({30, 300, 10, 40}, {0, 0, 1, 0}, 3, {});
  ASSERT_TRUE(p.has_lengths());
  EXPECT_DOUBLE_EQ(p.Mean(0), (30 + 40 + 300) / 3.0);
  EXPECT_DOUBLE_EQ(p.Remaining(0, 29), (1 + 11 + 271) / 3.0);
  EXPECT_DOUBLE_EQ(p.Remaining(0, 30), (10 + 270) / 2.0);  // the 30 has ended: longer than g only
  EXPECT_DOUBLE_EQ(p.Remaining(0, 200), 100);              // past the mean, the long member remains
  // Past every member of cluster 1: the whole calibration's members longer than 10 (30, 40, 300).
  EXPECT_DOUBLE_EQ(p.Remaining(1, 10), (20 + 30 + 290) / 3.0);
  EXPECT_DOUBLE_EQ(p.Mean(2), (30 + 300 + 10 + 40) / 4.0);  // an empty cluster: the calibration's mean
  EXPECT_DOUBLE_EQ(p.Remaining(0, 300), 1);                 // past every length: 1
  EXPECT_DOUBLE_EQ(p.Remaining(0, 299), 1);                 // 300 − 299
  EXPECT_DOUBLE_EQ(p.Remaining(-1, 0), 1);                  // no cluster
}

TEST(DecodeLengthPrior, WithoutLengthsThePriorIsSpentOnePerToken) {
  const DecodeLengthPrior p({}, {}, 2, {5, 0.5});
  EXPECT_FALSE(p.has_lengths());
  EXPECT_DOUBLE_EQ(p.Mean(0), 5);
  EXPECT_DOUBLE_EQ(p.Remaining(0, 3), 2);
  EXPECT_DOUBLE_EQ(p.Remaining(0, 7), 1);
  EXPECT_DOUBLE_EQ(p.Mean(1), 1);  // at least one token
  const DecodeLengthPrior none({}, {}, 2, {});
  EXPECT_DOUBLE_EQ(none.Mean(1), 1);
}

TEST(DecodeLengthPrior, EqualsABruteForceMean) {
  std::mt19937_64 rng(5);
  const int K = 4;
  std::vector<int64_t> lens;
  std::vector<int32_t> assignment;
  for (int i = 0; i < 60; ++i) {
    lens.push_back(static_cast<int64_t>(rng() % 200));
    assignment.push_back(static_cast<int32_t>(rng() % K));
  }
  const DecodeLengthPrior p(lens, assignment, K, {});
  const auto brute = [&](int k, int64_t g, bool whole) {
    double sum = 0;
    int n = 0;
    for (size_t i = 0; i < lens.size(); ++i) {
      const int64_t L = std::max<int64_t>(lens[i], 1);  // a length of 0 counts as 1 (as calibration weighs it)
      if ((whole || assignment[i] == k) && L > g) sum += static_cast<double>(L - g), ++n;
    }
    return n ? sum / n : -1.0;
  };
  for (int k = 0; k < K; ++k) {
    for (int64_t g = 0; g < 210; ++g) {
      double want = brute(k, g, false);
      if (want < 0) want = brute(k, g, true);
      if (want < 1) want = 1;
      ASSERT_NEAR(p.Remaining(k, g), want, 1e-9) << "cluster " << k << " g " << g;
    }
  }
}

}  // namespace
}  // namespace eldr
