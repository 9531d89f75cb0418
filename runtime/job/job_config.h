// The job configuration of `eldr serve` and `eldr simulate`, from YAML. Relative paths are
// resolved against the config file's directory, then the current directory.
//
//   topology:  {prefill_ranks: 1, decode_ranks: 4}        # world size = 1 (router) + prefill + decode · ep_size
//   model:     {config: ../models/tiny.yaml, weights: synthetic, seed: 0, gate: replay}   # or a .safetensors
//   routing:   {policy: eldr, tau: 0.1, calibration: calibration.h5, admission_cap: 0, seed: 0,
//               load_bound: 0,       # ε of the bounded load (router.h); 0 or unset = off (eldr_tail: 0.25)
//               cost_model: FILE,    # eldr serve: its decode cost model (default: simulate: section, else derived)
//               harm_weight: 0.75}   # eldr's λ: weight of what a request adds to the running TPOTs
//              policy: eldr (the default: marginal cost, the predicted step-time increase from the decoder's expert
//              union, batch and context), eldr_paper (the published band: τ, in-flight counts), eldr_tail (the
//              band on decode-work loads bounded in work and sequences, overflow in distance order), locality_top1,
//              domain, jsq, p2c, round_robin, random
//   kv_cache:  {block_size: 16, prefill_blocks: 4096, decode_blocks: 4096, transport: auto}
//              transport: how KV goes from a prefill rank to its decoder (runtime/comm/kv_transport.h).
//              mpi: inside the KV message (KvMsg, after the decoder accepted the offer: runtime/serve/protocol.h
//              "KV handoff"). nccl: KvMsg carries the KV's size and checksum, the KV floats go over NCCL
//              point-to-point, staged host→device on the prefill rank and device→host on the decoder (the
//              executor is host-only today, so NCCL buys no copy yet: it is the data plane a GPU executor will
//              use). The NCCL communicator holds the worker ranks only: the router (rank 0) needs no GPU; every
//              worker uses the GPU its compute plan chose (compute: below). Asking for nccl on a build without
//              NCCL, or where a worker rank has no device or shares one, fails at start on every rank with one
//              line. auto: nccl when the binary has NCCL and every worker rank has a device of its own (agreed
//              collectively), else mpi. The transport used is metrics.json's "kv_transport".
//   decode:    {max_batch: 64, ep_size: 1, placement: contiguous}
//              ep_size G (1..1024): each decoder is an expert-parallel group of G ranks
//              (runtime/serve/expert_parallel.h); placement: `contiguous` (no redundant slots, expert e on EP rank e /
//              (E/G); needs E % G == 0) or a calibration.h5 written by `eldr place calib --calib ... --ranks G`:
//              decoder k uses /placement/cluster_k when present, else /placement/global.
//   workload:  {trace: trace.h5, num_requests: 0, output_len: 0, request_rate: inf, burstiness: 1.0,
//               max_concurrency: 0, seed: 0}
//   output:    {dir: run, tokens: false, replace: false}   # tokens: generated ids in requests.jsonl; replace: an
//                                                          #   earlier run in dir (else refused; job/metrics.h)
//   watchdog_s: 120                                       # >= 1; also the limit for every rank to load its weights
//   compute:   auto                                       # cpu | cuda | auto: where the worker ranks compute
//              (runtime/serve/compute_plan.h). One GPU per worker rank, chosen once (its local rank among the
//              node's worker ranks, modulo the devices it sees) and shared by the executor and the KV transport;
//              rank 0, the router, never uses a GPU. cuda: every worker rank must have a CUDA device of its own,
//              else the job fails at start naming the rank and host; auto: cuda when the build has CUDA, every
//              worker rank has a device of its own and the executor runs on the CUDA backend, else cpu. The
//              startup line and metrics.json ("compute") say which.
//   simulate:  {cost_model: ../costs/h200-deepseek-v2-lite.yaml}   # eldr simulate only (runtime/cost/cost_model.h):
//              a cost model file and/or inline keys decode: {a, b, c, d}, prefill: {a, b},
//              kv_transfer: {latency_s, bandwidth_Bps}, control_latency_s, cores
//
// Every key is checked (runtime/common/yaml.h YamlMap): an unknown or duplicate key, a section that is not a
// mapping, a value of the wrong type or out of range is one "PATH:LINE: …" error naming the dotted key.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "runtime/common/status.h"
#include "runtime/common/yaml.h"
#include "runtime/cost/cost_model.h"
#include "runtime/router/router.h"

