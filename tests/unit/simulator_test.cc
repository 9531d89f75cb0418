// The simulator (runtime/sim): hand-computed timelines, distinct experts from the batch's real routing,
// queueing and admission, accounting invariants, determinism, routing identical to an independent
// nearest-centroid computation, and the cost-model fit against known coefficients.
#include "runtime/sim/simulator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>

#include "runtime/calib/calibrate.h"
#include "runtime/cost/cost_model.h"
#include "runtime/job/workload.h"
#include "runtime/signature/signature.h"
#include "runtime/trace/synth.h"
#include "tests/unit/centroid_reference.h"

namespace eldr {
namespace {

// argmin_k d_k = 1 − s·μ̂_k for a signature (the first k on ties), with the router's 16-bit fixed-point product
// (DESIGN.md §3 "Band routing") recomputed by the test's own implementation of their product.
int ArgminDistance(const Calibration& calib, const std::vector<float>& sig) {
  const std::vector<float> dots =
      testing::CentroidDotsReference(calib.centroids, calib.num_clusters, calib.signature.dim(), sig.data());
  int best = 0;
  for (int k = 1; k < calib.num_clusters; ++k) {
    if (1.0 - static_cast<double>(dots[k]) < 1.0 - static_cast<double>(dots[best])) best = k;
  }
  return best;
}

ModelConfig Tiny() { return LoadModelConfig(std::string(ELDR_SOURCE_DIR) + "/configs/models/tiny.yaml").value(); }
// The model the synthetic step logs below are fitted for: their distinct experts (up to ~60 a step) need more
// (layer, expert) pairs than the tiny model has (2 x 8), and a fit refuses a step above the model's count.
ModelConfig FitModel() {
  return LoadModelConfig(std::string(ELDR_SOURCE_DIR) + "/configs/models/deepseek-v2-lite.yaml").value();
}

// A trace of the tiny model's shape (L=2, E=8, k=2) from explicit rows: each request's rows are
// {prompt rows..., decode rows...}; a row is [L][k] expert ids.
using Row = std::vector<std::vector<uint16_t>>;
struct Req {
  std::string id, domain;
  std::vector<Row> prompt, decode;
};
Trace MakeTrace(const std::vector<Req>& reqs) {
  Trace t;
  t.shape = {"tiny", 2, 8, 2};
  int64_t offset = 0;
  for (const Req& r : reqs) {
    TraceRequest tr;
    tr.id = r.id;
    tr.domain = r.domain;
    tr.prompt_len = static_cast<int64_t>(r.prompt.size());
    tr.num_tokens = tr.prompt_len + static_cast<int64_t>(r.decode.size());
    tr.offset = offset;
    offset += tr.num_tokens;
    t.requests.push_back(tr);
    for (const auto* rows : {&r.prompt, &r.decode}) {
      for (const Row& row : *rows) {
        for (const auto& layer : row) t.topk_ids.insert(t.topk_ids.end(), layer.begin(), layer.end());
      }
    }
  }
  EXPECT_TRUE(ValidateTrace(t, "test").ok());
  return t;
}

JobRequests InOrder(Trace t, std::vector<int64_t> output_len) {
  JobRequests in;
  in.trace = std::move(t);
  for (size_t i = 0; i < output_len.size(); ++i) in.order.push_back(static_cast<int32_t>(i % in.trace.requests.size()));
  in.output_len = std::move(output_len);
  return in;
}

JobConfig Job(RoutingPolicy policy, int decoders, int max_batch = 8) {
  JobConfig c;
  c.path = "test.yaml";
  c.prefill_ranks = 1;
  c.decode_ranks = decoders;
  c.policy = policy;
  c.block_size = 4;
  c.prefill_blocks = 256;
  c.decode_blocks = 256;
  c.max_batch = max_batch;
  c.request_rate = std::numeric_limits<double>::infinity();
  return c;
}

TEST(Simulator, OneRequestTimelineByHand) {
  // Prompt 3 tokens, 4 output tokens (3 decode steps). Every cost term used once, each a distinct power of 2
  // so a wrong term shows.
  Row r0 = {{0, 1}, {2, 3}}, r1 = {{0, 2}, {4, 5}};
  const Trace t = MakeTrace({{"a", "x", {r0, r0, r0}, {r0, r1, r0}}});
  CostModel m;
  m.control_latency = 1e-3;
  m.prefill_a = 2e-3;
  m.prefill_b = 4e-3;  // × 3 computed tokens
  m.kv_latency = 8e-3;
  m.kv_bandwidth = 384e3;  // tiny: 2 (K,V)·3 layers·2 heads·8 dims·4 B = 384 B/token → 3 tokens = 3 ms
  m.decode_a = 16e-3;
  m.decode_b = 1e-3;   // × distinct (Σ over 2 layers)
  m.decode_c = 32e-3;  // × batch 1
  m.decode_d = 1e-4;   // × context tokens
  auto r = Simulate(Job(RoutingPolicy::kRoundRobin, 1), InOrder(t, {4}), Tiny(), nullptr, m, false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const RequestRecord& rec = r->records[0];
  ASSERT_TRUE(rec.success);
  ASSERT_EQ(rec.token_times.size(), 4u);
  const double ttft = 1e-3 + 2e-3 + 4e-3 * 3 + 1e-3;  // to prefill, prefill, back to the router
  EXPECT_NEAR(rec.token_times[0], ttft, 1e-12);
  // Route → prefill (control), KV (8 ms + 3 ms), then step j at context 3 + j + 1 with the row of step j:
  // rows r0, r1, r0 have 2+2 distinct experts each (a single sequence).
  double t_dec = ttft + 1e-3 + 8e-3 + 3e-3;
  for (int j = 0; j < 3; ++j) {
    t_dec += 16e-3 + 1e-3 * 4 + 32e-3 + 1e-4 * (3 + j + 1);
    EXPECT_NEAR(rec.token_times[j + 1], t_dec + 1e-3, 1e-12) << "token " << j + 1;
  }
  EXPECT_EQ(r->decoders[0].steps, 3);
  EXPECT_DOUBLE_EQ(r->decoders[0].distinct_sum, 12);
}

TEST(Simulator, DistinctExpertsAreTheBatchUnion) {
  // Two requests batched on one decoder: their decode rows overlap in some experts. Step 1: a's row {0,1}|{2,3},
  // b's row {1,4}|{3,5} → layer 0 {0,1,4} (3), layer 1 {2,3,5} (3) → 6. Step 2: b alone (a has 2 outputs).
  Row p = {{6, 7}, {6, 7}};
  Row a1 = {{0, 1}, {2, 3}}, b1 = {{1, 4}, {3, 5}}, b2 = {{0, 4}, {2, 3}};
  const Trace t = MakeTrace({{"a", "x", {p}, {a1}}, {"b", "x", {p}, {b1, b2}}});
  CostModel m;
  m.decode_a = 1e-3;
  auto r = Simulate(Job(RoutingPolicy::kRoundRobin, 1), InOrder(t, {2, 3}), Tiny(), nullptr, m, false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // All costs but decode_a are 0, so both requests reach the decoder at t = 0 and share step 1.
  EXPECT_EQ(r->decoders[0].steps, 2);
  EXPECT_DOUBLE_EQ(r->decoders[0].distinct_sum, 6 + 4);
  EXPECT_DOUBLE_EQ(r->decoders[0].batch_sum, 2 + 1);
}

TEST(Simulator, MaxBatchQueuesAndNothingIsDropped) {
  // max_batch 1: request b waits for a's 5 steps, then runs its own 5.
  Row p = {{0, 1}, {0, 1}};
  const Trace t = MakeTrace({{"a", "x", {p}, {p, p, p, p, p}}, {"b", "x", {p}, {p, p, p, p, p}}});
  CostModel m;
  m.decode_a = 1.0;
  auto r = Simulate(Job(RoutingPolicy::kJsq, 1, /*max_batch=*/1), InOrder(t, {6, 6}), Tiny(), nullptr, m, false);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->records[0].token_times.back(), 5.0);
  EXPECT_DOUBLE_EQ(r->records[1].token_times[1], 6.0);
  EXPECT_DOUBLE_EQ(r->records[1].token_times.back(), 10.0);
  EXPECT_EQ(r->decoders[0].steps, 10);
}

TEST(Simulator, KvCapacityQueuesAContextThatDoesNotFitYet) {
  // 4 decode blocks of 4 tokens; each request needs (1 + 7) / 4 = 2 blocks... three requests need 6: the third
  // waits for a completion even though max_batch allows it.
  Row p = {{0, 1}, {0, 1}};
  std::vector<Row> dec(6, p);
  const Trace t = MakeTrace({{"a", "x", {p}, dec}, {"b", "x", {p}, dec}, {"c", "x", {p}, dec}});
  CostModel m;
  m.decode_a = 1.0;
  JobConfig c = Job(RoutingPolicy::kJsq, 1);
  c.decode_blocks = 4;
  auto r = Simulate(c, InOrder(t, {7, 7, 7}), Tiny(), nullptr, m, false);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->records[1].token_times.back(), 6.0);
  EXPECT_DOUBLE_EQ(r->records[2].token_times[1], 7.0);  // admitted after a and b freed their blocks at t = 6
}

TEST(Simulator, ADecoderHoldsPromptPlusOutputMinusOnePositions) {
  // Prompt 1 + output 4: the decoder writes positions 0..3 (the last output token is never an input), one block of
  // 4, as serve's decode worker allocates. One decode block holds it; output 5 (5 positions, 2 blocks) fails.
  Row p = {{0, 1}, {0, 1}};
  const Trace t = MakeTrace({{"fits", "x", {p}, std::vector<Row>(4, p)}, {"over", "x", {p}, std::vector<Row>(5, p)}});
  CostModel m;
  m.decode_a = 1e-3;
  JobConfig c = Job(RoutingPolicy::kJsq, 1);
  c.decode_blocks = 1;
  auto r = Simulate(c, InOrder(t, {4, 5}), Tiny(), nullptr, m, false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->records[0].success) << r->records[0].error;
  EXPECT_FALSE(r->records[1].success);
  EXPECT_NE(r->records[1].error.find("context of 5 tokens exceeds the decode KV cache"), std::string::npos)
      << r->records[1].error;
}

TEST(Simulator, ContextLargerThanTheCacheFailsAndIsCounted) {
  Row p = {{0, 1}, {0, 1}};
  const Trace t = MakeTrace({{"a", "x", {p}, {p}}, {"big", "x", {p}, std::vector<Row>(40, p)}});
  CostModel m;
  m.decode_a = 1e-3;
  JobConfig c = Job(RoutingPolicy::kJsq, 1);
  c.decode_blocks = 4;
  auto r = Simulate(c, InOrder(t, {2, 41}), Tiny(), nullptr, m, false);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->records[0].success);
  EXPECT_FALSE(r->records[1].success);
  EXPECT_NE(r->records[1].error.find("exceeds the decode KV cache"), std::string::npos);
  const auto j = SummarizeServing(r->records, {});
  EXPECT_EQ(j["completed"], 1);
  EXPECT_EQ(j["failed"], 1);
}

struct Synth {
  Trace trace;
  Calibration calib;
};
Synth MakeSynth(int K) {
  SynthOptions o;
  o.num_domains = 3;
  o.num_requests = 120;
  o.num_layers = 2;
  o.num_experts = 8;
  o.top_k = 2;
  o.prompt_len_min = 6;
  o.prompt_len_max = 20;
  o.output_len_min = 3;
  o.output_len_max = 12;
  o.model = "tiny";
  Synth s;
  s.trace = SynthesizeTrace(o).value();
  CalibrateOptions co;
  co.num_decoders = K;
  co.seed = 1;
  s.calib = Calibrate(s.trace, co, nullptr).value();
  return s;
}

TEST(Simulator, EveryRequestIsAccountedForUnderEveryPolicy) {
  const Synth s = MakeSynth(3);
  CostModel m;
  m.decode_a = 2e-3;
  m.decode_b = 1e-4;
  m.prefill_a = 1e-3;
  m.prefill_b = 1e-5;
  m.control_latency = 1e-4;
  for (RoutingPolicy p : AllRoutingPolicies()) {
    JobConfig c = Job(p, 3, 4);
    c.request_rate = 200;
    c.admission_cap = 6;  // exercises holding at the router
    JobRequests in = InOrder(s.trace, std::vector<int64_t>(300, 0));
    for (int64_t i = 0; i < in.size(); ++i) in.output_len[i] = std::max<int64_t>(1, in.request(i).decode_len());
    auto r = Simulate(c, in, Tiny(), &s.calib, m, false);
    ASSERT_TRUE(r.ok()) << RoutingPolicyName(p) << ": " << r.status().ToString();
    int64_t routed = 0;
    for (const auto& d : r->decoders) routed += d.requests;
    EXPECT_EQ(routed, 300) << RoutingPolicyName(p);
    for (int64_t i = 0; i < in.size(); ++i) {
      const RequestRecord& rec = r->records[i];
      ASSERT_TRUE(rec.success) << RoutingPolicyName(p) << " request " << i;
      ASSERT_EQ(rec.output_len, in.output_len[i]);
      ASSERT_GE(rec.token_times.front(), rec.arrival);
      ASSERT_TRUE(std::is_sorted(rec.token_times.begin(), rec.token_times.end()));
    }
    // The same inputs give the same result.
    auto again = Simulate(c, in, Tiny(), &s.calib, m, false);
    ASSERT_TRUE(again.ok());
    for (int64_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(again->records[i].decoder, r->records[i].decoder);
      ASSERT_EQ(again->records[i].token_times, r->records[i].token_times);
    }
  }
}

TEST(Simulator, LocalityRoutingEqualsNearestCentroidOfTheFullPromptCounts) {
  // τ = 0 and no cap: each request goes to argmin_k (1 − s·μ_k) of its signature, computed here from the
  // whole prompt's routing — independent of the prefix cache the simulator assembles counts from (the
  // workload repeats requests, so there are full and partial hits).
  const Synth s = MakeSynth(3);
  CostModel m;
  m.decode_a = 1e-3;
  JobConfig c = Job(RoutingPolicy::kLocalityTop1, 3);
  c.request_rate = 100;
  JobRequests in = InOrder(s.trace, std::vector<int64_t>(360, 4));
  auto r = Simulate(c, in, Tiny(), &s.calib, m, false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const SignatureParams& sp = s.calib.signature;
  const int L = 2, E = 8, D = sp.dim();
  for (int64_t i = 0; i < in.size(); ++i) {
    const TraceRequest& tr = in.request(i);
    std::vector<float> counts(L * E, 0.f), sig(D);
    for (int64_t row = 0; row < tr.prompt_len; ++row) {
      const uint16_t* ids = s.trace.token_ids(tr.offset + row);
      for (int l = 0; l < L; ++l) {
        for (int k = 0; k < 2; ++k) counts[l * E + ids[l * 2 + k]] += 1;
      }
    }
    ComputeSignature(sp, counts.data(), nullptr, sig.data());
    ASSERT_EQ(r->records[i].decoder, ArgminDistance(s.calib, sig)) << "request " << i;
  }
}

// argmin_k (1 − s·μ_k) of the signature of `counts` [L, E] under `calib` (the first k on ties).
int NearestCentroid(const Calibration& calib, const std::vector<float>& counts) {
  std::vector<float> sig(calib.signature.dim());
  ComputeSignature(calib.signature, counts.data(), nullptr, sig.data());
  return ArgminDistance(calib, sig);
}

// The [L, E] expert counts of rows [from, to) of trace request `tr` (tiny shape: L = 2, E = 8, k = 2).
std::vector<float> RowCounts(const Trace& t, const TraceRequest& tr, int64_t from, int64_t to) {
  std::vector<float> counts(2 * 8, 0.f);
  for (int64_t row = from; row < to; ++row) {
    const uint16_t* ids = t.token_ids(tr.offset + row);
    for (int l = 0; l < 2; ++l) {
      for (int k = 0; k < 2; ++k) counts[l * 8 + ids[l * 2 + k]] += 1;
    }
  }
  return counts;
}

TEST(Simulator, RouteOnDecodeRoutesByTheDecodeTokensCounts) {
  // A calibration fitted on decode tokens (--features decode) and --route-on decode: with τ = 0 each request goes
  // to the nearest centroid of its decode tokens' counts, computed here from the trace rows; the prompt's counts
  // would send some requests elsewhere (so the test tells the two apart).
  Synth s = MakeSynth(3);
  CalibrateOptions co;
  co.num_decoders = 3;
  co.seed = 1;
  co.progress = false;
  co.features = SignatureFeatures::kDecode;
  const Calibration decode_calib = Calibrate(s.trace, co, nullptr).value();
  ASSERT_EQ(decode_calib.features, SignatureFeatures::kDecode);
  CostModel m;
  m.decode_a = 1e-3;
  JobConfig c = Job(RoutingPolicy::kLocalityTop1, 3);
  c.request_rate = 100;
  c.route_on_decode = true;
  JobRequests in = InOrder(s.trace, std::vector<int64_t>(s.trace.requests.size(), 4));
  auto r = Simulate(c, in, Tiny(), &decode_calib, m, false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  int differs = 0;
  for (int64_t i = 0; i < in.size(); ++i) {
    const TraceRequest& tr = in.request(i);
    const int by_decode = NearestCentroid(decode_calib, RowCounts(s.trace, tr, tr.prompt_len, tr.num_tokens));
    const int by_prompt = NearestCentroid(decode_calib, RowCounts(s.trace, tr, 0, tr.prompt_len));
    ASSERT_EQ(r->records[i].decoder, by_decode) << "request " << i;
    differs += by_decode != by_prompt ? 1 : 0;
  }
  EXPECT_GT(differs, 0);
}

TEST(Simulator, DecodeFeatureCalibrationAndRouteOnMustMatch) {
  // A decode-token calibration with prefill routing (what serve does) is refused, and so is --route-on decode
  // with a prefill calibration; load policies ignore both.
  Synth s = MakeSynth(2);
  CalibrateOptions co;
  co.num_decoders = 2;
  co.progress = false;
  co.features = SignatureFeatures::kDecode;
  const Calibration decode_calib = Calibrate(s.trace, co, nullptr).value();
  CostModel m;
  m.decode_a = 1e-3;
  JobRequests in = InOrder(s.trace, std::vector<int64_t>(10, 2));
  JobConfig c = Job(RoutingPolicy::kEldr, 2);
  auto r = Simulate(c, in, Tiny(), &decode_calib, m, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--route-on decode"), std::string::npos) << r.status().message();
  c.route_on_decode = true;
  r = Simulate(c, in, Tiny(), &s.calib, m, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--features decode"), std::string::npos) << r.status().message();
  EXPECT_TRUE(Simulate(c, in, Tiny(), &decode_calib, m, false).ok());
  c.policy = RoutingPolicy::kJsq;
  EXPECT_TRUE(Simulate(c, in, Tiny(), &s.calib, m, false).ok());
}

TEST(Simulator, RoundRobinAndTheDecoderCount) {
  const Synth s = MakeSynth(3);
  CostModel m;
  m.decode_a = 1e-3;
  JobConfig c = Job(RoutingPolicy::kRoundRobin, 5);
  JobRequests in = InOrder(s.trace, std::vector<int64_t>(50, 3));
  auto r = Simulate(c, in, Tiny(), nullptr, m, false);
  ASSERT_TRUE(r.ok());
  // One prefill rank, equal prefill times: requests reach the router in order, so request i → i mod 5.
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(r->records[i].decoder, i % 5);
}

TEST(Simulator, SignaturePolicyWithoutCalibrationIsAnError) {
  const Synth s = MakeSynth(3);
  auto r = Simulate(Job(RoutingPolicy::kEldr, 3), InOrder(s.trace, {3}), Tiny(), nullptr, CostModel{}, false);
  EXPECT_FALSE(r.ok());
}

// decode.ep_size > 1 is not modelled: refused with one line, not simulated as if it were 1.
TEST(Simulator, EpSizeAboveOneIsRefused) {
  const Synth s = MakeSynth(3);
  JobConfig c = Job(RoutingPolicy::kRoundRobin, 3);
  c.ep_size = 2;
  auto r = Simulate(c, InOrder(s.trace, {3}), Tiny(), nullptr, CostModel{}, false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      r.status().message(),
      "test.yaml: decode.ep_size 2: eldr simulate does not model expert-parallel decoders; simulate with ep_size 1");
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
}

// Per-decoder stats name the decoder and its leader rank as serve does: 1 + P + k (ep_size 1).
TEST(Simulator, DecoderStatsCarryDecoderAndLeaderRank) {
  const Synth s = MakeSynth(3);
  JobConfig c = Job(RoutingPolicy::kRoundRobin, 3);
  c.prefill_ranks = 2;
  auto r = Simulate(c, InOrder(s.trace, {3, 3, 3}), Tiny(), nullptr, CostModel{}, false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->decoders.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(r->decoders[k].decoder, k);
    EXPECT_EQ(r->decoders[k].leader_rank, 1 + 2 + k);
    EXPECT_EQ(r->decoders[k].requests, 1);
  }
}

TEST(CostModel, NonNegativeLeastSquaresRecoversKnownCoefficients) {
  std::vector<double> x, y;
  for (int i = 0; i < 50; ++i) {
    const double d = i % 7, b = (i * 3) % 11, ctx = (i * 13) % 17;
    x.insert(x.end(), {1.0, d, b, ctx});
    y.push_back(0.5 + 2 * d + 3 * b + 0.25 * ctx);
  }
  const auto beta = NonNegativeLeastSquares(x, y, 4);
  EXPECT_NEAR(beta[0], 0.5, 1e-9);
  EXPECT_NEAR(beta[1], 2, 1e-9);
  EXPECT_NEAR(beta[2], 3, 1e-9);
  EXPECT_NEAR(beta[3], 0.25, 1e-9);
}

TEST(CostModel, NegativeCoefficientIsClampedAndTheRestIsTheBestFit) {
  // y = 1 + 2·x1 − 0.5·x2: the best fit with β2 ≥ 0 has β2 = 0 and (β0, β1) from the 2-column fit, which
  // brute force over a grid cannot beat.
  std::vector<double> x, y;
  for (int i = 0; i < 40; ++i) {
    const double a = i % 5, b = (i * 7) % 9;
    x.insert(x.end(), {1.0, a, b});
    y.push_back(1 + 2 * a - 0.5 * b);
  }
  const auto beta = NonNegativeLeastSquares(x, y, 3);
  for (double v : beta) EXPECT_GE(v, 0);
  auto ss = [&](const std::vector<double>& bt) {
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      const double p = x[i * 3] * bt[0] + x[i * 3 + 1] * bt[1] + x[i * 3 + 2] * bt[2];
      s += (p - y[i]) * (p - y[i]);
    }
    return s;
  };
  const double best = ss(beta);
  for (double b0 = 0; b0 <= 4; b0 += 0.05) {
    for (double b1 = 0; b1 <= 4; b1 += 0.05) {
      for (double b2 = 0; b2 <= 1; b2 += 0.05) EXPECT_GE(ss({b0, b1, b2}), best - 1e-9);
    }
  }
}

TEST(CostModel, FitFromAStepLog) {
  const std::string path = ::testing::TempDir() + "/steps.jsonl";
  {
    std::ofstream o(path);
    for (int i = 0; i < 40; ++i) {
      const int distinct = 10 + i % 9, batch = 1 + i % 5, context = 100 + 37 * i;
      const double s = 1e-3 + 2e-5 * distinct + 3e-4 * batch + 1e-7 * context;
      o << R"({"kind":"decode","worker":0,"time":0,"seconds":)" << s << R"(,"batch":)" << batch
        << R"(,"distinct_experts":)" << distinct << R"(,"context_tokens":)" << context << "}\n";
      o << R"({"kind":"prefill","worker":0,"time":0,"seconds":)" << 2e-3 + 1e-5 * (i + 1) << R"(,"prompt_tokens":)"
        << i + 1 << "}\n";
    }
  }
  auto r = FitCostModel({path}, FitModel());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NEAR(r->model.decode_a, 1e-3, 1e-9);
  EXPECT_NEAR(r->model.decode_b, 2e-5, 1e-10);
  EXPECT_NEAR(r->model.decode_c, 3e-4, 1e-9);
  EXPECT_NEAR(r->model.decode_d, 1e-7, 1e-12);
  EXPECT_NEAR(r->model.prefill_a, 2e-3, 1e-9);
  EXPECT_NEAR(r->model.prefill_b, 1e-5, 1e-10);
  EXPECT_GT(r->decode_r2, 0.999999);
  // A malformed line is named.
  {
    std::ofstream o(path, std::ios::app);
    o << "{\"kind\":\"decode\",\"seconds\":\"x\"}\n";
  }
  auto bad = FitCostModel({path}, FitModel());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("steps.jsonl:81"), std::string::npos) << bad.status().message();
}

// A step log of 40 decode steps and 40 prefills with the given features; time = 1 ms + 20 us/expert + 300 us/sequence
// + 100 ns/context token (exact), prefill 2 ms + 10 us/token.
std::string WriteSteps(const std::string& name, const std::function<int(int)>& distinct,
                       const std::function<int(int)>& batch, const std::function<int(int)>& prompt) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream o(path);
  for (int i = 0; i < 40; ++i) {
    const int context = 100 + 37 * i;
    const double s = 1e-3 + 2e-5 * distinct(i) + 3e-4 * batch(i) + 1e-7 * context;
    o << R"({"kind":"decode","worker":0,"time":0,"seconds":)" << s << R"(,"batch":)" << batch(i)
      << R"(,"distinct_experts":)" << distinct(i) << R"(,"context_tokens":)" << context << "}\n";
    o << R"({"kind":"prefill","worker":0,"time":0,"seconds":)" << 2e-3 + 1e-5 * prompt(i) << R"(,"prompt_tokens":)"
      << prompt(i) << "}\n";
  }
  return path;
}

TEST(CostModel, CollinearDesignIsRefusedNamingTheTermsAndTheDataThatWouldSeparateThem) {
  // Distinct experts exactly 2 per sequence: b and c cannot be told apart (the fit reported R^2 1.000 and some split).
  const auto batch = [](int i) { return 1 + i % 5; };
  const auto prompt = [](int i) { return i + 1; };
  auto r = FitCostModel({WriteSteps(
                            "prop.jsonl", [&](int i) { return 2 * batch(i); }, batch, prompt)},
                        FitModel());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "the decode steps cannot tell decode.b (s per distinct expert) from decode.c (s per sequence): distinct "
            "experts = 2·batch in all 40 of them (a collinear design: every split between these terms fits equally "
            "well); add decode steps where the distinct experts vary at a fixed batch (e.g. same-domain and mixed "
            "batches of one size)");
  // Every step activating the same experts: b against the intercept.
  r = FitCostModel({WriteSteps(
                       "const.jsonl", [](int) { return 52; }, batch, prompt)},
                   FitModel());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cannot tell decode.a (s per step) from decode.b (s per distinct expert): "
                                      "distinct experts = 52 in all 40"),
            std::string::npos)
      << r.status().message();
  // One prompt length: prefill.a against prefill.b.
  r = FitCostModel({WriteSteps(
                       "prompt.jsonl", [](int i) { return 10 + i % 9; }, batch, [](int) { return 16; })},
                   FitModel());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("the prefills cannot tell prefill.a (s per prefill) from prefill.b"),
            std::string::npos)
      << r.status().message();
  // One expert more in every fourth step at each batch: identified, and the exact coefficients come back.
  r = FitCostModel({WriteSteps(
                       "near.jsonl", [&](int i) { return 2 * batch(i) + (i % 4 == 0); }, batch, prompt)},
                   FitModel());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_NEAR(r->model.decode_b, 2e-5, 1e-10);
  EXPECT_NEAR(r->model.decode_c, 3e-4, 1e-9);
}

