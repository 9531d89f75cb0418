// The workload of a job (DESIGN.md §2): which trace requests are sent, in what order, with how many output
// tokens, at what times, and what each prompt's token ids are. `eldr serve` and `eldr simulate` derive it
// from the job config in the same way, so both see the same requests.
//
// Arrivals follow vLLM's benchmark_serving: request_rate = inf sends everything at once; otherwise
// inter-arrival gaps are Gamma(shape = burstiness, scale = 1 / (rate · burstiness)), so burstiness 1 is a
// Poisson process and smaller values are burstier (the gaps' squared coefficient of variation is
// 1 / burstiness). Seeded and deterministic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/common/status.h"
#include "runtime/job/job_config.h"
#include "runtime/trace/trace.h"

namespace eldr {

struct ArrivalOptions {
  int64_t num_requests = 0;
  double request_rate = 0;  // requests per second; infinity = all at t = 0
  double burstiness = 1.0;
  uint64_t seed = 0;
  std::string rate_key = "workload.request_rate";  // how an error names the rate
};

// The latest arrival a job accepts, in seconds (about 116 days).
inline constexpr double kMaxArrivalSpan = 1e7;

// Arrival times in seconds, non-decreasing, the first at 0. InvalidArgument for a rate <= 0, burstiness <= 0,
// a negative count, or arrivals past kMaxArrivalSpan.
Result<std::vector<double>> ArrivalTimes(const ArrivalOptions& options);

// The requests of a job. Workload request i is trace request order[i]: the trace's requests in a seeded
// random order (workload.seed), cycling through fresh permutations when num_requests exceeds the trace.
struct JobRequests {
  Trace trace;
  std::vector<int32_t> order;       // [N] workload request → trace request
  std::vector<int64_t> output_len;  // [N] output tokens incl. prefill's: workload.output_len, else the
                                    //     trace's decode length (at least 1)
  int64_t size() const { return static_cast<int64_t>(order.size()); }
  const TraceRequest& request(int64_t i) const { return trace.requests[order[i]]; }
  // The id reported for workload request i: the trace id, with "#i" when requests repeat.
  std::string ReportId(int64_t i) const;
};

// Reads the job's trace and draws its requests. InvalidArgument (naming the trace) for an empty trace or a
// request without prompt tokens.
Result<JobRequests> LoadJobRequests(const JobConfig& config);

// A part of what a job's sizes make a process allocate: what sets it (the keys, for the message) and its bytes.
struct MemoryPart {
  std::string what;
  double bytes = 0;
};
// The latencies kept for every generated token of `in` (its time, inter-token latency and their summaries, and its
// id with output.tokens).
MemoryPart OutputTokenMemory(const JobConfig& c, const JobRequests& in);
// The parts summed against the memory budget before any of them is allocated: one line naming them all
// ("kv_cache.decode_blocks = ... (18.3 GB) + ...: needs ..."), instead of an out-of-memory kill or a bad_alloc.
Status CheckJobMemory(const std::vector<MemoryPart>& parts);

// Prompt token ids of a trace request. A routing trace records routing, not text, so the ids are drawn
// deterministically (seeded by the request id) from its domain's slice of the vocabulary ([vocab·d/M,
// vocab·(d+1)/M) for domain d of the M domain labels); a repeated request therefore shares its whole
// prompt with its earlier copies (prefix-cache hits). Domains are numbered in Trace::Domains() order.
std::vector<int32_t> PromptTokens(const TraceRequest& r, const std::vector<std::string>& domains, int vocab);

// Routing rows [first, first + n) of a request ([n, L_moe, top_k]); rows past the end of the trace wrap over
// its decode tokens (a fixed output_len longer than the recorded output).
std::vector<uint16_t> RoutingRows(const Trace& t, const TraceRequest& r, int64_t first, int64_t n);

}  // namespace eldr
