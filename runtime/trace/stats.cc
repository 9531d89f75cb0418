#include "runtime/trace/stats.h"

#include <algorithm>
#include <random>
#include <sstream>
#include <unordered_map>

#include "runtime/common/distinct_experts.h"
#include "runtime/common/json_util.h"

namespace eldr {

namespace {

// Uniform in [0, n), n >= 1, without modulo bias; specified here (unlike std::uniform_int_distribution)
// so that the batches are the same with every standard library.
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t n) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t r;
  do {
    r = rng();
  } while (r >= limit);
  return r % n;
}

// Prefill and decode activation counts per cell ℓ·E + e. Cells that were touched are listed so that
// clearing, merging and correlating cost O(touched cells) rather than O(L·E): a request touches few.
class ActivationCounts {
 public:
  explicit ActivationCounts(size_t num_cells) : prefill_(num_cells), decode_(num_cells), touched_(num_cells) {}

  void Add(size_t cell, bool decode, int64_t n) {
    if (!touched_[cell]) {
      touched_[cell] = 1;
      touched_cells_.push_back(cell);
    }
    (decode ? decode_ : prefill_)[cell] += n;
  }

  void AddTo(ActivationCounts* other) const {
    for (size_t c : touched_cells_) {
      other->Add(c, false, prefill_[c]);
      other->Add(c, true, decode_[c]);
    }
  }

  void Clear() {
    for (size_t c : touched_cells_) {
      prefill_[c] = decode_[c] = 0;
      touched_[c] = 0;
    }
    touched_cells_.clear();
  }

  // Pearson correlation over all cells of prefill_count/prefill_tokens vs decode_count/decode_tokens.
  // Untouched cells are (0, 0) and enter in closed form. NaN without tokens on a side or without variance.
  double Correlation(int64_t prefill_tokens, int64_t decode_tokens) const {
    if (prefill_tokens <= 0 || decode_tokens <= 0) return NAN;
    const double n = static_cast<double>(prefill_.size());
    const double px = 1.0 / static_cast<double>(prefill_tokens), py = 1.0 / static_cast<double>(decode_tokens);
    double sum_x = 0, sum_y = 0;
    for (size_t c : touched_cells_) {
      sum_x += prefill_[c] * px;
      sum_y += decode_[c] * py;
    }
    const double mx = sum_x / n, my = sum_y / n;
    const double untouched = n - static_cast<double>(touched_cells_.size());
    double sxy = untouched * mx * my, sxx = untouched * mx * mx, syy = untouched * my * my;
    for (size_t c : touched_cells_) {
      const double dx = prefill_[c] * px - mx, dy = decode_[c] * py - my;
      sxy += dx * dy;
      sxx += dx * dx;
      syy += dy * dy;
    }
    if (!(sxx > 0) || !(syy > 0)) return NAN;
    return std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0);
  }

 private:
  std::vector<int64_t> prefill_, decode_;  // [L * E]
  std::vector<uint8_t> touched_;           // [L * E]
  std::vector<size_t> touched_cells_;
};

Status CheckTraceLayout(const Trace& trace) {
  const auto& s = trace.shape;
  if (s.num_layers <= 0 || s.num_experts <= 0 || s.top_k <= 0 || s.num_experts > 65535) {
    return Status::InvalidArgument("trace stats: invalid trace shape " + s.ToString());
  }
  if (trace.topk_ids.size() % trace.token_stride() != 0) {
    return Status::InvalidArgument("trace stats: topk_ids size is not a multiple of L*k");
  }
  const int64_t total = trace.num_tokens_total();
  for (size_t r = 0; r < trace.requests.size(); ++r) {
    const auto& req = trace.requests[r];
    if (req.offset < 0 || req.num_tokens < 0 || req.num_tokens > total - req.offset || req.prompt_len < 0 ||
        req.prompt_len > req.num_tokens) {
      return Status::InvalidArgument("trace stats: request " + std::to_string(r) + " ('" + req.id +
                                     "') has offset/lengths outside the trace's " + std::to_string(total) + " tokens");
    }
  }
  return Status::Ok();
}

// Draws the decode tokens of one batch: `batch_size` requests from `pool` (distinct when the pool is large
// enough, a partial Fisher–Yates that leaves the pool a permutation of itself; otherwise with replacement),
// one uniformly random decode token of each.
void DrawBatch(const Trace& trace, std::vector<int>* pool, int batch_size, std::mt19937_64& rng,
               std::vector<int64_t>* tokens) {
  tokens->clear();
  const size_t n = pool->size();
  const bool reuse = n < static_cast<size_t>(batch_size);
  for (int i = 0; i < batch_size; ++i) {
    int r;
    if (reuse) {
      r = (*pool)[UniformBelow(rng, n)];
    } else {
      const size_t j = i + UniformBelow(rng, n - i);
      std::swap((*pool)[i], (*pool)[j]);
      r = (*pool)[i];
    }
    const auto& req = trace.requests[r];
    tokens->push_back(req.offset + req.prompt_len + static_cast<int64_t>(UniformBelow(rng, req.decode_len())));
  }
}

