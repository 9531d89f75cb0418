// eldr simulate: the serving job as a discrete-event simulation (runtime/sim), and the fit / derivation of
// its cost model.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/calib/calibration.h"
#include "runtime/cli/commands.h"
#include "runtime/common/atomic_file.h"
#include "runtime/common/json_util.h"
#include "runtime/common/signals.h"
#include "runtime/cost/cost_model.h"
#include "runtime/job/job_config.h"
#include "runtime/job/metrics.h"
#include "runtime/job/workload.h"
#include "runtime/sim/simulator.h"

namespace eldr::cli {

namespace {

struct SimulateArgs {
  std::string config, calib, trace, policy, cost_model, output_dir, model, prefill_from;
  std::vector<std::string> fit;
  std::string derive, out;
  std::string route_on = "prefill";
  // The overrides: unset (the config's value) or a value checked against the key's range (job_limits).
  std::optional<int> decoders, prefill, max_batch, decode_blocks;
  std::optional<int64_t> num_requests, output_len, max_concurrency, admission_cap;
  std::optional<double> tau, load_bound, harm_weight, rate, burstiness;
  std::optional<uint64_t> seed;
  double bandwidth = 0, cores = 0;
  bool json = false, quiet = false, no_output = false;
};

nlohmann::json CostModelJson(const CostModel& m) {
  return {{"name", m.name},
          {"source", m.source},
          {"decode", {{"a", m.decode_a}, {"b", m.decode_b}, {"c", m.decode_c}, {"d", m.decode_d}}},
          {"prefill", {{"a", m.prefill_a}, {"b", m.prefill_b}}},
          {"kv_transfer", {{"latency_s", m.kv_latency}, {"bandwidth_Bps", m.kv_bandwidth}}},
          {"control_latency_s", m.control_latency},
          {"cores", m.cores}};
}

Status WriteOrPrint(const std::string& out, const std::string& text) {
  if (out.empty()) {
    std::printf("%s", text.c_str());
    return Status::Ok();
  }
  ELDR_RETURN_IF_ERROR(WriteFileAtomic(out, text));
  std::fprintf(stderr, "wrote %s\n", out.c_str());
  return Status::Ok();
}

Status RunFit(const SimulateArgs& a) {
  if (a.model.empty()) return Status::InvalidArgument("--fit needs --model (the model config the steps ran)");
  std::vector<PathArg> inputs{{a.model, "--model"}};
  for (const auto& f : a.fit) inputs.push_back({f, "--fit"});
  if (!a.prefill_from.empty()) inputs.push_back({a.prefill_from, "--prefill-from"});
  ELDR_RETURN_IF_ERROR(CheckOutputs({{a.out, "--out"}}, inputs));
  ELDR_ASSIGN_OR_RETURN(ModelConfig mc, LoadModelConfig(a.model));
  std::optional<CostModel> prefill;
  if (!a.prefill_from.empty()) {
    ELDR_ASSIGN_OR_RETURN(prefill, LoadCostModel(a.prefill_from));
    prefill->source = a.prefill_from;
  }
  Result<FitReport> fitted = FitCostModel(a.fit, mc, a.cores, prefill ? &*prefill : nullptr);
  if (!fitted.ok() && fitted.status().message().rfind("the prefills ", 0) == 0) {
    // The decode steps may be fine: say how to keep their fit.
    return Status::InvalidArgument(fitted.status().message() +
                                   ", or give prefill.a and prefill.b with --prefill-from COST.yaml");
  }
  ELDR_ASSIGN_OR_RETURN(FitReport r, std::move(fitted));
  if (r.from_step_logs && r.prefill_samples == 0 && r.prefill_given_by.empty()) {
    // Step logs of decode lines only: their cost model would price every prefill at 0.
    return Status::InvalidArgument(
        "the --fit step logs hold no prefill steps, so prefill.a and prefill.b cannot be "
        "fitted; give them with --prefill-from COST.yaml");
  }
  // Step logs time the compute only; hops on this machine's MPI with polling receivers take ~0.1 ms.
  if (r.model.control_latency == 0) r.model.control_latency = 1e-4;
  if (r.model.kv_latency == 0) r.model.kv_latency = 1e-4;
  if (r.model.kv_bandwidth == 0) r.model.kv_bandwidth = 5e9;
  r.model.name = "fit-" + mc.name;
  ELDR_RETURN_IF_ERROR(CheckCostModel(r.model, "the fitted cost model (check the step times of the --fit files)"));
  if (a.json) {
    nlohmann::json j = CostModelJson(r.model);
    j["decode_r2"] = r.decode_r2;
    j["prefill_r2"] = r.prefill_r2;
    j["decode_samples"] = r.decode_samples;
    j["prefill_samples"] = r.prefill_samples;
    if (!r.prefill_given_by.empty()) j["prefill_given_by"] = r.prefill_given_by;
    j["decode_median_rel_error"] = r.decode_median_rel_error;
    const WithinBatchFit& w = r.within_batch;
    j["within_batch"] = {{"steps", w.steps},
                         {"groups", w.groups},
                         {"b", w.b},
                         {"b_se", w.b_se},
                         {"t", w.t()},
                         {"d", w.d},
                         {"partial_r", w.partial_r},
                         {"within_share", w.within_share}};
    ELDR_RETURN_IF_ERROR(WriteOrPrint(a.out, DumpJson(j) + "\n"));
  } else {
    ELDR_RETURN_IF_ERROR(WriteOrPrint(a.out, CostModelYaml(r.model)));
  }
  std::fprintf(stderr, "%s", r.Summary().c_str());  // after the write: a failed write's error is the first line
  return Status::Ok();
}

Status RunDerive(const SimulateArgs& a) {
  if (a.model.empty()) return Status::InvalidArgument("--derive needs --model (a model config YAML)");
  ELDR_RETURN_IF_ERROR(CheckOutputs({{a.out, "--out"}}, {{a.model, "--model"}}));
  ELDR_ASSIGN_OR_RETURN(ModelConfig mc, LoadModelConfig(a.model));
  DeviceSpec dev;
  if (a.derive != "h200" && a.derive != "H200") {
    return Status::InvalidArgument("--derive knows h200; give other devices with --bandwidth (bytes/s)");
  }
  if (a.bandwidth > 0) dev.memory_bandwidth = a.bandwidth;  // 0: not given (the option's range excludes 0)
  const CostModel m = DeriveCostModel(mc, dev);
  ELDR_RETURN_IF_ERROR(CheckCostModel(m, "the derived cost model (check --bandwidth, in bytes/s)"));
  ELDR_RETURN_IF_ERROR(WriteOrPrint(a.out, a.json ? DumpJson(CostModelJson(m)) + "\n" : CostModelYaml(m)));
  std::fprintf(stderr, "%s\n", m.source.c_str());  // after the write: a failed write's error is the first line
  return Status::Ok();
}

// simulate runs one of three modes (--fit, --derive, a simulation); an option of another mode would be ignored, so it
// is refused, naming the option and the mode.
Status CheckModeOptions(const CLI::App& cmd) {
  const bool fit = cmd.count("--fit") > 0, derive = cmd.count("--derive") > 0;
  if (fit && derive) return Status::InvalidArgument("--fit and --derive are two modes; give one");
  const char* mode = fit ? "--fit" : derive ? "--derive" : nullptr;
  const auto given = [&](const char* name) { return cmd.count(name) > 0; };
  for (const char* name :
       {"--config",     "--calib",           "--trace",       "--decoders",      "--prefill",       "--policy",
        "--tau",        "--load-bound",      "--harm-weight", "--rate",          "--burstiness",    "--num-requests",
        "--output-len", "--max-concurrency", "--max-batch",   "--decode-blocks", "--admission-cap", "--seed",
        "--route-on",   "--cost-model",      "--output-dir",  "--no-output"}) {
    if (mode && given(name)) return Status::InvalidArgument(std::string(name) + " does not apply with " + mode);
  }
  for (const char* name : {"--model", "--out"}) {
    if (!mode && given(name))
      return Status::InvalidArgument(std::string(name) + " applies only with --fit or --derive");
  }
  if (!derive && given("--bandwidth")) return Status::InvalidArgument("--bandwidth applies only with --derive");
  if (!fit && given("--cores")) return Status::InvalidArgument("--cores applies only with --fit");
  if (!fit && given("--prefill-from")) return Status::InvalidArgument("--prefill-from applies only with --fit");
  return Status::Ok();
}

Status RunSimulation(const SimulateArgs& a, const CLI::App& cmd) {
  if (a.config.empty()) return Status::InvalidArgument("--config is required (the job config of eldr serve)");
  ELDR_ASSIGN_OR_RETURN(JobConfig c, LoadJobConfig(a.config));
  if (!a.calib.empty()) c.calibration = a.calib;
  if (!a.trace.empty()) c.trace = a.trace;
  c.decode_ranks = a.decoders.value_or(c.decode_ranks);
  c.prefill_ranks = a.prefill.value_or(c.prefill_ranks);
  c.max_batch = a.max_batch.value_or(c.max_batch);
  c.decode_blocks = a.decode_blocks.value_or(c.decode_blocks);
  if (!a.policy.empty()) {
    ELDR_ASSIGN_OR_RETURN(c.policy, ParseRoutingPolicy(a.policy));
  }
  ELDR_RETURN_IF_ERROR(CheckPolicyOptions(cmd, c.policy));
  if (a.tau) c.tau = a.tau;
  if (a.load_bound) c.load_bound = a.load_bound;
  c.harm_weight = a.harm_weight.value_or(c.harm_weight);
  c.request_rate = a.rate.value_or(c.request_rate);
  c.burstiness = a.burstiness.value_or(c.burstiness);
  c.num_requests = a.num_requests.value_or(c.num_requests);
  c.output_len = a.output_len.value_or(c.output_len);
  c.max_concurrency = a.max_concurrency.value_or(c.max_concurrency);
  c.admission_cap = a.admission_cap.value_or(c.admission_cap);
  c.workload_seed = a.seed.value_or(c.workload_seed);
  const std::pair<const char*, const char*> keys[] = {{"--calib", "routing.calibration"},
                                                      {"--trace", "workload.trace"},
                                                      {"--decoders", "topology.decode_ranks"},
                                                      {"--prefill", "topology.prefill_ranks"},
                                                      {"--max-batch", "decode.max_batch"},
                                                      {"--decode-blocks", "kv_cache.decode_blocks"},
                                                      {"--policy", "routing.policy"},
                                                      {"--tau", "routing.tau"},
                                                      {"--load-bound", "routing.load_bound"},
                                                      {"--harm-weight", "routing.harm_weight"},
                                                      {"--rate", "workload.request_rate"},
                                                      {"--burstiness", "workload.burstiness"},
                                                      {"--num-requests", "workload.num_requests"},
                                                      {"--output-len", "workload.output_len"},
                                                      {"--max-concurrency", "workload.max_concurrency"},
                                                      {"--admission-cap", "routing.admission_cap"},
                                                      {"--seed", "workload.seed"},
                                                      {"--output-dir", "output.dir"}};
  for (const auto& [option, key] : keys) {
    if (cmd.count(option) > 0) c.overrides[key] = option;
  }
  if (a.no_output && !a.output_dir.empty()) {
    return Status::InvalidArgument("--no-output writes no files: drop --output-dir (or --no-output)");
  }
  if (!a.output_dir.empty()) c.output_dir = a.output_dir;
  if (a.route_on != "prefill" && a.route_on != "decode") {
    return Status::InvalidArgument("--route-on '" + a.route_on + "' must be prefill or decode");
  }
  c.route_on_decode = a.route_on == "decode";
  if (UsesSignature(c.policy) && c.calibration.empty()) {
    return Status::InvalidArgument(std::string("policy ") + RoutingPolicyName(c.policy) +
                                   " needs a calibration (routing.calibration or --calib)");
  }
  CostModel cost;
  if (!a.cost_model.empty()) {
    ELDR_ASSIGN_OR_RETURN(cost, LoadCostModel(a.cost_model));
  } else {
    ELDR_ASSIGN_OR_RETURN(cost, LoadJobCostModel(a.config));
  }
  auto loaded_mc = LoadModelConfig(c.model_config);
  if (!loaded_mc.ok()) return ForKey(c, loaded_mc.status(), "model.config", c.model_config);
  const ModelConfig mc = std::move(loaded_mc).value();
  auto loaded_in = LoadJobRequests(c);
  if (!loaded_in.ok()) return ForKey(c, loaded_in.status(), "workload.trace", c.trace);
  JobRequests in = std::move(loaded_in).value();
  std::unique_ptr<Calibration> calib;
  if (!c.calibration.empty() && UsesSignature(c.policy)) {
    auto cal = ReadCalibration(c.calibration);
    if (!cal.ok()) return ForKey(c, cal.status(), "routing.calibration", c.calibration);
    calib = std::make_unique<Calibration>(std::move(cal).value());
  }
  std::optional<RunDirectoryClaim> claim;  // until the run's files are committed; before `created` (destroyed after)
  CreatedDirectories created;
  if (!a.no_output) {                                                              // fail before the run, not after it
    Result<RunDirectoryClaim> claimed = RunDirectoryClaim::Acquire(c.output_dir);  // before the check: no gap
    if (!claimed.ok()) return claimed.status();
    claim.emplace(std::move(claimed).value());
    ELDR_RETURN_IF_ERROR(CheckRunDirectory(c.output_dir, c.output_replace));
    ELDR_RETURN_IF_ERROR(created.Create(c.output_dir));
    ELDR_RETURN_IF_ERROR(
        CheckOutputs({{c.output_dir + "/metrics.json", "output.dir"}, {c.output_dir + "/requests.jsonl", "output.dir"}},
                     {{a.config, "--config"},
                      {c.calibration, "calibration"},
                      {c.trace, "trace"},
                      {c.model_config, "model"},
                      {a.cost_model, "--cost-model"}}));
  }
  const auto start = std::chrono::steady_clock::now();
  ELDR_ASSIGN_OR_RETURN(SimulationResult r, Simulate(c, in, mc, calib.get(), cost, !a.quiet && !a.json));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  nlohmann::json j = JobMetrics(c, mc.name, r.records, r.decoders, r.routing);
  j["simulated"] = true;
  j["simulated_seconds"] = r.simulated_seconds;
  j["events"] = r.events;
  j["wall_seconds"] = wall;
  j["max_batch"] = c.max_batch;
  j["route_on"] = c.route_on_decode ? "decode" : "prefill";
  j["cost_model"] = CostModelJson(cost);
  if (!a.no_output) {
    ELDR_RETURN_IF_ERROR(WriteJobOutputs(c.output_dir, c.output_replace, j, r.records, false));
    created.Keep();
  }
  if (a.json) {
    std::printf("%s\n", DumpJson(j).c_str());
  } else {
    std::printf("%s", FormatServingSummary(j).c_str());
    std::printf("simulated %s of serving in %.2f s (%lld events); cost model: %s\n",
                (Fmt(r.simulated_seconds, 1) + " s").c_str(), wall, static_cast<long long>(r.events),
                cost.source.c_str());
    if (!a.no_output) std::printf("wrote %s/metrics.json and requests.jsonl\n", c.output_dir.c_str());
  }
  return Status::Ok();
}

}  // namespace

void AddSimulateCommand(CLI::App& app, Action* action) {
  auto a = std::make_shared<SimulateArgs>();
  auto* cmd = app.add_subcommand(
      "simulate",
      "Simulate an eldr serve job at any scale (discrete events; the real router, prefix and signature caches and "
      "decoder admission; step times from a cost model). Also: --fit a cost model to measured steps, --derive one "
      "for a GPU.");
  cmd->add_option("--config,-c", a->config,
                  "job config YAML, the same as eldr serve's; its simulate: section gives "
                  "the cost model (cost_model: FILE and/or inline keys)")
      ->check(NonEmptyPath());
  cmd->add_option("--calib", a->calib, "override routing.calibration")->check(NonEmptyPath());
  cmd->add_option("--trace", a->trace, "override workload.trace (a real or synthetic routing trace)")
      ->check(NonEmptyPath());
  // An override into its optional, checked against the range of the key it replaces.
  auto set = [cmd](const std::string& name, auto* field, const auto& range, const std::string& help) {
    using T = typename std::remove_pointer_t<decltype(field)>::value_type;
    cmd->add_option_function<T>(
           name, [field](const T& v) { *field = v; }, help)
        ->check(InRange(range));
  };
  set("--decoders,-K", &a->decoders, job_limits::kRanks, "override topology.decode_ranks");
  set("--prefill", &a->prefill, job_limits::kRanks, "override topology.prefill_ranks");
  cmd->add_option("--policy", a->policy,
                  "override routing.policy (random, round_robin, jsq, p2c, domain, "
                  "locality_top1, eldr, eldr_paper, eldr_tail)")
      ->check(NonEmptyName());
  set("--tau", &a->tau, job_limits::kTau, "override routing.tau (the band width of eldr_paper and eldr_tail)");
  set("--load-bound", &a->load_bound, job_limits::kLoadBound,
      "override routing.load_bound (bounded-load ε of eldr, eldr_paper, eldr_tail; 0 = off, but eldr_tail routes 0 as "
      "0.25: its bound is never off)");
  set("--harm-weight", &a->harm_weight, job_limits::kHarm,
      "override routing.harm_weight (eldr's λ, 0..1: weight of what a request adds to the running requests' TPOT)");
  set("--rate", &a->rate, job_limits::kRate, "override workload.request_rate (requests/s; inf: all at once)");
  set("--burstiness", &a->burstiness, job_limits::kBurstiness, "override workload.burstiness");
  set("--num-requests,-n", &a->num_requests, job_limits::kCount,
      "override workload.num_requests (cycles through the trace; 0: every request once)");
  set("--output-len", &a->output_len, job_limits::kOutputLen, "override workload.output_len (0: the trace's)");
  set("--max-concurrency", &a->max_concurrency, job_limits::kCount, "override workload.max_concurrency");
  set("--max-batch", &a->max_batch, job_limits::kMaxBatch, "override decode.max_batch");
  set("--decode-blocks", &a->decode_blocks, job_limits::kBlocks, "override kv_cache.decode_blocks");
  set("--admission-cap", &a->admission_cap, job_limits::kCount, "override routing.admission_cap");
  cmd->add_option_function<uint64_t>(
         "--seed", [a](const uint64_t& s) { a->seed = s; }, "override workload.seed")
      ->check(SeedValue());
  cmd->add_option("--route-on", a->route_on,
                  "evaluation option: prefill (default: the prompt's expert counts, as serve) or decode (the router "
                  "is handed each request's decode-token counts, with a calibration from 'eldr calibrate --features "
                  "decode': the ceiling of any signature)")
      ->capture_default_str();
  cmd->add_option("--cost-model", a->cost_model, "cost model YAML (instead of the config's simulate: section)")
      ->check(NonEmptyPath());
  cmd->add_option("--output-dir", a->output_dir, "override output.dir")->check(NonEmptyPath());
  cmd->add_flag("--no-output", a->no_output, "write no files (print only)");
  cmd->add_flag("--json", a->json, "print the metrics JSON to stdout (no table, no progress bar)");
  cmd->add_flag("--quiet", a->quiet, "no progress bar");
  cmd->add_option("--fit", a->fit,
                  "fit a cost model to these files: steps.jsonl of eldr serve runs and/or "
                  "moe_layer_bench --benchmark_format=json output")
      ->expected(1, -1)
      ->check(NonEmptyPath());
  cmd->add_option("--derive", a->derive, "derive a bandwidth-bound cost model for a device: h200");
  cmd->add_option("--bandwidth", a->bandwidth, "--derive: memory bandwidth in bytes/s (default H200's 4.8e12)")
      ->check(InRange(kMemoryBandwidth));
  cmd->add_option("--cores", a->cores,
                  "--fit: the serve run's ranks shared this many CPU cores (0: a device per "
                  "rank); the fit removes the sharing and the model simulates it")
      ->check(InRange(kCores));
  cmd->add_option("--prefill-from", a->prefill_from,
                  "--fit: take prefill.a and prefill.b from this cost model YAML instead of fitting them (for logs "
                  "whose prefills all have one prompt length; the decode terms are still fitted)")
      ->check(NonEmptyPath());
  cmd->add_option("--model", a->model, "--fit/--derive: the model config YAML")->check(NonEmptyPath());
  cmd->add_option("--out,-o", a->out, "--fit/--derive: write the cost model YAML here (default: stdout)")
      ->check(NonEmptyPath());
  cmd->callback([=] {
    *action = [=]() -> Status {
      ELDR_RETURN_IF_ERROR(CheckModeOptions(*cmd));
      InstallInterruptHandlers();
      if (!a->fit.empty()) return RunFit(*a);
      if (!a->derive.empty()) return RunDerive(*a);
      return RunSimulation(*a, *cmd);
    };
  });
}

}  // namespace eldr::cli
