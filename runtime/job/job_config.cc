#include "runtime/job/job_config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <limits>

namespace eldr {

namespace fs = std::filesystem;

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

// Checks the fields read from c->path and sets the parsed gate source and policy.
Status Validate(const std::string& gate, const std::string& policy, JobConfig* c_out) {
  JobConfig& c = *c_out;
  const std::string& path = c.path;
  auto bad = [&](const std::string& m) { return Status::InvalidArgument(path + ": " + m); };
  if (c.prefill_ranks < 1 || c.decode_ranks < 1) return bad("topology needs at least 1 prefill and 1 decode rank");
  if (c.model_config.empty()) return bad("model.config (a model YAML) is required");
  if (c.trace.empty()) return bad("workload.trace (an HDF5 routing trace) is required");
  if (gate != "replay" && gate != "computed") return bad("model.gate must be replay or computed, got '" + gate + "'");
  c.replay_gates = gate == "replay";
  auto p = ParseRoutingPolicy(policy);
  if (!p.ok()) return p.status().WithPrefix(path);
  c.policy = p.value();
  if (UsesSignature(c.policy) && c.calibration.empty()) {
    return bad(std::string("routing.policy ") + policy + " needs routing.calibration (run 'eldr calibrate')");
  }
  if (c.block_size < 1 || c.block_size > 127) return bad("kv_cache.block_size must be in [1, 127]");
  if (c.prefill_blocks < 1 || c.decode_blocks < 1) return bad("kv_cache blocks must be positive");
  if (c.kv_transport != "auto" && c.kv_transport != "mpi" && c.kv_transport != "nccl") {
    return bad("kv_cache.transport must be auto, mpi or nccl, got '" + c.kv_transport + "'");
  }
  if (c.max_batch < 1) return bad("decode.max_batch must be >= 1");
  if (c.ep_size < 1) return bad("decode.ep_size must be >= 1, got " + std::to_string(c.ep_size));
  if (c.placement.empty()) return bad("decode.placement must be contiguous or a calibration.h5 path");
  if (c.num_requests < 0 || c.output_len < 0 || c.max_concurrency < 0 || c.admission_cap < 0) {
    return bad("workload counts and caps must be >= 0");
  }
  if (!(c.request_rate > 0)) return bad("workload.request_rate must be > 0 or inf");
  if (!(c.load_bound >= 0)) return bad("routing.load_bound must be >= 0 (0 = off)");
  if (!(c.burstiness > 0)) return bad("workload.burstiness must be > 0");
  if (!(c.watchdog_s > 0)) return bad("watchdog_s must be > 0");
  return Status::Ok();
}

// Relative paths: against the config file's directory `dir` when the file is there, else the working directory.
void ResolvePaths(const std::string& dir, JobConfig* c) {
  c->model_config = Resolve(dir, c->model_config);
  c->trace = Resolve(dir, c->trace);
  c->calibration = Resolve(dir, c->calibration);
  if (c->placement != "contiguous") c->placement = Resolve(dir, c->placement);
  if (c->weights != "synthetic") c->weights = Resolve(dir, c->weights);
}

}  // namespace

