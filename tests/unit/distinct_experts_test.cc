// Distinct experts per step (DESIGN.md §3) against hand-computed unions: per layer, over the batch's tokens.
#include "runtime/common/distinct_experts.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace eldr {
namespace {

// Two MoE layers, E = 8, top-2. Token rows are [L, k].
//   token a: layer 0 {0, 1}, layer 1 {2, 3}
//   token b: layer 0 {1, 2}, layer 1 {3, 4}
//   token c: layer 0 {0, 1}, layer 1 {7, 6}
// Layer 0 ∪ = {0, 1, 2} (3), layer 1 ∪ = {2, 3, 4, 6, 7} (5): 8 distinct experts for the step {a, b, c}.
const uint16_t kA[] = {0, 1, 2, 3};
const uint16_t kB[] = {1, 2, 3, 4};
const uint16_t kC[] = {0, 1, 7, 6};

TEST(ExpertUnion, HandComputedUnionPerLayerSummedOverLayers) {
  ExpertUnion u(2, 8);
  EXPECT_EQ(u.Total(), 0);
  u.AddToken(kA, 2);
  EXPECT_EQ(u.Total(), 4);
  u.AddToken(kB, 2);
  u.AddToken(kC, 2);
  EXPECT_EQ(u.Layer(0), 3);
  EXPECT_EQ(u.Layer(1), 5);
  EXPECT_EQ(u.Total(), 8);
  u.AddToken(kA, 2);  // a token already counted adds nothing
  EXPECT_EQ(u.Total(), 8);
  u.Clear();
  EXPECT_EQ(u.Total(), 0);
  u.AddToken(kC, 2);
  EXPECT_EQ(u.Total(), 4);
}

TEST(ExpertUnion, Int32IdsAndPrecomputedTokenSetsCountTheSame) {
  const int32_t b32[] = {1, 2, 3, 4};
  ExpertUnion ids(2, 8), sets(2, 8);
  ids.AddToken(kA, 2);
  ids.AddToken(b32, 2);
  std::vector<uint64_t> sa(2 * 1, 0), sb(2 * 1, 0);
  TokenExpertSet(kA, 2, 8, 2, sa.data());
  TokenExpertSet(kB, 2, 8, 2, sb.data());
  EXPECT_EQ(sa[0], 0b11u);    // layer 0: experts 0, 1
  EXPECT_EQ(sa[1], 0b1100u);  // layer 1: experts 2, 3
  sets.AddTokenSet(sa.data());
  sets.AddTokenSet(sb.data());
  // a ∪ b: layer 0 {0, 1, 2}, layer 1 {2, 3, 4}.
  EXPECT_EQ(ids.Total(), 6);
  EXPECT_EQ(sets.Total(), 6);
  EXPECT_EQ(sets.Layer(1), 3);
}

TEST(ExpertUnion, ExpertsBeyondOneWord) {
  // E = 130: three words per layer; experts 63, 64 and 129 are distinct, 64 twice counts once.
  const uint16_t t0[] = {63, 64};
  const uint16_t t1[] = {64, 129};
  ExpertUnion u(1, 130);
  EXPECT_EQ(u.num_words(), 3);
  u.AddToken(t0, 2);
  u.AddToken(t1, 2);
  EXPECT_EQ(u.Total(), 3);
  std::vector<uint64_t> s(3, 0);
  TokenExpertSet(t1, 1, 130, 2, s.data());
  EXPECT_EQ(s[1], uint64_t{1});       // expert 64 = bit 0 of word 1
  EXPECT_EQ(s[2], uint64_t{1} << 1);  // expert 129 = bit 1 of word 2
}

TEST(DistinctByBatch, RowsPerBatchAscendingWithMeans) {
  DistinctByBatch d;
  d.Add(4, 10);
  d.Add(1, 3);
  d.Add(4, 14);
  d.Add(0, 99);  // nothing ran: ignored
  DistinctByBatch other;
  other.Add(1, 5);
  d.Merge(other);
  const std::vector<BatchDistinctRow> rows = d.Rows();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].batch, 1);
  EXPECT_EQ(rows[0].steps, 2);
  EXPECT_DOUBLE_EQ(rows[0].mean_distinct_experts, 4.0);  // (3 + 5) / 2
  EXPECT_EQ(rows[1].batch, 4);
  EXPECT_EQ(rows[1].steps, 2);
  EXPECT_DOUBLE_EQ(rows[1].mean_distinct_experts, 12.0);  // (10 + 14) / 2
  EXPECT_EQ(d.steps(), 4);
}

TEST(DistinctByBatch, MatchedBatchRatioWeighsThePolicysStepsAtSharedBatches) {
  // Policy: 3 steps at batch 2 (mean 8), 1 at batch 4 (mean 12), 1 at batch 8 (the reference never ran 8).
  // Reference: batch 2 mean 10, batch 4 mean 16. Ratio = (3·0.8 + 1·0.75) / 4 = 0.7875; covered 4/5.
  const std::vector<BatchDistinctRow> policy = {{2, 3, 8.0}, {4, 1, 12.0}, {8, 1, 20.0}};
  const std::vector<BatchDistinctRow> reference = {{1, 7, 3.0}, {2, 5, 10.0}, {4, 2, 16.0}};
  double covered = -1;
  EXPECT_NEAR(MatchedBatchRatio(policy, reference, &covered), 0.7875, 1e-12);
  EXPECT_NEAR(covered, 0.8, 1e-12);
  // Against itself: exactly 1, fully covered.
  EXPECT_DOUBLE_EQ(MatchedBatchRatio(reference, reference, &covered), 1.0);
  EXPECT_DOUBLE_EQ(covered, 1.0);
  // Nothing shared: 0, nothing covered.
  EXPECT_EQ(MatchedBatchRatio({{3, 2, 5.0}}, reference, &covered), 0.0);
  EXPECT_EQ(covered, 0.0);
}

}  // namespace
}  // namespace eldr
