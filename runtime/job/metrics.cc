#include "runtime/job/metrics.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

#include "runtime/common/atomic_file.h"
#include "runtime/common/json_util.h"
#include "runtime/common/provenance.h"

namespace eldr {

using namespace std::string_view_literals;

namespace {

// numpy.percentile, method "linear": rank = p/100 · (n − 1), interpolated between the neighbours lo and hi.
struct PercentileRank {
  size_t lo, hi;
  double frac;
};
PercentileRank RankOf(size_t n, double p) {
  const double rank = p / 100.0 * static_cast<double>(n - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  return {lo, std::min(lo + 1, n - 1), rank - static_cast<double>(lo)};
}

}  // namespace

double Percentile(const std::vector<double>& sorted, double p) {
  const PercentileRank r = RankOf(sorted.size(), p);
  return sorted[r.lo] + r.frac * (sorted[r.hi] - sorted[r.lo]);
}

Distribution Summarize(std::vector<double> v, const std::vector<double>& percentiles) {
  Distribution d;
  if (v.empty()) {
    for (double p : percentiles) d.percentiles.emplace_back(p, 0.0);
    return d;
  }
  const size_t n = v.size();
  double sum = 0;
  for (double x : v) sum += x;
  d.mean = sum / static_cast<double>(n);
  double ss = 0;
  for (double x : v) ss += (x - d.mean) * (x - d.mean);
  d.std = std::sqrt(ss / static_cast<double>(n));
  // Only the order statistics the percentiles read, by selection (O(n) each) rather than a full sort: a job's
  // inter-token latencies are millions of values.
  std::vector<size_t> ranks;
  std::vector<double> ps = percentiles;
  ps.push_back(50);
  for (double p : ps) {
    const PercentileRank r = RankOf(n, p);
    ranks.push_back(r.lo);
    ranks.push_back(r.hi);
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::vector<double> at(ranks.size());
  size_t from = 0;  // [0, from) holds the `from` smallest values
  for (size_t i = 0; i < ranks.size(); ++i) {
    std::nth_element(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(ranks[i]),
                     v.end());
    at[i] = v[ranks[i]];
    from = ranks[i] + 1;
  }
  const auto value = [&](size_t rank) {
    return at[std::lower_bound(ranks.begin(), ranks.end(), rank) - ranks.begin()];
  };
  const auto percentile = [&](double p) {
    const PercentileRank r = RankOf(n, p);
    return value(r.lo) + r.frac * (value(r.hi) - value(r.lo));
  };
  d.median = percentile(50);
  for (double p : percentiles) d.percentiles.emplace_back(p, percentile(p));
  return d;
}

namespace {

std::string PercentileKey(double p) {
  char buf[32];
  if (p == std::floor(p)) {
    std::snprintf(buf, sizeof(buf), "%d", static_cast<int>(p));
  } else {
    std::snprintf(buf, sizeof(buf), "%g", p);
  }
  return buf;
}

void AddDistribution(nlohmann::json& j, const std::string& name, const std::vector<double>& seconds,
                     const std::vector<double>& percentiles) {
  std::vector<double> ms(seconds.size());
  for (size_t i = 0; i < seconds.size(); ++i) ms[i] = seconds[i] * 1000.0;
  const Distribution d = Summarize(ms, percentiles);
  j["mean_" + name + "_ms"] = d.mean;
  j["median_" + name + "_ms"] = d.median;
  j["std_" + name + "_ms"] = d.std;
  for (const auto& [p, v] : d.percentiles) {
    std::string key = "p";
    key += PercentileKey(p);
    key += "_" + name + "_ms";
    j[key] = v;
  }
}

}  // namespace

nlohmann::json SummarizeServing(const std::vector<RequestRecord>& records, const ServingSummaryOptions& o) {
  std::vector<double> ttft, tpot, itl, e2el;
  int64_t completed = 0, failed = 0, input_tokens = 0, output_tokens = 0;
  double first_arrival = 0, last_token = 0;
  bool any = false;
  for (const auto& r : records) {
    if (!any || r.arrival < first_arrival) first_arrival = r.arrival;
    any = true;
    if (!r.success || r.token_times.empty()) {
      ++failed;
      continue;
    }
    ++completed;
    input_tokens += r.prompt_len;
    output_tokens += r.output_len;
    last_token = std::max(last_token, r.token_times.back());
    ttft.push_back(r.ttft());
    e2el.push_back(r.latency());
    if (r.output_len > 1) tpot.push_back((r.latency() - r.ttft()) / static_cast<double>(r.output_len - 1));
    for (size_t i = 1; i < r.token_times.size(); ++i) itl.push_back(r.token_times[i] - r.token_times[i - 1]);
  }
  const double duration = o.duration >= 0 ? o.duration : std::max(0.0, last_token - first_arrival);
  nlohmann::json j;
  j["duration"] = duration;
  j["completed"] = completed;
  j["failed"] = failed;
  j["total_input_tokens"] = input_tokens;
  j["total_output_tokens"] = output_tokens;
  j["request_throughput"] = duration > 0 ? completed / duration : 0.0;
  j["output_throughput"] = duration > 0 ? output_tokens / duration : 0.0;
  j["total_token_throughput"] = duration > 0 ? (input_tokens + output_tokens) / duration : 0.0;
  AddDistribution(j, "ttft", ttft, o.percentiles);
  AddDistribution(j, "tpot", tpot, o.percentiles);
  AddDistribution(j, "itl", itl, o.percentiles);
  AddDistribution(j, "e2el", e2el, o.percentiles);
  return j;
}

nlohmann::json PerDomainSummary(const std::vector<RequestRecord>& records) {
  struct Domain {
    int64_t requests = 0, completed = 0;
    std::vector<double> tpot_ms, ttft_ms;
  };
  std::map<std::string, Domain> domains;
  for (const RequestRecord& r : records) {
    Domain& d = domains[r.domain.empty() ? "unlabelled" : r.domain];
    ++d.requests;
    if (!r.success || r.token_times.empty()) continue;
    ++d.completed;
    d.ttft_ms.push_back(r.ttft() * 1000.0);
    if (r.output_len > 1) {
      d.tpot_ms.push_back((r.latency() - r.ttft()) / static_cast<double>(r.output_len - 1) * 1000.0);
    }
  }
  nlohmann::json j = nlohmann::json::object();
  for (auto& [name, d] : domains) {
    const Distribution tpot = Summarize(d.tpot_ms, {99});
    j[name] = {{"requests", d.requests},        {"completed", d.completed},
               {"median_tpot_ms", tpot.median}, {"p99_tpot_ms", tpot.percentiles[0].second},
               {"mean_tpot_ms", tpot.mean},     {"median_ttft_ms", Summarize(d.ttft_ms, {}).median}};
  }
  return j;
}

nlohmann::json DistinctByBatchJson(const DistinctByBatch& by_batch) {
  nlohmann::json j = nlohmann::json::array();
  for (const BatchDistinctRow& r : by_batch.Rows()) {
    j.push_back({{"batch", r.batch}, {"steps", r.steps}, {"mean_distinct_experts", r.mean_distinct_experts}});
  }
  return j;
}

nlohmann::json RequestRecordJson(const RequestRecord& r, bool with_tokens) {
  nlohmann::json j = {{"id", r.id},
                      {"domain", r.domain},
                      {"decoder", r.decoder},
                      {"prompt_len", r.prompt_len},
                      {"output_len", r.output_len},
                      {"arrival_s", r.arrival},
                      {"success", r.success}};
  if (!r.token_times.empty()) {
    j["ttft_ms"] = r.ttft() * 1000.0;
    j["e2el_ms"] = r.latency() * 1000.0;
    if (r.output_len > 1) j["tpot_ms"] = (r.latency() - r.ttft()) / static_cast<double>(r.output_len - 1) * 1000.0;
  }
  if (!r.success) j["error"] = r.error;
  if (with_tokens) j["tokens"] = r.tokens;
  return j;
}

namespace {

void AppendNumber(std::string& out, double x) {
  if (!std::isfinite(x)) {  // as nlohmann dumps it
    out += "null";
    return;
  }
  char buf[64];
  const char* end = nlohmann::detail::to_chars(buf, buf + sizeof(buf), x);  // nlohmann's own double format
  out.append(buf, static_cast<size_t>(end - buf));
}

void AppendNumber(std::string& out, int64_t x) {
  char buf[24];
  const auto res = std::to_chars(buf, buf + sizeof(buf), x);
  out.append(buf, static_cast<size_t>(res.ptr - buf));
}

void AppendString(std::string& out, const std::string& s) {
  // Printable ASCII other than " and \ is written as it is; anything else goes through nlohmann's escaping. (One
  // branch-free pass, which the compiler vectorises.)
  unsigned bad = 0;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    bad |= static_cast<unsigned>(c < 0x20) | static_cast<unsigned>(c > 0x7e) | static_cast<unsigned>(c == '"') |
           static_cast<unsigned>(c == '\\');
  }
  const bool plain = bad == 0;
  if (!plain) {
    out += DumpJsonLine(nlohmann::json(s));
    return;
  }
  out += '"';
  out += s;
  out += '"';
}

// `key` (with its punctuation: ",\"id\":") and the value.
template <typename T>
void AppendField(std::string& out, std::string_view key, const T& value) {
  out += key;
  if constexpr (std::is_same_v<T, std::string>) {
    AppendString(out, value);
  } else {
    AppendNumber(out, value);
  }
}

}  // namespace

void AppendRequestLine(std::string& out, const RequestRecord& r, bool with_tokens) {
  // The keys in nlohmann's (std::map) order: arrival_s decoder domain e2el_ms error id output_len prompt_len
  // success tokens tpot_ms ttft_ms.
  const bool timed = !r.token_times.empty();
  AppendField(out, "{\"arrival_s\":"sv, r.arrival);
  AppendField(out, ",\"decoder\":"sv, static_cast<int64_t>(r.decoder));
  AppendField(out, ",\"domain\":"sv, r.domain);
  if (timed) {
    AppendField(out, ",\"e2el_ms\":"sv, r.latency() * 1000.0);
  }
  if (!r.success) {
    AppendField(out, ",\"error\":"sv, r.error);
  }
  AppendField(out, ",\"id\":"sv, r.id);
  AppendField(out, ",\"output_len\":"sv, r.output_len);
  AppendField(out, ",\"prompt_len\":"sv, r.prompt_len);
  out += r.success ? ",\"success\":true"sv : ",\"success\":false"sv;
  if (with_tokens) {
    out += ",\"tokens\":["sv;
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      if (i > 0) out += ',';
      AppendNumber(out, static_cast<int64_t>(r.tokens[i]));
    }
    out += ']';
  }
  if (timed && r.output_len > 1) {
    AppendField(out, ",\"tpot_ms\":"sv, (r.latency() - r.ttft()) / static_cast<double>(r.output_len - 1) * 1000.0);
  }
  if (timed) {
    AppendField(out, ",\"ttft_ms\":"sv, r.ttft() * 1000.0);
  }
  out += "}\n"sv;
}

void AppendStepLine(std::string& out, const StepRecord& s) {
  const bool decode = s.kind == "decode";
  out += '{';
  if (decode) {
    AppendField(out, "\"batch\":"sv, s.batch);
    AppendField(out, ",\"context_tokens\":"sv, s.tokens);
    out += ',';
  }
  if (s.cpu_seconds >= 0) {
    AppendField(out, "\"cpu_seconds\":"sv, s.cpu_seconds);
    out += ',';
  }
  if (decode) {
    AppendField(out, "\"distinct_experts\":"sv, s.distinct_experts);
    out += ',';
  }
  AppendField(out, "\"kind\":"sv, s.kind);
  if (!decode) {
    AppendField(out, ",\"prompt_tokens\":"sv, s.tokens);
  }
  AppendField(out, ",\"seconds\":"sv, s.seconds);
  AppendField(out, ",\"time\":"sv, s.time);
  AppendField(out, ",\"worker\":"sv, static_cast<int64_t>(s.worker));
  out += "}\n"sv;
}

std::string FormatServingSummary(const nlohmann::json& j) {
  auto num = [&](const char* key, int decimals) -> std::string {
    if (!j.contains(key) || !j[key].is_number()) return "-";
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.*f", decimals, j[key].get<double>());
    return buf;
  };
  std::string s = "============ Serving Benchmark Result ============\n";
  auto line = [&](const std::string& label, const std::string& v) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%-40s %10s\n", label.c_str(), v.c_str());
    s += buf;
  };
  if (j.contains("policy")) line("Routing policy:", j["policy"].get<std::string>());
  if (j.contains("tau")) line("tau:", num("tau", 2));
  line("Successful requests:", num("completed", 0));
  line("Failed requests:", num("failed", 0));
  line("Benchmark duration (s):", num("duration", 2));
  line("Total input tokens:", num("total_input_tokens", 0));
  line("Total generated tokens:", num("total_output_tokens", 0));
  line("Request throughput (req/s):", num("request_throughput", 2));
  line("Output token throughput (tok/s):", num("output_throughput", 2));
  for (const char* m : {"ttft", "tpot", "itl", "e2el"}) {
    const std::string k(m);
    s += "---------------------- " + k + " ----------------------\n";
    line("Mean " + k + " (ms):", num(("mean_" + k + "_ms").c_str(), 2));
    line("Median " + k + " (ms):", num(("median_" + k + "_ms").c_str(), 2));
    line("P99 " + k + " (ms):", num(("p99_" + k + "_ms").c_str(), 2));
  }
  if (j.contains("mean_distinct_experts_per_step")) {
    s += "---------------------- experts ----------------------\n";
    line("Mean distinct experts per step:", num("mean_distinct_experts_per_step", 1));
    line("Distinct experts per token:", num("distinct_experts_per_token", 2));
  }
  s += "==================================================\n";
  return s;
}

