// Synthetic routing traces (runtime/trace/synth.h): validity, determinism, lengths, domain mix and the
// locality structure the generator promises, checked against independent expectations.
#include "runtime/trace/synth.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "runtime/trace/trace.h"

namespace eldr {
namespace {

SynthOptions Small() {
  SynthOptions o;
  o.num_domains = 3;
  o.num_requests = 60;
  o.num_layers = 4;
  o.num_experts = 32;
  o.top_k = 4;
  o.prompt_len_min = 5;
  o.prompt_len_max = 9;
  o.output_len_min = 2;
  o.output_len_max = 6;
  o.seed = 7;
  return o;
}

Trace MustSynth(const SynthOptions& o) {
  auto r = SynthesizeTrace(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : Trace{};
}

// The set of experts of token t at layer l.
std::set<int> TopK(const Trace& t, int64_t token, int layer) {
  const uint16_t* ids = t.token_ids(token) + static_cast<size_t>(layer) * t.shape.top_k;
  return std::set<int>(ids, ids + t.shape.top_k);
}

int Overlap(const std::set<int>& a, const std::set<int>& b) {
  int n = 0;
  for (int x : a) n += b.count(x);
  return n;
}

TEST(SynthTest, ProducesAValidTraceOfTheRequestedShape) {
  SynthOptions o = Small();
  o.model = "toy";
  Trace t = MustSynth(o);
  EXPECT_TRUE(ValidateTrace(t, "synthetic").ok()) << ValidateTrace(t, "synthetic").ToString();
  EXPECT_EQ(t.shape.model, "toy");
  EXPECT_EQ(t.shape.num_layers, 4);
  EXPECT_EQ(t.shape.num_experts, 32);
  EXPECT_EQ(t.shape.top_k, 4);
  ASSERT_EQ(t.requests.size(), 60u);
  ASSERT_TRUE(t.has_weights());
  EXPECT_EQ(t.topk_weights.size(), t.topk_ids.size());
  int64_t offset = 0;
  for (size_t i = 0; i < t.requests.size(); ++i) {
    const auto& r = t.requests[i];
    EXPECT_EQ(r.offset, offset);
    offset += r.num_tokens;
    ASSERT_EQ(r.domain.size(), 2u);
    EXPECT_EQ(r.domain[0], 'd');
    EXPECT_GE(r.domain[1], '0');
    EXPECT_LE(r.domain[1], '2');
    EXPECT_EQ(r.id, "syn-" + r.domain + "-" + std::to_string(i));
  }
  EXPECT_EQ(offset, t.num_tokens_total());
}

TEST(SynthTest, LengthsAreUniformOverTheirInclusiveRanges) {
  SynthOptions o = Small();
  o.num_requests = 400;
  o.num_layers = 1;
  Trace t = MustSynth(o);
  std::map<int64_t, int> prompt, output;
  for (const auto& r : t.requests) {
    ++prompt[r.prompt_len];
    ++output[r.decode_len()];
  }
  // 5 values each: every value appears, none is far from 400/5 = 80 (binomial sd ≈ 8).
  ASSERT_EQ(prompt.size(), 5u);
  ASSERT_EQ(output.size(), 5u);
  EXPECT_EQ(prompt.begin()->first, 5);
  EXPECT_EQ(prompt.rbegin()->first, 9);
  EXPECT_EQ(output.begin()->first, 2);
  EXPECT_EQ(output.rbegin()->first, 6);
  for (auto [len, n] : prompt) EXPECT_NEAR(n, 80, 40) << "prompt_len " << len;
  for (auto [len, n] : output) EXPECT_NEAR(n, 80, 40) << "output_len " << len;
}

TEST(SynthTest, ZeroOutputLengthGivesPrefillOnlyRequests) {
  SynthOptions o = Small();
  o.output_len_min = o.output_len_max = 0;
  Trace t = MustSynth(o);
  EXPECT_TRUE(ValidateTrace(t, "synthetic").ok());
  for (const auto& r : t.requests) EXPECT_EQ(r.decode_len(), 0);
}

TEST(SynthTest, DeterministicPerSeedAndDifferentAcrossSeeds) {
  SynthOptions o = Small();
  Trace a = MustSynth(o), b = MustSynth(o);
  EXPECT_EQ(a.topk_ids, b.topk_ids);
  EXPECT_EQ(a.topk_weights, b.topk_weights);
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].id, b.requests[i].id);
    EXPECT_EQ(a.requests[i].num_tokens, b.requests[i].num_tokens);
  }
  o.seed = 8;
  Trace c = MustSynth(o);
  EXPECT_NE(a.topk_ids, c.topk_ids);
}

