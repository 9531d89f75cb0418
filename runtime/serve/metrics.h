// Serving metrics (DESIGN.md §3 "Serving metrics"): per-request timestamps in, the summary of vLLM's
// benchmark_serving JSON out (same key names: completed, failed, request_throughput, output_throughput,
// mean_/median_/std_/p99_ttft_ms, ..._tpot_ms, ..._itl_ms, ..._e2el_ms), so tables and plots work on both.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace eldr {

// One request as the frontend saw it. Times in seconds from the start of the run.
struct RequestRecord {
  std::string id;
  std::string domain;
  int decoder = -1;
  int64_t prompt_len = 0;
  int64_t output_len = 0;              // tokens generated, the first (from prefill) included
  double arrival = 0;                  // when the request entered the frontend
  std::vector<double> token_times;     // [output_len] when each output token reached the frontend
  std::vector<int32_t> tokens;         // [output_len] the generated token ids
  bool success = true;
  std::string error;                   // why it failed
  double ttft() const { return token_times.empty() ? 0 : token_times.front() - arrival; }
  double latency() const { return token_times.empty() ? 0 : token_times.back() - arrival; }
};

// mean, median, std (population, as numpy), p-th percentiles with linear interpolation (numpy's default).
struct Distribution {
  double mean = 0, median = 0, std = 0;
  std::vector<std::pair<double, double>> percentiles;  // (p, value)
};
Distribution Summarize(std::vector<double> values, const std::vector<double>& percentiles);
double Percentile(const std::vector<double>& sorted, double p);  // REQUIRES: sorted ascending, non-empty

struct ServingSummaryOptions {
  std::vector<double> percentiles{99};  // vLLM's --metric-percentiles default
  double duration = -1;                 // seconds; < 0: first arrival to last token
};

// TTFT = first token − arrival; TPOT = (latency − TTFT)/(output_len − 1) for requests with > 1 output token;
// ITL = gaps between consecutive tokens (all requests, flattened); E2EL = latency. Failed requests count in
// `failed` only.
nlohmann::json SummarizeServing(const std::vector<RequestRecord>& records, const ServingSummaryOptions& options);

// A one-screen summary of a metrics JSON (vLLM's benchmark printout plus eldr's figures).
std::string FormatServingSummary(const nlohmann::json& metrics);

// One line of the per-request JSONL; with_tokens adds the generated token ids.
nlohmann::json RequestRecordJson(const RequestRecord& r, bool with_tokens = false);

}  // namespace eldr