TEST(CostModel, GivenPrefillTermsKeepTheDecodeFitOfLogsWithOnePromptLength) {
  // Every prefill has 16 prompt tokens: prefill.a and prefill.b cannot be fitted, the decode steps are fine.
  const auto batch = [](int i) { return 1 + i % 5; };
  const std::string path = WriteSteps(
      "one_prompt.jsonl", [&](int i) { return 10 * batch(i) + i % 7; }, batch, [](int) { return 16; });
  ASSERT_FALSE(FitCostModel({path}, FitModel()).ok());
  CostModel given;
  given.source = "prefill.yaml";
  given.prefill_a = 7e-3;
  given.prefill_b = 4e-6;
  given.decode_b = 1;  // only the prefill terms are taken
  auto r = FitCostModel({path}, FitModel(), 0, &given);
  ASSERT_TRUE(r.ok()) << r.status().message();
  // WriteSteps' decode coefficients, exactly; the prefill ones as given (not the logs' 2 ms + 10 us/token).
  EXPECT_NEAR(r->model.decode_a, 1e-3, 1e-9);
  EXPECT_NEAR(r->model.decode_b, 2e-5, 1e-10);
  EXPECT_NEAR(r->model.decode_c, 3e-4, 1e-9);
  EXPECT_NEAR(r->model.decode_d, 1e-7, 1e-12);
  EXPECT_EQ(r->model.prefill_a, 7e-3);
  EXPECT_EQ(r->model.prefill_b, 4e-6);
  EXPECT_EQ(r->prefill_samples, 0);
  EXPECT_EQ(r->prefill_given_by, "prefill.yaml");
  EXPECT_NE(r->model.source.find("prefill given by prefill.yaml"), std::string::npos) << r->model.source;
  EXPECT_NE(r->Summary().find("prefill terms given, not fitted"), std::string::npos) << r->Summary();
}

