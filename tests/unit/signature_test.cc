// Signatures, IDF and signature quality against hand-computed values and a direct brute-force
// computation of ρ (signatures built one by one, distances and ranks computed naively).
#include "runtime/signature/signature.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "runtime/signature/quality.h"

namespace eldr {
namespace {

// One request per entry: tokens[t][l] = top-k ids. First prompt_len tokens are prefill.
Trace MakeTrace(int L, int E, int K,
                const std::vector<std::pair<int, std::vector<std::vector<std::vector<int>>>>>& reqs) {
  Trace t;
  t.shape = {"test", L, E, K};
  int64_t offset = 0;
  int id = 0;
  for (const auto& [prompt_len, tokens] : reqs) {
    TraceRequest r;
    r.id = "r";
    r.id += std::to_string(id++);
    r.prompt_len = prompt_len;
    r.num_tokens = static_cast<int64_t>(tokens.size());
    r.offset = offset;
    offset += r.num_tokens;
    for (const auto& tok : tokens) {
      for (const auto& layer : tok) {
        for (int e : layer) t.topk_ids.push_back(static_cast<uint16_t>(e));
      }
    }
    t.requests.push_back(r);
  }
  return t;
}

TEST(Signature, CountsIdfAndDecodeProfileByHand) {
  // L = 1, E = 4, k = 2. Request 0: prefill {0,1},{0,2}; decode {0,1}. Request 1: prefill {0,3}; decode {2,3},{2,3}.
  Trace t = MakeTrace(1, 4, 2, {{2, {{{0, 1}}, {{0, 2}}, {{0, 1}}}}, {1, {{{0, 3}}, {{2, 3}}, {{2, 3}}}}});
  ASSERT_TRUE(ValidateTrace(t, "t").ok());
  RequestFeatures f = ComputeRequestFeatures(t, {0, 1});
  EXPECT_EQ(f.prefill_counts, (std::vector<float>{2, 1, 1, 0, 1, 0, 0, 1}));
  EXPECT_EQ(f.decode_profile, (std::vector<float>{1, 1, 0, 0, 0, 0, 1, 1}));
  // df = {2, 1, 1, 1}, |C| = 2 → w = log(3/3), log(3/2) ×3.
  auto idf = ComputeIdf(f.prefill_counts, 2, 1, 4);
  EXPECT_NEAR(idf[0], 0.0, 1e-7);
  for (int e = 1; e < 4; ++e) EXPECT_NEAR(idf[e], std::log(1.5), 1e-6);
  // count·idf signature of request 0: [0, w, w, 0] / (w√2) = [0, 1/√2, 1/√2, 0].
  SignatureParams p{SignatureVariant::kCountIdf, 1, 4, idf, {1}};
  std::vector<float> s(4);
  ComputeSignature(p, f.prefill_counts.data(), nullptr, s.data());
  EXPECT_NEAR(s[0], 0, 1e-7);
  EXPECT_NEAR(s[1], 1 / std::sqrt(2.0), 1e-6);
  EXPECT_NEAR(s[2], 1 / std::sqrt(2.0), 1e-6);
  EXPECT_NEAR(s[3], 0, 1e-7);
  // count variant: [2,1,1,0]/√6.
  p.variant = SignatureVariant::kCount;
  ComputeSignature(p, f.prefill_counts.data(), nullptr, s.data());
  EXPECT_NEAR(s[0], 2 / std::sqrt(6.0), 1e-6);
  // sqrt: [√2,1,1,0]/2; binary: [1,1,1,0]/√3.
  p.variant = SignatureVariant::kSqrt;
  ComputeSignature(p, f.prefill_counts.data(), nullptr, s.data());
  EXPECT_NEAR(s[0], std::sqrt(2.0) / 2, 1e-6);
  EXPECT_NEAR(s[1], 0.5, 1e-6);
  p.variant = SignatureVariant::kBinary;
  ComputeSignature(p, f.prefill_counts.data(), nullptr, s.data());
  EXPECT_NEAR(s[0], 1 / std::sqrt(3.0), 1e-6);
  EXPECT_NEAR(s[3], 0, 1e-7);
}

TEST(Signature, LayerMaskSelectsAndConcatenatesInLayerOrder) {
  // L = 3, E = 2, k = 1; prefill token routes to expert l % 2 at layer l.
  Trace t = MakeTrace(3, 2, 1, {{1, {{{0}, {1}, {0}}, {{1}, {1}, {1}}}}});
  RequestFeatures f = ComputeRequestFeatures(t, {0});
  SignatureParams p{SignatureVariant::kCount, 3, 2, std::vector<float>(6, 1.f), {1, 0, 1}};
  ASSERT_EQ(p.dim(), 4);
  std::vector<float> s(4);
  ComputeSignature(p, f.prefill_counts.data(), nullptr, s.data());
  const float r = 1 / std::sqrt(2.f);
  EXPECT_EQ(s, (std::vector<float>{r, 0, r, 0}));
}

TEST(Signature, NormalisationIsBitForBitTheInOrderDoubleSum) {
  // The definition (DESIGN.md §3, s = x/‖x‖₂ with ‖x‖² summed in double in index order) written out here;
  // ComputeSignature takes a faster sum and must still give the same floats. Lengths around the 8-lane
  // split, zero vectors, entries spanning 60 binades (so the in-order sum rounds a lot), count·idf rows.
  std::mt19937_64 rng(11);
  int checked = 0;
  for (int scenario = 0; scenario < 3000; ++scenario) {
    const int L = 1 + static_cast<int>(rng() % 6), E = 1 + static_cast<int>(rng() % 300);
    SignatureParams p;
    p.variant = scenario % 2 ? SignatureVariant::kCountIdf : SignatureVariant::kCount;
    p.num_layers = L;
    p.num_experts = E;
    p.layer_mask.assign(L, 0);
    for (auto& m : p.layer_mask) m = rng() % 4 != 0;
    std::vector<float> counts(static_cast<size_t>(L) * E);
    p.idf.resize(counts.size());
    const int spread = static_cast<int>(rng() % 60);
    for (size_t x = 0; x < counts.size(); ++x) {
      counts[x] = rng() % 5 == 0 ? 0.f : static_cast<float>(rng() % 2049);
      if (scenario % 7 == 0)
        counts[x] = std::ldexp(static_cast<float>(rng() % 1000 + 1), static_cast<int>(rng() % (spread + 1)) - 30);
      p.idf[x] = static_cast<float>(rng() % 4000) / 1000.f;
    }
    if (scenario % 50 == 0) std::fill(counts.begin(), counts.end(), 0.f);
    std::vector<float> want;
    for (int l = 0; l < L; ++l) {
      if (!p.layer_mask[l]) continue;
      for (int e = 0; e < E; ++e) {
        const size_t x = static_cast<size_t>(l) * E + e;
        want.push_back(p.variant == SignatureVariant::kCount ? counts[x] : counts[x] * p.idf[x]);
      }
    }
    double norm2 = 0;
    for (float v : want) norm2 += static_cast<double>(v) * v;
    if (norm2 > 0) {
      const float inv = static_cast<float>(1.0 / std::sqrt(norm2));
      for (auto& v : want) v *= inv;
    }
    std::vector<float> got(p.dim(), -1.f);
    ComputeSignature(p, counts.data(), nullptr, got.data());
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << "scenario " << scenario;
    ++checked;
  }
  EXPECT_EQ(checked, 3000);
}

TEST(Signature, GateProbNeedsWeights) {
  Trace t = MakeTrace(1, 2, 1, {{1, {{{0}}, {{1}}}}});
  RequestFeatures f = ComputeRequestFeatures(t, {0});
  EXPECT_FALSE(VariantFeatures(f, SignatureVariant::kGateProb, {1, 1}).ok());
  EXPECT_EQ(ParseSignatureVariant("bogus").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseSignatureVariant("count_idf").value(), SignatureVariant::kCountIdf);
}

TEST(Quality, AverageRanksHandleTies) {
  EXPECT_EQ(AverageRanks({10, 20, 20, 5}), (std::vector<double>{2, 3.5, 3.5, 1}));
  // Spearman of a monotone transform is 1, of a reversed order −1.
  EXPECT_NEAR(SpearmanCorrelation({1, 2, 3, 4}, {1, 4, 9, 16}), 1.0, 1e-12);
  EXPECT_NEAR(SpearmanCorrelation({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0, 1e-12);
  // Hand-computed: x ranks {1,2,3,4,5}, y = {2,1,4,3,5} → d² = 1+1+1+1+0 = 4; ρ = 1 − 6·4/(5·24) = 0.8.
  EXPECT_NEAR(SpearmanCorrelation({1, 2, 3, 4, 5}, {2, 1, 4, 3, 5}), 0.8, 1e-12);
}

TEST(Quality, PairSampling) {
  auto all = SampleRequestPairs(5, 100, 0);
  EXPECT_TRUE(all.all_pairs);
  EXPECT_EQ(all.size(), 10u);
  auto some = SampleRequestPairs(100, 500, 1);
  EXPECT_FALSE(some.all_pairs);
  EXPECT_EQ(some.size(), 500u);
  std::set<std::pair<int, int>> seen;
  for (size_t p = 0; p < some.size(); ++p) {
    EXPECT_LT(some.first[p], some.second[p]);
    EXPECT_TRUE(seen.insert({some.first[p], some.second[p]}).second);
  }
}

// ρ computed the slow way: normalised masked signatures, pairwise distances, Spearman.
double BruteForceRho(const std::vector<float>& feats, const std::vector<float>& decode, int n, int L, int E,
                     const std::vector<uint8_t>& mask) {
  std::vector<double> sd, dd;
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      std::vector<float> a, b;
      for (int l = 0; l < L; ++l) {
        if (!mask[l]) continue;
        for (int e = 0; e < E; ++e) {
          a.push_back(feats[(i * L + l) * E + e]);
          b.push_back(feats[(j * L + l) * E + e]);
        }
      }
      sd.push_back(CosineDistance(a.data(), b.data(), a.size()));
      dd.push_back(CosineDistance(decode.data() + i * L * E, decode.data() + j * L * E, L * E));
    }
  }
  return SpearmanCorrelation(sd, dd);
}

TEST(Quality, RhoAndGreedySelectionMatchBruteForce) {
  std::mt19937_64 rng(5);
  const int n = 30, L = 5, E = 6;
  std::vector<float> feats(n * L * E), decode(n * L * E);
  std::uniform_real_distribution<float> u(0, 1);
  for (int i = 0; i < n; ++i) {
    for (int l = 0; l < L; ++l) {
      for (int e = 0; e < E; ++e) {
        const float d = u(rng) < 0.4f ? u(rng) : 0.f;
        decode[(i * L + l) * E + e] = d;
        // Layers 0 and 3 are informative, others noise.
        feats[(i * L + l) * E + e] = (l == 0 || l == 3) ? d + 0.1f * u(rng) : u(rng);
      }
    }
  }
  SignatureQuality q(feats, decode, n, L, E, SampleRequestPairs(n, 0, 0));
  for (int m = 1; m < (1 << L); ++m) {
    std::vector<uint8_t> mask(L);
    for (int l = 0; l < L; ++l) mask[l] = (m >> l) & 1;
    EXPECT_NEAR(q.Rho(mask), BruteForceRho(feats, decode, n, L, E, mask), 1e-5) << "mask " << m;
  }
  GreedyLayerSelection g = q.SelectLayersGreedy(nullptr, nullptr);
  ASSERT_EQ(g.layer_order.size(), static_cast<size_t>(L));
  // Each greedy step is the best single addition (by brute force).
  std::vector<uint8_t> chosen(L, 0);
  for (int step = 0; step < L; ++step) {
    double best = -2;
    for (int l = 0; l < L; ++l) {
      if (chosen[l]) continue;
      auto mask = chosen;
      mask[l] = 1;
      best = std::max(best, BruteForceRho(feats, decode, n, L, E, mask));
    }
    chosen[g.layer_order[step]] = 1;
    EXPECT_NEAR(g.rho_curve[step], best, 1e-5);
  }
  // The informative layers come first; N* is the first maximum of the curve.
  std::set<int> first_two = {g.layer_order[0], g.layer_order[1]};
  EXPECT_EQ(first_two, (std::set<int>{0, 3}));
  const double peak = *std::max_element(g.rho_curve.begin(), g.rho_curve.end());
  EXPECT_DOUBLE_EQ(g.rho_curve[g.n_star - 1], peak);
}

}  // namespace
}  // namespace eldr
