#include "runtime/job/workload.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "runtime/common/json_util.h"
#include "runtime/common/memory_budget.h"

namespace eldr {

Result<std::vector<double>> ArrivalTimes(const ArrivalOptions& o) {
  if (o.num_requests < 0) return Status::InvalidArgument("the number of requests must be >= 0");
  if (!(o.request_rate > 0)) return Status::InvalidArgument("request_rate must be > 0 (use inf to send all at once)");
  if (!(o.burstiness > 0) || !std::isfinite(o.burstiness)) return Status::InvalidArgument("burstiness must be > 0");
  std::vector<double> t(o.num_requests, 0.0);
  if (std::isinf(o.request_rate)) return t;
  std::mt19937_64 rng(o.seed);
  std::gamma_distribution<double> gap(o.burstiness, 1.0 / o.request_rate / o.burstiness);  // mean 1/rate
  for (int64_t i = 1; i < o.num_requests; ++i) t[i] = t[i - 1] + gap(rng);
  // A job clock past kMaxArrivalSpan no longer resolves a decode step (a double at 1e7 s is exact to 2e-9 s; at
  // 1e300 s a step of 1e-4 s rounds away): one line instead of silently wrong latencies.
  if (!t.empty() && t.back() > kMaxArrivalSpan) {
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  " %.3g spreads %lld arrivals over %.3g s, more than %.0e s (the clock would no longer resolve a "
                  "decode step): raise the rate",
                  o.request_rate, static_cast<long long>(o.num_requests), t.back(), kMaxArrivalSpan);
    return Status::InvalidArgument(o.rate_key + msg);
  }
  return t;
}

std::string JobRequests::ReportId(int64_t i) const {
  const std::string& id = request(i).id;
  return size() > static_cast<int64_t>(trace.requests.size()) ? id + "#" + std::to_string(i) : id;
}

Result<JobRequests> LoadJobRequests(const JobConfig& c) {
  JobRequests in;
  ELDR_ASSIGN_OR_RETURN(in.trace, ReadTrace(c.trace));
  if (in.trace.requests.empty()) return Status::InvalidArgument(c.trace + ": the trace has no requests");
  const int64_t n = c.num_requests > 0 ? c.num_requests : static_cast<int64_t>(in.trace.requests.size());
  // Before the first allocation: order and output length here, then each request's arrival, Frontend record
  // and simulator state (~256 B in all), so that an absurd count is one line instead of "out of memory".
  ELDR_RETURN_IF_ERROR(CheckMemoryBudget(static_cast<double>(n) * 256,
                                         c.path + ": " + c.Key("workload.num_requests") + " " + std::to_string(n)));
  std::mt19937_64 rng(c.workload_seed);
  std::vector<int32_t> perm;
  in.order.reserve(n);
  in.output_len.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    if (perm.empty()) {
      perm.resize(in.trace.requests.size());
      for (size_t j = 0; j < perm.size(); ++j) perm[j] = static_cast<int32_t>(j);
      for (size_t j = perm.size(); j > 1; --j) std::swap(perm[j - 1], perm[rng() % j]);
    }
    in.order.push_back(perm.back());
    perm.pop_back();
    const TraceRequest& r = in.trace.requests[in.order.back()];
    in.output_len.push_back(c.output_len > 0 ? c.output_len : std::max<int64_t>(1, r.decode_len()));
  }
  for (int32_t i : in.order) {
    const TraceRequest& r = in.trace.requests[i];
    if (r.prompt_len < 1) return Status::InvalidArgument(c.trace + ": request '" + r.id + "' has no prompt tokens");
  }
  // A KV cache that holds none of the workload's requests would fail every one of them, each recorded and the
  // job ending with exit 0: one line naming the key instead. (A request that alone does not fit still fails and
  // is recorded: the others run.) The decode side counts the positions written, prompt + output − 1.
  int64_t shortest_prompt = std::numeric_limits<int64_t>::max(), shortest_context = shortest_prompt;
  for (int64_t i = 0; i < n; ++i) {
    shortest_prompt = std::min(shortest_prompt, in.request(i).prompt_len);
    shortest_context = std::min(shortest_context, in.request(i).prompt_len + in.output_len[i] - 1);
  }
  const auto blocks = [&](int64_t tokens) { return (std::max<int64_t>(1, tokens) + c.block_size - 1) / c.block_size; };
  const auto none_fits = [&](const std::string& key, int64_t have, const char* what, int64_t tokens,
                             const std::string& fix) {
    return Status::InvalidArgument(c.path + ": " + c.Key(key) + " = " + std::to_string(have) + " (blocks of " +
                                   std::to_string(c.block_size) + " tokens) holds no request of the workload: the " +
                                   what + " needs " + std::to_string(blocks(tokens)) + " (" + std::to_string(tokens) +
                                   " tokens); " + fix);
  };
  if (blocks(shortest_prompt) > c.prefill_blocks) {
    return none_fits("kv_cache.prefill_blocks", c.prefill_blocks, "shortest prompt", shortest_prompt,
                     "raise " + c.Key("kv_cache.prefill_blocks"));
  }
  if (blocks(shortest_context) > c.decode_blocks) {
    return none_fits("kv_cache.decode_blocks", c.decode_blocks, "shortest prompt + output", shortest_context,
                     "raise " + c.Key("kv_cache.decode_blocks") + " or lower " + c.Key("workload.output_len"));
  }
  return in;
}

