#include "runtime/job/job_config.h"

#include <filesystem>

#include "runtime/common/yaml.h"
#include "runtime/model/model_config.h"

namespace eldr {

namespace fs = std::filesystem;

std::string JobConfig::Key(const std::string& key) const {
  const auto it = overrides.find(key);
  return it == overrides.end() ? key : key + " (" + it->second + ")";
}

std::string JobConfig::RoleOf(int rank) const {
  if (rank == 0) return "router";
  if (rank <= prefill_ranks) return "prefill " + std::to_string(rank - 1);
  const int d = rank - 1 - prefill_ranks;
  const int ep_rank = d % ep_size;
  return "decode " + std::to_string(d / ep_size) + (ep_rank > 0 ? " ep " + std::to_string(ep_rank) : "");
}

namespace {

std::string Resolve(const std::string& base_dir, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  const fs::path near_config = fs::path(base_dir) / p;
  if (fs::exists(near_config)) return near_config.lexically_normal().string();
  return p;  // relative to the working directory
}

// The cross-key checks (the ranges of single keys are the schema's, in ReadJobYaml) and the parsed gate source
// and policy.
Status Validate(const std::string& gate, const std::string& policy, JobConfig* c_out) {
  JobConfig& c = *c_out;
  const std::string& path = c.path;
  auto bad = [&](const std::string& m) { return Status::InvalidArgument(path + ": " + m); };
  c.replay_gates = gate == "replay";
  auto p = ParseRoutingPolicy(policy);
  if (!p.ok()) return p.status().WithPrefix(path);
  c.policy = p.value();
  if (UsesSignature(c.policy) && c.calibration.empty()) {
    return bad(std::string("routing.policy ") + policy + " needs routing.calibration (run 'eldr calibrate')");
  }
  if (c.placement.empty()) return bad("decode.placement must be contiguous or a calibration.h5 path");
  // A key that names a file or directory is never empty: it would be read as the working directory or as nothing.
  for (const auto& [key, value] : {std::pair<const char*, const std::string*>{"model.config", &c.model_config},
                                   {"model.weights", &c.weights},
                                   {"workload.trace", &c.trace},
                                   {"output.dir", &c.output_dir}}) {
    if (value->empty()) return bad(std::string(key) + " is empty; give a path");
  }
  return Status::Ok();
}

// Every key of the job config against its schema (type, range, unknown and duplicate keys); `simulate:` is the
// cost model's (LoadJobCostModel checks it).
Status ReadJobYaml(const YAML::Node& y, JobConfig* c, std::string* gate, std::string* policy) {
  YamlMap root(c->path, y);
  YamlMap& topology = root.Section("topology");
  topology.Get("prefill_ranks", &c->prefill_ranks, job_limits::kRanks);
  topology.Get("decode_ranks", &c->decode_ranks, job_limits::kRanks);
  YamlMap& model = root.Section("model");
  model.Require("config");
  model.Get("config", &c->model_config);
  model.Get("weights", &c->weights);
  model.Get("seed", &c->weight_seed);
  model.Get("gate", gate, {"replay", "computed"});
  YamlMap& routing = root.Section("routing");
  routing.Get("policy", policy);
  routing.Get("tau", &c->tau, job_limits::kTau);
  routing.Get("load_bound", &c->load_bound, job_limits::kLoadBound);
  routing.Get("calibration", &c->calibration);
  routing.Get("admission_cap", &c->admission_cap, job_limits::kCount);
  routing.Get("seed", &c->routing_seed);
  routing.Get("cost_model", &c->routing_cost_model);
  routing.Get("harm_weight", &c->harm_weight, job_limits::kHarm);
  YamlMap& kv = root.Section("kv_cache");
  kv.Get("block_size", &c->block_size, IntRange::Between(1, 127));
  kv.Get("prefill_blocks", &c->prefill_blocks, job_limits::kBlocks);
  kv.Get("decode_blocks", &c->decode_blocks, job_limits::kBlocks);
  kv.Get("transport", &c->kv_transport, {"auto", "mpi", "nccl"});
  YamlMap& decode = root.Section("decode");
  decode.Get("max_batch", &c->max_batch, job_limits::kMaxBatch);
  decode.Get("ep_size", &c->ep_size, job_limits::kEpSize);
  decode.Get("placement", &c->placement);
  YamlMap& workload = root.Section("workload");
  workload.Require("trace");
  workload.Get("trace", &c->trace);
  workload.Get("num_requests", &c->num_requests, job_limits::kCount);
  workload.Get("output_len", &c->output_len, job_limits::kOutputLen);
  workload.Get("request_rate", &c->request_rate, job_limits::kRate);
  workload.Get("burstiness", &c->burstiness, job_limits::kBurstiness);
  workload.Get("max_concurrency", &c->max_concurrency, job_limits::kCount);
  workload.Get("seed", &c->workload_seed);
  YamlMap& output = root.Section("output");
  output.Get("dir", &c->output_dir);
  output.Get("tokens", &c->output_tokens);
  output.Get("replace", &c->output_replace);
  // At least 1 s: a rank is named as silent once it missed two heartbeats and rank 0's own stall allowance (serve.cc
  // "liveness"), about 0.6 s at this bound; a smaller watchdog would end jobs naming no rank.
  root.Get("watchdog_s", &c->watchdog_s, NumberRange::AtLeast(1));
  root.Get("compute", &c->compute, {"cpu", "cuda", "auto"});
  root.Allow("simulate");
  return root.Finish();
}

// Relative paths: inputs against the config file's directory `dir` when the file is there, else the working
// directory; output.dir (which need not exist yet) always against `dir`, as the configs' comments say.
void ResolvePaths(const std::string& dir, JobConfig* c) {
  if (!c->output_dir.empty() && !fs::path(c->output_dir).is_absolute()) {
    c->output_dir = (fs::path(dir) / c->output_dir).lexically_normal().string();
  }
  c->model_config = Resolve(dir, c->model_config);
  c->trace = Resolve(dir, c->trace);
  c->calibration = Resolve(dir, c->calibration);
  c->routing_cost_model = Resolve(dir, c->routing_cost_model);
  if (c->placement != "contiguous") c->placement = Resolve(dir, c->placement);
  if (c->weights != "synthetic") c->weights = Resolve(dir, c->weights);
}

}  // namespace

Result<JobConfig> LoadJobConfig(const std::string& path) {
  ELDR_ASSIGN_OR_RETURN(const YAML::Node y, LoadYamlFile(path, "a job config"));
  JobConfig c;
  c.path = path;
  std::string gate = "replay", policy = "eldr";
  ELDR_RETURN_IF_ERROR(ReadJobYaml(y, &c, &gate, &policy));
  ELDR_RETURN_IF_ERROR(Validate(gate, policy, &c));
  ResolvePaths(fs::path(path).parent_path().string(), &c);
  return c;
}

RouterConfig JobRouterConfig(const JobConfig& c, const TraceShape& model_shape, const Trace& trace) {
  RouterConfig rc;
  rc.policy = c.policy;
  rc.num_decoders = c.decode_ranks;
  rc.tau = c.tau;  // unset: the calibration's
  rc.load_bound = c.load_bound;
  rc.admission_cap = c.admission_cap;
  rc.seed = c.routing_seed;
  rc.job_shape = model_shape;
  rc.max_batch = c.max_batch;
  rc.harm_weight = c.harm_weight;
  rc.tokens_at_routing = 1;  // a request is routed when its prefill's token comes back (Frontend::OnFirstToken)
  for (const auto& r : trace.requests) rc.domains.push_back(r.domain);
  return rc;
}

Status ForKey(const JobConfig& c, const Status& st, const std::string& key, const std::string& file) {
  return st.WithPrefixIfAbout(file, c.Key(key));
}

Result<std::optional<CostModel>> JobStepCost(const JobConfig& c, const CostModel* simulated) {
  if (c.policy != RoutingPolicy::kEldr) return std::optional<CostModel>();
  if (simulated) return std::optional<CostModel>(*simulated);  // a simulation prices in the hardware it simulates
  if (!c.routing_cost_model.empty()) {
    auto m = LoadCostModel(c.routing_cost_model);
    if (!m.ok()) return ForKey(c, m.status(), "routing.cost_model", c.routing_cost_model);
    return std::optional<CostModel>(m.value());
  }
  auto m = LoadJobCostModel(c.path);
  if (m.ok()) return std::optional<CostModel>(m.value());
  if (m.status().code() != StatusCode::kNotFound) return m.status();
  // Neither: a bandwidth-bound model of the job's model on the reference GPU. Only its ratios decide (expert bytes
  // vs one more sequence vs context), which the model's shapes set.
  auto model = LoadModelConfig(c.model_config);
  if (!model.ok()) return ForKey(c, model.status(), "model.config", c.model_config);
  CostModel derived = DeriveCostModel(model.value(), DeviceSpec{});
  derived.source = "derived for routing (no routing.cost_model): " + derived.source;
  return std::optional<CostModel>(derived);
}

Status CheckWorldSize(const JobConfig& c, int world_size) {
  if (world_size != c.world_size()) {
    return Status::InvalidArgument(
        c.path + ": the topology needs " + std::to_string(c.world_size()) + " ranks (1 router + " +
        std::to_string(c.prefill_ranks) + " prefill + " + std::to_string(c.decode_ranks) + " decode" +
        (c.ep_size > 1 ? " x " + std::to_string(c.ep_size) + " EP ranks" : "") + ") but the job has " +
        std::to_string(world_size) + "; run with mpirun -np " + std::to_string(c.world_size()) + " (srun -n " +
        std::to_string(c.world_size()) + ")");
  }
  return Status::Ok();
}

}  // namespace eldr
