// Routing policies against hand-computed cases and distributional invariants (DESIGN.md §3).
#include "runtime/router/router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace eldr {
namespace {

std::vector<DecoderState> Loads(std::vector<int64_t> in_flight, int64_t cap = 0) {
  std::vector<DecoderState> d;
  for (auto n : in_flight) d.push_back({n, cap});
  return d;
}

RoutingDecision Band(const std::vector<DecoderState>& d, std::vector<double> dist, double tau) {
  DecisionInputs in;
  in.policy = RoutingPolicy::kEldrPaper;
  in.decoders = &d;
  in.distances = dist.data();
  in.tau = tau;
  return Decide(in);
}

TEST(Decide, BandPicksLeastLoadedWithinTau) {
  // d = {0.30, 0.35, 0.50, 0.38}, τ = 0.1 → B = {0, 1, 3} (≤ 0.40); loads {5, 3, 0, 4} → decoder 1.
  auto d = Loads({5, 3, 0, 4});
  auto r = Band(d, {0.30, 0.35, 0.50, 0.38}, 0.1);
  EXPECT_EQ(r.decoder, 1);
  EXPECT_EQ(r.band_size, 3);
  EXPECT_FALSE(r.fallback);
}

TEST(Decide, TieOnLoadGoesToTheNearerCentroid) {
  auto d = Loads({2, 2, 2});
  EXPECT_EQ(Band(d, {0.20, 0.10, 0.15}, 0.2).decoder, 1);
  // Equal load and equal distance: the lower index.
  EXPECT_EQ(Band(d, {0.10, 0.10, 0.30}, 0.2).decoder, 0);
}

TEST(Decide, EverythingInTheBandIsJsq) {
  auto d = Loads({4, 1, 3, 2});
  auto r = Band(d, {0.9, 0.1, 0.5, 0.3}, 10.0);
  EXPECT_EQ(r.decoder, 1);
  EXPECT_EQ(r.band_size, 4);
}

TEST(Decide, NothingEligibleInTheBandFallsBackToGlobalLeastLoaded) {
  // cap 3: decoders 0 and 1 are full; band = {0, 1} → fallback to the least loaded eligible (3, load 1).
  auto d = Loads({3, 3, 2, 1}, 3);
  auto r = Band(d, {0.1, 0.12, 0.9, 0.8}, 0.05);
  EXPECT_TRUE(r.fallback);
  EXPECT_EQ(r.decoder, 3);
  // Nobody eligible at all: no decoder; the request waits at the router (every policy).
  auto full = Loads({3, 3, 3}, 3);
  auto f = Band(full, {0.1, 0.2, 0.3}, 0.05);
  EXPECT_TRUE(f.fallback);
  EXPECT_EQ(f.decoder, -1);
  for (auto policy : AllRoutingPolicies()) {
    std::vector<double> dist = {0.1, 0.2, 0.3}, cost = {1, 2, 3};
    DecisionInputs in;
    in.policy = policy;
    in.decoders = &full;
    in.distances = dist.data();
    in.marginal_cost = cost.data();
    EXPECT_EQ(Decide(in).decoder, -1) << RoutingPolicyName(policy);
  }
}

TEST(Decide, BoundedLoadPassesOverAnOverfullBandMember) {
  // Loads {5, 0, 0, 1}, band = {0} alone (d = 0.1 vs ≥ 0.5, τ = 0.1). Σ in_flight + 1 = 7 over K = 4:
  // ε = 0.5 → cap = ceil(1.5 · 7 / 4) = ceil(2.625) = 3; decoder 0 holds 5 ≥ 3 → fallback to the least
  // loaded (decoder 1). ε = 2 → cap = ceil(5.25) = 6 > 5 → decoder 0 keeps it. ε = 0 → off.
  auto d = Loads({5, 0, 0, 1});
  std::vector<double> dist = {0.1, 0.5, 0.6, 0.7};
  auto decide = [&](double eps) {
    DecisionInputs in;
    in.policy = RoutingPolicy::kEldrPaper;
    in.decoders = &d;
    in.distances = dist.data();
    in.tau = 0.1;
    in.load_bound = eps;
    return Decide(in);
  };
  EXPECT_EQ(decide(0.5).decoder, 1);
  EXPECT_TRUE(decide(0.5).fallback);
  EXPECT_EQ(decide(0.5).band_size, 1);
  EXPECT_EQ(decide(2.0).decoder, 0);
  EXPECT_FALSE(decide(2.0).fallback);
  EXPECT_EQ(decide(0.0).decoder, 0);
  // The cap counts the request being routed: loads {2, 0, 0, 1}, Σ + 1 = 4, ε = 0.5 → cap ceil(1.5) = 2:
  // decoder 0 (2) is passed over.
  auto e = Loads({2, 0, 0, 1});
  DecisionInputs in;
  in.policy = RoutingPolicy::kEldrPaper;
  in.decoders = &e;
  in.distances = dist.data();
  in.tau = 0.1;
  in.load_bound = 0.5;
  EXPECT_EQ(Decide(in).decoder, 1);
}

TEST(Decide, BoundedLoadNeverLetsALoadExceedTheBoundWhenAnotherDecoderIsBelowIt) {
  // Invariant over random scenarios: the chosen decoder holds < cap, or no decoder at all does.
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    const int K = 1 + static_cast<int>(rng() % 8);
    std::vector<int64_t> loads(K);
    std::vector<double> dist(K);
    int64_t total = 1;
    for (int k = 0; k < K; ++k) {
      loads[k] = static_cast<int64_t>(rng() % 10);
      dist[k] = static_cast<double>(rng() % 1000) / 1000.0;
      total += loads[k];
    }
    auto d = Loads(loads);
    const double eps = static_cast<double>(rng() % 100) / 100.0 + 0.01;
    DecisionInputs in;
    in.policy = RoutingPolicy::kEldrPaper;
    in.decoders = &d;
    in.distances = dist.data();
    in.tau = 0.1;
    in.load_bound = eps;
    const RoutingDecision r = Decide(in);
    ASSERT_GE(r.decoder, 0);
    const int64_t cap = static_cast<int64_t>(std::ceil((1 + eps) * static_cast<double>(total) / K));
    const int64_t min_load = *std::min_element(loads.begin(), loads.end());
    if (min_load < cap) {
      ASSERT_LT(loads[r.decoder], cap) << "trial " << trial;
    }
  }
}