// Mean over layers of the number of distinct experts in the tokens' top-k sets: distinct experts per step
// (DESIGN.md §3) divided by L. experts: scratch of the trace's shape.
double DistinctPerLayer(const Trace& trace, const std::vector<int64_t>& tokens, ExpertUnion* experts) {
  experts->Clear();
  for (int64_t t : tokens) experts->AddToken(trace.token_ids(t), trace.shape.top_k);
  return static_cast<double>(experts->Total()) / trace.shape.num_layers;
}

nlohmann::json NumberOrNull(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

}  // namespace

Result<TraceStats> ComputeTraceStats(const Trace& trace, const TraceStatsOptions& options) {
  for (int b : options.batch_sizes) {
    if (b < 1 || b > TraceStatsOptions::kMaxBatchSize) {
      return Status::InvalidArgument("trace stats: batch sizes must be in [1, " +
                                     std::to_string(TraceStatsOptions::kMaxBatchSize) + "], got " + std::to_string(b));
    }
  }
  if (options.num_batches < 1 || options.num_batches > TraceStatsOptions::kMaxBatches) {
    return Status::InvalidArgument("trace stats: num_batches must be in [1, " +
                                   std::to_string(TraceStatsOptions::kMaxBatches) + "], got " +
                                   std::to_string(options.num_batches));
  }
  ELDR_RETURN_IF_ERROR(CheckTraceLayout(trace));
  const int L = trace.shape.num_layers, E = trace.shape.num_experts, K = trace.shape.top_k;

  TraceStats st;
  st.shape = trace.shape;
  st.num_requests = static_cast<int64_t>(trace.requests.size());
  st.num_tokens = trace.num_tokens_total();
  std::unordered_map<std::string, int> domain_index;
  std::vector<std::vector<int>> domain_requests;  // request indices per domain, in trace order
  for (size_t r = 0; r < trace.requests.size(); ++r) {
    const auto& req = trace.requests[r];
    auto [it, inserted] = domain_index.emplace(req.domain, static_cast<int>(st.domains.size()));
    if (inserted) {
      st.domains.push_back(DomainTraceStats{req.domain});
      domain_requests.emplace_back();
    }
    auto& d = st.domains[it->second];
    ++d.num_requests;
    d.prompt_tokens += req.prompt_len;
    d.decode_tokens += req.decode_len();
    domain_requests[it->second].push_back(static_cast<int>(r));
    st.prompt_tokens += req.prompt_len;
    st.decode_tokens += req.decode_len();
  }
  if (st.decode_tokens == 0) {
    return Status::FailedPrecondition(
        "trace stats: the trace has no decode tokens (every request ends with its prompt); prefill/decode "
        "correlation and decode-batch statistics need decode tokens");
  }

  // ---- activation frequencies and prefill/decode correlations: one pass over the tokens ----
  const size_t num_cells = static_cast<size_t>(L) * E;
  ActivationCounts overall(num_cells), domain(num_cells), request(num_cells);
  double request_corr_sum = 0;
  int64_t request_corr_count = 0;
  for (size_t d = 0; d < st.domains.size(); ++d) {
    domain.Clear();
    for (int r : domain_requests[d]) {
      const auto& req = trace.requests[r];
      request.Clear();
      for (int64_t t = 0; t < req.num_tokens; ++t) {
        const bool decode = t >= req.prompt_len;
        const uint16_t* ids = trace.token_ids(req.offset + t);
        for (int l = 0; l < L; ++l) {
          for (int j = 0; j < K; ++j) {
            const uint16_t e = ids[static_cast<size_t>(l) * K + j];
            if (e >= E) {
              return Status::InvalidArgument("trace stats: token " + std::to_string(req.offset + t) + " layer " +
                                             std::to_string(l) + ": expert id " + std::to_string(e) +
                                             " >= num_experts " + std::to_string(E));
            }
            request.Add(static_cast<size_t>(l) * E + e, decode, 1);
          }
        }
      }
      if (req.prompt_len > 0 && req.decode_len() > 0) {
        const double c = request.Correlation(req.prompt_len, req.decode_len());
        if (!std::isnan(c)) {
          request_corr_sum += c;
          ++request_corr_count;
        }
      }
      request.AddTo(&domain);
    }
    st.domains[d].prefill_decode_corr = domain.Correlation(st.domains[d].prompt_tokens, st.domains[d].decode_tokens);
    domain.AddTo(&overall);
  }
  st.prefill_decode_corr = overall.Correlation(st.prompt_tokens, st.decode_tokens);
  if (request_corr_count > 0) st.mean_request_prefill_decode_corr = request_corr_sum / request_corr_count;

  // ---- distinct experts per MoE layer in same-domain and mixed decode batches ----
  std::vector<std::vector<int>> groups;  // per domain with decode tokens: its requests with decode tokens
  std::vector<int> all;                  // every request with decode tokens
  for (const auto& reqs : domain_requests) {
    std::vector<int> g;
    for (int r : reqs) {
      if (trace.requests[r].decode_len() > 0) g.push_back(r);
    }
    all.insert(all.end(), g.begin(), g.end());
    if (!g.empty()) groups.push_back(std::move(g));
  }
  std::sort(all.begin(), all.end());
  std::mt19937_64 rng(options.seed);
  ExpertUnion experts(trace.shape.num_layers, E);
  std::vector<int64_t> tokens;
  for (int b : options.batch_sizes) {
    BatchDistinctStats bs;
    bs.batch_size = b;
    // Decided by the trace, not by which domains the seed happens to draw.
    for (const auto& g : groups) bs.requests_reused |= g.size() < static_cast<size_t>(b);
    double same = 0, mixed = 0;
    for (int i = 0; i < options.num_batches; ++i) {
      auto& g = groups[UniformBelow(rng, groups.size())];
      DrawBatch(trace, &g, b, rng, &tokens);
      same += DistinctPerLayer(trace, tokens, &experts);
    }
    for (int i = 0; i < options.num_batches; ++i) {
      DrawBatch(trace, &all, b, rng, &tokens);
      mixed += DistinctPerLayer(trace, tokens, &experts);
    }
    bs.same_domain = same / options.num_batches;
    bs.mixed = mixed / options.num_batches;
    bs.reduction_pct = bs.mixed > 0 ? 100.0 * (bs.mixed - bs.same_domain) / bs.mixed : NAN;
    st.batches.push_back(bs);
  }
  return st;
}

