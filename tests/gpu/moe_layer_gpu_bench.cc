// GPU figure of DESIGN.md §1: one MoE layer's decode latency against the number of distinct experts the
// batch activates, in bf16, at batch 16 and 64, at two layer shapes: Qwen3-30B-A3B (hidden 2048,
// moe_intermediate 768, 128 experts, top-8; cases BM_MoeLayerDecode/experts:N/batch:B/manual_time) and
// DeepSeek-V2-Lite (hidden 2048, moe_intermediate 1408, 64 routed experts, top-6; cases BM_Dsv2LiteMoeLayer...,
// and ...Graph: eight layers' steps as one CUDA graph against the same steps launched one by one),
// the model of the simulator's H200 cost model (configs/costs/h200-deepseek-v2-lite.yaml), whose per-expert
// term b assumes the expert weights stream at the full 4.8 TB/s: the slope of these cases measures it.
//
// A step is what a decode worker runs for one MoE layer: the router GEMV and top-k (computed, then replaced by
// the forced routing below), and MoeExperts (grouping, permute, expert GEMMs, SwiGLU, combine). BM_MoeLayerDecode
// and BM_MoeLayerDecodeGemmPerExpert run the host schedule (cuBLAS, one host synchronisation per layer),
// BM_MoeLayerDecodeDeviceSchedule the device schedule (cuda_ops.h MoeExperts: tiles found on the device, no host
// synchronisation). Time is measured with CUDA events around the step (manual time), so host gaps inside the
// step count.
//
// Forcing exactly N distinct experts at batch B: token t's j-th expert is (t * top_k + j) mod N, distinct
// within a token (top_k <= N) and covering all N experts (B * top_k >= N for every case here).
//
// Counters: weight_TBps = bytes of the N experts' weights (3 * hidden * moe_intermediate bf16 each) / step
// time; frac_of_4.8TBps = weight_TBps / 4.8 (H200 HBM3e peak). BM_DeviceCopy measures a 1 GiB device-to-device
// cudaMemcpyAsync; its copy_TBps counts bytes read + written (the STREAM convention). The ratio 128/16 and
// weight bandwidth / copy bandwidth are computed from the JSON by tests/gpu/run_gpu_checks.sh.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"

namespace eldr::kernels::cuda {
namespace {

constexpr int kMaxBatch = 64;
constexpr double kPeakBytesPerSecond = 4.8e12;

// One MoE layer's shape (routed experts only: a shared expert is a fixed cost, not a distinct-expert one).
struct Shape {
  int hidden, intermediate, num_experts, top_k;
};
constexpr Shape kQwen3{2048, 768, 128, 8};
constexpr Shape kDsv2Lite{2048, 1408, 64, 6};

// The layer's weights and buffers, built on first use and kept for the process (never freed: the CUDA
// runtime may be gone by the time static destructors run).
struct Layer {
  Shape shape;
  Context ctx{0};
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  Bf16* router = nullptr;   // [num_experts, hidden]
  Bf16* experts = nullptr;  // [3, num_experts, intermediate * hidden]: gate, up, down
  ExpertWeights weights;
  float* x = nullptr;                   // [max_batch, hidden]
  float* out = nullptr;                 // [max_batch, hidden]
  float* logits = nullptr;              // [max_batch, num_experts]
  int32_t* gate_ids = nullptr;          // [max_batch, top_k]
  float* gate_weights = nullptr;        // [max_batch, top_k]
  int32_t* ids = nullptr;               // [max_batch, top_k] the forced routing
  float* topk_weights = nullptr;        // [max_batch, top_k]
  int* error = nullptr;                 // the device schedule's error word; null: the host schedule
  int* error_word = nullptr;            // device memory for it
  const void** device_table = nullptr;  // [3, num_experts] the expert pointers (ExpertWeights::device_table)