TEST(CostModel, CollinearBenchResultsAreRefused) {
  // BM_MoeLayer/<distinct>/<batch> with distinct = 4·batch in every result.
  const std::string path = ::testing::TempDir() + "/bench_collinear.json";
  {
    std::ofstream o(path);
    o << R"({"benchmarks": [)";
    for (int b = 1; b <= 4; ++b) {
      o << (b > 1 ? "," : "") << R"({"name": "BM_MoeLayer/)" << 4 * b << "/" << b
        << R"(", "run_type": "iteration", "time_unit": "ms", "real_time": )" << 1.0 + 0.1 * b << "}";
    }
    o << "]}";
  }
  auto r = FitCostModel({path}, FitModel());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("the BM_MoeLayer results cannot tell decode.b (s per distinct expert) from "
                                      "decode.c (s per sequence): distinct experts = 4·batch in all 4 of them"),
            std::string::npos)
      << r.status().message();
}

TEST(CostModel, WithinBatchFitSeparatesExpertsFromTheBatch) {
  // Distinct experts grow with the batch (100 per sequence) and vary by ±{0, 5, 10} at each batch; the time is
  // 1 ms + 20 us/expert + 300 us/sequence + 100 ns/context token. Only the within-batch variation carries b:
  // the estimator must give b and d exactly, partial r = 1 (no noise).
  std::vector<double> x, y;
  for (int batch = 1; batch <= 8; ++batch) {
    for (int k = 0; k < 6; ++k) {
      const double distinct = 100.0 * batch + 5.0 * (k % 3) - 5.0, context = 50.0 * batch + 7.0 * k;
      x.insert(x.end(), {1.0, distinct, double(batch), context});
      y.push_back(1e-3 + 2e-5 * distinct + 3e-4 * batch + 1e-7 * context);
    }
  }
  const WithinBatchFit w = FitWithinBatch(x, y);
  EXPECT_EQ(w.steps, 48);
  EXPECT_EQ(w.groups, 8);
  EXPECT_NEAR(w.b, 2e-5, 1e-12);
  EXPECT_NEAR(w.d, 1e-7, 1e-13);
  EXPECT_NEAR(w.partial_r, 1.0, 1e-9);
  EXPECT_NEAR(w.b_se, 0.0, 1e-12);
  // Within share by hand: per batch the deviations are −5, 0, 5 twice (Σ = 100 per batch, 800 in all); the
  // total variance about the grand mean adds 100²·Σ(batch − 4.5)²·6 = 10⁴·42·6.
  EXPECT_NEAR(w.within_share, 800.0 / (800.0 + 1e4 * 42 * 6), 1e-12);
}

