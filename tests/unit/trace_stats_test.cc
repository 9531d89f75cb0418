// `eldr trace stats` computations (runtime/trace/stats.h) on hand-built traces whose frequencies,
// correlations and distinct-expert counts are worked out by hand in the comments.
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/trace/stats.h"
#include "runtime/trace/synth.h"
#include "runtime/trace/trace.h"

namespace eldr {
namespace {

// A token's experts: [L][k].
using Token = std::vector<std::vector<uint16_t>>;

Trace Empty(int L, int E, int k) {
  Trace t;
  t.shape = TraceShape{"hand", L, E, k};
  return t;
}

void AddRequest(Trace* t, const std::string& id, const std::string& domain, const std::vector<Token>& prefill,
                const std::vector<Token>& decode) {
  TraceRequest r;
  r.id = id;
  r.domain = domain;
  r.prompt_len = static_cast<int64_t>(prefill.size());
  r.num_tokens = r.prompt_len + static_cast<int64_t>(decode.size());
  r.offset = t->num_tokens_total();
  for (const auto* part : {&prefill, &decode}) {
    for (const Token& tok : *part) {
      for (const auto& layer : tok) t->topk_ids.insert(t->topk_ids.end(), layer.begin(), layer.end());
    }
  }
  t->requests.push_back(r);
  ASSERT_TRUE(ValidateTrace(*t, "hand").ok()) << ValidateTrace(*t, "hand").ToString();
}

// L = 1, k = 1 token routed to expert e.
Token T1(uint16_t e) { return {{e}}; }

TraceStats MustStats(const Trace& t, const TraceStatsOptions& o) {
  auto r = ComputeTraceStats(t, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : TraceStats{};
}

TEST(TraceStatsTest, CountsTokensPerDomainInOrderOfFirstAppearance) {
  Trace t = Empty(1, 4, 1);
  AddRequest(&t, "a", "B", {T1(0), T1(1)}, {T1(2)});
  AddRequest(&t, "b", "A", {T1(0)}, {T1(1), T1(2), T1(3)});
  AddRequest(&t, "c", "B", {T1(3)}, {});
  TraceStatsOptions o;
  o.batch_sizes = {1};
  TraceStats s = MustStats(t, o);
  EXPECT_EQ(s.num_requests, 3);
  EXPECT_EQ(s.num_tokens, 8);
  EXPECT_EQ(s.prompt_tokens, 4);
  EXPECT_EQ(s.decode_tokens, 4);
  EXPECT_TRUE(s.shape.SameAs(t.shape));
  ASSERT_EQ(s.domains.size(), 2u);
  EXPECT_EQ(s.domains[0].domain, "B");
  EXPECT_EQ(s.domains[0].num_requests, 2);
  EXPECT_EQ(s.domains[0].prompt_tokens, 3);
  EXPECT_EQ(s.domains[0].decode_tokens, 1);
  EXPECT_EQ(s.domains[1].domain, "A");
  EXPECT_EQ(s.domains[1].num_requests, 1);
  EXPECT_EQ(s.domains[1].prompt_tokens, 1);
  EXPECT_EQ(s.domains[1].decode_tokens, 3);
}

TEST(TraceStatsTest, PearsonOfActivationFrequenciesByHand) {
  // E = 4, k = 1. Prefill experts 0, 0, 1 -> x = (2/3, 1/3, 0, 0); decode 0, 1 -> y = (1/2, 1/2, 0, 0).
  // Means 1/4. Σdxdy = 1/4, Σdx² = 44/144, Σdy² = 1/4, so r = 6/sqrt(44).
  Trace t = Empty(1, 4, 1);
  AddRequest(&t, "r", "x", {T1(0), T1(0), T1(1)}, {T1(0), T1(1)});
  TraceStats s = MustStats(t, {});
  const double expected = 6 / std::sqrt(44.0);
  EXPECT_NEAR(s.prefill_decode_corr, expected, 1e-12);
  EXPECT_NEAR(s.mean_request_prefill_decode_corr, expected, 1e-12);
  ASSERT_EQ(s.domains.size(), 1u);
  EXPECT_NEAR(s.domains[0].prefill_decode_corr, expected, 1e-12);
}

TEST(TraceStatsTest, IdenticalPatternsCorrelateOneAndSwappedOnesMinusOne) {
  // L = 2, E = 3, k = 2. Same multiset of token patterns in prefill and decode: frequencies equal.
  Trace same = Empty(2, 3, 2);
  const Token p{{0, 1}, {2, 0}}, q{{1, 2}, {2, 1}};
  AddRequest(&same, "r", "", {p, p, q}, {q, p, p});
  EXPECT_NEAR(MustStats(same, {}).prefill_decode_corr, 1.0, 1e-12);
  // E = 2, k = 1: prefill always expert 0, decode always 1 -> x = (1, 0), y = (0, 1).
  Trace anti = Empty(1, 2, 1);
  AddRequest(&anti, "r", "", {T1(0), T1(0)}, {T1(1)});
  EXPECT_NEAR(MustStats(anti, {}).prefill_decode_corr, -1.0, 1e-12);
}

TEST(TraceStatsTest, OverallDomainAndPerRequestCorrelationsDiffer) {
  // E = 3, k = 1.
  //  r1 (A): prefill 0, decode 0 -> r = 1.
  //  r2 (B): prefill 1, decode 2 -> x = (0,1,0), y = (0,0,1): r = (-1/3) / (2/3) = -0.5.
  //  overall: x = (1/2,1/2,0), y = (1/2,0,1/2): r = (-1/12) / (1/6) = -0.5.
  Trace t = Empty(1, 3, 1);
  AddRequest(&t, "r1", "A", {T1(0)}, {T1(0)});
  AddRequest(&t, "r2", "B", {T1(1)}, {T1(2)});
  TraceStats s = MustStats(t, {});
  EXPECT_NEAR(s.domains[0].prefill_decode_corr, 1.0, 1e-12);
  EXPECT_NEAR(s.domains[1].prefill_decode_corr, -0.5, 1e-12);
  EXPECT_NEAR(s.prefill_decode_corr, -0.5, 1e-12);
  EXPECT_NEAR(s.mean_request_prefill_decode_corr, 0.25, 1e-12);

  //  r3 (A): prefill 2 only. Not in the per-request mean; domain A: x = (1/2,0,1/2), y = (1,0,0):
  //  Σdxdy = 1/6, Σdx² = 1/6, Σdy² = 2/3 -> r = 0.5. Overall prefill x = (1/3,1/3,1/3) has no variance: NaN.
  AddRequest(&t, "r3", "A", {T1(2)}, {});
  s = MustStats(t, {});
  EXPECT_NEAR(s.domains[0].prefill_decode_corr, 0.5, 1e-12);
  EXPECT_TRUE(std::isnan(s.prefill_decode_corr));
  EXPECT_NEAR(s.mean_request_prefill_decode_corr, 0.25, 1e-12);
  EXPECT_TRUE(s.ToJson()["prefill_decode_corr"].is_null());
}

TEST(TraceStatsTest, DomainWithoutDecodeTokensHasNanCorrelation) {
  Trace t = Empty(1, 3, 1);
  AddRequest(&t, "r1", "A", {T1(0)}, {T1(0), T1(1)});
  AddRequest(&t, "r2", "B", {T1(1)}, {});
  TraceStats s = MustStats(t, {});
  EXPECT_TRUE(std::isnan(s.domains[1].prefill_decode_corr));
  EXPECT_FALSE(std::isnan(s.domains[0].prefill_decode_corr));
}

// L = 2, E = 4, k = 2. Layer 0: domain A tokens use {0,1}, domain B tokens {2,3}; layer 1: everyone {0,1}.
// Two requests per domain. Same-domain batches: 2 distinct at both layers -> 2.
// Mixed batch of B = 2 distinct requests out of 4: same domain with probability 2/6 (layer 0: 2), else 4;
// mean over layers 2 or 3 -> expected 2·1/3 + 3·2/3 = 8/3. B >= 3 always mixes both domains -> (4+2)/2 = 3.
Trace TwoDomains() {
  Trace t = Empty(2, 4, 2);
  const Token a{{0, 1}, {0, 1}}, a_rev{{1, 0}, {1, 0}}, b{{2, 3}, {0, 1}}, b_rev{{3, 2}, {1, 0}};
  AddRequest(&t, "a1", "A", {b}, {a, a_rev});  // prefill tokens must never be drawn into a batch
  AddRequest(&t, "b1", "B", {a}, {b, b_rev, b});
  AddRequest(&t, "a2", "A", {b_rev}, {a_rev});
  AddRequest(&t, "b2", "B", {a, a}, {b});
  return t;
}

TEST(TraceStatsTest, DistinctExpertsOfSameDomainAndMixedBatches) {
  TraceStatsOptions o;
  o.batch_sizes = {1, 2, 3, 4};
  o.num_batches = 20000;
  o.seed = 3;
  TraceStats s = MustStats(TwoDomains(), o);
  ASSERT_EQ(s.batches.size(), 4u);
  for (const auto& b : s.batches) EXPECT_DOUBLE_EQ(b.same_domain, 2.0) << "B=" << b.batch_size;
  EXPECT_EQ(s.batches[0].batch_size, 1);
  EXPECT_DOUBLE_EQ(s.batches[0].mixed, 2.0);
  EXPECT_DOUBLE_EQ(s.batches[0].reduction_pct, 0.0);
  EXPECT_FALSE(s.batches[0].requests_reused);
  // B = 2: per-batch value sd = sqrt(2/9); 20000 batches -> standard error 0.0033.
  EXPECT_NEAR(s.batches[1].mixed, 8.0 / 3, 0.02);
  EXPECT_NEAR(s.batches[1].reduction_pct, 100 * (8.0 / 3 - 2) / (8.0 / 3), 1.0);
  EXPECT_FALSE(s.batches[1].requests_reused);
  // B = 3: each domain has only 2 requests -> same-domain batches reuse requests; mixed is exactly 3.
  EXPECT_DOUBLE_EQ(s.batches[2].mixed, 3.0);
  EXPECT_TRUE(s.batches[2].requests_reused);
  EXPECT_DOUBLE_EQ(s.batches[3].mixed, 3.0);
  EXPECT_NEAR(s.batches[3].reduction_pct, 100.0 / 3, 1e-9);
  EXPECT_TRUE(s.batches[3].requests_reused);
}

TEST(TraceStatsTest, DrawsOneUniformDecodeTokenPerRequestAndSkipsRequestsWithoutDecode) {
  // E = 4, k = 1. r1 decodes expert 0 only (its prefill uses 3); r2's decode tokens use 0, 1, 2, 3;
  // r3 has no decode tokens. B = 2 takes r1 and r2: 1 distinct when r2's token is expert 0 (1/4), else 2
  // -> expected 1.75. Drawing a prefill token or r3 would change it.
  Trace t = Empty(1, 4, 1);
  AddRequest(&t, "r1", "", {T1(3), T1(3)}, {T1(0)});
  AddRequest(&t, "r2", "", {T1(3)}, {T1(0), T1(1), T1(2), T1(3)});
  AddRequest(&t, "r3", "", {T1(1)}, {});
  TraceStatsOptions o;
  o.batch_sizes = {2};
  o.num_batches = 20000;
  TraceStats s = MustStats(t, o);
  // Per-batch sd = sqrt(3/16); standard error 0.003.
  EXPECT_NEAR(s.batches[0].mixed, 1.75, 0.02);
  EXPECT_NEAR(s.batches[0].same_domain, 1.75, 0.02);
  EXPECT_FALSE(s.batches[0].requests_reused);
  o.batch_sizes = {3};  // only 2 requests have decode tokens
  EXPECT_TRUE(MustStats(t, o).batches[0].requests_reused);
}

TEST(TraceStatsTest, ReuseFlagDependsOnTheTraceNotOnTheDraws) {
  // Domain A has 3 requests with decode tokens, B has 1: B = 2 needs replacement for B's batches, flagged
  // even when the one batch drawn happens to come from A. Domain C (no decode tokens) never counts.
  Trace t = Empty(1, 4, 1);
  AddRequest(&t, "a1", "A", {T1(0)}, {T1(0)});
  AddRequest(&t, "a2", "A", {T1(0)}, {T1(1)});
  AddRequest(&t, "a3", "A", {T1(0)}, {T1(2)});
  AddRequest(&t, "b1", "B", {T1(0)}, {T1(3)});
  AddRequest(&t, "c1", "C", {T1(0)}, {});
  TraceStatsOptions o;
  o.batch_sizes = {1, 2};
  o.num_batches = 1;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    o.seed = seed;
    TraceStats s = MustStats(t, o);
    EXPECT_FALSE(s.batches[0].requests_reused);
    EXPECT_TRUE(s.batches[1].requests_reused);
  }
}

TEST(TraceStatsTest, DeterministicForASeed) {
  TraceStatsOptions o;
  o.batch_sizes = {2};
  o.num_batches = 50;
  Trace t = TwoDomains();
  TraceStats a = MustStats(t, o), b = MustStats(t, o);
  EXPECT_EQ(a.batches[0].mixed, b.batches[0].mixed);
  EXPECT_EQ(a.ToJson(), b.ToJson());
}

TEST(TraceStatsTest, ErrorCases) {
  Trace prefill_only = Empty(1, 2, 1);
  AddRequest(&prefill_only, "r", "", {T1(0)}, {});
  auto r = ComputeTraceStats(prefill_only, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("no decode tokens"), std::string::npos) << r.status().message();

  r = ComputeTraceStats(Empty(1, 2, 1), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);

  TraceStatsOptions o;
  o.batch_sizes = {4, 0};
  r = ComputeTraceStats(TwoDomains(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("batch size"), std::string::npos) << r.status().message();

  o = {};
  o.num_batches = 0;
  r = ComputeTraceStats(TwoDomains(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  Trace bad_id = TwoDomains();
  bad_id.topk_ids.back() = 9;  // E = 4
  r = ComputeTraceStats(bad_id, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  Trace bad_offset = TwoDomains();
  bad_offset.requests.back().num_tokens += 5;
  r = ComputeTraceStats(bad_offset, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST(TraceStatsTest, JsonAndTextMirrorTheFields) {
  TraceStatsOptions o;
  o.batch_sizes = {2, 3};
  o.num_batches = 10;
  TraceStats s = MustStats(TwoDomains(), o);
  const nlohmann::json j = s.ToJson();
  EXPECT_EQ(j["shape"]["num_layers"], 2);
  EXPECT_EQ(j["shape"]["num_experts"], 4);
  EXPECT_EQ(j["shape"]["top_k"], 2);
  EXPECT_EQ(j["shape"]["model"], "hand");
  EXPECT_EQ(j["num_requests"], 4);
  EXPECT_EQ(j["num_tokens"], s.num_tokens);
  EXPECT_EQ(j["prompt_tokens"], 5);
  EXPECT_EQ(j["decode_tokens"], 7);
  ASSERT_EQ(j["domains"].size(), 2u);
  EXPECT_EQ(j["domains"][0]["domain"], "A");
  EXPECT_EQ(j["domains"][1]["num_requests"], 2);
  EXPECT_TRUE(j["domains"][0].contains("prefill_decode_corr"));
  EXPECT_TRUE(j.contains("mean_request_prefill_decode_corr"));
  ASSERT_EQ(j["batches"].size(), 2u);
  EXPECT_EQ(j["batches"][1]["batch_size"], 3);
  EXPECT_EQ(j["batches"][1]["requests_reused"], true);
  EXPECT_DOUBLE_EQ(j["batches"][0]["same_domain"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(j["batches"][1]["mixed"].get<double>(), 3.0);
  EXPECT_TRUE(j["batches"][0].contains("reduction_pct"));

  const std::string text = s.ToText();
  EXPECT_NE(text.find("L=2 E=4 k=2"), std::string::npos) << text;
  EXPECT_NE(text.find("same_domain"), std::string::npos) << text;
  EXPECT_NE(text.find("3*"), std::string::npos) << text;  // reused marker on batch size 3
}

TEST(TraceStatsTest, SyntheticTraceShowsDomainLocality) {
  SynthOptions so;
  so.num_domains = 4;
  so.num_requests = 200;
  so.num_layers = 8;
  so.num_experts = 64;
  so.top_k = 4;
  so.prompt_len_min = so.prompt_len_max = 16;
  so.output_len_min = so.output_len_max = 16;
  auto t = SynthesizeTrace(so);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  TraceStatsOptions o;
  o.batch_sizes = {8, 16};
  TraceStats s = MustStats(*t, o);
  EXPECT_GT(s.prefill_decode_corr, 0.5);
  EXPECT_GT(s.mean_request_prefill_decode_corr, 0.3);
  for (const auto& d : s.domains) EXPECT_GT(d.prefill_decode_corr, 0.5) << d.domain;
  for (const auto& b : s.batches) {
    EXPECT_LT(b.same_domain, b.mixed) << "B=" << b.batch_size;
    EXPECT_GT(b.reduction_pct, 5) << "B=" << b.batch_size;
    EXPECT_LE(b.mixed, std::min(64, b.batch_size * 4));
    EXPECT_FALSE(b.requests_reused);
  }
}

}  // namespace
}  // namespace eldr