namespace eldr {

// The valid values of the keys that the command line also overrides: `eldr serve` and `eldr simulate` check
// their options against the same ranges.
namespace job_limits {
inline const IntRange kRanks = IntRange::Between(1, 65536);  // topology.*
// decode.ep_size: the EP groups eldr places for (placement/placement.h kMaxPlacementRanks; a larger group could never
// get its /placement from `eldr place calib`).
inline const IntRange kEpSize = IntRange::Between(1, 1024);
inline const IntRange kCount = IntRange::AtLeast(0);  // workload counts, routing.admission_cap
// workload.output_len: at most the largest KV cache a decoder can have (kBlocks' 2^30 blocks of 127 tokens).
inline const IntRange kOutputLen = IntRange::Between(0, (int64_t{1} << 30) * 127);
inline const IntRange kBlocks = IntRange::Between(1, 1 << 30);    // kv_cache.*_blocks
inline const IntRange kMaxBatch = IntRange::Between(1, 1 << 20);  // decode.max_batch
inline const NumberRange kTau = NumberRange::AtLeast(0);          // routing.tau
inline const NumberRange kLoadBound = NumberRange::AtLeast(0);    // routing.load_bound
inline const NumberRange kHarm = NumberRange::Between(0, 1);      // routing.harm_weight (eldr's λ)
inline const NumberRange kRate = NumberRange::Above(0).OrInf();   // workload.request_rate (inf: all at once)
// workload.burstiness, the gamma shape of the gaps (CV² = 1/burstiness): at 1e6 the gaps are already even to 0.1 %,
// and beyond it rate x burstiness could overflow to a zero gap (every arrival at 0).
inline const NumberRange kBurstiness = {0, 1e6, true};
}  // namespace job_limits

struct JobConfig {
  std::string path;  // the file it came from
  int prefill_ranks = 1;
  int decode_ranks = 1;
  std::string model_config;
  std::string weights = "synthetic";  // or a safetensors path
  uint64_t weight_seed = 0;
  bool replay_gates = true;  // gate source: the trace's routing (replay) or the model's router
  RoutingPolicy policy = RoutingPolicy::kEldr;
  std::optional<double> tau;         // unset: the calibration's (0.1 without one)
  std::optional<double> load_bound;  // bounded-load ε (router.h); unset: the policy's DefaultLoadBound; 0 = off
  std::string calibration;
  double harm_weight = kHarmWeight;  // routing.harm_weight: eldr's λ (router.h)
  std::string routing_cost_model;    // routing.cost_model: eldr's decode cost model YAML (empty: see JobStepCost)
  int64_t admission_cap = 0;
  uint64_t routing_seed = 0;
  int block_size = 16;
  int prefill_blocks = 4096;
  int decode_blocks = 4096;
  std::string kv_transport = "auto";  // auto, mpi or nccl (kv_cache.transport)
  int max_batch = 64;
  int ep_size = 1;                       // ranks per decoder (an expert-parallel group when > 1)
  std::string placement = "contiguous";  // or a calibration.h5 path with /placement
  std::string trace;
  int64_t num_requests = 0;  // 0: every request of the trace once
  int64_t output_len = 0;    // 0: the trace's decode length (which counts the prefill's token); else fixed
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s; inf = all at once
  double burstiness = 1.0;
  int64_t max_concurrency = 0;  // 0: unlimited
  uint64_t workload_seed = 0;
  std::string output_dir = "run";
  bool output_tokens = false;   // write each request's generated token ids to requests.jsonl
  bool output_replace = false;  // replace an output.dir that holds an earlier run (job/metrics.h CommitRunDirectory)
  double watchdog_s = 120;
  std::string compute = "auto";  // cpu, cuda or auto (compute:)
  // Evaluation only, not a YAML key (`eldr simulate --route-on decode`): the router is handed each request's
  // decode-token expert counts instead of its prompt's, with a calibration fitted on decode tokens
  // (Calibration::features); the clairvoyant ceiling of any signature. Serve never sets it.
  bool route_on_decode = false;
  // The keys a command-line option replaced (eldr simulate, eldr serve): key → option, "kv_cache.decode_blocks" →
  // "--decode-blocks". Errors about a key's value name its option too (Key), since the file holds another value.
  std::map<std::string, std::string> overrides;

  // `key` as an error names it: "kv_cache.decode_blocks", or "kv_cache.decode_blocks (--decode-blocks)" when the
  // command line set it.
  std::string Key(const std::string& key) const;
  int world_size() const { return 1 + prefill_ranks + decode_ranks * ep_size; }
  // Rank r's role: 0 router, [1, 1 + P) prefill, then decoder k's group [1 + P + k·G, 1 + P + (k+1)·G):
  // "decode k" for its leader (the first rank, which rank 0 and the prefill ranks talk to) and "decode k ep i"
  // for EP rank i > 0 of the group.
  std::string RoleOf(int rank) const;
  // The rank of decoder k's leader.
  int DecoderLeaderRank(int decoder) const { return 1 + prefill_ranks + decoder * ep_size; }
  // The decoder whose group holds `rank`, or -1 for rank 0 and prefill ranks.
  int DecoderOfRank(int rank) const { return rank <= prefill_ranks ? -1 : (rank - 1 - prefill_ranks) / ep_size; }
};

Result<JobConfig> LoadJobConfig(const std::string& path);
// The router of a job (serve's rank 0 and the simulator): its policy, decoders, τ, load bound, admission cap
// and seed, the model's routing shape, and the trace's domain labels (domain policy groups).
RouterConfig JobRouterConfig(const JobConfig& c, const TraceShape& model_shape, const Trace& trace);
// The decode cost model eldr prices its routing in (nullopt for other policies): in `eldr simulate`, `simulated`
// (the model it simulates with: a simulation prices in the hardware it simulates); in serve (simulated null),
// routing.cost_model when set, else the job config's `simulate:` section, else one derived from the model config
// for the reference GPU (DeriveCostModel, bandwidth-bound). Errors name the file.
Result<std::optional<CostModel>> JobStepCost(const JobConfig& c, const CostModel* simulated);
// The topology against the world size, with the numbers in the message.
Status CheckWorldSize(const JobConfig& c, int world_size);

// An error about the file a config key names, prefixed with that key ("workload.trace: t.h5: no such file"), or
// with c.Key(key) when a command-line option set it ("workload.trace (--trace): t.h5: ..."). An error that does not
// start with the file's name is returned as it is.
Status ForKey(const JobConfig& c, const Status& st, const std::string& key, const std::string& file);

}  // namespace eldr
