#include "runtime/trace/synth.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "runtime/common/json_util.h"
#include "runtime/common/memory_budget.h"
#include "runtime/common/signals.h"
#include "runtime/trace/sampling.h"

namespace eldr {

namespace {

// Streams of random numbers, derived from the seed so that one part of the trace (e.g. weights) does not
// shift another (ids).
enum Stream : uint64_t { kStructureStream = 1, kRequestIdStream = 2, kRequestWeightStream = 3 };

using trace_sampling::AliasBucket;
using trace_sampling::AliasTable;
using trace_sampling::DrawAlias;
using trace_sampling::StreamSeed;
using trace_sampling::UniformBelow;
using trace_sampling::UniformUnit;

// Writes m distinct experts, uniformly chosen, to out. perm: [E], any permutation of 0..E-1; it stays one
// (a partial Fisher–Yates over a permutation picks a uniform subset whatever the permutation's order).
void ChooseDistinct(std::mt19937_64& rng, int m, std::vector<uint16_t>* perm, uint16_t* out) {
  const int n = static_cast<int>(perm->size());
  for (int i = 0; i < m; ++i) {
    const int j = i + static_cast<int>(UniformBelow(rng, static_cast<uint64_t>(n - i)));
    std::swap((*perm)[i], (*perm)[j]);
    out[i] = (*perm)[i];
  }
}

// Zipf-skewed weights w_i ∝ 1/(i+1), summing to 1.
std::vector<double> ZipfWeights(int m) {
  std::vector<double> w(m);
  double sum = 0;
  for (int i = 0; i < m; ++i) sum += (w[i] = 1.0 / (i + 1));
  for (auto& x : w) x /= sum;
  return w;
}

Status ValidateOptions(const SynthOptions& o) {
  auto bad = [](const std::string& m) { return Status::InvalidArgument("synthetic trace: " + m); };
  if (o.num_domains < 1) return bad("num_domains must be >= 1, got " + std::to_string(o.num_domains));
  if (o.num_requests < 1) return bad("num_requests must be >= 1, got " + std::to_string(o.num_requests));
  // The shape the trace readers accept (a trace of 5000 layers would be written and then rejected by every reader).
  ELDR_RETURN_IF_ERROR(ValidateTraceShape(o.num_layers, o.num_experts, o.top_k, "synthetic trace"));
  if (o.prompt_len_min < 1) return bad("prompt_len_min must be >= 1, got " + std::to_string(o.prompt_len_min));
  if (o.prompt_len_min > o.prompt_len_max) {
    return bad("prompt_len_min (" + std::to_string(o.prompt_len_min) + ") exceeds prompt_len_max (" +
               std::to_string(o.prompt_len_max) + ")");
  }
  if (o.output_len_min < 0) return bad("output_len_min must be >= 0, got " + std::to_string(o.output_len_min));
  if (o.output_len_min > o.output_len_max) {
    return bad("output_len_min (" + std::to_string(o.output_len_min) + ") exceeds output_len_max (" +
               std::to_string(o.output_len_max) + ")");
  }
  const double max_entries = static_cast<double>(o.num_requests) *
                             (static_cast<double>(o.prompt_len_max) + static_cast<double>(o.output_len_max)) *
                             o.num_layers * o.top_k;
  if (max_entries > kMaxSynthEntries) {
    return bad("num_requests * (prompt_len_max + output_len_max) * num_layers * top_k = " + Fmt(max_entries, 0) +
               " routing entries exceeds the limit of 2^34");
  }
  // ids (uint16) and weights (float) of the trace at its mean lengths, held in memory before the write.
  const double mean_entries = static_cast<double>(o.num_requests) *
                              (static_cast<double>(o.prompt_len_min + o.prompt_len_max) / 2 +
                               static_cast<double>(o.output_len_min + o.output_len_max) / 2) *
                              o.num_layers * o.top_k;
  ELDR_RETURN_IF_ERROR(CheckMemoryBudget(mean_entries * (o.with_weights ? 6 : 2),
                                         "synthetic trace of " + Fmt(mean_entries, 0) + " routing entries"));
  if (!o.domain_mix.empty()) {
    if (o.domain_mix.size() != static_cast<size_t>(o.num_domains)) {
      return bad("domain_mix has " + std::to_string(o.domain_mix.size()) + " weights but num_domains is " +
                 std::to_string(o.num_domains));
    }
    double sum = 0;
    for (size_t d = 0; d < o.domain_mix.size(); ++d) {
      const double w = o.domain_mix[d];
      if (!std::isfinite(w) || w < 0) {
        return bad("domain_mix[" + std::to_string(d) + "] must be finite and >= 0, got " + std::to_string(w));
      }
      sum += w;
    }
    if (!(sum > 0) || !std::isfinite(sum)) return bad("domain_mix must have a positive, finite sum");
  }
  auto fraction = [&](const char* name, double v) -> Status {
    if (!std::isfinite(v) || v < 0 || v > 1)
      return bad(std::string(name) + " must be in [0, 1], got " + std::to_string(v));
    return Status::Ok();
  };
  ELDR_RETURN_IF_ERROR(fraction("domain_affinity", o.domain_affinity));
  ELDR_RETURN_IF_ERROR(fraction("shared_fraction", o.shared_fraction));
  ELDR_RETURN_IF_ERROR(fraction("request_affinity", o.request_affinity));
  if (o.domain_affinity + o.shared_fraction > 1 + 1e-12) {
    return bad("domain_affinity + shared_fraction must be <= 1, got " + std::to_string(o.domain_affinity) + " + " +
               std::to_string(o.shared_fraction));
  }
  return Status::Ok();
}

}  // namespace

std::vector<double> WildChatMix(int num_domains) {
  if (num_domains <= 1) return {1.0};
  if (num_domains == 2) return {0.6, 0.4};
  std::vector<double> mix{0.45, 0.30};
  const int rest = num_domains - 2;
  // Geometric tail 1/2, 1/4, ... scaled to 0.25: its first weight is at most 0.25, below 0.30.
  const double tail_sum = 1.0 - std::ldexp(1.0, -rest);
  for (int i = 0; i < rest; ++i) mix.push_back(0.25 * std::ldexp(1.0, -(i + 1)) / tail_sum);
  return mix;
}

Result<Trace> SynthesizeTrace(const SynthOptions& o) {
  ELDR_RETURN_IF_ERROR(ValidateOptions(o));
  const int L = o.num_layers, E = o.num_experts, K = o.top_k;
  const int domain_set = std::min(2 * K, E), shared_set = std::min(K, E), personal_set = std::min(K, E);
  const double mass_personal = o.domain_affinity * o.request_affinity;
  const double mass_domain = o.domain_affinity * (1 - o.request_affinity);
  const double mass_shared = o.shared_fraction;
  const double mass_background = std::max(0.0, 1 - o.domain_affinity - o.shared_fraction);

  // ---- structure: shared and domain preferred sets, request domains and lengths ----
  std::mt19937_64 rng(StreamSeed(o.seed, kStructureStream, 0));
  std::vector<uint16_t> perm(E);
  for (int e = 0; e < E; ++e) perm[e] = static_cast<uint16_t>(e);
  std::vector<uint16_t> shared_ids(static_cast<size_t>(L) * shared_set);  // [L, shared_set]
  for (int l = 0; l < L; ++l) ChooseDistinct(rng, shared_set, &perm, &shared_ids[static_cast<size_t>(l) * shared_set]);
  std::vector<uint16_t> domain_ids(static_cast<size_t>(o.num_domains) * L * domain_set);  // [D, L, domain_set]
  for (size_t i = 0; i < static_cast<size_t>(o.num_domains) * L; ++i) {
    ChooseDistinct(rng, domain_set, &perm, &domain_ids[i * domain_set]);
  }
  const std::vector<double> domain_w = ZipfWeights(domain_set), shared_w = ZipfWeights(shared_set),
                            personal_w = ZipfWeights(personal_set);

  std::vector<double> cum(o.num_domains);
  {
    const std::vector<double> mix = o.domain_mix.empty() ? std::vector<double>(o.num_domains, 1.0) : o.domain_mix;
    double sum = 0;
    for (double w : mix) sum += w;
    double acc = 0;
    for (int d = 0; d < o.num_domains; ++d) cum[d] = (acc += mix[d] / sum);
  }
  int last_domain = o.num_domains - 1;  // the last domain of positive weight: catches u at the rounding edge
  while (last_domain > 0 && cum[last_domain] == cum[last_domain - 1]) --last_domain;

  Trace trace;
  trace.shape = TraceShape{o.model, L, E, K};
  trace.requests.resize(o.num_requests);
  std::vector<int> request_domain(o.num_requests);
  int64_t total_tokens = 0;
  for (int64_t r = 0; r < o.num_requests; ++r) {
    const double u = UniformUnit(rng);
    int d = static_cast<int>(std::upper_bound(cum.begin(), cum.end(), u) - cum.begin());
    if (d > last_domain) d = last_domain;
    request_domain[r] = d;
    const int64_t prompt_len =
        o.prompt_len_min +
        static_cast<int64_t>(UniformBelow(rng, static_cast<uint64_t>(o.prompt_len_max - o.prompt_len_min) + 1));
    const int64_t output_len =
        o.output_len_min +
        static_cast<int64_t>(UniformBelow(rng, static_cast<uint64_t>(o.output_len_max - o.output_len_min) + 1));
    auto& req = trace.requests[r];
    req.domain = "d" + std::to_string(d);
    req.id = "syn-" + req.domain + "-" + std::to_string(r);
    req.prompt_len = prompt_len;
    req.num_tokens = prompt_len + output_len;
    req.offset = total_tokens;
    total_tokens += req.num_tokens;
  }
  const size_t stride = trace.token_stride();
  trace.topk_ids.resize(static_cast<size_t>(total_tokens) * stride);
  if (o.with_weights) trace.topk_weights.resize(static_cast<size_t>(total_tokens) * stride);

  // ---- tokens: one mixture (alias table) per request and layer; every token draws k distinct experts ----
  AliasTable builder(E);
  std::vector<double> p(E);
  std::vector<float> prob(static_cast<size_t>(L) * E);         // [L, E] the request's mixture, for weights
  std::vector<AliasBucket> table(static_cast<size_t>(L) * E);  // [L, E] the request's mixture, to draw from
  std::vector<uint16_t> personal(personal_set);
  std::vector<uint32_t> mark(E, 0);  // mark[e] == stamp: e already drawn for this token and layer
  uint32_t stamp = 0;
  // The rarest expert of a support of exactly k has probability >= 1/(k·H_k); a draw that is still short
  // after this many tries takes the most probable unused experts instead (keeps the support; ~never used).
  const int max_tries = 64 * K + 256;

  for (int64_t r = 0; r < o.num_requests; ++r) {
    if (Interrupted()) return InterruptStatus();
    const auto& req = trace.requests[r];
    const int d = request_domain[r];
    std::mt19937_64 id_rng(StreamSeed(o.seed, kRequestIdStream, static_cast<uint64_t>(r)));
    std::mt19937_64 weight_rng(StreamSeed(o.seed, kRequestWeightStream, static_cast<uint64_t>(r)));
    for (int l = 0; l < L; ++l) {
      std::fill(p.begin(), p.end(), mass_background / E);
      const uint16_t* dom = &domain_ids[(static_cast<size_t>(d) * L + l) * domain_set];
      for (int i = 0; i < domain_set; ++i) p[dom[i]] += mass_domain * domain_w[i];
      const uint16_t* sh = &shared_ids[static_cast<size_t>(l) * shared_set];
      for (int i = 0; i < shared_set; ++i) p[sh[i]] += mass_shared * shared_w[i];
      ChooseDistinct(id_rng, personal_set, &perm, personal.data());
      for (int i = 0; i < personal_set; ++i) p[personal[i]] += mass_personal * personal_w[i];
      builder.Build(p.data(), &table[static_cast<size_t>(l) * E]);
      for (int e = 0; e < E; ++e) prob[static_cast<size_t>(l) * E + e] = static_cast<float>(p[e]);
    }

    for (int64_t t = req.offset; t < req.offset + req.num_tokens; ++t) {
      uint16_t* ids = trace.topk_ids.data() + static_cast<size_t>(t) * stride;
      for (int l = 0; l < L; ++l, ids += K) {
        if (++stamp == 0) {  // wrapped: forget every old stamp
          std::fill(mark.begin(), mark.end(), 0);
          stamp = 1;
        }
        const AliasBucket* tl = &table[static_cast<size_t>(l) * E];
        int n = 0;
        // Branch-free rejection of repeats: always write ids[n], advance n only for a new expert.
        auto accept = [&](uint16_t e) {
          ids[n] = e;
          n += mark[e] != stamp;
          mark[e] = stamp;
        };
        for (int tries = 0; n < K && tries < max_tries; tries += 2) {
          const uint64_t bits = id_rng();
          accept(DrawAlias(static_cast<uint32_t>(bits >> 32), static_cast<uint32_t>(E), tl));
          if (n < K) accept(DrawAlias(static_cast<uint32_t>(bits), static_cast<uint32_t>(E), tl));
        }
        const float* pl = &prob[static_cast<size_t>(l) * E];
        while (n < K) {
          int best = -1;
          for (int e = 0; e < E; ++e) {
            if (mark[e] != stamp && (best < 0 || pl[e] > pl[best])) best = e;
          }
          mark[best] = stamp;
          ids[n++] = static_cast<uint16_t>(best);
        }
        if (!o.with_weights) continue;
        // Sequential draws without replacement rank the experts as a Plackett–Luce model of gate scores
        // does, so the draw order is the top-k order. Weights follow it: w_j = min(w_{j-1}, p(e_j)·jitter_j)
        // with jitter in [0.5, 1.5) (8 random bits each), so they descend and track the mixture; then they
        // are normalised.
        float* w = trace.topk_weights.data() + (ids - trace.topk_ids.data());
        uint64_t bits = 0;
        float prev = std::numeric_limits<float>::max(), sum = 0;
        for (int j = 0; j < K; ++j) {
          if (j % 8 == 0) bits = weight_rng();
          const float jitter = 0.5f + static_cast<float>(bits & 0xff) * (1.0f / 256.0f);
          bits >>= 8;
          prev = w[j] = std::min(prev, pl[ids[j]] * jitter);
          sum += w[j];
        }
        const float inv = 1.0f / sum;
        for (int j = 0; j < K; ++j) w[j] *= inv;
      }
    }
  }
  return trace;
}

}  // namespace eldr
