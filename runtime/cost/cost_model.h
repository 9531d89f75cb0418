// The simulator's cost model (runtime/cost/, below sim/ and router/: the simulator and a cost-aware router read
// it): how long a prefill, a decode step and a KV transfer take.
//
//   decode step   t = a + b·distinct_experts + c·batch_tokens + d·context_tokens
//   prefill       t = a + b·computed_prompt_tokens
//   KV transfer   t = latency + bytes / bandwidth       (bytes: the prompt's K and V in the model's dtype)
//   control       every message to or from the router adds control_latency
//   cores         0 (default): every worker computes on its own device (a GPU per rank). N > 0: the workers
//                 share N CPU cores (`eldr serve` on one machine with more ranks than cores): processor
//                 sharing — while n workers compute, each progresses at min(1, N / n) of its own speed.
//
// distinct_experts is Σ over MoE layers of the experts the step's batch activates (DESIGN.md §3), the
// quantity the routing policy changes: a decode step streams each distinct expert's weights once.
//
// Where a model comes from:
//  - FitCostModel: least squares (non-negative coefficients) to measured steps — the steps.jsonl that
//    `eldr serve` writes (every prefill and decode step, timed on its rank), or the JSON of
//    `bench/moe_layer_bench --benchmark_format=json` (BM_MoeLayer/<distinct>/<batch> gives a, b, c per
//    MoE layer, scaled by the model's MoE layer count; d from the measured read bandwidth BM_Read and the
//    model's KV bytes per token).
//  - DeriveCostModel: from the model's bytes and a device's memory bandwidth and peak FLOP/s (a decode
//    step is bandwidth-bound: every distinct expert's weights, the dense weights and the KV are read once).
//  - YAML: configs/costs/*.yaml, or the `simulate:` section of a job config (inline keys override the
//    `cost_model:` file they name).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "runtime/common/status.h"
#include "runtime/common/yaml.h"
#include "runtime/model/model_config.h"

namespace eldr {

// The plausible hardware figures: the ranges the cost model's YAML keys, CheckCostModel, the measured read bandwidth
// of a moe_layer_bench fit and the --derive/--fit options accept. Generous on purpose: a figure outside is a typo
// or a unit slip (GB/s written as B/s), not a machine. A negative zero is refused (NumberRange::Physical).
// Link (kv_transfer.bandwidth_Bps), B/s: 1 MB/s (slow Ethernet) to 10 TB/s (beyond any NVLink); 0 = a KV transfer
// costs its latency only.
inline const NumberRange kLinkBandwidth =
    NumberRange::Physical(1e6, 1e13,
                          "bytes/s: 1 MB/s to 10 TB/s holds every network link, from slow Ethernet to beyond NVLink; "
                          "0: a transfer costs latency_s only")
        .OrZero();
// Memory (DeviceSpec::memory_bandwidth, --derive --bandwidth, BM_Read), B/s: 1 GB/s (one DDR channel) to 100 TB/s
// (20x an H200's 4.8 TB/s).
inline const NumberRange kMemoryBandwidth = NumberRange::Physical(
    1e9, 1e14, "bytes/s: 1 GB/s to 100 TB/s holds every memory, from one DDR channel to 20x an H200's HBM3e");
// Shared CPU cores (cores, --fit --cores): a 0.1-core container quota to 65536; 0 = a device per worker.
inline const NumberRange kCores =
    NumberRange::Physical(
        0.1, 65536, "CPU cores the workers share: from a 0.1-core container quota to 65536; 0: a device per worker")
        .OrZero();
// Every time (a coefficient, a latency), s: at most an hour (beyond that a model costs nothing real, and its sums
// overflow the metrics: 1e304 s per step printed ttft inf and null).
inline const NumberRange kCostSeconds = NumberRange::Physical(0, 3600, "");

struct CostModel {
  std::string name;
  std::string source;          // how the numbers were obtained (fit, derived, given)
  double decode_a = 0;         // s per step
  double decode_b = 0;         // s per distinct expert (summed over MoE layers)
  double decode_c = 0;         // s per sequence in the batch
  double decode_d = 0;         // s per context token attended
  double prefill_a = 0;        // s per prefill
  double prefill_b = 0;        // s per computed prompt token
  double kv_latency = 0;       // s per KV transfer
  double kv_bandwidth = 0;     // bytes/s (0: transfers take kv_latency only)
  double control_latency = 0;  // s per router message hop
  double cores = 0;            // shared CPU cores (0: a device per worker)