nlohmann::json JobMetrics(const JobConfig& c, const std::string& model, const std::vector<RequestRecord>& records,
                          const std::vector<DecoderStats>& decoders, const RoutingStats& routing) {
  nlohmann::json j = SummarizeServing(records, {});
  j["policy"] = RoutingPolicyName(c.policy);
  j["tau"] = routing.tau;
  j["load_bound"] = RoutedLoadBound(c.policy, c.load_bound);  // the ε routed with
  j["num_prompts"] = static_cast<int64_t>(records.size());
  j["request_rate"] = std::isinf(c.request_rate) ? nlohmann::json("inf") : nlohmann::json(c.request_rate);
  j["burstiness"] = c.burstiness;
  j["max_concurrency"] = c.max_concurrency;
  double steps = 0, distinct = 0, batch = 0;
  DistinctByBatch by_batch;
  nlohmann::json dec = nlohmann::json::array();
  for (const DecoderStats& d : decoders) {
    by_batch.Merge(d.by_batch);
    steps += static_cast<double>(d.steps);
    distinct += d.distinct_sum;
    batch += d.batch_sum;
    dec.push_back({{"decoder", d.decoder},
                   {"leader_rank", d.leader_rank},
                   {"requests", d.requests},
                   {"steps", d.steps},
                   {"mean_batch", d.steps ? d.batch_sum / static_cast<double>(d.steps) : 0.0},
                   {"mean_distinct_experts_per_step", d.steps ? d.distinct_sum / static_cast<double>(d.steps) : 0.0}});
    if (d.ep_size >= 1) dec.back()["ep_size"] = d.ep_size;
    if (d.ep_size > 1) {
      dec.back()["mean_rank_load"] = d.mean_rank_load;
      dec.back()["mean_balancedness"] = d.mean_balancedness;
      dec.back()["p1_balancedness"] = d.p1_balancedness;
    }
  }
  j["mean_distinct_experts_per_step"] = steps > 0 ? distinct / steps : 0.0;
  j["distinct_experts_per_token"] = batch > 0 ? distinct / batch : 0.0;
  j["distinct_by_batch"] = DistinctByBatchJson(by_batch);
  j["per_domain"] = PerDomainSummary(records);
  j["mean_band_size"] =
      routing.band_n ? static_cast<double>(routing.band_sum) / static_cast<double>(routing.band_n) : 0.0;
  j["fallbacks"] = routing.fallbacks;
  j["decoders"] = dec;
  j["topology"] = {{"prefill_ranks", c.prefill_ranks}, {"decode_ranks", c.decode_ranks}, {"ep_size", c.ep_size}};
  j["model"] = model;
  j["trace"] = c.trace;
  const nlohmann::json provenance = Provenance(JobConfigJson(c));  // named: items() must not outlive it
  for (const auto& [key, value] : provenance.items()) j[key] = value;
  return j;
}