  explicit Layer(Shape s) : shape(s) {
    const int hidden = s.hidden, intermediate = s.intermediate, num_experts = s.num_experts, top_k = s.top_k;
    ELDR_CUDA_CHECK(cudaStreamCreate(&stream));
    ELDR_CUDA_CHECK(cudaEventCreate(&start));
    ELDR_CUDA_CHECK(cudaEventCreate(&stop));
    const int64_t per = static_cast<int64_t>(intermediate) * hidden;
    ELDR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&router), sizeof(Bf16) * num_experts * hidden));
    ELDR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&experts), sizeof(Bf16) * 3 * num_experts * per));
    FillUniformBf16(router, static_cast<int64_t>(num_experts) * hidden, 0.03f, 1, stream);
    FillUniformBf16(experts, 2 * num_experts * per, 0.038f, 2, stream);  // gate, up: ~sqrt(3 / hidden)
    FillUniformBf16(experts + 2 * num_experts * per, num_experts * per, 0.0625f, 3, stream);  // down: ~sqrt(3 / inter)
    weights.num_experts = num_experts;
    weights.hidden = hidden;
    weights.intermediate = intermediate;
    for (int e = 0; e < num_experts; ++e) {
      weights.gate_proj.push_back(experts + e * per);
      weights.up_proj.push_back(experts + (num_experts + e) * per);
      weights.down_proj.push_back(experts + (2 * num_experts + e) * per);
    }
    ELDR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&x), sizeof(float) * kMaxBatch * hidden));
    ELDR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), sizeof(float) * kMaxBatch * hidden));
    ELDR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&logits), sizeof(float) * kMaxBatch * num_experts));
    ELDR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&gate_ids), sizeof(int32_t) * kMaxBatch * top_k));
    ELDR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&gate_weights), sizeof(float) * kMaxBatch * top_k));
    ELDR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ids), sizeof(int32_t) * kMaxBatch * top_k));
    ELDR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&topk_weights), sizeof(float) * kMaxBatch * top_k));
    ELDR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&error_word), sizeof(int)));
    ELDR_CUDA_CHECK(cudaMemset(error_word, 0, sizeof(int)));
    // The pointer table resident on the device, as a serving worker keeps it (no per-call table copy).
    ELDR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_table), sizeof(void*) * 3 * num_experts));
    UploadExpertTable(weights, device_table, stream);
    weights.device_table = device_table;
    ctx.Reserve(MoeScratchBytes(kMaxBatch, top_k, num_experts, hidden, intermediate), stream);
    std::mt19937_64 rng(4);
    std::normal_distribution<float> g(0.f, 1.f);
    std::vector<float> hx(static_cast<size_t>(kMaxBatch) * hidden);
    for (float& v : hx) v = g(rng);
    ELDR_CUDA_CHECK(cudaMemcpy(x, hx.data(), sizeof(float) * hx.size(), cudaMemcpyHostToDevice));
    ELDR_CUDA_CHECK(cudaMemset(out, 0, sizeof(float) * kMaxBatch * hidden));
    ELDR_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  // Round-robin routing over the first `num_distinct` experts, equal weights.
  void ForceRouting(int batch, int num_distinct) {
    const int top_k = shape.top_k;
    std::vector<int32_t> h_ids(static_cast<size_t>(batch) * top_k);
    for (size_t i = 0; i < h_ids.size(); ++i) h_ids[i] = static_cast<int32_t>(i % num_distinct);
    std::vector<float> h_w(h_ids.size(), 1.f / top_k);
    ELDR_CUDA_CHECK(cudaMemcpy(ids, h_ids.data(), sizeof(int32_t) * h_ids.size(), cudaMemcpyHostToDevice));
    ELDR_CUDA_CHECK(cudaMemcpy(topk_weights, h_w.data(), sizeof(float) * h_w.size(), cudaMemcpyHostToDevice));
  }

  void Step(int batch) {
    const int hidden = shape.hidden, num_experts = shape.num_experts, top_k = shape.top_k;
    Linear(ctx, {x, router, logits, batch, hidden, num_experts}, stream);
    GateTopK({logits, batch, num_experts, top_k, true, gate_ids, gate_weights}, stream);
    MoeExperts(ctx, {x, ids, topk_weights, batch, top_k, &weights, out, error}, stream);
  }

  // Seconds of one call of `run` on the stream, by CUDA events.
  template <typename Run>
  double Time(Run run) {
    ELDR_CUDA_CHECK(cudaEventRecord(start, stream));
    run();
    ELDR_CUDA_CHECK(cudaEventRecord(stop, stream));
    ELDR_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    ELDR_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms * 1e-3;
  }
};

// The layer of each shape, built on its first case (device memory holds both: 1.2 + 1.1 GB of experts).
Layer& GetLayer(const Shape& shape) {
  static Layer* qwen3 = nullptr;
  static Layer* dsv2 = nullptr;
  Layer*& layer = shape.num_experts == kQwen3.num_experts ? qwen3 : dsv2;
  if (layer == nullptr) layer = new Layer(shape);
  return *layer;
}