  double DecodeStep(double distinct, double batch, double context) const {
    return decode_a + decode_b * distinct + decode_c * batch + decode_d * context;
  }
  double Prefill(double tokens) const { return prefill_a + prefill_b * tokens; }
  double KvTransfer(double bytes) const { return kv_latency + (kv_bandwidth > 0 ? bytes / kv_bandwidth : 0.0); }
};

// Reads a cost model YAML (configs/costs/*.yaml). Errors name the file and key; a model whose decode terms are all 0
// (a step that takes no time) is InvalidArgument, here, in LoadJobCostModel and in CheckCostModel.
Result<CostModel> LoadCostModel(const std::string& path);
// The cost model of a job config's `simulate:` section: its `cost_model:` file (relative to the config)
// with the section's inline keys on top. NotFound when the section is missing.
Result<CostModel> LoadJobCostModel(const std::string& job_config_path);
// The keys of a job config's `simulate:` section (when it has one) against the schema LoadJobCostModel reads,
// without reading its cost_model file: what `eldr serve` checks (it runs no cost model, yet a misspelled key is an
// error there too). Errors: one "PATH:LINE: …" line naming the dotted key, as LoadJobCostModel's.
Status CheckJobCostKeys(const std::string& job_config_path);
// The coefficients against the ranges LoadCostModel accepts (kCostSeconds, kLinkBandwidth, kCores), so that a writer
// (--fit, --derive) never writes a model its reader refuses. InvalidArgument: "WHAT: decode.a = inf, must be in
// [0, 3600]" (and the range's reason).
Status CheckCostModel(const CostModel& m, const std::string& what);
// YAML text of a cost model (what LoadCostModel reads), with a comment header.
std::string CostModelYaml(const CostModel& m);

// Hardware figures for DeriveCostModel.
struct DeviceSpec {
  std::string name = "H200";
  double memory_bandwidth = 4.8e12;  // bytes/s (H200 SXM: 4.8 TB/s HBM3e)
  double peak_flops = 989e12;        // dense bf16 FLOP/s (H200 SXM)
  double mfu = 0.4;                  // achieved fraction of peak in prefill GEMMs
  double step_overhead = 30e-6;      // s per decode step (launches with CUDA graphs, sampling, scheduling)
  double link_bandwidth = 50e9;      // bytes/s for KV transfers (NVLink/IB per GPU pair; 50 GB/s ≈ 400 Gb/s IB)
  double link_latency = 20e-6;       // s per KV transfer
  double control_latency = 50e-6;    // s per router message (host-side MPI)
};
// A bandwidth-bound decode model: a = (dense weights + shared experts)/BW + overhead, b = expert bytes/BW,
// c = 2·active params/(peak·mfu) (the batch's compute, small), d = KV bytes per token/BW; prefill from FLOPs.
// Dtype: the model config's torch_dtype.
CostModel DeriveCostModel(const ModelConfig& model, const DeviceSpec& device);

// Whether decode steps identify b apart from the batch (distinct experts grow with the batch, so a pooled fit can
// credit the batch's cost to them or the reverse): the within-batch ("fixed effects") estimator. Steps are grouped
// by their source (one worker of one step log) and batch size; time, distinct experts and context are demeaned
// within each group; the demeaned time is regressed on the demeaned distinct experts and context (ordinary least
// squares, no intercept, no sign constraint). b then comes only from steps of one worker in one run whose distinct
// experts differ at the same batch (e.g. same-domain vs mixed batches). Grouping by source keeps what differs
// between runs or workers out of b: policies are run one after another on a shared machine, so a run that met a
// slower machine and had fewer distinct experts at each batch (a locality policy) would otherwise read as a
// negative b (seen in launch/demo: -0.16 +- 3.08 us by batch alone, 25.2 +- 3.7 us by run and batch).
struct WithinBatchFit {
  int steps = 0;            // decode steps in groups with >= 2 steps (the others carry no within variation)
  int groups = 0;           // such (source, batch size) groups
  double b = 0;             // s per distinct expert at a fixed batch (not clamped: negative means none)
  double b_se = 0;          // its standard error (homoscedastic least squares); 0 when undefined
  double d = 0;             // s per context token at a fixed batch
  double partial_r = 0;     // correlation of time and distinct experts at a fixed batch, context partialled out
  double within_share = 0;  // share of distinct experts' variance (about the mean of all steps) within the groups
  double t() const { return b_se > 0 ? b / b_se : 0.0; }
};
// x: [n, 4] rows (1, distinct, batch, context), y: [n] seconds (the decode samples of a fit), source: [n] the
// step's source (any id; steps of different sources are never compared), or empty: one source.
WithinBatchFit FitWithinBatch(const std::vector<double>& x, const std::vector<double>& y,
                              const std::vector<int64_t>& source = {});

struct FitReport {
  CostModel model;
  int decode_samples = 0, prefill_samples = 0;
  bool from_step_logs = false;  // the decode terms were fitted to steps.jsonl steps (not moe_layer_bench results)
  // prefill.a and prefill.b were given (FitCostModel's `prefill`), not fitted: the prefill samples were not used.
  std::string prefill_given_by;
  double decode_r2 = 0, prefill_r2 = 0;
  double decode_median_rel_error = 0;  // median |predicted − measured| / measured over the decode samples
  WithinBatchFit within_batch;         // from step logs (steps == 0 for moe_layer_bench input)
  std::string Summary() const;
};
// The fields of a steps.jsonl record, which runtime/job/metrics.cc AppendStepLine writes (its test checks it against
// these lists) and FitCostModel reads: any other field is refused.
inline constexpr std::string_view kStepFields[] = {"kind", "seconds", "time", "worker", "cpu_seconds"};
inline constexpr std::string_view kDecodeStepFields[] = {"batch", "context_tokens", "distinct_experts"};
inline constexpr std::string_view kPrefillStepFields[] = {"prompt_tokens"};

// Fits from `eldr serve` steps.jsonl files and/or moe_layer_bench JSON files (told apart by content).
// `model` gives the MoE layer count and KV bytes needed to scale bench figures. Coefficients are
// non-negative (a coefficient the data would make negative is fixed at 0 and the rest refitted).
// cores > 0: the steps ran on that many shared cores; each step's time is replaced by its work on a dedicated
// core: its cpu_seconds when the log has them (eldr serve writes them), else ∫ min(1, cores / n(t)) dt over
// its interval with n(t) the steps in progress (from the log's intervals, per file). The coefficients are
// then those of an unshared core; the model records `cores`.
// InvalidArgument naming the file and line for malformed input (a step's seconds outside [0, 3600]), when there are
// too few samples, or when the samples cannot separate two or more terms (a collinear design, e.g. distinct experts
// = 50·batch in every step: any split of the time between b and c fits as well). The last is one line naming the
// coefficients, the relation and the samples that would identify them: "the decode steps cannot tell decode.b (s per
// distinct expert) from decode.c (s per sequence): distinct experts = 50·batch in all 60 of them (...); add decode
// steps where the distinct experts vary at a fixed batch (...)".
// prefill: when set, the prefill terms are not fitted: prefill_a and prefill_b are copied from *prefill (e.g. a
// cost model of the same model on the same device, fitted to runs whose prompt lengths varied), the prefill samples
// are read but not used, and prefill_given_by = prefill->source. For logs whose prefills cannot identify the two
// prefill terms (one prompt length) while the decode steps are fine.
Result<FitReport> FitCostModel(const std::vector<std::string>& files, const ModelConfig& model, double cores = 0,
                               const CostModel* prefill = nullptr);

// Non-negative least squares for small problems (columns ≤ 8): min ‖Xβ − y‖ with β ≥ 0, by fixing
// negative coefficients at zero and refitting the rest. X is row-major [rows, cols]. Exposed for tests.
std::vector<double> NonNegativeLeastSquares(const std::vector<double>& x, const std::vector<double>& y, int cols);

}  // namespace eldr