TEST(CostModel, WithinBatchFitFindsNoExpertTermWhereTimeFollowsTheBatchOnly) {
  // Time = 2 ms per sequence; distinct experts rise with the batch and vary at a fixed batch. A pooled fit may
  // credit the batch's cost to distinct experts; the within-batch slope is exactly 0.
  std::vector<double> x, y;
  for (int batch = 1; batch <= 6; ++batch) {
    for (int k = 0; k < 4; ++k) {
      x.insert(x.end(), {1.0, 50.0 * batch + 3.0 * k, double(batch), 10.0});
      y.push_back(2e-3 * batch);
    }
  }
  const WithinBatchFit w = FitWithinBatch(x, y);
  EXPECT_EQ(w.groups, 6);
  EXPECT_NEAR(w.b, 0.0, 1e-15);
  EXPECT_NEAR(w.d, 0.0, 1e-15);  // context constant: the fit uses distinct experts alone
  EXPECT_EQ(w.partial_r, 0.0);
}

TEST(CostModel, WithinBatchFitByHand) {
  // Two batch sizes, context constant. Batch 1: distinct (10, 12, 14), time (1, 2, 4); batch 2: distinct (20, 22),
  // time (5, 5). Deviations: distinct (−2, 0, 2 | −1, 1), time (−4/3, −1/3, 5/3 | 0, 0); Σ e·t = 6, Σ e² = 10:
  // b = 0.6. Residuals t − 0.6·e = (−2/15, −1/3, 7/15 | 0.6, −0.6); dof =
  // 5 − 2 − 1 = 2; se = sqrt(SSR/2/10). A batch size with a single step is left out.
  std::vector<double> x, y;
  auto add = [&](double batch, double distinct, double time) {
    x.insert(x.end(), {1.0, distinct, batch, 0.0});
    y.push_back(time);
  };
  add(1, 10, 1), add(1, 12, 2), add(1, 14, 4), add(2, 20, 5), add(2, 22, 5), add(3, 40, 9);
  const WithinBatchFit w = FitWithinBatch(x, y);
  EXPECT_EQ(w.steps, 5);
  EXPECT_EQ(w.groups, 2);
  EXPECT_NEAR(w.b, 0.6, 1e-12);
  const double ssr = std::pow(-4.0 / 3 + 1.2, 2) + std::pow(-1.0 / 3, 2) + std::pow(5.0 / 3 - 1.2, 2) + 0.36 + 0.36;
  EXPECT_NEAR(w.b_se, std::sqrt(ssr / 2 / 10), 1e-12);
  // Σ t² = 16/9 + 1/9 + 25/9 = 42/9: r = 6 / sqrt(10 · 42/9).
  EXPECT_NEAR(w.partial_r, 6 / std::sqrt(10 * 42.0 / 9), 1e-12);
}

