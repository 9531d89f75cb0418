// eldr, the marginal-cost rule (DESIGN.md §3 "Marginal-cost routing"): the predicted expert union against hand-computed
// products and a brute-force recomputation, the marginal cost against hand-computed prices, and the decision rule.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "runtime/router/predicted_union.h"
#include "runtime/router/router.h"

namespace eldr {
namespace {

// L = 2, E = 2, only layer 0 in the mask (scale 2). Profile 0 at layer 0: {0.5, 0.5}; profile 1: {0.2, 0.8}.
PredictedUnion HandUnion() {
  std::vector<float> profiles = {0.5f, 0.5f, 0.9f, 0.9f,   // p0: layer 0, then layer 1 (ignored)
                                 0.2f, 0.8f, 0.9f, 0.9f};  // p1
  return PredictedUnion(profiles, 2, {1, 0}, 2, 2, 1);
}

TEST(PredictedUnion, HandComputedProducts) {
  PredictedUnion u = HandUnion();
  EXPECT_DOUBLE_EQ(u.Union(0), 0);
  EXPECT_NEAR(u.Growth(0, 0), 2 * (0.5 + 0.5), 1e-6);
  u.Add(0, 0);  // untouched {0.5, 0.5}
  EXPECT_NEAR(u.Union(0), 2 * (2 - 1.0), 1e-6);
  EXPECT_NEAR(u.Growth(0, 1), 2 * (0.5 * 0.2 + 0.5 * 0.8), 1e-6);
  u.Add(0, 1);  // untouched {0.4, 0.1}
  EXPECT_NEAR(u.Union(0), 2 * (2 - 0.5), 1e-6);
  u.Remove(0, 0);  // untouched {0.8, 0.2}
  EXPECT_NEAR(u.Union(0), 2 * (2 - 1.0), 1e-6);
  u.Remove(0, 1);
  EXPECT_EQ(u.Union(0), 0);  // exactly: an empty decoder's products are reset
  EXPECT_EQ(u.requests(0), 0);
}

TEST(PredictedUnion, MatchesABruteForceProductOverRandomAddsAndRemoves) {
  const int L = 3, E = 8, P = 4, K = 3;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  std::vector<float> profiles(P * L * E);
  for (float& q : profiles) q = uni(rng) < 0.3f ? 0.f : uni(rng);
  profiles[5] = 1.0f;  // a certain expert (clamped below 1)
  const std::vector<uint8_t> mask = {1, 0, 1};
  PredictedUnion u(profiles, P, mask, L, E, K);
  std::vector<std::vector<int>> members(K);
  for (int step = 0; step < 400; ++step) {
    const int k = static_cast<int>(rng() % K);
    if (!members[k].empty() && rng() % 3 == 0) {
      const size_t i = rng() % members[k].size();
      u.Remove(k, members[k][i]);
      members[k].erase(members[k].begin() + static_cast<long>(i));
    } else {
      const int p = static_cast<int>(rng() % P);
      u.Add(k, p);
      members[k].push_back(p);
    }
    for (int d = 0; d < K; ++d) {
      double uni_sum = 0, growth = 0;
      const int p = step % P;
      for (int l = 0; l < L; ++l) {
        if (!mask[l]) continue;
        for (int e = 0; e < E; ++e) {
          double keep = 1;
          for (int m : members[d]) keep *= 1 - std::min(profiles[(m * L + l) * E + e], 1.0f - 1e-6f);
          uni_sum += 1 - keep;
          growth += keep * std::min(profiles[(p * L + l) * E + e], 1.0f - 1e-6f);
        }
      }
      const double scale = 3.0 / 2.0;
      ASSERT_NEAR(u.Union(d), scale * uni_sum, 1e-4) << "step " << step << " decoder " << d;
      ASSERT_NEAR(u.Growth(d, p), scale * growth, 1e-4);
    }
  }
}

// L = 1, E = 4, count signatures, centroid k = e_k; cluster profiles: 0 → {0.5, 0.5, 0, 0}, 1 → {0, 0, 0.5, 0.5};
// prior 4 decode tokens for both.
Calibration CostCalibration() {
  Calibration c;
  c.shape = {"tiny", 1, 4, 1};
  c.signature = {SignatureVariant::kCount, 1, 4, {1, 1, 1, 1}, {1}};
  c.num_clusters = 2;
  c.tau = 0.1;
  c.centroids = {1, 0, 0, 0, 0, 0, 1, 0};
  c.expert_load = {0.5f, 0.5f, 0, 0, 0, 0, 0.5f, 0.5f};
  c.mean_decode_len = {4, 4};
  return c;
}

// harm_weight 1 (the social optimum) unless given: the hand-computed prices below add the whole harm.
Router CostRouter(const Calibration& calib, double b, double c, double d, int64_t max_batch, double harm = 1,
                  int64_t tokens_at_routing = 0) {
  RouterConfig rc;
  rc.harm_weight = harm;
  rc.tokens_at_routing = tokens_at_routing;
  rc.policy = RoutingPolicy::kEldr;
  rc.num_decoders = 2;
  rc.job_shape = calib.shape;
  rc.max_batch = max_batch;
  CostModel m;
  m.decode_a = 1e-3;
  m.decode_b = b;
  m.decode_c = c;
  m.decode_d = d;
  rc.step_cost = m;
  auto r = Router::Create(rc, &calib);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return std::move(r).value();
}

// A hand-built decision: a request of cluster `cluster` (4 predicted tokens, no context) held by `decoder`.
RoutingDecision Held(int decoder, int cluster) {
  RoutingDecision d;
  d.decoder = decoder;
  d.nearest = cluster;
  d.predicted_tokens = 4;
  return d;
}

TEST(MarginalCost, HandComputedPrices) {
  const Calibration calib = CostCalibration();
  Router r = CostRouter(calib, 1e-5, 1e-4, 1e-6, 64);
  const std::vector<float> c0 = {3, 0, 0, 0}, c1 = {0, 0, 2, 0};  // nearest 0 (3 prompt tokens), nearest 1 (2)
  // Empty decoders: own step = a + b·ΔU + c·1 + d·(3 + 4/2), ΔU = 0.5 + 0.5.
  EXPECT_NEAR(r.MarginalCost(0, 0, 3, 4), 1e-3 + 1e-5 * 1.0 + 1e-4 + 1e-6 * 5, 1e-12);
  const RoutingDecision a = r.Route(c0.data(), nullptr, "");
  EXPECT_EQ(a.nearest, 0);
  EXPECT_DOUBLE_EQ(a.context, 3);
  EXPECT_EQ(a.decoder, 0);  // equal prices: the nearer centroid
  r.Dispatch(a);
  const RoutingDecision b = r.Route(c1.data(), nullptr, "");
  EXPECT_EQ(b.decoder, 1);  // an idle decoder is cheaper than a busy one
  r.Dispatch(b);
  // Decoder 0 holds a cluster-0 request (U = 1, context 3 + 2), decoder 1 a cluster-1 request (U = 1, context
  // 2 + 2). A new cluster-0 request (3 prompt tokens): ΔU = 0.5 on decoder 0, 1 on decoder 1.
  const double own0 = 1e-3 + 1e-5 * 1.5 + 1e-4 * 2 + 1e-6 * (5 + 5), harm0 = 1e-5 * 0.5 + 1e-4 + 1e-6 * 5;
  const double own1 = 1e-3 + 1e-5 * 2.0 + 1e-4 * 2 + 1e-6 * (4 + 5), harm1 = 1e-5 * 1.0 + 1e-4 + 1e-6 * 5;
  EXPECT_NEAR(r.MarginalCost(0, 0, 3, 4), own0 + harm0, 1e-12);
  EXPECT_NEAR(r.MarginalCost(1, 0, 3, 4), own1 + harm1, 1e-12);
  const RoutingDecision c = r.Route(c0.data(), nullptr, "");
  EXPECT_EQ(c.decoder, 0);  // shares experts with decoder 0's request
  EXPECT_NEAR(c.predicted_cost, own0 + harm0, 1e-12);
  // λ = 0.5 halves the slowdown term.
  Router half = CostRouter(calib, 1e-5, 1e-4, 1e-6, 64, 0.5);
  half.Dispatch(a);
  half.Dispatch(b);
  EXPECT_NEAR(half.MarginalCost(0, 0, 3, 4), own0 + 0.5 * harm0, 1e-12);
  EXPECT_NEAR(half.MarginalCost(1, 0, 3, 4), own1 + 0.5 * harm1, 1e-12);
  // Completions release the union and the context exactly.
  r.Complete(a);
  r.Complete(b);
  EXPECT_NEAR(r.MarginalCost(1, 0, 3, 4), 1e-3 + 1e-5 * 1.0 + 1e-4 + 1e-6 * 5, 1e-12);
}

// The slowdown a request causes a running request j counts for the share of j's decode the two overlap,
// min(tokens, m_j) / (g_j + m_j), with m_j = DecodeLengthPrior::Remaining (decode_length_test checks that rule).
// By hand: b = d = 0, c = 1e-4, λ = 1; calibration lengths: cluster 0 {2, 6}, cluster 1 {10}.
TEST(MarginalCost, TheSlowdownCountsForTheShareOfTheRunningRequestsDecodeItOverlaps) {
  Calibration calib = CostCalibration();
  calib.decode_lens = {2, 6, 10};
  calib.assignment = {0, 0, 1};
  calib.mean_decode_len = {4, 10};
  Router r = CostRouter(calib, 0, 1e-4, 0, 64);
  const double a = 1e-3, c = 1e-4;
  const std::vector<float> c0 = {3, 0, 0, 0};
  const RoutingDecision x = r.Route(c0.data(), nullptr, "");
  ASSERT_EQ(x.decoder, 0);
  EXPECT_DOUBLE_EQ(x.predicted_tokens, 4);  // cluster 0's mean
  r.Dispatch(x);
  // Fresh: m = 4, g = 0; a newcomer of 10 tokens overlaps all of it.
  EXPECT_NEAR(r.MarginalCost(0, 1, 0, 10), a + 2 * c + 1.0 * c, 1e-15);
  for (int t = 0; t < 3; ++t) r.ConsumeToken(x);
  // g = 3: the members longer than 3 ran 6, so m = 3; share min(10, 3) / 6.
  EXPECT_DOUBLE_EQ(r.RemainingTokens(x), 3);
  EXPECT_DOUBLE_EQ(r.decoders()[0].work, 3);
  EXPECT_NEAR(r.MarginalCost(0, 1, 0, 10), a + 2 * c + 0.5 * c, 1e-15);
  // A hand-built decision (ticket −1) is a load without a record: it counts 1 beside x's 0.5, and its release
  // takes back its 4 predicted tokens.
  const RoutingDecision held = Held(0, 0);
  r.Dispatch(held);
  EXPECT_NEAR(r.MarginalCost(0, 1, 0, 10), a + 3 * c + 1.5 * c, 1e-15);
  EXPECT_DOUBLE_EQ(r.decoders()[0].work, 3 + 4);
  r.Complete(held);
  EXPECT_DOUBLE_EQ(r.decoders()[0].work, 3);
  EXPECT_NEAR(r.MarginalCost(0, 1, 0, 10), a + 2 * c + 0.5 * c, 1e-15);
  for (int t = 0; t < 3; ++t) r.ConsumeToken(x);
  // g = 6: no member of cluster 0 is longer; of the calibration, the 10: m = 4, and the work grows again.
  EXPECT_DOUBLE_EQ(r.RemainingTokens(x), 4);
  EXPECT_DOUBLE_EQ(r.decoders()[0].work, 4);
  EXPECT_NEAR(r.MarginalCost(0, 1, 0, 10), a + 2 * c + 0.4 * c, 1e-15);
  EXPECT_NEAR(r.MarginalCost(0, 0, 0, 2), a + 2 * c + 0.2 * c, 1e-15);  // a 2-token newcomer: min(2, 4) / 10
  r.Complete(x);
  EXPECT_EQ(r.decoders()[0].in_flight, 0);
  EXPECT_DOUBLE_EQ(r.decoders()[0].work, 0);
  EXPECT_NEAR(r.MarginalCost(0, 1, 0, 10), a + c, 1e-15);
}

// serve and simulate route a request when its prefill's token comes back: one of its L tokens is out, so its
// prediction and its record start at g = 1. Its TPOT is over its decode steps, g − 1 + m. By hand, cluster 0 ran
// {2, 6}: m(0, 1) = (1 + 5) / 2 = 3 (not the mean 4), its share of a 10-token newcomer's overlap min(10, 3) / (0 + 3)
// = 1 (a fresh request counts whole, as with g from 0); a token later m(0, 2) = 4, share 4 / (1 + 4).
TEST(MarginalCost, ARequestRoutedAfterItsFirstTokenStartsAtOneToken) {
  Calibration calib = CostCalibration();
  calib.decode_lens = {2, 6, 10};
  calib.assignment = {0, 0, 1};
  calib.mean_decode_len = {4, 10};
  Router r = CostRouter(calib, 0, 1e-4, 0, 64, 1, /*tokens_at_routing=*/1);
  const double a = 1e-3, c = 1e-4;
  EXPECT_DOUBLE_EQ(r.PriorDecodeTokens(0), 3);
  EXPECT_DOUBLE_EQ(r.PriorDecodeTokens(1), 9);
  const std::vector<float> c0 = {3, 0, 0, 0};
  const RoutingDecision x = r.Route(c0.data(), nullptr, "");
  ASSERT_EQ(x.decoder, 0);
  EXPECT_DOUBLE_EQ(x.predicted_tokens, 3);
  r.Dispatch(x);
  EXPECT_DOUBLE_EQ(r.decoders()[0].work, 3);
  EXPECT_NEAR(r.MarginalCost(0, 1, 0, 10), a + 2 * c + 1.0 * c, 1e-15);
  r.ConsumeToken(x);
  EXPECT_DOUBLE_EQ(r.RemainingTokens(x), 4);
  EXPECT_DOUBLE_EQ(r.decoders()[0].work, 4);
  EXPECT_NEAR(r.MarginalCost(0, 1, 0, 10), a + 2 * c + 0.8 * c, 1e-15);
  r.Complete(x);
  EXPECT_DOUBLE_EQ(r.decoders()[0].work, 0);
}

// The prefill path hands the router counts of the masked layers only (SignatureCache::SumCounts with the mask). With
// layer 0 outside the mask, the request's context must still be its prompt tokens (read from a masked layer), and
// the price must charge it: by hand, 3 prompt tokens of top-2 routing on layer 1 of 2, d = 1e-3 per context token.
TEST(MarginalCost, ContextComesFromAMaskedLayerWhenLayerZeroIsLeftOut) {
  Calibration calib;
  calib.shape = {"tiny", 2, 4, 2};
  calib.signature = {SignatureVariant::kCount, 2, 4, {1, 1, 1, 1, 1, 1, 1, 1}, {0, 1}};  // layer 1 only
  calib.num_clusters = 2;
  calib.tau = 0.1;
  calib.centroids = {1, 0, 0, 0, 0, 0, 1, 0};
  calib.expert_load = {0, 0, 0, 0, 0.5f, 0.5f, 0, 0, 0, 0, 0, 0, 0, 0, 0.5f, 0.5f};
  calib.mean_decode_len = {4, 4};
  RouterConfig rc;
  rc.policy = RoutingPolicy::kEldr;
  rc.num_decoders = 2;
  rc.job_shape = calib.shape;
  rc.step_cost = CostModel{"test", "", 1e-3, 0, 0, 1e-3};
  Router r = Router::Create(rc, &calib).value();
  // 3 prompt tokens, each on experts {0, 1} at layer 1: layer 1's counts sum to 3 · 2; layer 0's are left 0.
  const std::vector<float> counts = {0, 0, 0, 0, 3, 3, 0, 0};
  const RoutingDecision d = r.Route(counts.data(), nullptr, "");
  EXPECT_EQ(d.nearest, 0);
  EXPECT_DOUBLE_EQ(d.context, 3);
  // Empty decoders: a + d · (3 + 4 / 2) = 1e-3 + 5e-3.
  EXPECT_NEAR(d.predicted_cost, 1e-3 + 1e-3 * 5, 1e-12);
}

TEST(MarginalCost, AFullDecoderIsTheSecondChoiceWhateverItsPrice) {
  // max_batch 2, experts dear. Decoder 0: two cluster-0 requests (full; U = 1.5, ΔU = 0.25 → a + 2.25·b);
  // decoder 1: one cluster-1 request (U = 1, ΔU = 1 → a + 3·b). A cluster-0 request goes to decoder 1.
  const Calibration calib = CostCalibration();
  const double b = 1e-3;
  Router r = CostRouter(calib, b, 0, 0, 2);
  const RoutingDecision d0 = Held(0, 0), d1 = Held(1, 1);
  r.Dispatch(d0);
  r.Dispatch(d0);
  r.Dispatch(d1);
  EXPECT_NEAR(r.MarginalCost(0, 0, 3, 4), 1e-3 + 2.25 * b, 1e-9);
  EXPECT_NEAR(r.MarginalCost(1, 0, 3, 4), 1e-3 + 3 * b, 1e-9);
  const std::vector<float> c0 = {3, 0, 0, 0};
  const RoutingDecision x = r.Route(c0.data(), nullptr, "");
  EXPECT_EQ(x.decoder, 1);
  r.Dispatch(x);
  EXPECT_EQ(r.Route(c0.data(), nullptr, "").decoder, 0);  // both full, equal queues: the cheaper
  r.Dispatch(d1);
  EXPECT_EQ(r.Route(c0.data(), nullptr, "").decoder, 0);  // both full: the shorter queue
}

TEST(MarginalCost, LocalityWinsOnlyWhileItPays) {
  // Busy decoders, experts dear (b ≫ c): the request joins the decoder whose requests share its experts, even
  // with more of them; with sequences dear (c ≫ b) it joins the shorter batch.
  const Calibration calib = CostCalibration();
  for (const bool experts_dear : {true, false}) {
    Router r = experts_dear ? CostRouter(calib, 1e-4, 1e-7, 0, 64) : CostRouter(calib, 1e-7, 1e-4, 0, 64);
    const std::vector<float> c0 = {3, 0, 0, 0}, c1 = {0, 0, 2, 0};
    // Decoder 0: three cluster-0 requests; decoder 1: one cluster-1 request (routed by hand-built decisions).
    const RoutingDecision d0 = Held(0, 0), d1 = Held(1, 1);
    for (int i = 0; i < 3; ++i) r.Dispatch(d0);
    r.Dispatch(d1);
    EXPECT_EQ(r.Route(c0.data(), nullptr, "").decoder, experts_dear ? 0 : 1);
  }
}

// Decision inputs of the eldr rule over `d`, `dist` and `cost` (borrowed).
DecisionInputs EldrInputs(const std::vector<DecoderState>& d, const std::vector<double>& dist,
                          const std::vector<double>& cost) {
  DecisionInputs in;
  in.policy = RoutingPolicy::kEldr;
  in.decoders = &d;
  in.distances = dist.data();
  in.marginal_cost = cost.data();
  return in;
}

TEST(DecideCost, CheapestEligibleDecoderTiesToTheNearerCentroid) {
  std::vector<DecoderState> d = {{1, 2}, {2, 2}, {0, 2}};  // decoder 1 at its cap
  std::vector<double> dist = {0.3, 0.1, 0.2}, cost = {2.0, 1.0, 2.0};
  DecisionInputs in = EldrInputs(d, dist, cost);
  RoutingDecision r = Decide(in);
  EXPECT_EQ(r.decoder, 2);  // 1 is cheapest but full; 0 and 2 tie, 2 is nearer
  EXPECT_DOUBLE_EQ(r.predicted_cost, 2.0);
  EXPECT_EQ(r.nearest, 1);
  d[0].in_flight = d[2].in_flight = 2;
  r = Decide(in);
  EXPECT_EQ(r.decoder, -1);  // all at their caps: the request waits
  EXPECT_TRUE(r.fallback);
  // max_batch 1: decoder 0 (1 in flight) is full, 2 is not: 2 although 0 is cheaper.
  d = {{1, 0}, {3, 0}, {0, 0}};
  cost = {1.0, 0.5, 2.0};
  in.max_batch = 1;
  EXPECT_EQ(Decide(in).decoder, 2);
  d[2].in_flight = 1;
  EXPECT_EQ(Decide(in).decoder, 0);  // all full: the fewest in flight (0 and 2), then the cheaper
  d[1].in_flight = 1;
  EXPECT_EQ(Decide(in).decoder, 1);  // equal queues: the cheapest
}

TEST(DecideCost, LoadBoundMakesAnOverloadedDecoderASecondChoice) {
  // Works 10, 2, 0 and a request of 3: Σ = 15, K = 3. ε = 0.5: cap 1.5 · 15 / 3 = 7.5, so decoder 0 (the
  // cheapest) is over it; decoders 1 and 2 are under it and 1 is the cheaper. ε = 3: cap 20, every decoder under it.
  std::vector<DecoderState> d = {{1, 0, 10.0}, {1, 0, 2.0}, {0, 0, 0.0}};
  std::vector<double> dist = {0.1, 0.2, 0.3}, cost = {1.0, 2.0, 3.0};
  DecisionInputs in = EldrInputs(d, dist, cost);
  in.request_work = 3;
  EXPECT_EQ(Decide(in).decoder, 0);  // ε = 0: off
  in.load_bound = 0.5;
  EXPECT_EQ(Decide(in).decoder, 1);
  in.load_bound = 3;
  EXPECT_EQ(Decide(in).decoder, 0);
  // Exactly at the cap is over it: works 5, 0, 0 and a request of 1 with ε = 1.5: cap 2.5 · 6 / 3 = 5.
  d = {{1, 0, 5.0}, {0, 0, 0.0}, {0, 0, 0.0}};
  in.request_work = 1;
  in.load_bound = 1.5;
  EXPECT_EQ(Decide(in).decoder, 1);
  // A full decoder stays behind an over-bound one: max_batch 1, decoder 1 and 2 full, decoder 0 over the bound.
  d = {{0, 0, 5.0}, {1, 0, 0.0}, {1, 0, 0.0}};
  in.max_batch = 1;
  EXPECT_EQ(Decide(in).decoder, 0);
}

TEST(Router, LoadBoundDefaultsPerPolicy) {
  EXPECT_EQ(DefaultLoadBound(RoutingPolicy::kEldr), 0.0);
  EXPECT_EQ(DefaultLoadBound(RoutingPolicy::kEldrTail), kTailLoadBound);
  EXPECT_EQ(DefaultLoadBound(RoutingPolicy::kEldrPaper), 0.0);  // the published band
  EXPECT_EQ(DefaultLoadBound(RoutingPolicy::kJsq), 0.0);
  const Calibration calib = CostCalibration();
  EXPECT_EQ(CostRouter(calib, 1e-4, 1e-7, 0, 64).load_bound(), 0.0);
  RouterConfig rc;
  rc.policy = RoutingPolicy::kEldr;
  rc.num_decoders = 2;
  rc.job_shape = calib.shape;
  rc.step_cost = CostModel();
  rc.load_bound = 0.3;
  EXPECT_EQ(Router::Create(rc, &calib).value().load_bound(), 0.3);
  rc.policy = RoutingPolicy::kEldrTail;
  rc.load_bound.reset();
  EXPECT_EQ(Router::Create(rc, &calib).value().load_bound(), kTailLoadBound);
  rc.load_bound = 0;  // eldr_tail's bound is never off: 0 routes (and is recorded) as kTailLoadBound
  EXPECT_EQ(Router::Create(rc, &calib).value().load_bound(), kTailLoadBound);
  EXPECT_EQ(RoutedLoadBound(RoutingPolicy::kEldrTail, 0.0), kTailLoadBound);
  EXPECT_EQ(RoutedLoadBound(RoutingPolicy::kEldrTail, 0.5), 0.5);
  EXPECT_EQ(RoutedLoadBound(RoutingPolicy::kEldr, 0.0), 0.0);
  EXPECT_EQ(RoutedLoadBound(RoutingPolicy::kEldrPaper, std::nullopt), 0.0);
  rc.load_bound = -0.1;
  EXPECT_FALSE(Router::Create(rc, &calib).ok());
}

TEST(Router, EldrNeedsACostModelAndExpertLoad) {
  Calibration calib = CostCalibration();
  RouterConfig rc;
  rc.policy = RoutingPolicy::kEldr;
  rc.num_decoders = 2;
  rc.job_shape = calib.shape;
  auto no_cost = Router::Create(rc, &calib);
  ASSERT_FALSE(no_cost.ok());
  EXPECT_NE(no_cost.status().message().find("cost model"), std::string::npos);
  rc.step_cost = CostModel();
  rc.harm_weight = 1.5;
  auto bad_weight = Router::Create(rc, &calib);
  ASSERT_FALSE(bad_weight.ok());
  EXPECT_NE(bad_weight.status().message().find("harm_weight"), std::string::npos);
  rc.harm_weight = kHarmWeight;
  calib.expert_load.clear();
  auto no_load = Router::Create(rc, &calib);
  ASSERT_FALSE(no_load.ok());
  EXPECT_NE(no_load.status().message().find("expert_load"), std::string::npos);
}

}  // namespace
}  // namespace eldr