TEST(SynthTest, IdsDoNotDependOnWhetherWeightsAreEmitted) {
  SynthOptions o = Small();
  o.with_weights = false;
  Trace without = MustSynth(o);
  EXPECT_FALSE(without.has_weights());
  o.with_weights = true;
  Trace with = MustSynth(o);
  EXPECT_EQ(with.topk_ids, without.topk_ids);
}

TEST(SynthTest, WeightsAreDescendingGateProbabilities) {
  Trace t = MustSynth(Small());
  const int K = t.shape.top_k;
  for (int64_t tok = 0; tok < t.num_tokens_total(); ++tok) {
    for (int l = 0; l < t.shape.num_layers; ++l) {
      const float* w = t.token_weights(tok) + l * K;
      double sum = 0;
      for (int j = 0; j < K; ++j) {
        ASSERT_GT(w[j], 0.0f);
        if (j > 0) {
          ASSERT_LE(w[j], w[j - 1]);
        }
        sum += w[j];
      }
      ASSERT_NEAR(sum, 1.0, 1e-5);
    }
  }
}

TEST(SynthTest, DomainCountsFollowTheMix) {
  SynthOptions o;
  o.num_domains = 4;
  o.num_requests = 20000;
  o.num_layers = 1;
  o.num_experts = 8;
  o.top_k = 1;
  o.prompt_len_min = o.prompt_len_max = 1;
  o.output_len_min = o.output_len_max = 0;
  o.domain_mix = {3, 1, 0, 4};  // probabilities 3/8, 1/8, 0, 1/2
  o.with_weights = false;
  Trace t = MustSynth(o);
  std::map<std::string, int> count;
  for (const auto& r : t.requests) ++count[r.domain];
  EXPECT_EQ(count.count("d2"), 0u);
  const double n = 20000;
  for (auto [name, p] : std::vector<std::pair<std::string, double>>{{"d0", 3.0 / 8}, {"d1", 1.0 / 8}, {"d3", 0.5}}) {
    const double sd = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(count[name], n * p, 5 * sd) << name;
  }
  // Empty mix: uniform.
  o.domain_mix.clear();
  count.clear();
  for (const auto& r : MustSynth(o).requests) ++count[r.domain];
  ASSERT_EQ(count.size(), 4u);
  for (auto [name, c] : count) EXPECT_NEAR(c, 5000, 5 * std::sqrt(n * 0.25 * 0.75)) << name;
}

TEST(SynthTest, WildChatMixPutsThreeQuartersOnTwoDomains) {
  EXPECT_EQ(WildChatMix(1), std::vector<double>{1.0});
  for (int n = 2; n <= 12; ++n) {
    const auto mix = WildChatMix(n);
    ASSERT_EQ(mix.size(), static_cast<size_t>(n));
    EXPECT_NEAR(std::accumulate(mix.begin(), mix.end(), 0.0), 1.0, 1e-12) << n;
    for (int i = 1; i < n; ++i) EXPECT_LE(mix[i], mix[i - 1]) << n;
    for (double w : mix) EXPECT_GT(w, 0);
    if (n >= 3) {
      EXPECT_DOUBLE_EQ(mix[0], 0.45);
      EXPECT_DOUBLE_EQ(mix[1], 0.30);
      EXPECT_NEAR(mix[0] + mix[1], 0.75, 1e-12);
    }
  }
  // Usable as options.domain_mix.
  SynthOptions o = Small();
  o.num_domains = 6;
  o.domain_mix = WildChatMix(6);
  EXPECT_TRUE(SynthesizeTrace(o).ok());
}

// Average top-k overlap at the same layer between decode tokens of pairs of requests.
struct Overlaps {
  double same_request = 0, same_domain = 0, cross_domain = 0;
};

