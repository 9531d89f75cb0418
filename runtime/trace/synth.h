// Synthetic domain-structured routing traces for scale tests (DESIGN.md §4 trace/).
//
// Model, per MoE layer ℓ:
//   - every domain has a preferred set of min(2k, E) experts with Zipf-skewed weights (w_i ∝ 1/(i+1));
//   - one shared popular set of min(k, E) experts, the same for every domain, also skewed;
//   - every request has a personal preferred set of min(k, E) experts, also skewed;
//   - the rest of the mass is uniform over all E experts (background).
// A token of request r (domain d) draws its top-k at ℓ, without repetition, from the mixture
//   p(e) = a·q·personal_r(e) + a·(1−q)·domain_d(e) + s·shared(e) + (1−a−s)/E
// where a = domain_affinity, s = shared_fraction, q = request_affinity. Prefill and decode tokens of a
// request draw from the same mixture, so a request's prefill predicts its decode and a domain's tokens
// share experts with each other more than with other domains'. The k experts are drawn one after another
// (an alias table per request and layer, repeats rejected), so they come out in a Plackett–Luce order: the
// stored order is the top-k order. Gate weights, when emitted, descend along it and follow the mixture:
// w_j = min(w_{j-1}, p(e_j)·jitter_j), jitter uniform in [0.5, 1.5), then normalised to sum 1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/common/status.h"
#include "runtime/trace/trace.h"

namespace eldr {

struct SynthOptions {
  int num_domains = 4;
  int64_t num_requests = 1000;
  int num_layers = 48, num_experts = 128, top_k = 8;
  int64_t prompt_len_min = 128, prompt_len_max = 128;  // prefill tokens, uniform in [min, max], min >= 1
  int64_t output_len_min = 128, output_len_max = 128;  // decode tokens, uniform in [min, max], min >= 0
  uint64_t seed = 0;
  std::vector<double> domain_mix;  // relative weights per domain; empty = uniform
  double domain_affinity = 0.6;    // mass of a token's draw on its domain's (and its request's) preferred experts
  double shared_fraction = 0.2;    // mass on the shared popular set (same for all domains)
  double request_affinity = 0.3;   // share of domain_affinity moved to the request's personal set
  bool with_weights = true;        // also emit topk_weights (gate probabilities, descending, summing to 1)
  std::string model = "synthetic";
};

// Domain weights like WildChat's language mix: the first two domains carry 75% of the traffic (0.45, 0.30)
// and the remaining 25% is split geometrically (ratio 1/2) over the others, so weights are non-increasing
// and sum to 1. For 2 domains returns {0.6, 0.4}; for 1 (or fewer) returns {1}.
std::vector<double> WildChatMix(int num_domains);

// Generates a trace of options.num_requests requests. Request i gets a domain drawn from the mix (names
// "d0", "d1", ...) and the id "syn-<domain>-<i>" (e.g. "syn-d1-17"; i is the global request index, so ids
// are unique); requests are stored contiguously in index order. The result passes ValidateTrace.
// Deterministic for a given options value: it uses std::mt19937_64 (whose output the standard specifies)
// and its own distributions, none of the implementation-defined std ones. topk_ids do not depend on
// with_weights.
// Invalid options return InvalidArgument naming the option.
// Thread safety: reentrant.
Result<Trace> SynthesizeTrace(const SynthOptions& options);

}  // namespace eldr
