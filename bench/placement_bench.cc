// Expert-placement benchmarks on the real expert-load profiles in bench/data/expert-load-profiles.
//
//  - BM_Place/<algorithm>: the headline figure: placing the Qwen3-235B-A22B profile (94 MoE layers x 128
//    experts) into 160 slots (32 redundant) on 32 ranks in 4 nodes, 8 groups; target <= 5 ms per
//    placement on the 2-core dev machine. Counters: balancedness, group_locality.
//  - BM_PlaceWithPrevious/slack:S: eldr re-planning after the load drifts by up to ±20%, given the placement
//    in service, with move_slack S; counters moved_experts (with / without the previous placement) and
//    balancedness (idem).
//  - BM_Balancedness/<profile>/R<ranks>/X<redundant>: every algorithm on each profile for R in {8, 16, 32}
//    (N = 1, 2, 4 nodes), 0 or 32 redundant slots, G = 8; counters per algorithm. The same numbers are
//    printed as a table before the benchmarks run.
// Balancedness (DESIGN.md §3): Σ_layers mean rank load ÷ Σ_layers max rank load; group_locality: the share
// of each group's load served on a single node (placement/placement.h).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_provenance.h"
#include "placement/placement.h"
#include "runtime/common/check.h"
#include "runtime/common/json_util.h"

