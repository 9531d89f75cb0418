// `eldr route`'s replay (runtime/eval/route_replay): distinct experts per step by batch size against a hand-computed
// timeline, and the matched-batch invariants (the rows account for every step; jsq against itself is 1).
#include "runtime/eval/route_replay.h"

#include <gtest/gtest.h>

#include <cmath>

#include "runtime/calib/calibrate.h"
#include "runtime/trace/synth.h"

namespace eldr {
namespace {

// L = 1, E = 8, k = 1; each request: (prompt rows, decode rows), one expert id per row.
Trace MakeTrace(const std::vector<std::pair<std::vector<uint16_t>, std::vector<uint16_t>>>& reqs) {
  Trace t;
  t.shape = {"test", 1, 8, 1};
  int64_t offset = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    TraceRequest r;
    r.id = "r" + std::to_string(i);
    r.prompt_len = static_cast<int64_t>(reqs[i].first.size());
    r.num_tokens = r.prompt_len + static_cast<int64_t>(reqs[i].second.size());
    r.offset = offset;
    offset += r.num_tokens;
    t.requests.push_back(r);
    t.topk_ids.insert(t.topk_ids.end(), reqs[i].first.begin(), reqs[i].first.end());
    t.topk_ids.insert(t.topk_ids.end(), reqs[i].second.begin(), reqs[i].second.end());
  }
  EXPECT_TRUE(ValidateTrace(t, "test").ok());
  return t;
}

Calibration Calib(const Trace& t, int K) {
  CalibrateOptions o;
  o.num_decoders = K;
  o.progress = false;
  return Calibrate(t, o, nullptr).value();
}

TEST(RouteReplay, DistinctByBatchOnOneDecoderByHand) {
  // One decoder, all three requests at once: decodes [0], [1 2], [0 2 5]. Step 1: batch 3, experts {0, 1, 0} → 2;
  // step 2: batch 2, {2, 2} → 1; step 3: batch 1, {5} → 1. Whatever the arrival order, per batch: 1 → 1, 2 → 1,
  // 3 → 2, one step each.
  const Trace t = MakeTrace({{{7}, {0}}, {{6}, {1, 2}}, {{7}, {0, 2, 5}}});
  const Calibration calib = Calib(t, 1);
  RouteReplayOptions o;
  o.policies = {RoutingPolicy::kJsq, RoutingPolicy::kRoundRobin};
  o.rate = 0;
  auto r = ReplayRoutes(t, calib, o, "t", "c");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const PolicyReplayStats& p : r->policies) {
    ASSERT_EQ(p.distinct_by_batch.size(), 3u) << p.policy;
    for (int b = 0; b < 3; ++b) {
      EXPECT_EQ(p.distinct_by_batch[b].batch, b + 1);
      EXPECT_EQ(p.distinct_by_batch[b].steps, 1);
    }
    EXPECT_DOUBLE_EQ(p.distinct_by_batch[0].mean_distinct_experts, 1);
    EXPECT_DOUBLE_EQ(p.distinct_by_batch[1].mean_distinct_experts, 1);
    EXPECT_DOUBLE_EQ(p.distinct_by_batch[2].mean_distinct_experts, 2);
    double covered = 0;
    EXPECT_DOUBLE_EQ(r->MatchedVsJsq(p, &covered).value(), 1.0);
    EXPECT_DOUBLE_EQ(covered, 1.0);
  }
  const nlohmann::json j = r->ToJson();
  EXPECT_FALSE(j["policies"][0].contains("distinct_experts_per_token"));  // dropped: confounded by batch size
  EXPECT_EQ(j["policies"][1]["distinct_by_batch"].size(), 3u);
  // A calibration fitted on decode tokens is refused: the replay routes on the prompt's counts.
  Calibration decode = calib;
  decode.features = SignatureFeatures::kDecode;
  auto refused = ReplayRoutes(t, decode, o, "t", "c");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--features decode"), std::string::npos);
}

