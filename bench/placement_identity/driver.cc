// Old-vs-new check of the eldr placer (bench/placement_identity/compare.sh builds this file twice, against two
// revisions of placement/). `driver dump FILE [N]` writes phy2log, logcnt and log2phy of every case to FILE:
// the 18 profile x ranks x redundancy cases of bench/placement_bench (with N = R/8 nodes and G = 8, and with one
// node and one group), N random problems (shapes, nodes, groups and load distributions with ties and zero
// layers), each placed fresh and then with the fresh placement as previous after a +-20% drift, at move_slack
// 0, 0.005 and 0.05. `driver time N` prints the median and minimum thread-CPU time of N BM_Place/eldr cases.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "placement/placement.h"
using namespace eldr;
struct Prof {
  int L, E;
  std::vector<double> load;
};
static std::vector<Prof> Profiles() {
  std::vector<Prof> out;
  const std::string dir =
      std::string(getenv("ELDR_PROFILES") ? getenv("ELDR_PROFILES") : "bench/data/expert-load-profiles") + "/";
  for (const char* n : {"Qwen3-235B-A22B-Instruct-2507", "Qwen3-Coder-30B-A3B-Instruct", "GLM-4.5-Air"}) {
    Prof p;
    auto l = ReadLoadJson(dir + n + "_expert_scores_summary.json", "token_scores", &p.L, &p.E);
    p.load = l.value();
    out.push_back(p);
  }
  return out;
}
static uint64_t h = 1469598103934665603ull;
static void Mix(const void* d, size_t n) {
  auto* c = (const unsigned char*)d;
  for (size_t i = 0; i < n; ++i) {
    h ^= c[i];
    h *= 1099511628211ull;
  }
}
static FILE* out;
static void Dump(const Placement& p) {
  fwrite(p.phy2log.data(), 4, p.phy2log.size(), out);
  fwrite(p.logcnt.data(), 4, p.logcnt.size(), out);
  fwrite(p.log2phy.data(), 4, p.log2phy.size(), out);
  Mix(p.phy2log.data(), 4 * p.phy2log.size());
  Mix(p.logcnt.data(), 4 * p.logcnt.size());
}
static long cases = 0;
static void Run(const PlacementProblem& pb, std::mt19937_64& rng) {
  auto r = Place(pb, PlacementAlgorithm::kEldr);
  if (!r.ok()) {
    fprintf(stderr, "fail %s\n", r.status().message().c_str());
    return;
  }
  Dump(r.value());
  ++cases;
  PlacementProblem now = pb;
  std::uniform_real_distribution<double> drift(0.8, 1.2);
  for (auto& v : now.load) v *= drift(rng);
  for (double slack : {0.0, 0.005, 0.05}) {
    now.move_slack = slack;
    auto q = Place(now, PlacementAlgorithm::kEldr, &r.value());
    Dump(q.value());
    ++cases;
  }
}
int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "dump";
  auto profs = Profiles();
  if (mode == "time") {
    int n = argc > 2 ? atoi(argv[2]) : 200;
    PlacementProblem p;
    p.num_layers = profs[0].L;
    p.num_experts = profs[0].E;
    p.load = profs[0].load;
    p.num_slots = p.num_experts + 32;
    p.num_ranks = 32;
    p.num_nodes = 4;
    p.num_groups = 8;
    std::vector<double> t;
    for (int i = 0; i < n; ++i) {
      timespec a, b;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
      auto r = Place(p, PlacementAlgorithm::kEldr);
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
      t.push_back((b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) * 1e-6);
      if (r.value().phy2log.empty()) return 1;
    }
    if (t.empty()) return 0;
    std::sort(t.begin(), t.end());
    printf("median %.4f ms min %.4f ms\n", t[t.size() / 2], t[0]);
    return 0;
  }
  out = fopen(argc > 2 ? argv[2] : "/tmp/eplb/dump.bin", "wb");
  std::mt19937_64 rng(12345);
  for (auto& pr : profs)
    for (int R : {8, 16, 32})
      for (int X : {0, 32}) {
        PlacementProblem p;
        p.num_layers = pr.L;
        p.num_experts = pr.E;
        p.load = pr.load;
        p.num_slots = pr.E + X;
        p.num_ranks = R;
        p.num_nodes = R / 8;
        p.num_groups = 8;
        Run(p, rng);
        p.num_nodes = 1;
        p.num_groups = 1;
        Run(p, rng);
      }
  int nrand = argc > 3 ? atoi(argv[3]) : 3000;
  for (int it = 0; it < nrand; ++it) {
    const int Es[] = {4, 8, 12, 16, 24, 32, 64, 128, 160, 256};
    int E = Es[rng() % 10];
    std::vector<int> Rs;
    for (int R = 1; R <= 64; ++R)
      if (R <= 2 * E) Rs.push_back(R);
    int R = Rs[rng() % Rs.size()];
    int spr_min = (E + R - 1) / R;
    int spr = spr_min + (int)(rng() % 4);
    if (spr > E) spr = E;
    int P = spr * R;
    if (P < E) continue;
    std::vector<int> Ns;
    for (int n = 1; n <= R; ++n)
      if (R % n == 0) Ns.push_back(n);
    int N = Ns[rng() % Ns.size()];
    std::vector<int> Gs;
    for (int g = 1; g <= E; ++g)
      if (E % g == 0) Gs.push_back(g);
    int G = Gs[rng() % Gs.size()];
    int L = 1 + rng() % 40;
    PlacementProblem p;
    p.num_layers = L;
    p.num_experts = E;
    p.num_slots = P;
    p.num_ranks = R;
    p.num_nodes = N;
    p.num_groups = G;
    p.load.resize((size_t)L * E);
    int dist = rng() % 6;
    std::exponential_distribution<double> ex(1.0);
    std::uniform_real_distribution<double> un(0, 1);
    std::lognormal_distribution<double> ln(0, 1.5);
    for (int l = 0; l < L; ++l) {
      bool zero_layer = rng() % 20 == 0;
      for (int e = 0; e < E; ++e) {
        double v;
        switch (dist) {
          case 0:
            v = un(rng);
            break;
          case 1:
            v = ex(rng);
            break;
          case 2:
            v = (double)(rng() % 4);
            break;
          case 3:
            v = ln(rng);
            break;
          case 4:
            v = 1.0 / (1 + (rng() % E));
            break;
          default:
            v = rng() % 3 == 0 ? 0.0 : (double)(rng() % 1000) / 997.0;
            break;
        }
        p.load[(size_t)l * E + e] = zero_layer ? 0.0 : v;
      }
    }
    Run(p, rng);
  }
  fclose(out);
  printf("cases %ld hash %016llx\n", cases, (unsigned long long)h);
}