Overlaps MeasureOverlaps(const Trace& t) {
  double sums[3] = {0, 0, 0};
  int64_t counts[3] = {0, 0, 0};
  const auto& rq = t.requests;
  for (size_t a = 0; a < rq.size(); ++a) {
    for (size_t b = a; b < rq.size(); ++b) {
      const int kind = a == b ? 0 : (rq[a].domain == rq[b].domain ? 1 : 2);
      // First decode token of a vs last decode token of b (different tokens even when a == b).
      const int64_t ta = rq[a].offset + rq[a].prompt_len, tb = rq[b].offset + rq[b].num_tokens - 1;
      for (int l = 0; l < t.shape.num_layers; ++l) {
        sums[kind] += Overlap(TopK(t, ta, l), TopK(t, tb, l));
        ++counts[kind];
      }
    }
  }
  return {sums[0] / counts[0], sums[1] / counts[1], sums[2] / counts[2]};
}

TEST(SynthTest, TokensShareMoreExpertsWithinARequestAndWithinADomain) {
  SynthOptions o = Small();
  o.num_requests = 120;
  o.num_experts = 64;
  o.top_k = 4;
  o.num_layers = 6;
  const Overlaps ov = MeasureOverlaps(MustSynth(o));
  // Uniform draws would overlap by k²/E = 0.25 experts; the shared set lifts every pair alike.
  EXPECT_GT(ov.same_domain, 1.5 * ov.cross_domain) << ov.same_domain << " vs " << ov.cross_domain;
  EXPECT_GT(ov.same_request, ov.same_domain + 0.1) << ov.same_request << " vs " << ov.same_domain;

  // Without a personal preference, two tokens of one request are just two tokens of its domain.
  o.request_affinity = 0;
  const Overlaps no_personal = MeasureOverlaps(MustSynth(o));
  EXPECT_NEAR(no_personal.same_request, no_personal.same_domain, 0.15);
  EXPECT_GT(no_personal.same_domain, 1.5 * no_personal.cross_domain);

  // Without domain preference, domains are indistinguishable (shared set and background only).
  o.domain_affinity = 0;
  const Overlaps flat = MeasureOverlaps(MustSynth(o));
  EXPECT_NEAR(flat.same_domain, flat.cross_domain, 0.1);
}

TEST(SynthTest, FullDomainAffinityKeepsTokensInTheDomainsPreferredSet) {
  SynthOptions o = Small();
  o.domain_affinity = 1;
  o.shared_fraction = 0;
  o.request_affinity = 0;
  o.num_experts = 64;
  Trace t = MustSynth(o);
  // Per (domain, layer) the union of all tokens' experts is the preferred set: at most 2k experts.
  std::map<std::pair<std::string, int>, std::set<int>> used;
  for (const auto& r : t.requests) {
    for (int64_t tok = r.offset; tok < r.offset + r.num_tokens; ++tok) {
      for (int l = 0; l < t.shape.num_layers; ++l) {
        for (int e : TopK(t, tok, l)) used[{r.domain, l}].insert(e);
      }
    }
  }
  for (const auto& [key, set] : used) EXPECT_LE(set.size(), 2u * o.top_k) << key.first << " layer " << key.second;
}

TEST(SynthTest, FullSharedFractionGivesEveryTokenTheSameExperts) {
  SynthOptions o = Small();
  o.domain_affinity = 0;
  o.shared_fraction = 1;
  Trace t = MustSynth(o);
  // The shared set has exactly k experts: every token draws all of them at every layer.
  for (int l = 0; l < t.shape.num_layers; ++l) {
    const std::set<int> first = TopK(t, 0, l);
    for (int64_t tok = 1; tok < t.num_tokens_total(); ++tok) ASSERT_EQ(TopK(t, tok, l), first) << "layer " << l;
  }
}