nlohmann::json TraceStats::ToJson() const {
  nlohmann::json j;
  j["shape"] = {{"model", shape.model},
                {"num_layers", shape.num_layers},
                {"num_experts", shape.num_experts},
                {"top_k", shape.top_k}};
  j["num_requests"] = num_requests;
  j["num_tokens"] = num_tokens;
  j["prompt_tokens"] = prompt_tokens;
  j["decode_tokens"] = decode_tokens;
  j["domains"] = nlohmann::json::array();
  for (const auto& d : domains) {
    j["domains"].push_back({{"domain", d.domain},
                            {"num_requests", d.num_requests},
                            {"prompt_tokens", d.prompt_tokens},
                            {"decode_tokens", d.decode_tokens},
                            {"prefill_decode_corr", NumberOrNull(d.prefill_decode_corr)}});
  }
  j["prefill_decode_corr"] = NumberOrNull(prefill_decode_corr);
  j["mean_request_prefill_decode_corr"] = NumberOrNull(mean_request_prefill_decode_corr);
  j["batches"] = nlohmann::json::array();
  for (const auto& b : batches) {
    j["batches"].push_back({{"batch_size", b.batch_size},
                            {"same_domain", NumberOrNull(b.same_domain)},
                            {"mixed", NumberOrNull(b.mixed)},
                            {"reduction_pct", NumberOrNull(b.reduction_pct)},
                            {"requests_reused", b.requests_reused}});
  }
  return j;
}

std::string TraceStats::ToText() const {
  std::ostringstream os;
  os << "trace: model '" << shape.model << "' " << shape.ToString() << ", " << num_requests << " requests, "
     << num_tokens << " tokens (" << prompt_tokens << " prefill, " << decode_tokens << " decode)\n";
  os << "prefill/decode activation correlation: overall " << Fmt(prefill_decode_corr) << ", mean per request "
     << Fmt(mean_request_prefill_decode_corr) << "\n\n";
  std::vector<std::vector<std::string>> rows;
  for (const auto& d : domains) {
    rows.push_back({d.domain.empty() ? "(none)" : d.domain, std::to_string(d.num_requests),
                    std::to_string(d.prompt_tokens), std::to_string(d.decode_tokens), Fmt(d.prefill_decode_corr)});
  }
  os << FormatTable({"domain", "requests", "prompt_tokens", "decode_tokens", "prefill_decode_corr"}, rows) << "\n";
  rows.clear();
  bool any_reused = false;
  for (const auto& b : batches) {
    any_reused |= b.requests_reused;
    rows.push_back({std::to_string(b.batch_size) + (b.requests_reused ? "*" : ""), Fmt(b.same_domain, 2),
                    Fmt(b.mixed, 2), Fmt(b.reduction_pct, 1)});
  }
  os << "distinct experts per MoE layer in a decode batch\n";
  os << FormatTable({"batch", "same_domain", "mixed", "reduction_%"}, rows);
  if (any_reused) {
    os << "* a domain (or the trace) has fewer requests with decode tokens than the batch size: requests were "
          "drawn with replacement\n";
  }
  return os.str();
}

}  // namespace eldr