nlohmann::json JobConfigJson(const JobConfig& c) {
  const auto number = [](double v) { return std::isinf(v) ? nlohmann::json("inf") : nlohmann::json(v); };
  return {{"path", c.path},
          {"topology", {{"prefill_ranks", c.prefill_ranks}, {"decode_ranks", c.decode_ranks}}},
          {"model",
           {{"config", c.model_config},
            {"weights", c.weights},
            {"seed", c.weight_seed},
            {"gate", c.replay_gates ? "replay" : "model"}}},
          {"routing",
           {{"policy", RoutingPolicyName(c.policy)},
            {"tau", c.tau ? nlohmann::json(*c.tau) : nlohmann::json("calibration")},
            {"calibration", c.calibration},
            {"admission_cap", c.admission_cap},
            {"seed", c.routing_seed},
            {"load_bound", RoutedLoadBound(c.policy, c.load_bound)},
            {"harm_weight", c.harm_weight}}},
          {"kv_cache",
           {{"block_size", c.block_size},
            {"prefill_blocks", c.prefill_blocks},
            {"decode_blocks", c.decode_blocks},
            {"transport", c.kv_transport}}},
          {"decode", {{"max_batch", c.max_batch}, {"ep_size", c.ep_size}, {"placement", c.placement}}},
          {"workload",
           {{"trace", c.trace},
            {"num_requests", c.num_requests},
            {"output_len", c.output_len},
            {"request_rate", number(c.request_rate)},
            {"burstiness", c.burstiness},
            {"max_concurrency", c.max_concurrency},
            {"seed", c.workload_seed}}},
          {"output", {{"dir", c.output_dir}, {"tokens", c.output_tokens}, {"replace", c.output_replace}}},
          {"watchdog_s", c.watchdog_s}};
}