TEST(SynthTest, FirstDrawFollowsTheMixture) {
  // Shared set (k = 4 experts, Zipf weights 1/(i+1) / H_4 = 0.48, 0.24, 0.16, 0.12) with mass s = 0.5, the
  // rest uniform over E = 32. A token's first expert is one draw from the mixture, so the sorted first-draw
  // frequencies at a layer are 0.5·w_i + 0.5/32 for the shared experts and 0.5/32 for the others.
  SynthOptions o = Small();
  o.num_requests = 2000;
  o.num_layers = 2;
  o.domain_affinity = 0;
  o.shared_fraction = 0.5;
  Trace t = MustSynth(o);
  const double h4 = 1 + 1.0 / 2 + 1.0 / 3 + 1.0 / 4, bg = 0.5 / 32;
  std::vector<double> expected(32, bg);
  for (int i = 0; i < 4; ++i) expected[i] += 0.5 / (i + 1) / h4;
  const double n = static_cast<double>(t.num_tokens_total());
  for (int l = 0; l < 2; ++l) {
    std::vector<double> freq(32, 0);
    for (int64_t tok = 0; tok < t.num_tokens_total(); ++tok) freq[t.token_ids(tok)[l * o.top_k]] += 1 / n;
    std::sort(freq.rbegin(), freq.rend());
    for (int i = 0; i < 32; ++i) {
      EXPECT_NEAR(freq[i], expected[i], 5 * std::sqrt(expected[i] / n) + 0.002) << "layer " << l << " rank " << i;
    }
  }
}

TEST(SynthTest, BackgroundOnlyIsUniformOverExperts) {
  SynthOptions o = Small();
  o.domain_affinity = 0;
  o.shared_fraction = 0;
  o.num_requests = 200;
  o.num_layers = 2;
  o.num_experts = 16;
  o.top_k = 2;
  Trace t = MustSynth(o);
  std::vector<int64_t> count(o.num_experts, 0);
  for (uint16_t e : t.topk_ids) ++count[e];
  const double n = static_cast<double>(t.topk_ids.size()), p = 1.0 / o.num_experts;
  for (int e = 0; e < o.num_experts; ++e) EXPECT_NEAR(count[e], n * p, 5 * std::sqrt(n * p * (1 - p))) << e;
}

TEST(SynthTest, TopKEqualToNumExpertsUsesEveryExpert) {
  SynthOptions o = Small();
  o.num_experts = 6;
  o.top_k = 6;
  Trace t = MustSynth(o);
  EXPECT_TRUE(ValidateTrace(t, "synthetic").ok());
  for (int64_t tok = 0; tok < t.num_tokens_total(); ++tok) EXPECT_EQ(TopK(t, tok, 0).size(), 6u);
}

TEST(SynthTest, RejectsInvalidOptions) {
  struct Case {
    const char* what;
    void (*edit)(SynthOptions*);
  };
  // clang-format off
  const Case cases[] = {
      {"num_domains", [](SynthOptions* o) { o->num_domains = 0; }},
      {"num_requests", [](SynthOptions* o) { o->num_requests = 0; }},
      {"num_layers", [](SynthOptions* o) { o->num_layers = 0; }},
      {"num_experts", [](SynthOptions* o) { o->num_experts = 65536; }},
      {"top_k", [](SynthOptions* o) { o->top_k = 0; }},
      {"top_k", [](SynthOptions* o) { o->top_k = o->num_experts + 1; }},
      {"prompt_len_min", [](SynthOptions* o) { o->prompt_len_min = o->prompt_len_max = 0; }},
      {"prompt_len_min", [](SynthOptions* o) { o->prompt_len_min = o->prompt_len_max + 1; }},
      {"output_len_min", [](SynthOptions* o) { o->output_len_min = -1; }},
      {"output_len_min", [](SynthOptions* o) { o->output_len_min = o->output_len_max + 1; }},
      {"domain_mix", [](SynthOptions* o) { o->domain_mix = {1, 1}; }},
      {"domain_mix", [](SynthOptions* o) { o->domain_mix = {1, -1, 1}; }},
      {"domain_mix", [](SynthOptions* o) { o->domain_mix = {1, NAN, 1}; }},
      {"domain_mix", [](SynthOptions* o) { o->domain_mix = {0, 0, 0}; }},
      {"domain_affinity", [](SynthOptions* o) { o->domain_affinity = 1.5; }},
      {"shared_fraction", [](SynthOptions* o) { o->shared_fraction = -0.1; }},
      {"request_affinity", [](SynthOptions* o) { o->request_affinity = NAN; }},
      {"domain_affinity + shared_fraction",
       [](SynthOptions* o) { o->domain_affinity = 0.7; o->shared_fraction = 0.4; }},
      {"exceeds the limit", [](SynthOptions* o) { o->num_requests = int64_t{1} << 40; }},
  };
  // clang-format on
  for (const auto& c : cases) {
    SynthOptions o = Small();
    c.edit(&o);
    auto r = SynthesizeTrace(o);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(r.status().message().find(c.what), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace eldr