TEST(Decide, TauZeroEqualsLocalityTop1AndLargeTauEqualsJsq) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 2000; ++trial) {
    const int K = 1 + static_cast<int>(rng() % 12);
    std::vector<DecoderState> d;
    std::vector<double> dist(K);
    for (int k = 0; k < K; ++k) {
      d.push_back({static_cast<int64_t>(rng() % 5), 0});
      dist[k] = std::round(u(rng) * 20) / 20;  // coarse values make ties common
    }
    DecisionInputs in;
    in.decoders = &d;
    in.distances = dist.data();
    in.policy = RoutingPolicy::kEldrPaper;
    in.tau = 0;
    const auto eldr0 = Decide(in);
    in.policy = RoutingPolicy::kLocalityTop1;
    EXPECT_EQ(eldr0.decoder, Decide(in).decoder);
    // Independently: among the nearest centroids (exact ties), the least loaded, then the lower index.
    const double dmin = *std::min_element(dist.begin(), dist.end());
    int expect = -1;
    for (int k = 0; k < K; ++k) {
      if (dist[k] == dmin && (expect < 0 || d[k].in_flight < d[expect].in_flight)) expect = k;
    }
    EXPECT_EQ(eldr0.decoder, expect);
    // τ = 0 with distinct minimum: the nearest centroid.
    in.policy = RoutingPolicy::kEldrPaper;
    in.tau = 100;
    const auto wide = Decide(in);
    in.policy = RoutingPolicy::kJsq;
    const auto jsq = Decide(in);
    EXPECT_EQ(d[wide.decoder].in_flight, d[jsq.decoder].in_flight);  // same load; ties differ only by distance
    int at_min = 0;
    for (int k2 = 0; k2 < K; ++k2) at_min += d[k2].in_flight == d[jsq.decoder].in_flight;
    if (at_min == 1) {
      EXPECT_EQ(wide.decoder, jsq.decoder);  // a unique least-loaded decoder: the same one
    }
    EXPECT_EQ(wide.band_size, K);
  }
}

TEST(Decide, JsqAndDomain) {
  auto d = Loads({2, 0, 0, 1});
  DecisionInputs in;
  in.decoders = &d;
  in.policy = RoutingPolicy::kJsq;
  EXPECT_EQ(Decide(in).decoder, 1);  // tie between 1 and 2 → lower index
  in.policy = RoutingPolicy::kDomain;
  std::vector<int> group = {0, 3};
  in.domain_group = &group;
  EXPECT_EQ(Decide(in).decoder, 3);
  in.domain_group = nullptr;  // unknown domain → jsq over all
  EXPECT_EQ(Decide(in).decoder, 1);
}

