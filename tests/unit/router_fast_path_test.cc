// The router's fast paths against plain recomputations (issue 15): the per-(cluster, decoder) growth cache of
// PredictedUnion and the Router's decisions (every signature policy) on random route / dispatch / complete
// sequences, compared with Decide() fed distances from a plain recomputation of the product (the 16-bit fixed-point
// centroids times the signature, as DESIGN.md §3 defines d_k = 1 − s·μ̂_k) and prices from the uncached MarginalCost.
// The decisions must agree exactly (the same decoder, band, nearest cluster and price bit for bit).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <random>

#include "runtime/router/predicted_union.h"
#include "runtime/router/router.h"
#include "tests/unit/centroid_reference.h"

namespace eldr {
namespace {

TEST(PredictedUnionCache, GrowthsEqualGrowthBitForBitAndRecomputeOnlyChangedDecoders) {
  const int L = 4, E = 16, P = 5, K = 6;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  std::vector<float> profiles(P * L * E);
  for (float& q : profiles) q = uni(rng) < 0.2f ? 0.f : 0.5f * uni(rng);
  const std::vector<uint8_t> mask = {1, 1, 0, 1};
  PredictedUnion u(profiles, P, mask, L, E, K);
  std::vector<std::vector<int>> members(K);
  std::vector<std::vector<int>> changed_since(P, std::vector<int>(K, 1));  // 1: Growths(p) must recompute k
  for (int step = 0; step < 2000; ++step) {
    const int op = static_cast<int>(rng() % 3);
    if (op < 2) {
      const int k = static_cast<int>(rng() % K);
      if (op == 1 && !members[k].empty()) {
        const size_t i = rng() % members[k].size();
        u.Remove(k, members[k][i]);
        members[k].erase(members[k].begin() + static_cast<long>(i));
      } else {
        const int p = static_cast<int>(rng() % P);
        u.Add(k, p);
        members[k].push_back(p);
      }
      for (int p = 0; p < P; ++p) changed_since[p][k] = 1;
    } else {
      const int p = static_cast<int>(rng() % P);
      int64_t expected = 0;
      for (int k = 0; k < K; ++k) expected += changed_since[p][k];
      const int64_t before = u.growth_evaluations();
      const double* g = u.Growths(p);
      ASSERT_EQ(u.growth_evaluations() - before, expected) << "step " << step;
      for (int k = 0; k < K; ++k) {
        ASSERT_EQ(g[k], u.Growth(k, p)) << "step " << step << " decoder " << k;  // bit for bit
        // and the definition: Σ over the masked (ℓ, e) of Π (1 − q_m) · q_p, scale L / |S|
        double brute = 0;
        for (int l = 0; l < L; ++l) {
          if (!mask[l]) continue;
          for (int e = 0; e < E; ++e) {
            double keep = 1;
            for (int m : members[k]) keep *= 1 - profiles[(m * L + l) * E + e];
            brute += keep * profiles[(p * L + l) * E + e];
          }
        }
        ASSERT_NEAR(g[k], 4.0 / 3.0 * brute, 1e-4);
        changed_since[p][k] = 0;
      }
    }
  }
}

constexpr int kL = 4, kE = 16, kTopK = 2;

// Random clustered centroids (K/2 distinct directions, each twice: exactly equal distances), count·idf signatures.
Calibration RandomCalibration(int K, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  Calibration c;
  c.shape = {"fast-path", kL, kE, kTopK};
  c.signature.variant = SignatureVariant::kCountIdf;
  c.signature.num_layers = kL;
  c.signature.num_experts = kE;
  c.signature.idf.resize(kL * kE);
  for (auto& w : c.signature.idf) w = 2.f * u(rng);
  c.signature.layer_mask = {1, 0, 1, 1};
  const int D = c.signature.dim();
  c.num_clusters = K;
  c.tau = 0.05;
  c.centroids.resize(static_cast<size_t>(K) * D);
  for (int k = 0; k < K; ++k) {
    float* mu = c.centroids.data() + static_cast<size_t>(k) * D;
    if (k % 2 == 1) {
      std::copy(mu - D, mu, mu);
      continue;
    }
    double n2 = 0;
    for (int x = 0; x < D; ++x) n2 += std::pow(mu[x] = u(rng) < 0.3f ? 0.f : u(rng), 2);
    for (int x = 0; x < D; ++x) mu[x] /= static_cast<float>(std::sqrt(n2));
  }
  c.expert_load.resize(static_cast<size_t>(K) * kL * kE);
  for (auto& q : c.expert_load) q = u(rng) < 0.3f ? 0.f : 0.3f * u(rng);
  // Three calibration requests per cluster of 1..100 decode tokens: the requests' remainders (and eldr's overlap
  // shares) follow them.
  for (int i = 0; i < 3 * K; ++i) {
    c.decode_lens.push_back(1 + static_cast<int64_t>(rng() % 100));
    c.assignment.push_back(i % K);
  }
  c.mean_decode_len = ClusterMeanDecodeLen(c.decode_lens, c.assignment, K);
  return c;
}

// The plain distances: d_k = 1 − s·μ̂_k, the product recomputed by the test's own implementation of the centroid
// matrix's definition (16-bit fixed point, runtime/router/centroid_matrix.h).
std::vector<double> PlainDistances(const Calibration& c, const std::vector<float>& s) {
  const std::vector<float> dots =
      testing::CentroidDotsReference(c.centroids, c.num_clusters, c.signature.dim(), s.data());
  std::vector<double> d(c.num_clusters);
  for (int k = 0; k < c.num_clusters; ++k) d[k] = 1.0 - static_cast<double>(dots[k]);
  return d;
}

void ExpectSameDecision(const RoutingDecision& fast, const RoutingDecision& plain, int step) {
  ASSERT_EQ(fast.decoder, plain.decoder) << "step " << step;
  ASSERT_EQ(fast.nearest, plain.nearest) << "step " << step;
  ASSERT_EQ(fast.band_size, plain.band_size) << "step " << step;
  ASSERT_EQ(fast.fallback, plain.fallback) << "step " << step;
  ASSERT_EQ(fast.overflow, plain.overflow) << "step " << step;
  ASSERT_EQ(fast.distance, plain.distance) << "step " << step;
  ASSERT_EQ(fast.predicted_cost, plain.predicted_cost)
      << "step " << step << std::setprecision(17) << " " << fast.predicted_cost << " " << plain.predicted_cost;
  ASSERT_EQ(fast.predicted_tokens, plain.predicted_tokens) << "step " << step;
}

// Routes `steps` random requests through `router` (policy of `rc`), completing random in-flight ones in between, and
// checks every decision against Decide() on the plain distances and (eldr) the uncached prices.
void RunRandomSequence(const RouterConfig& rc, const Calibration& calib, uint64_t seed, int steps) {
  Router router = Router::Create(rc, &calib).value();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<RoutingDecision> in_flight;
  const int D = calib.signature.dim(), L = calib.shape.num_layers, E = calib.shape.num_experts;
  std::vector<float> counts(static_cast<size_t>(L) * E), s(D);
  for (int step = 0; step < steps; ++step) {
    if (!in_flight.empty() && rng() % 5 < 2) {
      const size_t i = rng() % in_flight.size();
      router.Complete(in_flight[i]);
      in_flight.erase(in_flight.begin() + static_cast<long>(i));
      continue;
    }
    if (!in_flight.empty() && rng() % 4 == 0) {  // some decode tokens of a random in-flight request
      const RoutingDecision& d = in_flight[rng() % in_flight.size()];
      for (int t = static_cast<int>(rng() % 40); t > 0; --t) router.ConsumeToken(d);
      continue;
    }
    // A prompt of 1..40 tokens whose experts lean towards a random centroid's.
    const int tokens = 1 + static_cast<int>(rng() % 40);
    std::fill(counts.begin(), counts.end(), 0.f);
    for (int l = 0; l < L; ++l) {
      for (int t = 0; t < tokens; ++t) {
        const int first = static_cast<int>(rng() % (E - 1));
        counts[l * E + first] += 1;
        counts[l * E + first + 1] += 1;
      }
    }
    ComputeSignature(calib.signature, counts.data(), nullptr, s.data());
    const std::vector<double> dist = PlainDistances(calib, s);
    // The plain decision, on the state before routing.
    const std::vector<DecoderState> decoders = router.decoders();
    int nearest = 0;
    for (int k = 1; k < calib.num_clusters; ++k) nearest = dist[k] < dist[nearest] ? k : nearest;
    const double context = 2.0 * tokens / calib.shape.top_k;  // each prompt token adds top_k to layer 0
    DecisionInputs in;
    in.policy = rc.policy;
    in.decoders = &decoders;
    in.distances = dist.data();
    in.tau = *rc.tau;
    in.load_bound = router.load_bound();
    in.request_work = router.PriorDecodeTokens(nearest);
    std::vector<double> cost(calib.num_clusters);
    if (rc.policy == RoutingPolicy::kEldr) {
      for (int k = 0; k < calib.num_clusters; ++k) cost[k] = router.MarginalCost(k, nearest, context, in.request_work);
      in.marginal_cost = cost.data();
      in.max_batch = rc.max_batch;
    }
    const RoutingDecision plain = Decide(in);
    const RoutingDecision fast = router.Route(counts.data(), nullptr, "");
    ExpectSameDecision(fast, plain, step);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_DOUBLE_EQ(fast.context, context);
    const std::vector<double>& all = router.last_distances();  // every d_k, bit for bit the plain product's
    for (int k = 0; k < calib.num_clusters; ++k) {
      if (all[k] != dist[k]) {
        ADD_FAILURE() << "step " << step << ": d_" << k << " = " << all[k] << ", plain " << dist[k];
        return;
      }
    }
    if (fast.decoder < 0) continue;  // every decoder at its cap: the request waits (dropped here)
    router.Dispatch(fast);
    in_flight.push_back(fast);
  }
}

TEST(RouterFastPath, EldrDecisionsEqualThePlainRecomputation) {
  const int K = 8;
  const Calibration calib = RandomCalibration(K, 21);
  RouterConfig rc;
  rc.policy = RoutingPolicy::kEldr;
  rc.num_decoders = K;
  rc.tau = 0.05;
  rc.job_shape = calib.shape;
  rc.step_cost = CostModel{"test", "", 5e-4, 3.6e-5, 1.3e-5, 4.6e-8};
  for (const int64_t max_batch : {int64_t{64}, int64_t{3}}) {
    for (const int64_t cap : {int64_t{0}, int64_t{4}}) {
      rc.max_batch = max_batch;
      rc.admission_cap = cap;
      RunRandomSequence(rc, calib, 100 + max_batch + cap, 3000);
      if (HasFatalFailure()) return;
    }
  }
  // Sequences dear and experts cheap (ties broken by distance among near-equal prices), and λ = 0.
  rc.max_batch = 64;
  rc.admission_cap = 0;
  rc.step_cost = CostModel{"test", "", 5e-4, 0, 1e-3, 0};
  RunRandomSequence(rc, calib, 7, 3000);
  if (HasFatalFailure()) return;
  rc.harm_weight = 0;
  rc.step_cost = CostModel{"test", "", 5e-4, 3.6e-5, 1.3e-5, 4.6e-8};
  RunRandomSequence(rc, calib, 8, 3000);
}

TEST(RouterFastPath, BandDecisionsEqualThePlainRecomputation) {
  for (const int K : {2, 5, 8, 40}) {
    const Calibration calib = RandomCalibration(K, 30 + K);
    for (const RoutingPolicy policy :
         {RoutingPolicy::kEldrPaper, RoutingPolicy::kEldrTail, RoutingPolicy::kLocalityTop1}) {
      for (const double tau : {0.0, 0.02, 0.1, 2.0}) {
        RouterConfig rc;
        rc.policy = policy;
        rc.num_decoders = K;
        rc.tau = tau;
        rc.admission_cap = 6;
        rc.load_bound = policy == RoutingPolicy::kEldrTail ? 0 : 0.25 * (K % 3);
        rc.job_shape = calib.shape;
        RunRandomSequence(rc, calib, 1000 * K + static_cast<int>(tau * 100), 1500);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The benchmark's shape (L = 48, E = 128, all layers masked: D = 6144; K = 40) with uniform random centroids (all
// distances within ~0.02 of each other), and a 16-layer mask.
TEST(RouterFastPath, BenchmarkShapeDecisionsEqualThePlainRecomputation) {
  for (const int layers : {48, 16}) {
    const int L = 48, E = 128, K = 40;
    std::mt19937_64 rng(layers);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    Calibration c;
    c.shape = {"bench", L, E, 8};
    c.signature.variant = SignatureVariant::kCountIdf;
    c.signature.num_layers = L;
    c.signature.num_experts = E;
    c.signature.idf.resize(L * E);
    for (auto& w : c.signature.idf) w = 3.f * u(rng);
    c.signature.layer_mask.assign(L, 0);
    for (int l = 0; l < layers; ++l) c.signature.layer_mask[(l * 7) % L] = 1;
    const int D = c.signature.dim();
    c.num_clusters = K;
    c.tau = 0.1;
    c.centroids.resize(static_cast<size_t>(K) * D);
    for (int k = 0; k < K; ++k) {
      double n2 = 0;
      for (int x = 0; x < D; ++x) n2 += std::pow(c.centroids[k * D + x] = u(rng), 2);
      for (int x = 0; x < D; ++x) c.centroids[k * D + x] /= static_cast<float>(std::sqrt(n2));
    }
    c.expert_load.resize(static_cast<size_t>(K) * L * E);
    for (auto& q : c.expert_load) q = std::min(1.f, 2.f * 8 / E * u(rng));
    for (const RoutingPolicy policy : {RoutingPolicy::kEldr, RoutingPolicy::kEldrPaper}) {
      RouterConfig rc;
      rc.policy = policy;
      rc.num_decoders = K;
      rc.tau = policy == RoutingPolicy::kEldr ? 0.1 : 0.004;  // a band edge among the distances
      rc.job_shape = c.shape;
      rc.step_cost = CostModel{"test", "", 5e-4, 3.6e-6, 1.3e-5, 4.6e-8};
      RunRandomSequence(rc, c, 5 + layers, 300);
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace eldr