TEST(CostModel, WithinBatchFitComparesStepsOfOneSourceOnly) {
  // Two runs (sources 7 and 9) at batches 1 and 2; time = 10 us per distinct expert exactly, plus 1 ms in run 9
  // only (a slower machine while it ran). Run 9 has fewer distinct experts at each batch (a locality policy): at
  // batch B, run 7 has 100B and 100B + 10, run 9 100B − 20 and 100B − 10. Within (source, batch) the deviations are
  // ±5 and the time's ±50 us: b = 1e-5 exactly, partial r = 1.
  std::vector<double> x, y;
  std::vector<int64_t> source;
  auto add = [&](int64_t src, double batch, double distinct, double extra) {
    x.insert(x.end(), {1.0, distinct, batch, 0.0});
    y.push_back(1e-5 * distinct + extra);
    source.push_back(src);
  };
  for (double batch : {1.0, 2.0}) {
    const double base = 100 * batch;
    add(7, batch, base, 0), add(7, batch, base + 10, 0), add(9, batch, base - 20, 1e-3), add(9, batch, base - 10, 1e-3);
  }
  const WithinBatchFit w = FitWithinBatch(x, y, source);
  EXPECT_EQ(w.steps, 8);
  EXPECT_EQ(w.groups, 4);
  EXPECT_NEAR(w.b, 1e-5, 1e-15);
  EXPECT_NEAR(w.partial_r, 1.0, 1e-12);
  // By batch alone, run 9's extra millisecond rides on its lower counts. Per batch the distinct deviations are
  // (5, 15, −15, −5), Σ e² = 500; the time's are 1e-5·e + (−0.5, −0.5, 0.5, 0.5) ms, so Σ e·t = 5e-3 − 20e-3 =
  // −15e-3. Over both batches b = −30e-3 / 1000 = −3e-5: a negative cost per expert.
  const WithinBatchFit pooled = FitWithinBatch(x, y);
  EXPECT_EQ(pooled.groups, 2);
  EXPECT_NEAR(pooled.b, -3e-5, 1e-15);
}

