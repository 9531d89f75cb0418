// `eldr trace stats`: what a routing trace says about domain locality (DESIGN.md §1, §3).
//
// Activation frequency of (layer ℓ, expert e) over a set of tokens = fraction of those tokens whose top-k
// at ℓ contains e. A prefill/decode correlation is the Pearson correlation, over all L·E pairs (ℓ, e), of
// the prefill tokens' activation frequency and the decode tokens' activation frequency; it is NaN when
// either side has no tokens or zero variance (e.g. k == E).
//
// Distinct experts of a batch: B requests with >= 1 decode token are drawn (distinct while possible), one
// uniformly random decode token from each; per MoE layer |∪ of the B tokens' top-k sets|, averaged over
// layers; then averaged over num_batches seeded batches. Same-domain batches first pick a domain uniformly
// among the domains that have a request with decode tokens and draw all B requests from it; mixed batches
// draw from the whole trace. A group with fewer than B such requests is drawn with replacement.
#pragma once

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/common/status.h"
#include "runtime/trace/trace.h"

namespace eldr {

struct TraceStatsOptions {
  static constexpr int kMaxBatchSize = 65536;
  static constexpr int kMaxBatches = 1000000;
  std::vector<int> batch_sizes{8, 16, 32};  // each in [1, kMaxBatchSize]
  int num_batches = 200;                    // batches averaged per batch size and kind, in [1, kMaxBatches]
  uint64_t seed = 0;
};

struct DomainTraceStats {
  std::string domain;
  int64_t num_requests = 0, prompt_tokens = 0, decode_tokens = 0;
  double prefill_decode_corr = NAN;  // over this domain's tokens
};

struct BatchDistinctStats {
  int batch_size = 0;
  double same_domain = NAN;      // mean distinct experts per MoE layer, batches drawn from one domain
  double mixed = NAN;            // same, batches drawn from the whole trace
  double reduction_pct = NAN;    // 100 * (mixed - same_domain) / mixed
  bool requests_reused = false;  // some domain has fewer than batch_size requests with decode tokens, so its
                                 // batches (and mixed ones, if the whole trace has fewer) reuse requests
};

struct TraceStats {
  TraceShape shape;
  int64_t num_requests = 0, num_tokens = 0, prompt_tokens = 0, decode_tokens = 0;
  std::vector<DomainTraceStats> domains;          // in order of first appearance ("" if unlabelled)
  double prefill_decode_corr = NAN;               // over all requests' tokens
  double mean_request_prefill_decode_corr = NAN;  // mean over requests with prefill and decode tokens of the
                                                  // per-request correlation (requests where it is NaN skipped)
  std::vector<BatchDistinctStats> batches;        // in the order of options.batch_sizes

  // snake_case keys mirroring the fields; shape as {model, num_layers, num_experts, top_k}; NaN as null.
  nlohmann::json ToJson() const;
  // Readable summary: totals, a per-domain table and a batch table.
  std::string ToText() const;
};

// Errors: InvalidArgument for a batch size < 1, num_batches < 1, or a trace whose request table or expert
// ids do not fit its shape; FailedPrecondition when the trace has no decode tokens.
// Deterministic for a given seed (one std::mt19937_64 and this module's own distributions).
// Cost: one pass over the tokens plus O(num_batches · Σ batch_sizes · L · k); memory O(L · E + requests).
// Thread safety: reentrant.
Result<TraceStats> ComputeTraceStats(const Trace& trace, const TraceStatsOptions& options);

}  // namespace eldr