void RunMoeLayer(benchmark::State& state, const Shape& shape, bool grouped, bool device_schedule = false) {
  const int num_distinct = static_cast<int>(state.range(0)), batch = static_cast<int>(state.range(1));
  Layer& layer = GetLayer(shape);
  if (grouped && !Context::GroupedGemmAvailable()) {
    state.SkipWithError("cuBLAS without cublasGemmGroupedBatchedEx");
    return;
  }
  layer.ctx.set_grouped_gemm(grouped);
  layer.error = device_schedule ? layer.error_word : nullptr;
  layer.ForceRouting(batch, num_distinct);
  for (int i = 0; i < 5; ++i) layer.Step(batch);  // warm-up: cuBLAS heuristics, scratch growth
  ELDR_CUDA_CHECK(cudaStreamSynchronize(layer.stream));
  double total = 0;
  for (auto _ : state) {
    const double s = layer.Time([&] { layer.Step(batch); });
    state.SetIterationTime(s);
    total += s;
  }
  int error = 0;
  ELDR_CUDA_CHECK(cudaMemcpy(&error, layer.error_word, sizeof(int), cudaMemcpyDeviceToHost));
  if (error != 0) {
    state.SkipWithError("the device schedule reported an error");
    return;
  }
  const double mean = total / static_cast<double>(state.iterations());
  const double bytes = static_cast<double>(num_distinct) * 3 * shape.hidden * shape.intermediate * sizeof(Bf16);
  state.counters["distinct_experts"] = num_distinct;
  state.counters["grouped_gemm"] = layer.ctx.grouped_gemm() ? 1 : 0;  // 0 if cuBLAS refused the grouped call
  state.counters["latency_us"] = mean * 1e6;
  state.counters["expert_weight_MB"] = bytes / 1e6;
  state.counters["weight_TBps"] = bytes / mean / 1e12;
  state.counters["frac_of_4.8TBps"] = bytes / mean / kPeakBytesPerSecond;
}

// kGraphLayers layer steps on the device schedule (nothing waits for the host), captured as one CUDA graph as a
// decode step's MoE layers would be, and the same steps launched one by one: latency_us is the graph's time per
// layer, eager_us the launched steps' (both by CUDA events around all kGraphLayers steps). The difference is what
// the launches of a layer's ~14 kernels cost.
constexpr int kGraphLayers = 8;
void RunMoeLayerGraph(benchmark::State& state, const Shape& shape) {
  const int num_distinct = static_cast<int>(state.range(0)), batch = static_cast<int>(state.range(1));
  Layer& layer = GetLayer(shape);
  layer.ctx.set_grouped_gemm(false);
  layer.error = layer.error_word;
  layer.ForceRouting(batch, num_distinct);
  const auto steps = [&] {
    for (int i = 0; i < kGraphLayers; ++i) layer.Step(batch);
  };
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  try {
    steps();  // warm-up
    ELDR_CUDA_CHECK(cudaStreamSynchronize(layer.stream));
    ELDR_CUDA_CHECK(cudaStreamBeginCapture(layer.stream, cudaStreamCaptureModeThreadLocal));
    steps();
    ELDR_CUDA_CHECK(cudaStreamEndCapture(layer.stream, &graph));
    ELDR_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  } catch (const std::exception& e) {
    state.SkipWithError((std::string("capture failed: ") + e.what()).c_str());
    return;
  }
  double eager = 0, total = 0;
  int64_t rounds = 0;
  for (auto _ : state) {
    eager += layer.Time(steps);
    const double s = layer.Time([&] { ELDR_CUDA_CHECK(cudaGraphLaunch(exec, layer.stream)); });
    state.SetIterationTime(s);
    total += s;
    ++rounds;
  }
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  int error = 0;
  ELDR_CUDA_CHECK(cudaMemcpy(&error, layer.error_word, sizeof(int), cudaMemcpyDeviceToHost));
  if (error != 0) {
    state.SkipWithError("the device schedule reported an error");
    return;
  }
  const double per_layer = total / static_cast<double>(rounds * kGraphLayers);
  const double bytes = static_cast<double>(num_distinct) * 3 * shape.hidden * shape.intermediate * sizeof(Bf16);
  state.counters["distinct_experts"] = num_distinct;
  state.counters["latency_us"] = per_layer * 1e6;
  state.counters["eager_us"] = eager / static_cast<double>(rounds * kGraphLayers) * 1e6;
  state.counters["frac_of_4.8TBps"] = bytes / per_layer / kPeakBytesPerSecond;
}

