// Serving metrics (DESIGN.md §3 "Serving metrics"): per-request timestamps in, the summary of vLLM's
// benchmark_serving JSON out (same key names: completed, failed, request_throughput, output_throughput,
// mean_/median_/std_/p99_ttft_ms, ..._tpot_ms, ..._itl_ms, ..._e2el_ms), so tables and plots work on both.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "runtime/common/distinct_experts.h"
#include "runtime/common/status.h"
#include "runtime/job/job_config.h"

namespace eldr {

// One request as the frontend saw it. Times in seconds from the start of the run.
struct RequestRecord {
  std::string id;
  std::string domain;
  int decoder = -1;
  int64_t prompt_len = 0;
  int64_t output_len = 0;           // tokens generated, the first (from prefill) included
  double arrival = 0;               // when it was due at the frontend (Frontend::Admit)
  std::vector<double> token_times;  // [output_len] when each output token reached the frontend
  std::vector<int32_t> tokens;      // [output_len] the generated token ids
  bool success = true;
  std::string error;  // why it failed
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

// Per domain of the records (a missing domain is "unlabelled"): {domain: {requests, completed, median_tpot_ms,
// p99_tpot_ms, mean_tpot_ms, median_ttft_ms}}, with TPOT and TTFT as SummarizeServing defines them (completed
// requests; TPOT of those with > 1 output token; 0 where there are none).
nlohmann::json PerDomainSummary(const std::vector<RequestRecord>& records);

// Distinct experts per step at matched batch (DistinctByBatch) as JSON: [{batch, steps, mean_distinct_experts}],
// ascending in batch.
nlohmann::json DistinctByBatchJson(const DistinctByBatch& by_batch);

// One line of the per-request JSONL; with_tokens adds the generated token ids.
nlohmann::json RequestRecordJson(const RequestRecord& r, bool with_tokens = false);
// The same line as text, appended to `out` with its newline: byte for byte DumpJsonLine(RequestRecordJson(r,
// with_tokens)) (nlohmann's sorted keys, number format and string escapes), without building a json object per
// record (a million-record job's requests.jsonl took seconds that way, past the launcher's kill delay).
void AppendRequestLine(std::string& out, const RequestRecord& r, bool with_tokens = false);

// What a job observed per decoder and at the router, beyond the per-request records.
struct DecoderStats {
  int decoder = -1;          // the decoder index k
  int leader_rank = -1;      // the rank of its leader, 1 + P + k·ep_size (JobConfig::DecoderLeaderRank)
  int64_t requests = 0;      // routed to it
  int64_t steps = 0;         // decode steps that ran (batch > 0)
  double batch_sum = 0;      // Σ batch over those steps
  double distinct_sum = 0;   // Σ distinct experts (over MoE layers) over those steps
  DistinctByBatch by_batch;  // the same steps by batch size
  // Expert parallelism (decode.ep_size). 0: not recorded, nothing printed; 1: only "ep_size" is printed. The
  // load of EP rank i in a step is the number of token·expert activations computed on it, summed over the MoE
  // layers; a step's balancedness is DESIGN.md §3's Σ_layers mean-over-ranks ÷ Σ_layers max-over-ranks.
  int ep_size = 0;
  std::vector<double> mean_rank_load;  // [ep_size] mean over the steps
  double mean_balancedness = 0;        // mean over the steps of the per-step balancedness
  double p1_balancedness = 0;          // its 1st percentile (numpy's linear interpolation)
};
struct RoutingStats {
  double tau = 0;                    // the band width in effect
  int64_t band_sum = 0, band_n = 0;  // band sizes of signature-routed requests
  int64_t fallbacks = 0;
};

// The job's metrics JSON: SummarizeServing's vLLM keys plus policy, tau, workload parameters, topology,
// mean_distinct_experts_per_step, distinct_experts_per_token, distinct_by_batch (every decoder's steps merged,
// DistinctByBatchJson), per_domain (PerDomainSummary), mean_band_size, fallbacks and per-decoder
// {decoder, leader_rank, requests, steps, mean_batch, mean_distinct_experts_per_step, and with ep_size set: ep_size,
// and when it is > 1 mean_rank_load, mean_balancedness, p1_balancedness}. `eldr serve` and `eldr simulate` both write
// it, so every table and plot works on either. It carries its provenance: eldr_version, git_sha, build_type,
// date and the resolved config (JobConfigJson).
nlohmann::json JobMetrics(const JobConfig& config, const std::string& model, const std::vector<RequestRecord>& records,
                          const std::vector<DecoderStats>& decoders, const RoutingStats& routing);
// The resolved job config (every default filled in, every override applied) as JSON, in the YAML's layout.
nlohmann::json JobConfigJson(const JobConfig& config);

// One prefill or decode step as a worker timed it: the data `eldr simulate --fit` fits its cost model to.
struct StepRecord {
  std::string kind;              // "prefill" or "decode"
  int worker = 0;                // prefill rank index or decoder index
  double time = 0;               // when rank 0 heard of it (s from the start)
  double seconds = 0;            // the worker's busy wall time: prefill: the prefill call; decode: the whole loop
                                 // iteration (KV import, admission, the step, sending tokens), idle waits excluded
  int64_t batch = 0;             // decode: sequences in the step; prefill: 1
  int64_t distinct_experts = 0;  // decode: Σ over MoE layers of distinct experts
  int64_t tokens = 0;            // decode: context tokens attended; prefill: prompt tokens computed
  double cpu_seconds = -1;       // the worker process's CPU time over the same span (-1: not measured)
};
// Writes one JSON line per step, atomically.
Status WriteStepLog(const std::string& path, const std::vector<StepRecord>& steps);
// One step's line (with its newline), appended to `out`: {batch, context_tokens, cpu_seconds (when measured),
// distinct_experts, kind, seconds, time, worker} for a decode step, {cpu_seconds, kind, prompt_tokens, seconds,
// time, worker} for a prefill step, in nlohmann's key order and number format.
void AppendStepLine(std::string& out, const StepRecord& s);

// The run directory (output.dir) of serve and simulate, committed all or none: every file is written into a new
// temporary directory beside it (.NAME.tmp.PID, each file fsynced), and that directory is renamed to `dir` only when
// all are written; on an error nothing is replaced and the temporary is removed. A `dir` that does not exist or is
// empty is simply replaced. One that holds files is refused unless `replace` (output.replace), and then replaced
// whole by an atomic exchange (renameat2 RENAME_EXCHANGE; where the file system lacks it, `dir` is moved aside
// first, so for an instant it is absent), the earlier run removed after: the directory never mixes two runs'
// files, and a file the earlier run did not have (or another tool put there) goes with it.
// Errors, one line naming output.dir: `dir` is a symlink or not a directory, it holds files and !replace, a write
// or rename failed.
Status CommitRunDirectory(const std::string& dir, bool replace, std::vector<std::pair<std::string, std::string>> files);

// What CommitRunDirectory would refuse, checked before a job runs (so that a long run is not lost at its end).
Status CheckRunDirectory(const std::string& dir, bool replace);

// Directories (a path and any missing parents) created before a run, so that a path that cannot be created fails
// before the run rather than after it; removed again, deepest first and only while empty, unless Keep() was called:
// a failed run leaves no empty directory behind.
class CreatedDirectories {
 public:
  CreatedDirectories() = default;
  CreatedDirectories(CreatedDirectories&& o) noexcept : created_(std::exchange(o.created_, {})) {}
  CreatedDirectories& operator=(CreatedDirectories&&) = delete;
  ~CreatedDirectories();
  // Creates `dir` and its missing parents. Error (IoError): "DIR: cannot create the output directory: WHY".
  Status Create(const std::string& dir);
  void Keep() { created_.clear(); }