TEST(Decide, P2cNeverPicksTheMoreLoadedOfItsTwo) {
  auto d = Loads({0, 1, 2, 3, 4, 5, 6, 7});
  std::mt19937_64 rng(3);
  std::vector<int> picks(8, 0);
  for (int i = 0; i < 20000; ++i) {
    DecisionInputs in;
    in.decoders = &d;
    in.policy = RoutingPolicy::kP2c;
    in.random_a = rng();
    in.random_b = rng();
    const int a = static_cast<int>(in.random_a % 8);
    const uint64_t j = in.random_b % 7;
    const int b = static_cast<int>(j < static_cast<uint64_t>(a) ? j : j + 1);
    const int got = Decide(in).decoder;
    EXPECT_EQ(got, std::min(a, b));  // loads equal the index here
    ++picks[got];
  }
  EXPECT_EQ(picks[7], 0);  // the most loaded decoder is never chosen
  // P(pick k) = P(k is the min of two distinct draws) = 2(7-k)/56.
  for (int k = 0; k < 8; ++k) EXPECT_NEAR(picks[k] / 20000.0, 2.0 * (7 - k) / 56.0, 0.015) << k;
}

TEST(Router, RoundRobinIsExactlyEvenAndRandomIsRoughlyUniform) {
  for (auto policy : {RoutingPolicy::kRoundRobin, RoutingPolicy::kRandom}) {
    RouterConfig c;
    c.policy = policy;
    c.num_decoders = 5;
    c.seed = 7;
    auto r = Router::Create(c, nullptr);
    ASSERT_TRUE(r.ok());
    std::vector<int> n(5, 0);
    for (int i = 0; i < 5000; ++i) {
      const int k = r->Route(nullptr, nullptr, "").decoder;
      ++n[k];
      r->Dispatch(k);  // loads do not influence these policies
    }
    for (int k = 0; k < 5; ++k) {
      if (policy == RoutingPolicy::kRoundRobin) {
        EXPECT_EQ(n[k], 1000);
      } else {
        EXPECT_NEAR(n[k], 1000, 120);
      }
    }
  }
}

TEST(Router, RoundRobinSkipsDecodersAtTheirCap) {
  RouterConfig c;
  c.policy = RoutingPolicy::kRoundRobin;
  c.num_decoders = 3;
  c.admission_cap = 1;
  auto r = Router::Create(c, nullptr).value();
  EXPECT_EQ(r.Route(nullptr, nullptr, "").decoder, 0);
  r.Dispatch(0);
  r.Dispatch(1);  // decoder 1 is full
  EXPECT_EQ(r.Route(nullptr, nullptr, "").decoder, 2);
}

Calibration TinyCalibration(int K) {
  // L = 1, E = 4, all layers selected, idf 1; centroid k = e_k (unit vector on expert k).
  Calibration c;
  c.shape = {"tiny", 1, 4, 1};
  c.signature = {SignatureVariant::kCount, 1, 4, {1, 1, 1, 1}, {1}};
  c.num_clusters = K;
  c.tau = 0.1;
  for (int k = 0; k < K; ++k) {
    for (int e = 0; e < 4; ++e) c.centroids.push_back(e == k ? 1.f : 0.f);
  }
  return c;
}

TEST(Router, SignatureRoutingFromCounts) {
  Calibration calib = TinyCalibration(3);
  calib.tau = 0.05;
  RouterConfig c;
  c.policy = RoutingPolicy::kEldrPaper;
  c.num_decoders = 3;
  c.tau = std::nullopt;  // unset: take the calibration's 0.05
  c.job_shape = calib.shape;
  auto r = Router::Create(c, &calib);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_DOUBLE_EQ(r->tau(), 0.05);
  // -1 is a value like any other, no longer "take the calibration's": refused.
  RouterConfig negative = c;
  negative.tau = -1;
  auto refused = Router::Create(negative, &calib);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), "tau must be a finite value >= 0");
  // Unset without a calibration (a load-only policy): DESIGN.md's default 0.1.
  RouterConfig jsq;
  jsq.policy = RoutingPolicy::kJsq;
  jsq.num_decoders = 3;
  jsq.tau = std::nullopt;
  EXPECT_DOUBLE_EQ(Router::Create(jsq, nullptr).value().tau(), 0.1);
  // counts {0, 5, 0, 1}: s = (0, 5, 0, 1)/√26; d_1 = 1 − 5/√26 ≈ 0.019 is nearest, d_0 = d_2 = 1 → B = {1}.
  std::vector<float> counts = {0, 5, 0, 1};
  auto d = r->Route(counts.data(), nullptr, "");
  EXPECT_EQ(d.decoder, 1);
  EXPECT_EQ(d.band_size, 1);
  // In the router's 16-bit fixed point (runtime/router/centroid_matrix.h): μ_1 = e_1 → w = 32767, r = 1/32767; σ = 1,
  // a = 32767, q = nearbyint(32767 · 5/√26 = 32130.7) = 32131 → s·μ̂_1 = 32131/32767 (5/√26 − 9.5e-6).
  EXPECT_NEAR(r->last_distances()[1], 1 - 32131.0 / 32767, 1e-7);
  EXPECT_NEAR(r->last_distances()[1], 1 - 5 / std::sqrt(26.0), 0.51 / 32767);  // the header's bound
  // Load decoder 1 to the cap-free point where a wider band would move the request: τ = 2 → jsq.
  r->Dispatch(1);
  c.tau = 2;
  auto wide = Router::Create(c, &calib).value();
  wide.Dispatch(1);
  EXPECT_EQ(wide.Route(counts.data(), nullptr, "").decoder, 0);
}