TEST(Simulator, SharedCoresSlowConcurrentWork) {
  // cores = 1: two decoders start a 1 s step at t = 0 and share the core: both end at t = 2 (processor sharing).
  Row p = {{0, 1}, {0, 1}};
  const Trace t = MakeTrace({{"a", "x", {p}, {p}}, {"b", "x", {p}, {p}}});
  CostModel m;
  m.decode_a = 1.0;
  m.cores = 1;
  auto r = Simulate(Job(RoutingPolicy::kRoundRobin, 2), InOrder(t, {2, 2}), Tiny(), nullptr, m, false);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->records[0].token_times[1], 2.0);
  EXPECT_DOUBLE_EQ(r->records[1].token_times[1], 2.0);
  // cores = 2: no sharing needed, both end at 1.
  m.cores = 2;
  r = Simulate(Job(RoutingPolicy::kRoundRobin, 2), InOrder(t, {2, 2}), Tiny(), nullptr, m, false);
  EXPECT_DOUBLE_EQ(r->records[1].token_times[1], 1.0);
  m.cores = 0;  // a device per worker
  r = Simulate(Job(RoutingPolicy::kRoundRobin, 2), InOrder(t, {2, 2}), Tiny(), nullptr, m, false);
  EXPECT_DOUBLE_EQ(r->records[1].token_times[1], 1.0);
}