namespace {

namespace fs = std::filesystem;

// The run directory as it stands: absent (false), or a real directory with or without entries; else an error.
Result<bool> RunDirectoryHoldsFiles(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(dir, ec);
  if (ec || st.type() == fs::file_type::not_found) return false;
  if (st.type() == fs::file_type::symlink) {
    return Status::InvalidArgument("output.dir " + dir + " is a symlink; give the directory itself");
  }
  if (st.type() != fs::file_type::directory) {
    return Status::InvalidArgument("output.dir " + dir + " exists and is not a directory");
  }
  const bool empty = fs::is_empty(dir, ec);
  if (ec) return Status::IoError("output.dir " + dir + ": cannot read it: " + ec.message());
  return !empty;
}

// Why `dir` is not an earlier run (output.replace replaces an earlier run, never other data), or "" when it is:
// every entry a regular file a run writes, and metrics.json a run's (a JSON object naming eldr_version), so that a
// user's own file that happens to be called metrics.json or requests.jsonl is never taken for a run's.
std::string NotAnEarlierRun(const std::string& dir) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool run_file = name == "metrics.json" || name == "requests.jsonl" || name == "steps.jsonl";
    if (!run_file || !e.is_regular_file(ec) || e.is_symlink(ec)) return name + ", which is not a run's file";
  }
  if (ec) return std::string("entries it cannot list (") + ec.message() + ")";
  std::ifstream in(fs::path(dir) / "metrics.json");
  if (!in) return "no metrics.json, which every run writes";
  const nlohmann::json m = nlohmann::json::parse(in, nullptr, false);
  if (!m.is_object() || !m.contains("eldr_version")) return "a metrics.json that no eldr run wrote";
  return "";
}