Result<JobConfig> LoadJobConfig(const std::string& path) {
  if (!fs::exists(path)) return Status::NotFound(path + ": no such file");
  YAML::Node y;
  try {
    y = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(path + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg);
  }
  if (!y.IsMap()) return Status::InvalidArgument(path + ": a job config must be a YAML mapping");
  JobConfig c;
  c.path = path;
  const std::string dir = fs::path(path).parent_path().string();
  Status error;
  auto field = [&](const char* section, const char* key) -> YAML::Node {
    if (!y[section] || !y[section].IsMap()) return YAML::Node(YAML::NodeType::Undefined);  // the default stays
    return y[section][key];
  };
  auto num = [&](const char* section, const char* key, auto* v) {
    if (!error.ok()) return;
    YAML::Node n = field(section, key);
    if (!n) return;
    try {
      using T = std::remove_pointer_t<decltype(v)>;
      if constexpr (std::is_floating_point_v<T>) {
        const std::string s = n.as<std::string>();
        *v = (s == "inf" || s == ".inf" || s == "infinity") ? std::numeric_limits<double>::infinity() : n.as<double>();
      } else {
        *v = n.as<T>();
      }
    } catch (const YAML::Exception&) {
      error = Status::InvalidArgument(path + ":" + std::to_string(n.Mark().line + 1) + ": " + section + "." + key +
                                      " must be a number");
    }
  };
  auto str = [&](const char* section, const char* key, std::string* v) {
    YAML::Node n = field(section, key);
    if (n && !n.IsNull()) *v = n.as<std::string>("");  // "key:" with no value keeps the default
  };
  num("topology", "prefill_ranks", &c.prefill_ranks);
  num("topology", "decode_ranks", &c.decode_ranks);
  str("model", "config", &c.model_config);
  str("model", "weights", &c.weights);
  num("model", "seed", &c.weight_seed);
  std::string gate = "replay";
  str("model", "gate", &gate);
  std::string policy = "eldr";
  str("routing", "policy", &policy);
  num("routing", "tau", &c.tau);
  num("routing", "load_bound", &c.load_bound);
  str("routing", "calibration", &c.calibration);
  num("routing", "admission_cap", &c.admission_cap);
  num("routing", "seed", &c.routing_seed);
  num("kv_cache", "block_size", &c.block_size);
  num("kv_cache", "prefill_blocks", &c.prefill_blocks);
  num("kv_cache", "decode_blocks", &c.decode_blocks);
  str("kv_cache", "transport", &c.kv_transport);
  num("decode", "max_batch", &c.max_batch);
  num("decode", "ep_size", &c.ep_size);
  str("decode", "placement", &c.placement);
  str("workload", "trace", &c.trace);
  num("workload", "num_requests", &c.num_requests);
  num("workload", "output_len", &c.output_len);
  num("workload", "request_rate", &c.request_rate);
  num("workload", "burstiness", &c.burstiness);
  num("workload", "max_concurrency", &c.max_concurrency);
  num("workload", "seed", &c.workload_seed);
  str("output", "dir", &c.output_dir);
  if (y["output"] && y["output"]["tokens"]) c.output_tokens = y["output"]["tokens"].as<bool>(false);
  if (y["watchdog_s"]) {
    try {
      c.watchdog_s = y["watchdog_s"].as<double>();
    } catch (const YAML::Exception&) {
      error = Status::InvalidArgument(path + ": watchdog_s must be a number");
    }
  }
  ELDR_RETURN_IF_ERROR(error);
  ELDR_RETURN_IF_ERROR(Validate(gate, policy, &c));
  ResolvePaths(dir, &c);
  return c;
}

RouterConfig JobRouterConfig(const JobConfig& c, const TraceShape& model_shape, const Trace& trace) {
  RouterConfig rc;
  rc.policy = c.policy;
  rc.num_decoders = c.decode_ranks;
  rc.tau = c.tau;
  rc.load_bound = c.load_bound;
  rc.admission_cap = c.admission_cap;
  rc.seed = c.routing_seed;
  rc.job_shape = model_shape;
  for (const auto& r : trace.requests) rc.domains.push_back(r.domain);
  return rc;
}

Status CheckWorldSize(const JobConfig& c, int world_size) {
  if (world_size != c.world_size()) {
    return Status::InvalidArgument(
        c.path + ": the topology needs " + std::to_string(c.world_size()) + " ranks (1 router + " +
        std::to_string(c.prefill_ranks) + " prefill + " + std::to_string(c.decode_ranks) + " decode" +
        (c.ep_size > 1 ? " x " + std::to_string(c.ep_size) + " EP ranks" : "") + ") but the job has " +
        std::to_string(world_size) + "; run with mpirun -np " + std::to_string(c.world_size()));
  }
  return Status::Ok();
}

}  // namespace eldr
