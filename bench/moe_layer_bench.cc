// MoE decode cost on this CPU (bench/README.md):
//  - BM_MoeLayer/experts:N/batch:B: one MoE layer (routed experts only) of the Qwen3-30B-A3B shape (hidden 2048,
//    moe_intermediate 768, 128 experts, top-8, fp32 weights: 2.4 GB) for a decode batch of B tokens whose
//    top-k sets cover exactly N distinct experts. Counter GBps = bytes of the N experts' weights / time.
//  - BM_Copy: a STREAM-like copy of 1 GiB (2 threads; GBps counts read + write bytes, as STREAM does), the
//    machine's attainable bandwidth; the MoE figures are reported as a fraction of it. BM_Read: read-only.
//  - BM_DemoDecode/batch:B: end-to-end decode steps of the CPU demo model (configs/models/cpu-demo.yaml).
#include <benchmark/benchmark.h>

#include <Eigen/Dense>
#include <cstring>
#include <memory>
#include <random>

#include "kernels/ops.h"
#include "runtime/common/parallel.h"
#include "runtime/kvcache/block_manager.h"
#include "runtime/model/executor.h"

namespace eldr {
namespace {

constexpr int kHidden = 2048, kInter = 768, kExperts = 128, kTopK = 8;

struct Layer {
  std::vector<float> weights;  // [E, 3, I, H]
  kernels::ExpertWeights view;
  Layer() : weights(static_cast<size_t>(kExperts) * 3 * kInter * kHidden) {
    ParallelFor(kExperts, [&](int64_t e) {
      std::mt19937_64 rng(e);
      std::normal_distribution<float> g(0.f, 0.02f);
      float* w = weights.data() + static_cast<size_t>(e) * 3 * kInter * kHidden;
      for (size_t i = 0; i < static_cast<size_t>(3) * kInter * kHidden; ++i) w[i] = g(rng);
    });
    view.num_experts = kExperts;
    view.hidden = kHidden;
    view.intermediate = kInter;
    for (int e = 0; e < kExperts; ++e) {
      const float* w = weights.data() + static_cast<size_t>(e) * 3 * kInter * kHidden;
      view.gate_proj.push_back({kernels::DType::kF32, w, kInter, kHidden});
      view.up_proj.push_back({kernels::DType::kF32, w + static_cast<size_t>(kInter) * kHidden, kInter, kHidden});
      view.down_proj.push_back({kernels::DType::kF32, w + 2 * static_cast<size_t>(kInter) * kHidden, kHidden, kInter});
    }
  }
};

Layer& SharedLayer() {
  static Layer layer;
  return layer;
}

void BM_Copy(benchmark::State& state) {
  const size_t n = (1u << 30) / sizeof(float);
  std::vector<float> a(n, 1.f), b(n, 0.f);
  const int threads = DefaultThreads();
  for (auto _ : state) {
    ParallelFor(
        threads,
        [&](int64_t t) {
          const size_t begin = n / threads * t, end = t == threads - 1 ? n : n / threads * (t + 1);
          std::memcpy(b.data() + begin, a.data() + begin, (end - begin) * sizeof(float));
        },
        threads);
    benchmark::ClobberMemory();
  }
  // STREAM counts a copy as read + write.
  const double bytes = 2.0 * n * sizeof(float);
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
  state.counters["GBps"] = benchmark::Counter(bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Copy)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

// Read-only streaming (a sum over 1 GiB, 2 threads): the limit for a kernel that only reads weights.
void BM_Read(benchmark::State& state) {
  const size_t n = (1u << 30) / sizeof(float);
  std::vector<float> a(n, 1.f);
  const int threads = DefaultThreads();
  std::vector<double> sums(threads);
  for (auto _ : state) {
    ParallelFor(
        threads,
        [&](int64_t t) {
          const size_t begin = n / threads * t, end = t == threads - 1 ? n : n / threads * (t + 1);
          sums[t] = Eigen::Map<const Eigen::VectorXf>(a.data() + begin, static_cast<Eigen::Index>(end - begin)).sum();
        },
        threads);
    benchmark::DoNotOptimize(sums.data());
  }
  const double bytes = static_cast<double>(n) * sizeof(float);
  state.counters["GBps"] = benchmark::Counter(bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Read)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

void BM_MoeLayer(benchmark::State& state) {
  const int N = static_cast<int>(state.range(0)), B = static_cast<int>(state.range(1));
  Layer& layer = SharedLayer();
  std::vector<int32_t> ids(static_cast<size_t>(B) * kTopK);
  std::vector<float> w(ids.size(), 1.f / kTopK);
  // Token t takes experts (t·k + j) mod N: distinct within a token (N ≥ k) and covering all N when B·k ≥ N.
  for (int t = 0; t < B; ++t) {
    for (int j = 0; j < kTopK; ++j) ids[t * kTopK + j] = (t * kTopK + j) % N;
  }
  std::mt19937_64 rng(1);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(B) * kHidden), out(x.size());
  for (auto& v : x) v = g(rng);
  for (auto _ : state) {
    std::fill(out.begin(), out.end(), 0.f);
    kernels::MoeExperts({x.data(), ids.data(), w.data(), B, kTopK, &layer.view, out.data()});
    benchmark::DoNotOptimize(out.data());
  }
  const double bytes = static_cast<double>(N) * 3 * kInter * kHidden * sizeof(float);
  state.counters["GBps"] = benchmark::Counter(bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["weight_MB"] = bytes / 1e6;
}
BENCHMARK(BM_MoeLayer)
    ->ArgsProduct({{16, 32, 64, 128}, {16, 64}})
    ->ArgNames({"experts", "batch"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(1.0);

void BM_DemoDecode(benchmark::State& state) {
  const int B = static_cast<int>(state.range(0));
  static auto config = LoadModelConfig(std::string(ELDR_SOURCE_DIR) + "/configs/models/cpu-demo.yaml");
  if (!config.ok()) {
    state.SkipWithError(config.status().message().c_str());
    return;
  }
  static ModelWeights weights = MakeSyntheticWeights(config.value(), SyntheticWeightOptions{}).value();
  const int block_size = 16, prompt = 64, steps = 32;
  const int blocks_per_seq = (prompt + steps + 8) / block_size + 1;
  Executor ex(weights, B * blocks_per_seq, block_size);
  BlockManager bm(B * blocks_per_seq, block_size);
  std::vector<std::vector<BlockId>> tables(B);
  std::vector<int32_t> next(B);
  for (int i = 0; i < B; ++i) {
    std::vector<int32_t> tokens(prompt);
    for (int t = 0; t < prompt; ++t) tokens[t] = (i * 977 + t * 31) % config->vocab_size;
    auto a = bm.AllocatePrompt(tokens).value();
    tables[i] = a.blocks;
    next[i] = ex.Prefill(tokens, a.blocks, 0, nullptr, nullptr).value().next_token;
  }
  int pos = prompt;
  int64_t distinct = 0, step_count = 0;
  for (auto _ : state) {
    if (pos >= prompt + steps) {  // rewind: the same KV slots are rewritten
      state.PauseTiming();
      pos = prompt;
      state.ResumeTiming();
    }
    std::vector<DecodeSequence> batch(B);
    for (int i = 0; i < B; ++i) {
      if (static_cast<int64_t>(tables[i].size()) * block_size <= pos) {
        if (!bm.AppendSlot(&tables[i], pos).ok()) state.SkipWithError("KV cache full");
      }
      batch[i] = {next[i], pos, &tables[i], nullptr};
    }
    auto r = ex.Decode(batch).value();
    next = r.next_tokens;
    distinct += r.total_distinct_experts();
    ++step_count;
    ++pos;
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(B) * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["distinct_experts_per_step"] = static_cast<double>(distinct) / std::max<int64_t>(step_count, 1);
}
BENCHMARK(BM_DemoDecode)->Arg(1)->Arg(16)->Arg(64)->ArgName("batch")->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace eldr