// Puts `temp` in the place of `dir` (which holds an earlier run), and returns where the earlier run went.
Result<std::string> ExchangeDirectory(const std::string& temp, const std::string& dir) {
  if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) return temp;
  if (errno != EINVAL && errno != ENOSYS) {
    return Status::IoError("output.dir " + dir + ": cannot replace it: " + std::strerror(errno));
  }
  const std::string aside = temp + ".old";
  if (::rename(dir.c_str(), aside.c_str()) != 0 || ::rename(temp.c_str(), dir.c_str()) != 0) {
    return Status::IoError("output.dir " + dir + ": cannot replace it: " + std::strerror(errno));
  }
  return aside;
}

void SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  (void)::fsync(fd);  // some file systems cannot fsync a directory; the rename is atomic there all the same
  ::close(fd);
}

// The run is written beside output.dir at the end: a place where nothing can be created (a read-only file system,
// /sys, no permission) is found before the run, by creating and removing a directory in the nearest existing
// directory on the way.
Status CheckCreatable(const std::string& dir) {
  std::error_code ec;
  fs::path at = fs::absolute(fs::path(dir), ec).lexically_normal();
  if (ec) return Status::IoError("output.dir " + dir + ": " + ec.message());
  if (!at.has_filename()) at = at.parent_path();
  do {
    at = at.parent_path();
  } while (!fs::is_directory(at, ec) && at.has_relative_path());
  const std::string probe = TemporaryPath((at / ".eldr-write-probe").string());
  if (::mkdir(probe.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::IoError("output.dir " + dir + ": nothing can be created in " + at.string() + " (" +
                           std::strerror(errno) + "); choose a writable output.dir");
  }
  ::rmdir(probe.c_str());
  return Status::Ok();
}

}  // namespace