// eldr_tail (router.h): loads are decode work w_k; under the bounds iff w_k < (1+ε)(Σ w + w_r)/K and
// n_k < ceil((1+ε)(Σ n + 1)/K).
std::vector<DecoderState> Work(std::vector<double> work, std::vector<int64_t> in_flight = {}, int64_t cap = 0) {
  std::vector<DecoderState> d;
  for (size_t k = 0; k < work.size(); ++k) {
    DecoderState s;
    s.in_flight = in_flight.empty() ? 1 : in_flight[k];
    s.admission_cap = cap;
    s.work = work[k];
    d.push_back(s);
  }
  return d;
}

RoutingDecision Tail(const std::vector<DecoderState>& d, std::vector<double> dist, double tau, double w_r,
                     double eps = 0.25) {
  DecisionInputs in;
  in.policy = RoutingPolicy::kEldrTail;
  in.decoders = &d;
  in.distances = dist.data();
  in.tau = tau;
  in.load_bound = eps;
  in.request_work = w_r;
  return Decide(in);
}

TEST(DecideTail, PicksTheLeastDecodeWorkInTheBandNotTheFewestRequests) {
  // d = {0.30, 0.35, 0.50, 0.38}, τ = 0.1 → B = {0, 1, 3}. Work {100, 40, 10, 60}, w_r = 20: Σ + w_r = 230,
  // bound 1.25·230/4 = 71.875 → 0 is over; 1 (40) and 3 (60) under → 1. Counts {1, 3, 4, 1}: count bound
  // ceil(1.25·10/4) = 4, 1 (3 requests) is under it. The count-based band (eldr_paper) would take 0 (one request,
  // tied with 3, 0 nearer).
  auto d = Work({100, 40, 10, 60}, {1, 3, 4, 1});
  std::vector<double> dist = {0.30, 0.35, 0.50, 0.38};
  auto r = Tail(d, dist, 0.1, 20);
  EXPECT_EQ(r.decoder, 1);
  EXPECT_EQ(r.band_size, 3);
  EXPECT_FALSE(r.fallback);
  EXPECT_FALSE(r.overflow);
  EXPECT_EQ(r.nearest, 0);
  EXPECT_DOUBLE_EQ(r.predicted_tokens, 20);
  DecisionInputs in;
  in.policy = RoutingPolicy::kEldrPaper;
  in.decoders = &d;
  in.distances = dist.data();
  in.tau = 0.1;
  EXPECT_EQ(Decide(in).decoder, 0);
}

TEST(DecideTail, OverflowGoesToTheNextNearestCentroidNotTheGlobalLeastLoaded) {
  // d = {0.1, 0.6, 0.3, 0.2}, τ = 0.05 → B = {0}. Work {90, 0, 10, 20}, w_r = 10: bound 1.25·130/4 = 40.625;
  // 0 (90) is over (and over the count bound ceil(1.25·13/4) = 5 with 9) → ascending distance: 3 (d 0.2, work
  // 20 < 40.625, 2 requests) takes it, though 1 holds nothing.
  auto d = Work({90, 0, 10, 20}, {9, 0, 1, 2});
  std::vector<double> dist = {0.1, 0.6, 0.3, 0.2};
  auto r = Tail(d, dist, 0.05, 10);
  EXPECT_EQ(r.decoder, 3);
  EXPECT_TRUE(r.overflow);
  EXPECT_TRUE(r.fallback);
  EXPECT_EQ(r.band_size, 1);
  EXPECT_DOUBLE_EQ(r.distance, 0.2);
  // The published band with the same ε on counts: Σ + 1 = 13, cap ceil(1.25·13/4) = 5, 0 holds 9 → the global
  // least loaded, decoder 1.
  DecisionInputs in;
  in.policy = RoutingPolicy::kEldrPaper;
  in.decoders = &d;
  in.distances = dist.data();
  in.tau = 0.05;
  in.load_bound = 0.25;
  EXPECT_EQ(Decide(in).decoder, 1);
}