void BM_MoeLayerDecode(benchmark::State& state) { RunMoeLayer(state, kQwen3, Context::GroupedGemmAvailable()); }
void BM_MoeLayerDecodeGemmPerExpert(benchmark::State& state) { RunMoeLayer(state, kQwen3, false); }
void BM_MoeLayerDecodeDeviceSchedule(benchmark::State& state) { RunMoeLayer(state, kQwen3, false, true); }
void BM_Dsv2LiteMoeLayerDecode(benchmark::State& state) {
  RunMoeLayer(state, kDsv2Lite, Context::GroupedGemmAvailable());
}
void BM_Dsv2LiteMoeLayerDecodeDeviceSchedule(benchmark::State& state) { RunMoeLayer(state, kDsv2Lite, false, true); }
void BM_Dsv2LiteMoeLayerDecodeGraph(benchmark::State& state) { RunMoeLayerGraph(state, kDsv2Lite); }

BENCHMARK(BM_MoeLayerDecode)
    ->ArgNames({"experts", "batch"})
    ->ArgsProduct({{16, 32, 64, 128}, {16, 64}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MoeLayerDecodeGemmPerExpert)
    ->ArgNames({"experts", "batch"})
    ->ArgsProduct({{16, 32, 64, 128}, {16, 64}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MoeLayerDecodeDeviceSchedule)
    ->ArgNames({"experts", "batch"})
    ->ArgsProduct({{16, 32, 64, 128}, {16, 64}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
// DeepSeek-V2-Lite: batch 16 x top-6 = 96 >= 64 rows, so every count up to all 64 experts can be forced.
BENCHMARK(BM_Dsv2LiteMoeLayerDecode)
    ->ArgNames({"experts", "batch"})
    ->ArgsProduct({{8, 16, 32, 48, 64}, {16, 64}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Dsv2LiteMoeLayerDecodeDeviceSchedule)
    ->ArgNames({"experts", "batch"})
    ->ArgsProduct({{8, 16, 32, 48, 64}, {16, 64}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Dsv2LiteMoeLayerDecodeGraph)
    ->ArgNames({"experts", "batch"})
    ->ArgsProduct({{8, 16, 64}, {16}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_DeviceCopy(benchmark::State& state) {
  const size_t bytes = size_t{1} << 30;
  Layer& layer = GetLayer(kQwen3);
  static void* src = nullptr;
  static void* dst = nullptr;
  if (src == nullptr) {
    ELDR_CUDA_CHECK(cudaMalloc(&src, bytes));
    ELDR_CUDA_CHECK(cudaMalloc(&dst, bytes));
    ELDR_CUDA_CHECK(cudaMemset(src, 1, bytes));
    ELDR_CUDA_CHECK(cudaMemset(dst, 0, bytes));
  }
  auto copy = [&] { ELDR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, layer.stream)); };
  for (int i = 0; i < 2; ++i) copy();
  double total = 0;
  for (auto _ : state) {
    const double s = layer.Time(copy);
    state.SetIterationTime(s);
    total += s;
  }
  int error = 0;
  ELDR_CUDA_CHECK(cudaMemcpy(&error, layer.error_word, sizeof(int), cudaMemcpyDeviceToHost));
  if (error != 0) {
    state.SkipWithError("the device schedule reported an error");
    return;
  }
  const double mean = total / static_cast<double>(state.iterations());
  state.counters["copy_TBps"] = 2.0 * bytes / mean / 1e12;  // read + write
  state.counters["frac_of_4.8TBps"] = 2.0 * bytes / mean / kPeakBytesPerSecond;
}
BENCHMARK(BM_DeviceCopy)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace eldr::kernels::cuda

int main(int argc, char** argv) {
  using namespace eldr::kernels::cuda;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (DeviceCount() == 0) {
    std::fprintf(stderr, "moe_layer_gpu_bench: no CUDA device, nothing to measure\n");
    return 1;
  }
  cudaDeviceProp prop{};
  ELDR_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int runtime = 0, driver = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaDriverGetVersion(&driver);
  benchmark::AddCustomContext("device", prop.name);
  benchmark::AddCustomContext("cuda_runtime", std::to_string(runtime));
  benchmark::AddCustomContext("cuda_driver", std::to_string(driver));
  benchmark::AddCustomContext("cublas", std::to_string(CUBLAS_VERSION));
  benchmark::AddCustomContext("layer",
                              "Qwen3-30B-A3B MoE: hidden 2048, moe_intermediate 768, 128 experts, top-8, bf16");
  benchmark::AddCustomContext("peak_bandwidth", "4.8 TB/s (H200 HBM3e)");
#ifndef NDEBUG
  benchmark::AddCustomContext("warning", "assertions on (not a Release build): the numbers mean nothing");
#endif
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