Status CheckRunDirectory(const std::string& dir, bool replace) {
  ELDR_ASSIGN_OR_RETURN(const bool holds_files, RunDirectoryHoldsFiles(dir));
  ELDR_RETURN_IF_ERROR(CheckCreatable(dir));
  if (holds_files && !replace) {
    return Status::InvalidArgument("output.dir " + dir +
                                   " already holds files (an earlier run?); set output.replace: true to replace it "
                                   "whole, or choose another directory");
  }
  if (holds_files) {
    const std::string why = NotAnEarlierRun(dir);
    if (!why.empty()) {
      return Status::InvalidArgument("output.dir " + dir + " holds " + why +
                                     ": output.replace replaces only an earlier run; choose another directory");
    }
  }
  return Status::Ok();
}

CreatedDirectories::~CreatedDirectories() {
  std::error_code ec;
  for (const auto& d : created_) fs::remove(d, ec);  // fails (harmlessly) on a non-empty one
}

Status CreatedDirectories::Create(const std::string& dir) {
  std::error_code ec;
  for (fs::path p = fs::absolute(dir, ec).lexically_normal(); !p.empty() && !fs::exists(p, ec) && p != p.parent_path();
       p = p.parent_path()) {
    created_.push_back(p);  // deepest first
  }
  fs::create_directories(dir, ec);
  if (ec) return Status::IoError(dir + ": cannot create the output directory: " + ec.message());
  return Status::Ok();
}