 private:
  std::vector<std::filesystem::path> created_;  // deepest first
};

// A job's claim on its output.dir, from before its run until its files are committed, so that a second job given
// the same output.dir (two launches of one config) is refused before it runs instead of at its end: an exclusive
// flock(2) on "<parent>/.<name>.eldr-lock" beside output.dir (the parent created if missing, removed again if it
// stays empty), whose content names the holder ("pid 1234 on node7"). Released when destroyed (the lock file
// removed) and by the kernel when the process dies (its lock file stays and is reused). The parent's path is
// resolved (links followed). On a file system without flock the claim is taken without a lock, and where locks are
// node-local (NFS mounted nolock, Lustre localflock) it excludes only jobs on the same node; CommitRunDirectory
// still refuses to mix two runs.
class RunDirectoryClaim {
 public:
  // Error (FailedPrecondition): "output.dir DIR is in use by another eldr job (pid 1234 on node7); wait for it to
  // end or choose another directory"; IoError when the parent or the lock file cannot be created.
  static Result<RunDirectoryClaim> Acquire(const std::string& dir);
  RunDirectoryClaim(RunDirectoryClaim&& o) noexcept;
  RunDirectoryClaim& operator=(RunDirectoryClaim&&) = delete;
  ~RunDirectoryClaim();

 private:
  RunDirectoryClaim() = default;
  int fd_ = -1;
  std::string lock_path_;
  CreatedDirectories parents_;  // removed (when empty) after the destructor has removed the lock file
};

// <dir>/requests.jsonl and <dir>/metrics.json (eldr simulate), through CommitRunDirectory.
Status WriteJobOutputs(const std::string& dir, bool replace, const nlohmann::json& metrics,
                       const std::vector<RequestRecord>& records, bool with_tokens);

// `eldr serve`'s run directory: requests.jsonl, steps.jsonl and metrics.json, through CommitRunDirectory.
Status WriteServeOutputs(const std::string& dir, bool replace, const nlohmann::json& metrics,
                         const std::vector<RequestRecord>& records, bool with_tokens,
                         const std::vector<StepRecord>& steps);

}  // namespace eldr