TEST(CostModel, FitRemovesCoreSharing) {
  // Pairs of identical decode steps run side by side on 1 core: each was measured at twice its own time.
  const std::string path = ::testing::TempDir() + "/shared_steps.jsonl";
  {
    std::ofstream o(path);
    double t = 0;
    for (int i = 0; i < 30; ++i) {
      const int distinct = 8 + i % 5, batch = 1 + i % 3, context = 40 + 9 * i;
      const double own = 1e-3 + 2e-5 * distinct + 3e-4 * batch + 1e-7 * context;
      for (int w = 0; w < 2; ++w) {
        o << R"({"kind":"decode","worker":)" << w << R"(,"time":)" << t + 2 * own << R"(,"seconds":)" << 2 * own
          << R"(,"batch":)" << batch << R"(,"distinct_experts":)" << distinct << R"(,"context_tokens":)" << context
          << "}\n";
      }
      t += 2 * own + 0.5;  // idle gap between pairs
    }
  }
  auto shared = FitCostModel({path}, FitModel(), 1.0);
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  EXPECT_NEAR(shared->model.decode_a, 1e-3, 1e-8);
  EXPECT_NEAR(shared->model.decode_b, 2e-5, 1e-9);
  EXPECT_NEAR(shared->model.decode_c, 3e-4, 1e-8);
  EXPECT_EQ(shared->model.cores, 1.0);
  auto unshared = FitCostModel({path}, FitModel(), 0.0);  // without the correction: twice the coefficients
  ASSERT_TRUE(unshared.ok());
  EXPECT_NEAR(unshared->model.decode_a, 2e-3, 1e-8);
}