Result<RunDirectoryClaim> RunDirectoryClaim::Acquire(const std::string& dir) {
  std::error_code ec;
  fs::path target = fs::absolute(fs::path(dir), ec).lexically_normal();
  if (ec) return Status::IoError("output.dir " + dir + ": " + ec.message());
  if (!target.has_filename()) target = target.parent_path();
  ELDR_RETURN_IF_ERROR(CheckCreatable(dir));
  RunDirectoryClaim claim;
  ELDR_RETURN_IF_ERROR(claim.parents_.Create(target.parent_path().string()));
  // The parent as the file system names it (links followed): two spellings of one directory take one lock.
  const fs::path parent = fs::weakly_canonical(target.parent_path(), ec);
  if (ec) return Status::IoError("output.dir " + dir + ": " + ec.message());
  claim.lock_path_ = (parent / ("." + target.filename().string() + ".eldr-lock")).string();
  // The holder removes the lock file before it unlocks: a lock taken on a file that is no longer (or no longer
  // the same file) at lock_path_ came too late; open the path again.
  for (int attempt = 0; attempt < 100; ++attempt) {
    // Another user's stale lock file (mode 0666 less the umask) is still lockable read-only: the note is then not
    // rewritten, nothing else is lost.
    // (O_NONBLOCK: a FIFO put there must not block the open.)
    constexpr int kFlags = O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
    int fd = ::open(claim.lock_path_.c_str(), O_RDWR | O_CREAT | kFlags, 0666);
    if (fd < 0 && errno == EACCES) fd = ::open(claim.lock_path_.c_str(), O_RDONLY | kFlags);
    if (fd < 0 && errno == ELOOP) {  // O_NOFOLLOW: never lock (or later remove) what a link points to
      return Status::FailedPrecondition("output.dir " + dir + ": its lock file " + claim.lock_path_ +
                                        " is a symbolic link, not one eldr made; remove it");
    }
    if (fd < 0) {
      return Status::IoError("output.dir " + dir + ": cannot create its lock file " + claim.lock_path_ + ": " +
                             std::strerror(errno));
    }
    struct stat st = {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {  // a FIFO or device there is someone else's: never removed
      ::close(fd);
      return Status::FailedPrecondition("output.dir " + dir + ": its lock file " + claim.lock_path_ +
                                        " is not a regular file, not one eldr made; remove it");
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err != EWOULDBLOCK) {  // no flock on this file system: no claim (see the header)
        claim.fd_ = fd;
        return claim;
      }
      char holder[256] = {};
      const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
      ::close(fd);
      std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
      while (!who.empty() && (who.back() == '\n' || who.back() == '\0')) who.pop_back();
      return Status::FailedPrecondition("output.dir " + dir + " is in use by another eldr job" +
                                        (who.empty() ? "" : " (" + PrintableMessage(who) + ")") +
                                        "; wait for it to end or choose another directory");
    }
    struct stat held = {};
    struct stat named = {};
    if (::fstat(fd, &held) == 0 && ::lstat(claim.lock_path_.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
        held.st_ino == named.st_ino) {
      char host[256] = {};
      if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof host, "this host");
      const std::string who = "pid " + std::to_string(::getpid()) + " on " + host + "\n";
      if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, who.data(), who.size(), 0) < 0) {
        // The lock holds without its note: the message then names no holder.
      }
      claim.fd_ = fd;
      return claim;
    }
    ::close(fd);
  }
  return Status::IoError("output.dir " + dir + ": its lock file " + claim.lock_path_ +
                         " keeps being replaced; is another program removing it?");
}

RunDirectoryClaim::RunDirectoryClaim(RunDirectoryClaim&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), lock_path_(std::move(o.lock_path_)), parents_(std::move(o.parents_)) {}

