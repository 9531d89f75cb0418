// Offline calibration benchmarks (bench/README.md). The headline figure is BM_CalibrateFit: the whole
// `eldr calibrate` fit for N = 1000 requests, L = 48, E = 128, top-8, K = 16 on a synthetic trace,
// greedy layer selection included (target <= 5 s, stretch <= 2 s on the 2-core dev machine). range(0) = the
// clusters' balance: 0 = by decode work (the default, WeightedCapacitatedAssignment), 1 = by request count.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "runtime/calib/balanced_kmeans.h"
#include "runtime/calib/calibrate.h"
#include "runtime/calib/calibration.h"
#include "runtime/signature/quality.h"
#include "runtime/trace/synth.h"

namespace eldr {
namespace {

const Trace& FitTrace() {
  static const Trace trace = [] {
    SynthOptions o;
    o.num_domains = 16;
    o.num_requests = 1000;
    o.num_layers = 48;
    o.num_experts = 128;
    o.top_k = 8;
    o.prompt_len_min = 64;
    o.prompt_len_max = 512;
    o.output_len_min = o.output_len_max = 128;
    o.seed = 1;
    return SynthesizeTrace(o).value();
  }();
  return trace;
}

CalibrateOptions FitOptions() {
  CalibrateOptions o;
  o.num_decoders = 16;
  o.progress = false;
  return o;
}

void BM_CalibrateFit(benchmark::State& state) {
  const Trace& t = FitTrace();  // synthesised once, outside the timed loop
  CalibrateOptions o = FitOptions();
  o.balance = state.range(0) == 0 ? ClusterBalance::kWork : ClusterBalance::kCount;
  state.SetLabel(ClusterBalanceName(o.balance));
  CalibrateReport rep;
  for (auto _ : state) {
    auto c = Calibrate(t, o, &rep);
    if (!c.ok()) state.SkipWithError(c.status().message().c_str());
    benchmark::DoNotOptimize(c);
  }
  state.counters["n_star"] = rep.n_star;
  state.counters["rho_selected"] = rep.rho_selected;
  state.counters["s_features"] = rep.seconds_features;
  state.counters["s_rho_greedy"] = rep.seconds_quality;
  state.counters["s_kmeans"] = rep.seconds_kmeans;
  state.counters["s_total"] = rep.seconds_total;
}
BENCHMARK(BM_CalibrateFit)
    ->Arg(0)
    ->Arg(1)
    ->Setup([](const benchmark::State&) { FitTrace(); })
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);

// Writing the calibration of the fit above (signatures [1000, D], decode profiles [1000, 48, 128], expert load
// [16, 48, 128]; ~45 MB of floats). range(0): 0 = the storage before issue 15 (shuffle + deflate 4 on every large
// dataset, one thread: the bytes HDF5's own pipeline wrote), 1 = CalibrationStorage{} on one thread, 2 =
// CalibrationStorage{} on DefaultThreads() threads. Counters: file_mb (the file written), dim (D).
const Calibration& FitCalibration() {
  static const Calibration calib = [] {
    CalibrateReport rep;
    return Calibrate(FitTrace(), FitOptions(), &rep).value();
  }();
  return calib;
}

void BM_CalibrationWrite(benchmark::State& state) {
  const Calibration& c = FitCalibration();
  CalibrationStorage storage;
  if (state.range(0) == 0) storage.signatures = storage.profiles = DatasetStorage{true, 4};
  storage.num_threads = state.range(0) == 2 ? 0 : 1;
  const std::string path =
      (std::filesystem::temp_directory_path() / ("eldr_bench_calib_" + std::to_string(getpid()) + ".h5")).string();
  for (auto _ : state) {
    const Status s = WriteCalibration(c, path, storage);
    if (!s.ok()) state.SkipWithError(s.message().c_str());
  }
  state.counters["file_mb"] = static_cast<double>(std::filesystem::file_size(path)) / 1e6;
  state.counters["dim"] = c.dim();
  std::filesystem::remove(path);
}
BENCHMARK(BM_CalibrationWrite)
    ->Setup([](const benchmark::State&) { FitCalibration(); })
    ->ArgName("storage")
    ->DenseRange(0, 2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Error of ρ from the default 20k sampled pairs against all N(N-1)/2 = 499500 pairs, for every greedy
// prefix of the fit's layer order (reported as the max and mean absolute error).
void BM_RhoSampleError(benchmark::State& state) {
  const Trace& t = FitTrace();
  CalibrateReport rep;
  auto c = Calibrate(t, FitOptions(), &rep);
  std::vector<int32_t> idx(t.requests.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
  RequestFeatures f = ComputeRequestFeatures(t, idx);
  auto feats = VariantFeatures(f, SignatureVariant::kCountIdf, c->signature.idf).value();
  const int n = f.num_requests, L = f.num_layers, E = f.num_experts;
  double max_err = 0, sum_err = 0;
  for (auto _ : state) {
    SignatureQuality all(feats, f.decode_profile, n, L, E, SampleRequestPairs(n, 0, 0));
    SignatureQuality sample(feats, f.decode_profile, n, L, E, SampleRequestPairs(n, 20000, 0));
    std::vector<uint8_t> mask(L, 0);
    max_err = sum_err = 0;
    for (int i = 0; i < L; ++i) {
      mask[rep.layer_order[i]] = 1;
      const double err = std::abs(all.Rho(mask) - sample.Rho(mask));
      max_err = std::max(max_err, err);
      sum_err += err;
    }
  }
  state.counters["rho_err_max"] = max_err;
  state.counters["rho_err_mean"] = sum_err / L;
}
BENCHMARK(BM_RhoSampleError)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

void BM_CapacitatedAssignment(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0)), k = static_cast<int>(state.range(1));
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0, 2);
  std::vector<double> cost(static_cast<size_t>(n) * k);
  for (auto& x : cost) x = u(rng);
  for (auto _ : state) benchmark::DoNotOptimize(CapacitatedAssignment(cost, n, k, ClusterCapacity(n, k)));
}
BENCHMARK(BM_CapacitatedAssignment)->Args({1000, 16})->Args({10000, 40})->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace eldr