std::vector<int32_t> PromptTokens(const TraceRequest& r, const std::vector<std::string>& domains, int vocab) {
  uint64_t h = 1469598103934665603ULL;
  for (char ch : r.id) h = (h ^ static_cast<uint8_t>(ch)) * 1099511628211ULL;
  std::mt19937_64 rng(h);
  const int num_domains = std::max<int>(1, static_cast<int>(domains.size()));
  int d = 0;
  for (int i = 0; i < static_cast<int>(domains.size()); ++i) {
    if (domains[i] == r.domain) d = i;
  }
  const int64_t lo = static_cast<int64_t>(vocab) * d / num_domains;
  const int64_t hi = static_cast<int64_t>(vocab) * (d + 1) / num_domains;
  const uint64_t span = static_cast<uint64_t>(std::max<int64_t>(1, hi - lo));
  std::vector<int32_t> t(r.prompt_len);
  for (auto& x : t) x = static_cast<int32_t>(lo + static_cast<int64_t>(rng() % span));
  return t;
}

std::vector<uint16_t> RoutingRows(const Trace& t, const TraceRequest& r, int64_t first, int64_t n) {
  const size_t stride = t.token_stride();
  std::vector<uint16_t> out(static_cast<size_t>(n) * stride);
  for (int64_t i = 0; i < n; ++i) {
    int64_t row = first + i;
    if (row >= r.num_tokens) {
      const int64_t decode = std::max<int64_t>(1, r.decode_len());
      row = r.prompt_len + (row - r.prompt_len) % decode;
      if (row >= r.num_tokens) row = r.num_tokens - 1;
    }
    std::copy_n(t.token_ids(r.offset + row), stride, out.begin() + static_cast<size_t>(i) * stride);
  }
  return out;
}

MemoryPart OutputTokenMemory(const JobConfig& c, const JobRequests& in) {
  double tokens = 0;
  for (int64_t n : in.output_len) tokens += static_cast<double>(n);
  // A token's time (8 bytes, and its id with output.tokens), and at the summary its inter-token latency, copied
  // into a distribution and sorted: about 40 bytes in all at the peak.
  const double per_token = 40.0 + (c.output_tokens ? sizeof(int32_t) : 0);
  return {"the workload's " + Fmt(tokens, 0) + " output tokens (" + c.Key("workload.output_len") + ")",
          tokens * per_token};
}

Status CheckJobMemory(const std::vector<MemoryPart>& parts) {
  double total = 0;
  std::string what;
  for (const MemoryPart& p : parts) {
    total += p.bytes;
    what += (what.empty() ? "" : " + ") + p.what + (parts.size() > 1 ? " (" + FormatBytes(p.bytes) + ")" : "");
  }
  return CheckMemoryBudget(total, what);
}

}  // namespace eldr