TEST(DecideTail, OverflowSkipsDecodersOverTheBoundOrAtTheirCap) {
  // Work {90, 1, 50, 20}, w_r = 10: bound 1.25·171/4 = 53.4375; in flight {2, 1, 1, 2}: count bound
  // ceil(1.25·7/4) = 3. Distance order 0 (over in work), 3 (under both bounds, but at its admission cap 2),
  // 2 (50 < 53.4375, 1 request) → 2.
  auto d = Work({90, 1, 50, 20}, {2, 1, 1, 2}, 2);
  auto r = Tail(d, {0.1, 0.6, 0.3, 0.2}, 0.05, 10);
  EXPECT_EQ(r.decoder, 2);
  EXPECT_TRUE(r.overflow);
}

TEST(DecideTail, WhenOnlyCappedDecodersAreUnderTheBoundTheLeastOverloadedEligibleOneTakesIt) {
  // Work {90, 0, 90, 90}, w_r = 10: bound 1.25·280/4 = 87.5; only 1 is under and it is at its cap →
  // least overload among the eligible {0, 2, 3}: all 90 / 87.5 → the lower index, 0. Not an overflow.
  auto d = Work({90, 0, 90, 90}, {1, 1, 1, 1}, 1);
  d[0].in_flight = d[2].in_flight = d[3].in_flight = 0;
  auto r = Tail(d, {0.5, 0.1, 0.6, 0.7}, 0.05, 10);
  EXPECT_EQ(r.decoder, 0);
  EXPECT_TRUE(r.fallback);
  EXPECT_FALSE(r.overflow);
}

TEST(DecideTail, ABandMemberHoldingTooManyRequestsOverflowsThoughItsWorkIsLow) {
  // d = {0.1, 0.6, 0.3, 0.2}, τ = 0.05 → B = {0}. Work {10, 40, 30, 20}, w_r = 10: work bound 1.25·110/4 =
  // 34.375, all but 1 under. In flight {6, 1, 1, 1}: count bound ceil(1.25·10/4) = 4 → 0 (six short requests)
  // is over → overflow in distance order: 3 (d 0.2, work 20, 1 request).
  auto d = Work({10, 40, 30, 20}, {6, 1, 1, 1});
  auto r = Tail(d, {0.1, 0.6, 0.3, 0.2}, 0.05, 10);
  EXPECT_EQ(r.decoder, 3);
  EXPECT_TRUE(r.overflow);
  // With room for one more request (count bound ceil(1.25·10/2) = 7 at K = 2), 0 keeps it.
  auto two = Work({10, 20}, {6, 3});
  EXPECT_EQ(Tail(two, {0.1, 0.6}, 0.05, 10).decoder, 0);
}

TEST(DecideTail, WhenNoDecoderIsUnderBothBoundsTheLeastOverloadedTakesIt) {
  // K = 2, w_r = 10. Ten short requests (work 10) on 0, one long one (work 200) on 1: work bound
  // 1.25·220/2 = 137.5 → 1 over (200 / 137.5 = 1.4545); count bound ceil(1.25·12/2) = 8 → 0 over (10 / 8 = 1.25)
  // → 0, the less overloaded.
  auto a = Work({10, 200}, {10, 1});
  auto r = Tail(a, {0.1, 0.9}, 0.05, 10);
  EXPECT_EQ(r.decoder, 0);
  EXPECT_TRUE(r.fallback);
  EXPECT_FALSE(r.overflow);
  // Thirty on 0 (work 30): work bound 1.25·240/2 = 150 → 1 at 1.3333; count bound ceil(1.25·32/2) = 20 → 0 at
  // 1.5 → 1.
  auto b = Work({30, 200}, {30, 1});
  EXPECT_EQ(Tail(b, {0.1, 0.9}, 0.05, 10).decoder, 1);
}