// Requests with no decode tokens (or no prompt) are skipped and counted, as calibrate skips them (usable_request.h):
// a trace with two unusable requests among the usable ones replays exactly as the usable ones alone, each routed
// by its own prompt (locality_top1 over two clusters, experts 0-1 against 5-6: a request read at another's row
// would go to the other decoder); a trace of unusable requests only is refused.
TEST(RouteReplay, UnusableRequestsAreSkippedAndCounted) {
  const Trace usable = MakeTrace({{{0, 1}, {0}}, {{5, 6}, {5, 6}}, {{0, 0}, {1, 0}}, {{6, 5}, {6}}, {{1, 1}, {0}}});
  const Trace mixed = MakeTrace(
      {{{5}, {}}, {{0, 1}, {0}}, {{5, 6}, {5, 6}}, {{3, 4}, {}}, {{0, 0}, {1, 0}}, {{6, 5}, {6}}, {{1, 1}, {0}}});
  const Calibration calib = Calib(usable, 2);
  RouteReplayOptions o;
  o.policies = {RoutingPolicy::kLocalityTop1, RoutingPolicy::kJsq};
  o.rate = 0;
  auto want = ReplayRoutes(usable, calib, o, "t", "c");
  auto r = ReplayRoutes(mixed, calib, o, "t", "c");
  ASSERT_TRUE(want.ok() && r.ok()) << r.status().ToString();
  EXPECT_EQ(r->num_requests, 5);
  EXPECT_EQ(r->num_skipped, 2);
  EXPECT_EQ(want->num_skipped, 0);
  EXPECT_EQ(r->ToJson()["skipped_requests"], 2);
  EXPECT_NE(r->ToText().find("5 requests routed to 2 decoders (2 of the trace's skipped"), std::string::npos);
  for (size_t p = 0; p < r->policies.size(); ++p) {
    const PolicyReplayStats &got = r->policies[p], &ref = want->policies[p];
    ASSERT_EQ(got.decoders.size(), 2u);
    for (int k = 0; k < 2; ++k) EXPECT_EQ(got.decoders[k].requests, ref.decoders[k].requests) << got.policy << k;
    ASSERT_EQ(got.distinct_by_batch.size(), ref.distinct_by_batch.size());
    for (size_t b = 0; b < got.distinct_by_batch.size(); ++b) {
      EXPECT_EQ(got.distinct_by_batch[b].steps, ref.distinct_by_batch[b].steps);
      EXPECT_EQ(got.distinct_by_batch[b].mean_distinct_experts, ref.distinct_by_batch[b].mean_distinct_experts);
    }
  }
  // locality_top1 keeps the two expert groups apart: 3 requests of experts 0-1 on one decoder, 2 of 5-6 on the other.
  std::vector<int64_t> split = {r->policies[0].decoders[0].requests, r->policies[0].decoders[1].requests};
  std::sort(split.begin(), split.end());
  EXPECT_EQ(split, (std::vector<int64_t>{2, 3}));
  auto none = ReplayRoutes(MakeTrace({{{7}, {}}, {{6}, {}}}), calib, o, "t", "c");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(), "t: none of its 2 requests has both prompt and decode tokens: nothing to route");
}

TEST(RouteReplay, MatchedBatchRowsAccountForEveryStep) {
  SynthOptions so;
  so.num_domains = 3;
  so.num_requests = 60;
  so.num_layers = 2;
  so.num_experts = 16;
  so.top_k = 2;
  so.prompt_len_min = 8;
  so.prompt_len_max = 16;
  so.output_len_min = 4;
  so.output_len_max = 20;
  so.seed = 3;
  const Trace t = SynthesizeTrace(so).value();
  const Calibration calib = Calib(t, 3);
  RouteReplayOptions o;
  o.policies = {RoutingPolicy::kJsq, RoutingPolicy::kRoundRobin, RoutingPolicy::kEldr};
  o.rate = 50;
  auto r = ReplayRoutes(t, calib, o, "t", "c");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const PolicyReplayStats& p : r->policies) {
    int64_t steps = 0, decoder_steps = 0;
    double distinct = 0, batch = 0;
    for (const BatchDistinctRow& row : p.distinct_by_batch) {
      steps += row.steps;
      distinct += row.steps * row.mean_distinct_experts;
      batch += static_cast<double>(row.steps * row.batch);
    }
    for (const DecoderReplayStats& d : p.decoders) decoder_steps += d.steps;
    EXPECT_EQ(steps, decoder_steps) << p.policy;
    EXPECT_NEAR(distinct / steps, p.mean_distinct_experts_per_step, 1e-9) << p.policy;
    EXPECT_NEAR(batch / steps, p.mean_batch, 1e-9) << p.policy;
    double covered = 0;
    const double ratio = r->MatchedVsJsq(p, &covered).value();
    EXPECT_GT(ratio, 0) << p.policy;
    EXPECT_GT(covered, 0) << p.policy;
    EXPECT_LE(covered, 1) << p.policy;
    if (p.policy == "jsq") {
      EXPECT_DOUBLE_EQ(ratio, 1.0);
    }
  }
  // Without jsq there is no reference.
  o.policies = {RoutingPolicy::kRoundRobin};
  auto alone = ReplayRoutes(t, calib, o, "t", "c");
  ASSERT_TRUE(alone.ok());
  double covered = 0;
  EXPECT_FALSE(alone->MatchedVsJsq(alone->policies[0], &covered).has_value());
}

}  // namespace
}  // namespace eldr