TEST(CostModel, HardwareFiguresArePlausible) {
  // The reference device and every figure a writer fills in pass; a finite but absurd one is refused by name.
  const DeviceSpec h200;
  EXPECT_TRUE(kMemoryBandwidth.Contains(h200.memory_bandwidth));
  EXPECT_TRUE(kLinkBandwidth.Contains(h200.link_bandwidth));
  const ModelConfig q = LoadModelConfig(std::string(ELDR_SOURCE_DIR) + "/configs/models/qwen3-30b-a3b.yaml").value();
  CostModel m = DeriveCostModel(q, h200);
  EXPECT_TRUE(CheckCostModel(m, "derived").ok());
  m.kv_bandwidth = 0;  // a transfer that costs its latency only
  m.cores = 0.5;
  EXPECT_TRUE(CheckCostModel(m, "derived").ok());
  m.kv_bandwidth = 1e30;
  EXPECT_EQ(CheckCostModel(m, "derived").message(),
            "derived: kv_transfer.bandwidth_Bps = 1e+30, must be 0 or in [1e6, 1e13] (" + kLinkBandwidth.why + ")");
  m.kv_bandwidth = 5e9;
  m.cores = 1e-9;
  EXPECT_NE(CheckCostModel(m, "derived").message().find("cores = 1e-09, must be 0 or in [0.1, 65536]"),
            std::string::npos);
  m.cores = -0.0;
  EXPECT_NE(CheckCostModel(m, "derived").message().find("(a negative zero: write 0)"), std::string::npos);
  // --fit --cores takes the same range.
  EXPECT_NE(
      FitCostModel({"unused.jsonl"}, FitModel(), 1e30).status().message().find("--cores must be 0 or in [0.1, 65536]"),
      std::string::npos);
}

TEST(CostModel, DerivedH200ModelIsBandwidthBound) {
  const ModelConfig q = LoadModelConfig(std::string(ELDR_SOURCE_DIR) + "/configs/models/qwen3-30b-a3b.yaml").value();
  const CostModel m = DeriveCostModel(q, DeviceSpec{});
  // One bf16 expert of Qwen3-30B-A3B: 3·2048·768·2 B = 9.437 MB, at 4.8 TB/s = 1.966 µs.
  EXPECT_NEAR(m.decode_b, 3.0 * 2048 * 768 * 2 / 4.8e12, 1e-12);
  // KV per token: 2·48 layers·4 heads·128·2 B = 98304 B → 20.48 ns.
  EXPECT_NEAR(m.decode_d, 98304 / 4.8e12, 1e-15);
  // 128 distinct experts in each of 48 layers cost 12 ms; 16 per layer 1.5 ms.
  EXPECT_NEAR(m.decode_b * 128 * 48, 12.08e-3, 0.01e-3);
}

}  // namespace
}  // namespace eldr