TEST(DecideBoundedLoad, AHugeEpsilonMeansNoBound) {
  // ε = 1e300: the bounds are beyond any load (the count bound saturates instead of overflowing int64).
  auto d = Work({90, 0}, {9, 0});
  auto tail = Tail(d, {0.1, 0.9}, 0.05, 10, 1e300);
  EXPECT_EQ(tail.decoder, 0);
  EXPECT_FALSE(tail.fallback);
  DecisionInputs in;
  in.policy = RoutingPolicy::kEldrPaper;
  in.decoders = &d;
  const std::vector<double> dist = {0.1, 0.9};
  in.distances = dist.data();
  in.tau = 0.05;
  in.load_bound = 1e300;
  EXPECT_EQ(Decide(in).decoder, 0);
  EXPECT_FALSE(Decide(in).fallback);
}

TEST(DecideTail, LoadBoundZeroMeansTheDefaultEpsilon) {
  // K = 2, work {50, 0}, w_r = 10, B = {0}. ε = kTailLoadBound = 0.25: bound 1.25·60/2 = 37.5 → 0 over → 1.
  // ε = 1: bound 60 → 0 keeps it.
  auto d = Work({50, 0});
  EXPECT_EQ(Tail(d, {0.1, 0.9}, 0.1, 10, 0.0).decoder, 1);
  EXPECT_EQ(Tail(d, {0.1, 0.9}, 0.1, 10, 1.0).decoder, 0);
  // Ties on work go to the nearer centroid, then the lower index (the band's rule).
  auto t = Work({5, 5, 5});
  EXPECT_EQ(Tail(t, {0.20, 0.10, 0.15}, 0.2, 1, 10).decoder, 1);
  EXPECT_EQ(Tail(t, {0.10, 0.10, 0.30}, 0.2, 1, 10).decoder, 0);
}

TEST(DecideTail, InvariantsOverRandomScenarios) {
  // With random admission caps. No eligible decoder: none chosen (fallback). When an eligible decoder is under both
  // bounds, the chosen one is; it is a band member whenever one is under them (and then the least work among
  // those); otherwise the nearest decoder under them (overflow). When none is, the lowest-indexed eligible decoder
  // of least max(w_k / work bound, n_k / count bound).
  std::mt19937_64 rng(11);
  int none_under = 0, none_eligible = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const int K = 1 + static_cast<int>(rng() % 8);
    std::vector<double> work(K), dist(K);
    std::vector<int64_t> n(K);
    for (int k = 0; k < K; ++k) {
      n[k] = static_cast<int64_t>(rng() % 12);
      work[k] = static_cast<double>(n[k] + rng() % 200);  // every request holds at least 1
      dist[k] = static_cast<double>(rng() % 1000) / 1000.0;
    }
    const int64_t cap = rng() % 2 ? 0 : 1 + static_cast<int64_t>(rng() % 12);
    const double w_r = 1 + static_cast<double>(rng() % 50), eps = static_cast<double>(rng() % 100) / 100.0;
    const double tau = static_cast<double>(rng() % 300) / 1000.0;
    auto d = Work(work, n, cap);
    auto r = Tail(d, dist, tau, w_r, eps);
    const double e = eps > 0 ? eps : kTailLoadBound;
    double total = w_r;
    for (double w : work) total += w;
    const double bound = (1 + e) * total / K;
    int64_t count = 1;
    for (int64_t x : n) count += x;
    int64_t count_bound = 1;  // the least integer >= (1+e)·count/K, found by counting up
    while (static_cast<double>(count_bound) < (1 + e) * static_cast<double>(count) / K) ++count_bound;
    auto eligible = [&](int k) { return cap == 0 || n[k] < cap; };
    auto under = [&](int k) { return eligible(k) && work[k] < bound && n[k] < count_bound; };
    auto over = [&](int k) { return std::max(work[k] / bound, static_cast<double>(n[k]) / count_bound); };
    bool any_eligible = false, any_under = false;
    int least_over = -1;
    for (int k = 0; k < K; ++k) {
      any_eligible = any_eligible || eligible(k);
      any_under = any_under || under(k);
      if (eligible(k) && (least_over < 0 || over(k) < over(least_over))) least_over = k;
    }
    if (!any_eligible) {
      ++none_eligible;
      EXPECT_EQ(r.decoder, -1);
      EXPECT_TRUE(r.fallback);
      continue;
    }
    ASSERT_GE(r.decoder, 0);
    if (!any_under) {
      ++none_under;
      EXPECT_TRUE(r.fallback);
      EXPECT_FALSE(r.overflow);
      EXPECT_EQ(r.decoder, least_over);
      continue;
    }
    EXPECT_TRUE(under(r.decoder));
    const double dmin = *std::min_element(dist.begin(), dist.end());
    double best_in_band = -1;
    double nearest_under = 1e9;
    for (int k = 0; k < K; ++k) {
      if (!under(k)) continue;
      nearest_under = std::min(nearest_under, dist[k]);
      if (dist[k] <= dmin + tau && (best_in_band < 0 || work[k] < best_in_band)) best_in_band = work[k];
    }
    if (best_in_band >= 0) {
      EXPECT_LE(dist[r.decoder], dmin + tau);
      EXPECT_EQ(work[r.decoder], best_in_band);
      EXPECT_FALSE(r.overflow);
    } else {
      EXPECT_TRUE(r.overflow);
      EXPECT_EQ(dist[r.decoder], nearest_under);
    }
  }
  // Every branch was exercised.
  EXPECT_GT(none_under, 20);
  EXPECT_GT(none_eligible, 20);
}

