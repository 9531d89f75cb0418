// The job configuration of `eldr serve` (and, later, `eldr simulate`), from YAML. Relative paths are
// resolved against the config file's directory, then the current directory.
//
//   topology:  {prefill_ranks: 1, decode_ranks: 4}        # world size = 1 (router) + prefill + decode
//   model:     {config: ../models/tiny.yaml, weights: synthetic, seed: 0, gate: replay}   # or a .safetensors
//   routing:   {policy: eldr, tau: 0.1, calibration: calibration.h5, admission_cap: 0, seed: 0}
//   kv_cache:  {block_size: 16, prefill_blocks: 4096, decode_blocks: 4096}
//   decode:    {max_batch: 64}
//   workload:  {trace: trace.h5, num_requests: 0, output_len: 0, request_rate: inf, burstiness: 1.0,
//               max_concurrency: 0, seed: 0}
//   output:    {dir: run}
//   watchdog_s: 120
#pragma once

#include <cstdint>
#include <string>

#include "runtime/common/status.h"
#include "runtime/router/router.h"

namespace eldr {

struct JobConfig {
  std::string path;  // the file it came from
  int prefill_ranks = 1;
  int decode_ranks = 1;
  std::string model_config;
  std::string weights = "synthetic";  // or a safetensors path
  uint64_t weight_seed = 0;
  bool replay_gates = true;           // gate source: the trace's routing (replay) or the model's router
  RoutingPolicy policy = RoutingPolicy::kEldr;
  double tau = -1;                    // < 0: the calibration's
  std::string calibration;
  int64_t admission_cap = 0;
  uint64_t routing_seed = 0;
  int block_size = 16;
  int prefill_blocks = 4096;
  int decode_blocks = 4096;
  int max_batch = 64;
  std::string trace;
  int64_t num_requests = 0;           // 0: every request of the trace once
  int64_t output_len = 0;             // 0: the trace's decode length (+1 for prefill's token); else fixed
  double request_rate = 0;            // requests/s; infinity (inf) = all at once
  double burstiness = 1.0;
  int64_t max_concurrency = 0;        // 0: unlimited
  uint64_t workload_seed = 0;
  std::string output_dir = "run";
  bool output_tokens = false;         // write each request's generated token ids to requests.jsonl
  double watchdog_s = 120;

  int world_size() const { return 1 + prefill_ranks + decode_ranks; }
  // Rank r's role: 0 router, [1, 1 + P) prefill, the rest decode.
  std::string RoleOf(int rank) const;
};

Result<JobConfig> LoadJobConfig(const std::string& path);
// The topology against the world size, with the numbers in the message.
Status CheckWorldSize(const JobConfig& c, int world_size);

}  // namespace eldr