RunDirectoryClaim::~RunDirectoryClaim() {
  if (fd_ < 0) return;
  struct stat held = {};
  struct stat named = {};
  if (::fstat(fd_, &held) == 0 && ::lstat(lock_path_.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
      held.st_ino == named.st_ino) {
    ::unlink(lock_path_.c_str());  // before the unlock (see Acquire); only the file this claim locked
  }
  ::close(fd_);
}

Status CommitRunDirectory(const std::string& dir, bool replace,
                          std::vector<std::pair<std::string, std::string>> files) {
  ELDR_RETURN_IF_ERROR(CheckRunDirectory(dir, replace));
  const fs::path target = fs::absolute(fs::path(dir)).lexically_normal();
  const fs::path name = target.has_filename() ? target.filename() : target.parent_path().filename();
  const fs::path parent = (target.has_filename() ? target : target.parent_path()).parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) return Status::IoError("output.dir " + dir + ": cannot create " + parent.string() + ": " + ec.message());
  RemoveStaleTemporaries((parent / name).string());  // a killed earlier run's (README "When a rank fails")
  const std::string temp = TemporaryPath((parent / name).string());
  fs::remove_all(temp, ec);
  if (!fs::create_directory(temp, ec) || ec) {
    return Status::IoError("output.dir " + dir + ": cannot create " + temp + ": " + (ec ? ec.message() : "exists"));
  }
  std::vector<std::pair<std::string, std::string>> paths;
  for (auto& [file, content] : files) paths.emplace_back(temp + "/" + file, std::move(content));  // no copy
  Status st = WriteFilesAtomic(paths);  // each file written, fsynced and renamed inside `temp`, which is fsynced
  if (!st.ok()) {                       // name the run's file as the user knows it, not the temporary directory's
    std::string m = st.message();
    for (size_t at = m.find(temp); at != std::string::npos; at = m.find(temp, at + dir.size()))
      m.replace(at, temp.size(), dir);
    st = Status(st.code(), m);
  }
  std::string earlier;  // where an earlier run went, to be removed
  if (st.ok()) {
    ELDR_ASSIGN_OR_RETURN(const bool holds_files, RunDirectoryHoldsFiles(target.string()));
    if (!holds_files) {
      if (::rename(temp.c_str(), target.c_str()) != 0)
        st = Status::IoError("output.dir " + dir + ": cannot rename the run into place: " + std::strerror(errno));
    } else {
      Result<std::string> aside = ExchangeDirectory(temp, target.string());
      if (aside.ok()) earlier = *aside;
      st = aside.status();
    }
  }
  if (!st.ok()) {
    fs::remove_all(temp, ec);
    return st;
  }
  SyncDirectory(parent.string());
  if (!earlier.empty()) fs::remove_all(earlier, ec);
  return Status::Ok();
}

namespace {

std::string RequestLines(const std::vector<RequestRecord>& records, bool with_tokens) {
  size_t bytes = 0;  // one allocation: growing a few hundred MB by doubling copied and faulted it in again and again
  for (const RequestRecord& r : records) {
    bytes += 200 + r.id.size() + r.domain.size() + r.error.size() + (with_tokens ? 8 * r.tokens.size() : 0);
  }
  std::string lines;
  lines.reserve(bytes);
  for (const RequestRecord& r : records) AppendRequestLine(lines, r, with_tokens);
  return lines;
}

std::string StepLines(const std::vector<StepRecord>& steps) {
  std::string lines;
  lines.reserve(200 * steps.size());
  for (const StepRecord& s : steps) AppendStepLine(lines, s);
  return lines;
}

// The run's files, moved into CommitRunDirectory (a file's content is not copied on the way).
std::vector<std::pair<std::string, std::string>> RunFiles(std::string requests, std::string metrics,
                                                          std::optional<std::string> steps) {
  std::vector<std::pair<std::string, std::string>> files;
  files.emplace_back("requests.jsonl", std::move(requests));
  if (steps) files.emplace_back("steps.jsonl", std::move(*steps));
  files.emplace_back("metrics.json", std::move(metrics));
  return files;
}

}  // namespace

Status WriteJobOutputs(const std::string& dir, bool replace, const nlohmann::json& metrics,
                       const std::vector<RequestRecord>& records, bool with_tokens) {
  return CommitRunDirectory(dir, replace,
                            RunFiles(RequestLines(records, with_tokens), DumpJson(metrics) + "\n", std::nullopt));
}

Status WriteServeOutputs(const std::string& dir, bool replace, const nlohmann::json& metrics,
                         const std::vector<RequestRecord>& records, bool with_tokens,
                         const std::vector<StepRecord>& steps) {
  return CommitRunDirectory(dir, replace,
                            RunFiles(RequestLines(records, with_tokens), DumpJson(metrics) + "\n", StepLines(steps)));
}

Status WriteStepLog(const std::string& path, const std::vector<StepRecord>& steps) {
  return WriteFileAtomic(path, StepLines(steps));
}

}  // namespace eldr