TEST(Router, DecodeWorkIsHeldSpentPerTokenAndReleased) {
  // Prior 5 (cluster 1's mean decode length): the request holds 5; each token spends 1 until 1 is left, which
  // stays held until it completes.
  Calibration calib = TinyCalibration(3);
  calib.mean_decode_len = {2, 5, 8};
  RouterConfig c;
  c.policy = RoutingPolicy::kEldrTail;
  c.num_decoders = 3;
  c.job_shape = calib.shape;
  auto r = Router::Create(c, &calib).value();
  std::vector<float> counts = {0, 5, 0, 1};  // nearest centroid 1
  auto d = r.Route(counts.data(), nullptr, "");
  EXPECT_EQ(d.nearest, 1);
  EXPECT_DOUBLE_EQ(d.predicted_tokens, 5);
  EXPECT_EQ(d.decoder, 1);
  r.Dispatch(d);
  EXPECT_DOUBLE_EQ(r.decoders()[1].work, 5);
  for (int t = 0; t < 7; ++t) r.ConsumeToken(d);
  EXPECT_DOUBLE_EQ(r.RemainingTokens(d), 1);
  EXPECT_DOUBLE_EQ(r.decoders()[1].work, 1);
  r.Complete(d);
  EXPECT_DOUBLE_EQ(r.decoders()[1].work, 0);
  EXPECT_EQ(r.decoders()[1].in_flight, 0);
  EXPECT_DOUBLE_EQ(r.PriorDecodeTokens(0), 2);
  EXPECT_DOUBLE_EQ(r.PriorDecodeTokens(-1), 1);  // no cluster: one token
  // Without the calibration's prior every request weighs 1: work = in-flight requests.
  calib.mean_decode_len.clear();
  auto plain = Router::Create(c, &calib).value();
  EXPECT_DOUBLE_EQ(plain.Route(counts.data(), nullptr, "").predicted_tokens, 1);
}

TEST(Router, RefusesMismatchedCalibration) {
  Calibration calib = TinyCalibration(3);
  RouterConfig c;
  c.policy = RoutingPolicy::kEldrPaper;
  c.num_decoders = 4;
  c.job_shape = calib.shape;
  auto r = Router::Create(c, &calib);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("--refit"), std::string::npos);
  c.num_decoders = 3;
  c.job_shape = {"other", 2, 4, 1};
  EXPECT_EQ(Router::Create(c, &calib).status().code(), StatusCode::kFailedPrecondition);
  c.job_shape = TraceShape();
  EXPECT_EQ(Router::Create(c, &calib).status().code(), StatusCode::kInvalidArgument);  // no job shape to check
  c.job_shape = calib.shape;
  EXPECT_EQ(Router::Create(c, nullptr).status().code(), StatusCode::kInvalidArgument);  // eldr without calibration
  c.policy = RoutingPolicy::kDomain;
  EXPECT_EQ(Router::Create(c, nullptr).status().code(), StatusCode::kInvalidArgument);  // no labels
  EXPECT_EQ(ParseRoutingPolicy("nope").status().code(), StatusCode::kInvalidArgument);
}

TEST(Router, DomainGroupsSplitDecoders) {
  RouterConfig c;
  c.policy = RoutingPolicy::kDomain;
  c.num_decoders = 4;
  c.domains = {"b", "a", "a"};
  auto r = Router::Create(c, nullptr).value();
  // Sorted labels a → {0, 2}, b → {1, 3}.
  for (int i = 0; i < 6; ++i) {
    const int k = r.Route(nullptr, nullptr, "a").decoder;
    EXPECT_TRUE(k == 0 || k == 2);
    r.Dispatch(k);
  }
  EXPECT_EQ(r.decoders()[0].in_flight, 3);
  EXPECT_EQ(r.decoders()[2].in_flight, 3);
  const int k = r.Route(nullptr, nullptr, "b").decoder;
  EXPECT_TRUE(k == 1 || k == 3);
}