namespace eldr {
namespace {

constexpr int kNumGroups = 8;
constexpr PlacementAlgorithm kAlgorithms[] = {PlacementAlgorithm::kDeepSeekGlobal,
                                              PlacementAlgorithm::kDeepSeekHierarchical, PlacementAlgorithm::kEldr};

struct Profile {
  std::string name;
  int num_layers = 0, num_experts = 0;
  std::vector<double> load;  // [L, E]
};

const std::vector<Profile>& Profiles() {
  static const std::vector<Profile> profiles = [] {
    const std::string dir = std::string(ELDR_SOURCE_DIR) + "/bench/data/expert-load-profiles/";
    std::vector<Profile> out;
    for (const char* name : {"Qwen3-235B-A22B-Instruct-2507", "Qwen3-Coder-30B-A3B-Instruct", "GLM-4.5-Air"}) {
      Profile p;
      p.name = name;
      auto load =
          ReadLoadJson(dir + name + "_expert_scores_summary.json", "token_scores", &p.num_layers, &p.num_experts);
      ELDR_CHECK(load.ok(), load.status().message());
      p.load = std::move(load).value();
      out.push_back(std::move(p));
    }
    return out;
  }();
  return profiles;
}

PlacementProblem MakeProblem(const Profile& pr, int ranks, int redundant) {
  PlacementProblem p;
  p.num_layers = pr.num_layers;
  p.num_experts = pr.num_experts;
  p.load = pr.load;
  p.num_slots = pr.num_experts + redundant;
  p.num_ranks = ranks;
  p.num_nodes = ranks / 8;  // 8 ranks per node
  p.num_groups = kNumGroups;
  return p;
}

void BM_Place(benchmark::State& state, PlacementAlgorithm algorithm) {
  const PlacementProblem p = MakeProblem(Profiles()[0], 32, 32);
  Placement last;
  for (auto _ : state) {
    auto r = Place(p, algorithm);
    if (!r.ok()) {
      state.SkipWithError(r.status().message().c_str());
      return;
    }
    last = std::move(r).value();
    benchmark::DoNotOptimize(last.phy2log.data());
  }
  state.counters["balancedness"] = Balancedness(last, p.load);
  state.counters["group_locality"] = GroupLocality(last, p.load, p.num_groups, p.num_nodes);
}

// eldr re-planning after the load drifted by up to ±20%, given the placement in service; `slack` is
// PlacementProblem::move_slack (0: no layer's bottleneck above the fresh placement's).
void BM_PlaceWithPrevious(benchmark::State& state, double slack) {
  const PlacementProblem before = MakeProblem(Profiles()[0], 32, 32);
  const Placement in_service = Place(before, PlacementAlgorithm::kEldr).value();
  PlacementProblem now = before;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> drift(0.8, 1.2);
  for (auto& v : now.load) v *= drift(rng);
  now.move_slack = slack;
  Placement last;
  for (auto _ : state) {
    last = Place(now, PlacementAlgorithm::kEldr, &in_service).value();
    benchmark::DoNotOptimize(last.phy2log.data());
  }
  const Placement fresh = Place(now, PlacementAlgorithm::kEldr).value();
  state.counters["moved_experts"] = static_cast<double>(CountMoves(in_service, last).moved_experts);
  state.counters["moved_without_previous"] = static_cast<double>(CountMoves(in_service, fresh).moved_experts);
  state.counters["balancedness"] = Balancedness(last, now.load);
  state.counters["balancedness_without_previous"] = Balancedness(fresh, now.load);
}

struct Row {
  double balancedness[3];
  double locality[3];
};

Row Evaluate(const Profile& pr, int ranks, int redundant) {
  const PlacementProblem p = MakeProblem(pr, ranks, redundant);
  Row row{};
  for (int a = 0; a < 3; ++a) {
    const Placement pl = Place(p, kAlgorithms[a]).value();
    row.balancedness[a] = Balancedness(pl, p.load);
    row.locality[a] = GroupLocality(pl, p.load, p.num_groups, p.num_nodes);
  }
  return row;
}

void BM_Balancedness(benchmark::State& state, int profile, int ranks, int redundant) {
  Row row{};
  for (auto _ : state) row = Evaluate(Profiles()[profile], ranks, redundant);
  state.counters["global"] = row.balancedness[0];
  state.counters["hierarchical"] = row.balancedness[1];
  state.counters["eldr"] = row.balancedness[2];
  state.counters["eldr_locality"] = row.locality[2];
  state.counters["global_locality"] = row.locality[0];
}

void PrintTable() {
  std::vector<std::vector<std::string>> rows;
  for (const Profile& pr : Profiles()) {
    for (int ranks : {8, 16, 32}) {
      for (int redundant : {0, 32}) {
        const Row r = Evaluate(pr, ranks, redundant);
        rows.push_back({pr.name, std::to_string(ranks), std::to_string(ranks / 8), std::to_string(redundant),
                        Fmt(r.balancedness[0], 4), Fmt(r.balancedness[1], 4), Fmt(r.balancedness[2], 4),
                        Fmt(r.locality[0], 3), Fmt(r.locality[2], 3)});
      }
    }
  }
  std::printf("%s", ProvenanceHeader("placement_bench", nullptr).c_str());
  std::printf("# balancedness (1.0 = perfect) and group locality, G = %d, 8 ranks per node\n", kNumGroups);
  std::printf("%s\n", FormatTable({"profile", "ranks", "nodes", "redundant", "global", "hierarchical", "eldr",
                                   "loc_global", "loc_eldr"},
                                  rows)
                          .c_str());
}

void RegisterAll() {
  for (PlacementAlgorithm a : kAlgorithms) {
    benchmark::RegisterBenchmark((std::string("BM_Place/") + PlacementAlgorithmName(a)).c_str(), BM_Place, a)
        ->Unit(benchmark::kMillisecond);
  }
  for (double slack : {0.0, 0.005}) {
    const std::string name = "BM_PlaceWithPrevious/slack:" + std::to_string(slack).substr(0, 5);
    benchmark::RegisterBenchmark(name.c_str(), BM_PlaceWithPrevious, slack)->Unit(benchmark::kMillisecond);
  }
  const char* short_names[] = {"Qwen3-235B", "Qwen3-Coder-30B", "GLM-4.5-Air"};
  for (int pr = 0; pr < 3; ++pr) {
    for (int ranks : {8, 16, 32}) {
      for (int redundant : {0, 32}) {
        const std::string name = std::string("BM_Balancedness/") + short_names[pr] + "/R" + std::to_string(ranks) +
                                 "/X" + std::to_string(redundant);
        benchmark::RegisterBenchmark(name.c_str(), BM_Balancedness, pr, ranks, redundant)
            ->Unit(benchmark::kMillisecond)
            ->Iterations(1);
      }
    }
  }
}

}  // namespace
}  // namespace eldr

int main(int argc, char** argv) {
  eldr::bench::AddProvenanceContext();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  eldr::PrintTable();
  eldr::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