TEST(Router, DeterministicForASeed) {
  std::vector<int> a, b;
  for (auto* out : {&a, &b}) {
    RouterConfig c;
    c.policy = RoutingPolicy::kP2c;
    c.num_decoders = 6;
    c.seed = 99;
    auto r = Router::Create(c, nullptr).value();
    for (int i = 0; i < 200; ++i) {
      const int k = r.Route(nullptr, nullptr, "").decoder;
      out->push_back(k);
      r.Dispatch(k);
      if (i % 3 == 0) r.Complete(k);
    }
  }
  EXPECT_EQ(a, b);
}

// SettingsOf (the table the command line refuses overrides by) against behaviour: two routers that differ in one
// setting route the same 300 requests (random expert counts, random completions) alike exactly when the table says
// the policy does not read it, and differently somewhere when it says it does.
TEST(Router, SettingsOfIsWhatEachPolicyReads) {
  Calibration calib = TinyCalibration(3);
  calib.expert_load = {0.9f, 0.3f, 0, 0, 0, 0.9f, 0.3f, 0, 0, 0, 0.9f, 0.3f};
  calib.mean_decode_len = {2, 5, 8};
  CostModel m;
  m.decode_a = 1e-3;
  m.decode_b = 1e-4;
  m.decode_c = 1e-5;
  m.decode_d = 1e-7;
  enum Setting { kTau, kLoadBound, kHarm, kStepCost };
  // `with_calib`: the router is handed the calibration (required by the policies that read it).
  const auto routes = [&](RoutingPolicy p, Setting which, int variant, bool with_calib) {
    RouterConfig c;
    c.policy = p;
    c.num_decoders = 3;
    c.job_shape = calib.shape;
    c.step_cost = m;
    c.max_batch = 8;
    if (which == kStepCost && variant) {  // experts dear against context, and a smaller batch
      c.step_cost->decode_b = 1e-2;
      c.max_batch = 2;
    }
    c.tau = which == kTau && variant ? 2.0 : 0.01;
    c.load_bound = which == kLoadBound && variant ? 100.0 : 0.01;
    c.harm_weight = which == kHarm && variant ? 1.0 : 0.0;
    if (p == RoutingPolicy::kDomain) c.domains = {"a", "b", "c"};
    auto r = Router::Create(c, with_calib ? &calib : nullptr);
    EXPECT_TRUE(r.ok()) << RoutingPolicyName(p) << ": " << r.status().message();
    std::mt19937 rng(11);  // the same requests and completions for both routers
    std::vector<RoutingDecision> held;
    std::vector<int> decoders;
    for (int i = 0; i < 300; ++i) {
      // Mostly cluster 0's expert, so that the band and the bounds bind.
      std::vector<float> counts(4, 0.f);
      counts[rng() % 4 < 3 ? 0 : rng() % 4] += 4;
      counts[rng() % 4] += 1;
      const RoutingDecision d = r->Route(counts.data(), nullptr, "");
      decoders.push_back(d.decoder);
      r->Dispatch(d);
      held.push_back(d);
      if (held.size() > 6 || rng() % 5 < 2) {  // at most 6 in flight: the decoders are rarely all full
        const size_t j = rng() % held.size();
        r->Complete(held[j]);
        held.erase(held.begin() + static_cast<long>(j));
      }
    }
    return decoders;
  };
  for (RoutingPolicy p : AllRoutingPolicies()) {
    const PolicySettings reads = SettingsOf(p);
    // A policy that does not read the calibration routes alike with it and without it.
    if (!reads.calibration) {
      EXPECT_EQ(routes(p, kTau, 0, true), routes(p, kTau, 0, false)) << RoutingPolicyName(p) << " read the calibration";
    }
    for (auto [which, read] : {std::pair{kTau, reads.tau},
                               {kLoadBound, reads.load_bound},
                               {kHarm, reads.harm_weight},
                               {kStepCost, reads.step_cost}}) {
      EXPECT_EQ(routes(p, which, 0, reads.calibration) != routes(p, which, 1, reads.calibration), read)
          << RoutingPolicyName(p) << ", setting " << which << (read ? " is read but changed nothing" : " is not read");
    }
  }
}

}  // namespace
}  // namespace eldr
