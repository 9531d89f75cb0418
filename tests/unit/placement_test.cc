// Expert placement: the DeepSeek EPLB README example, structural invariants as vLLM's EPLB tests check
// them, eldr's extra guarantees (no duplicate replica on a rank, balance at least DeepSeek's, zero moves
// for an unchanged load), hand-computed balancedness and moves, and the load readers.
#include "placement/placement.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "placement/placement_internal.h"
#include "runtime/common/hdf5.h"

namespace eldr {
namespace {

constexpr PlacementAlgorithm kAll[] = {PlacementAlgorithm::kDeepSeekGlobal, PlacementAlgorithm::kDeepSeekHierarchical,
                                       PlacementAlgorithm::kEldr};

// The README example of github.com/deepseek-ai/EPLB: 2 layers, 12 experts, 16 replicas, 4 groups, 2 nodes,
// 8 GPUs.
PlacementProblem ReadmeProblem() {
  PlacementProblem p;
  p.num_layers = 2;
  p.num_experts = 12;
  p.load = {90, 132, 40,  61, 104, 165, 39,  4,   73,  56, 183, 86,  //
            20, 107, 104, 64, 19,  197, 187, 157, 172, 86, 16,  27};
  p.num_slots = 16;
  p.num_ranks = 8;
  p.num_nodes = 2;
  p.num_groups = 4;
  return p;
}

Placement PlaceOrDie(const PlacementProblem& p, PlacementAlgorithm a, const Placement* previous = nullptr) {
  auto r = Place(p, a, previous);
  EXPECT_TRUE(r.ok()) << PlacementAlgorithmName(a) << ": " << r.status().message();
  return r.ok() ? std::move(r).value() : Placement{};
}

// Structural invariants (the checks of vLLM's EPLB tests, written independently of the code).
void ExpectValid(const PlacementProblem& p, const Placement& pl, const std::string& what) {
  const int L = p.num_layers, E = p.num_experts, P = p.num_slots;
  ASSERT_EQ(pl.num_layers, L) << what;
  ASSERT_EQ(pl.num_experts, E) << what;
  ASSERT_EQ(pl.num_slots, P) << what;
  ASSERT_EQ(pl.num_ranks, p.num_ranks) << what;
  ASSERT_EQ(pl.phy2log.size(), static_cast<size_t>(L) * P) << what;
  ASSERT_EQ(pl.logcnt.size(), static_cast<size_t>(L) * E) << what;
  ASSERT_GE(pl.max_replicas, 1) << what;
  ASSERT_EQ(pl.log2phy.size(), static_cast<size_t>(L) * E * pl.max_replicas) << what;
  int max_cnt = 0;
  for (int l = 0; l < L; ++l) {
    std::vector<int> seen(E, 0);
    for (int s = 0; s < P; ++s) {
      const int e = pl.phy2log[l * P + s];
      ASSERT_GE(e, 0) << what;
      ASSERT_LT(e, E) << what;
      ++seen[e];
    }
    int sum = 0;
    for (int e = 0; e < E; ++e) {
      const int c = pl.logcnt[l * E + e];
      ASSERT_GE(c, 1) << what << " layer " << l << " expert " << e;
      ASSERT_EQ(c, seen[e]) << what << " layer " << l << " expert " << e;
      sum += c;
      max_cnt = std::max(max_cnt, c);
      // log2phy: logcnt distinct slots that hold e, then -1 padding.
      std::vector<int> listed;
      for (int k = 0; k < pl.max_replicas; ++k) {
        const int s = pl.log2phy[(static_cast<size_t>(l) * E + e) * pl.max_replicas + k];
        if (k < c) {
          ASSERT_GE(s, 0) << what;
          ASSERT_LT(s, P) << what;
          ASSERT_EQ(pl.phy2log[l * P + s], e) << what << " layer " << l << " expert " << e;
          listed.push_back(s);
        } else {
          ASSERT_EQ(s, -1) << what;
        }
      }
      std::sort(listed.begin(), listed.end());
      ASSERT_EQ(std::unique(listed.begin(), listed.end()), listed.end()) << what;
    }
    ASSERT_EQ(sum, P) << what;
  }
  ASSERT_EQ(pl.max_replicas, max_cnt) << what;
}

bool HasDuplicateOnRank(const Placement& pl) {
  const int spr = pl.num_slots / pl.num_ranks;
  for (int l = 0; l < pl.num_layers; ++l) {
    for (int r = 0; r < pl.num_ranks; ++r) {
      std::vector<int> ids(pl.phy2log.begin() + l * pl.num_slots + r * spr,
                           pl.phy2log.begin() + l * pl.num_slots + (r + 1) * spr);
      std::sort(ids.begin(), ids.end());
      if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) return true;
    }
  }
  return false;
}

// Skewed loads: log-normal with a few very hot experts (as real expert-load profiles are).
std::vector<double> SkewedLoad(int L, int E, uint64_t seed, double sigma = 1.2) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, sigma);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<double> load(static_cast<size_t>(L) * E);
  for (auto& v : load) v = std::exp(normal(rng)) * (uniform(rng) < 0.03 ? 8.0 : 1.0);
  return load;
}

PlacementProblem Problem(int L, int E, int P, int R, int N, int G, std::vector<double> load) {
  PlacementProblem p;
  p.num_layers = L;
  p.num_experts = E;
  p.load = std::move(load);
  p.num_slots = P;
  p.num_ranks = R;
  p.num_nodes = N;
  p.num_groups = G;
  return p;
}

// Sets an environment variable for the life of the guard and restores it after (also when an assertion returns).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old) saved_ = old;
    had_ = old != nullptr;
    Set(value);
  }
  ~ScopedEnv() { had_ ? Set(saved_.c_str()) : (void)unsetenv(name_); }
  void Set(const char* value) { setenv(name_, value, 1); }

 private:
  const char* name_;
  std::string saved_;
  bool had_ = false;
};

// Shapes used by the randomised tests: {E, P, R, N, G}.
struct Shape {
  int E, P, R, N, G;
};
constexpr Shape kShapes[] = {{12, 16, 8, 2, 4},  {16, 16, 4, 2, 4},    {16, 24, 8, 1, 1},   {32, 40, 8, 2, 8},
                             {64, 80, 16, 4, 8}, {128, 160, 32, 4, 8}, {128, 128, 8, 1, 8}, {8, 24, 4, 2, 2},
                             {6, 12, 3, 1, 2},   {20, 30, 5, 1, 4}};

// ---------------------------------------------------------------------------------------------------------

TEST(PlacementTest, ParsesAlgorithmNames) {
  for (PlacementAlgorithm a : kAll) {
    auto r = ParsePlacementAlgorithm(PlacementAlgorithmName(a));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.value(), a);
  }
  auto bad = ParsePlacementAlgorithm("eplb");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'eplb'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("deepseek-hierarchical"), std::string::npos);
}

TEST(PlacementTest, DeepSeekHierarchicalReproducesReadmeExample) {
  const PlacementProblem p = ReadmeProblem();
  const Placement pl = PlaceOrDie(p, PlacementAlgorithm::kDeepSeekHierarchical);
  ExpectValid(p, pl, "readme");
  // README.md of deepseek-ai/EPLB, "# Output:".
  const std::vector<int32_t> phy2log = {5, 6,  5, 7, 8, 4,  3, 4, 10, 9, 10, 2, 0, 1, 11, 1,  //
                                        7, 10, 6, 8, 6, 11, 8, 9, 2,  4, 5,  1, 5, 0, 3,  1};
  EXPECT_EQ(pl.phy2log, phy2log);
  // eplb.py's logcnt: the replica counts of that output.
  const std::vector<int32_t> logcnt = {1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1,  //
                                       1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1};
  EXPECT_EQ(pl.logcnt, logcnt);
  // eplb.py's log2phy lists the original slot first, then the copies: in layer 0, node 0 holds groups 1
  // and 2 (experts 3..8) and copies experts 5 (165) and 4 (104); packing 82.5, 82.5, 73, 61, 52, 52, 39, 4
  // onto its 4 GPUs puts expert 4's original replica in slot 7 and its copy in slot 5.
  ASSERT_EQ(pl.max_replicas, 2);
  const std::vector<int32_t> log2phy = {12, -1, 15, 13, 11, -1, 6,  -1, 7, 5,  0,  2,  1, -1, 3, -1,  //
                                        4,  -1, 9,  -1, 8,  10, 14, -1,                               //
                                        13, -1, 15, 11, 8,  -1, 14, -1, 9, -1, 10, 12, 2, 4,  0, -1,  //
                                        6,  3,  7,  -1, 1,  -1, 5,  -1};
  EXPECT_EQ(pl.log2phy, log2phy);
}

TEST(PlacementTest, DeepSeekGlobalFollowsEplbAndMayDuplicateOnARank) {
  // eplb.py rebalance_experts(weight, 16, 1, 1, 8) on the README weights, traced by hand with the
  // documented tie rule: 16 replicas onto 8 GPUs without groups. It puts both replicas of expert 1 of
  // layer 0 on GPU 7 (slots 14, 15): the public algorithm allows a duplicate on one rank.
  PlacementProblem p = ReadmeProblem();
  const Placement pl = PlaceOrDie(p, PlacementAlgorithm::kDeepSeekGlobal);
  ExpectValid(p, pl, "global");
  const std::vector<int32_t> phy2log = {10, 6,  10, 7, 0, 2,  11, 4, 5, 9, 5, 4, 8, 3, 1, 1,  //
                                        1,  10, 2,  4, 5, 11, 5,  0, 6, 7, 6, 3, 8, 8, 9, 7};
  EXPECT_EQ(pl.phy2log, phy2log);
  EXPECT_TRUE(HasDuplicateOnRank(pl));
  // Global ignores groups and nodes, so a grouping the hierarchy could not use gives the same result.
  p.num_groups = 3;
  EXPECT_EQ(PlaceOrDie(p, PlacementAlgorithm::kDeepSeekGlobal).phy2log, phy2log);

  const Placement eldr = PlaceOrDie(ReadmeProblem(), PlacementAlgorithm::kEldr);
  ExpectValid(ReadmeProblem(), eldr, "eldr");
  EXPECT_FALSE(HasDuplicateOnRank(eldr));
  EXPECT_GE(Balancedness(eldr, p.load), Balancedness(pl, p.load) - 1e-12);
}

TEST(PlacementTest, InvariantsOnRandomSkewedLoads) {
  uint64_t seed = 1;
  for (const Shape& s : kShapes) {
    const PlacementProblem p = Problem(5, s.E, s.P, s.R, s.N, s.G, SkewedLoad(5, s.E, seed++));
    for (PlacementAlgorithm a : kAll) {
      const std::string what = std::string(PlacementAlgorithmName(a)) + " E=" + std::to_string(s.E) +
                               " P=" + std::to_string(s.P) + " R=" + std::to_string(s.R);
      ExpectValid(p, PlaceOrDie(p, a), what);
    }
  }
}

TEST(PlacementTest, HottestExpertGetsReplicatedWhenThereIsSlack) {
  // Expert 7 carries 40% of the load; 4 spare slots (2 per node for the hierarchy).
  std::vector<double> load(16, 1.0);
  load[7] = 10.0;
  const PlacementProblem p = Problem(1, 16, 20, 4, 2, 4, load);
  for (PlacementAlgorithm a : kAll) {
    const Placement pl = PlaceOrDie(p, a);
    ExpectValid(p, pl, PlacementAlgorithmName(a));
    EXPECT_GE(pl.logcnt[7], 2) << PlacementAlgorithmName(a);
    EXPECT_EQ(*std::max_element(pl.logcnt.begin(), pl.logcnt.end()), pl.logcnt[7]) << PlacementAlgorithmName(a);
  }
}

TEST(PlacementTest, EqualLoadsWithoutSpareSlotsAreNotReplicated) {
  const PlacementProblem p = Problem(3, 16, 16, 4, 2, 4, std::vector<double>(48, 5.0));
  for (PlacementAlgorithm a : kAll) {
    const Placement pl = PlaceOrDie(p, a);
    ExpectValid(p, pl, PlacementAlgorithmName(a));
    EXPECT_EQ(pl.max_replicas, 1) << PlacementAlgorithmName(a);
    for (int32_t c : pl.logcnt) EXPECT_EQ(c, 1) << PlacementAlgorithmName(a);
    EXPECT_DOUBLE_EQ(Balancedness(pl, p.load), 1.0) << PlacementAlgorithmName(a);
  }
}

void ExpectInvalid(const PlacementProblem& p, PlacementAlgorithm a, const std::vector<std::string>& words) {
  auto r = Place(p, a);
  ASSERT_FALSE(r.ok()) << PlacementAlgorithmName(a);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().message();
  for (const auto& w : words) EXPECT_NE(r.status().message().find(w), std::string::npos) << r.status().message();
}

TEST(PlacementTest, RejectsInconsistentCountsWithClearErrors) {
  const auto base = [] { return Problem(1, 16, 20, 4, 2, 4, std::vector<double>(16, 1.0)); };
  for (PlacementAlgorithm a : kAll) {
    auto p = base();
    p.num_slots = 18;  // 18 slots onto 4 ranks
    ExpectInvalid(p, a, {"P = 18", "R = 4"});
    p = base();
    p.num_ranks = 5;  // 20 slots on 5 ranks, 5 ranks on 2 nodes
    ExpectInvalid(p, a, {"R = 5", "N = 2"});
    p = base();
    p.num_groups = 3;  // 16 experts in 3 groups
    ExpectInvalid(p, a, {"E = 16", "G = 3"});
    p = base();
    p.num_slots = 12;  // fewer slots than experts
    ExpectInvalid(p, a, {"P = 12", "E = 16"});
    p = base();
    p.load[3] = -1.0;
    ExpectInvalid(p, a, {"expert 3", ">= 0"});
    p = base();
    p.load[5] = std::numeric_limits<double>::quiet_NaN();
    ExpectInvalid(p, a, {"expert 5", "finite"});
    p = base();
    p.load.pop_back();
    ExpectInvalid(p, a, {"15 values", "E = 16"});
    p = base();
    p.num_ranks = 0;
    ExpectInvalid(p, a, {"R = 0"});
  }
  // Only the hierarchy needs whole groups per node: 2 groups cannot be split over 4 nodes.
  auto p = Problem(1, 16, 16, 4, 4, 2, std::vector<double>(16, 1.0));
  ExpectInvalid(p, PlacementAlgorithm::kDeepSeekHierarchical, {"G = 2", "N = 4"});
  EXPECT_TRUE(Place(p, PlacementAlgorithm::kDeepSeekGlobal).ok());
  EXPECT_TRUE(Place(p, PlacementAlgorithm::kEldr).ok());
  // eldr cannot keep 8 slots per rank free of duplicates with 6 experts.
  p = Problem(1, 6, 16, 2, 1, 1, std::vector<double>(6, 1.0));
  ExpectInvalid(p, PlacementAlgorithm::kEldr, {"P/R = 8", "E = 6"});
  EXPECT_TRUE(Place(p, PlacementAlgorithm::kDeepSeekGlobal).ok());
  // A previous placement of another shape.
  p = base();
  const Placement other =
      PlaceOrDie(Problem(1, 16, 16, 4, 2, 4, std::vector<double>(16, 1.0)), PlacementAlgorithm::kEldr);
  auto r = Place(p, PlacementAlgorithm::kEldr, &other);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("P = 16"), std::string::npos) << r.status().message();
}

TEST(PlacementTest, EldrNeverPutsTwoReplicasOfAnExpertOnOneRank) {
  uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    for (double sigma : {0.5, 1.5, 3.0}) {  // sigma 3: a few experts want many replicas
      const PlacementProblem p = Problem(4, s.E, s.P, s.R, s.N, s.G, SkewedLoad(4, s.E, seed++, sigma));
      const Placement pl = PlaceOrDie(p, PlacementAlgorithm::kEldr);
      ExpectValid(p, pl, "eldr");
      EXPECT_FALSE(HasDuplicateOnRank(pl)) << "E=" << s.E << " P=" << s.P << " R=" << s.R << " sigma=" << sigma;
    }
  }
  // One expert with nearly all the load and 3 spare slots per rank: it wants more replicas than ranks, so
  // it is capped at one per rank (4), and the other slots still hold distinct experts.
  std::vector<double> load(8, 0.01);
  load[2] = 100;
  const PlacementProblem p = Problem(1, 8, 16, 4, 1, 1, load);
  const Placement pl = PlaceOrDie(p, PlacementAlgorithm::kEldr);
  ExpectValid(p, pl, "capped");
  EXPECT_EQ(pl.logcnt[2], 4);
  EXPECT_FALSE(HasDuplicateOnRank(pl));
  EXPECT_TRUE(HasDuplicateOnRank(PlaceOrDie(p, PlacementAlgorithm::kDeepSeekGlobal)));
}

TEST(PlacementTest, EldrIsAtLeastAsBalancedAsDeepSeekOnSkewedLoads) {
  // Balancedness over 60 random skewed layers per shape. Not a per-layer guarantee: where eplb.py puts k
  // copies of an expert on one rank, that rank carries k shares, an unequal split that no placement with
  // distinct ranks and equal shares reproduces, so a single layer can come out slightly better for it.
  // With 2 slots per rank (the README shape) this holds for about 97% of such problems, so those shapes
  // are left to the README example (DeepSeekGlobalFollowsEplbAndMayDuplicateOnARank).
  uint64_t seed = 1000;
  for (const Shape& s : kShapes) {
    if (s.P / s.R <= 2) continue;
    const PlacementProblem p = Problem(60, s.E, s.P, s.R, s.N, s.G, SkewedLoad(60, s.E, seed++));
    const double eldr = Balancedness(PlaceOrDie(p, PlacementAlgorithm::kEldr), p.load);
    const double global = Balancedness(PlaceOrDie(p, PlacementAlgorithm::kDeepSeekGlobal), p.load);
    EXPECT_GE(eldr, global) << "E=" << s.E << " P=" << s.P << " R=" << s.R << " seed=" << seed - 1;
    if (s.G % s.N == 0) {
      const double hier = Balancedness(PlaceOrDie(p, PlacementAlgorithm::kDeepSeekHierarchical), p.load);
      EXPECT_GE(eldr, hier) << "E=" << s.E << " P=" << s.P << " R=" << s.R << " seed=" << seed - 1;
    }
  }
}

// The one-pass magnitude sort of the eldr placer must give the order of a stable sort by descending key:
// wide and narrow ranges, ties, zeros, keys that share a bucket and keys far below the largest.
TEST(PlacementTest, MagnitudeSortIsAStableDescendingSort) {
  std::mt19937_64 rng(15);
  placement_internal::MagnitudeSortScratch scratch;
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 300);
    std::vector<double> key(n);
    const int kind = trial % 5;
    std::lognormal_distribution<double> wide(0.0, kind == 0 ? 8.0 : 1.5);
    std::uniform_real_distribution<double> narrow(1.0, 1.05);
    for (double& k : key) {
      if (kind == 2) {
        k = narrow(rng);  // every key in one or two buckets
      } else if (kind == 3) {
        k = static_cast<double>(rng() % 4);  // ties and zeros
      } else {
        k = wide(rng) * (rng() % 7 == 0 ? 0.0 : 1.0);
      }
    }
    if (kind == 4) key[rng() % n] = 1e300;  // everything else far below the largest
    std::vector<int32_t> want(n), got(n);
    std::iota(want.begin(), want.end(), 0);
    std::stable_sort(want.begin(), want.end(), [&](int32_t a, int32_t b) { return key[a] > key[b]; });
    placement_internal::SortIndicesByDescendingMagnitude(key.data(), n, got.data(), &scratch);
    ASSERT_EQ(got, want) << "trial " << trial << " n " << n;
  }
}

// ReplicationMayImprove (the skip test of the re-replication search) against every re-replication, by brute
// force: whenever it says no move exists, none leaves every rank it touches below max - eps while touching
// the most loaded rank. Random small layers with random counts and distinct-rank slots.
TEST(PlacementTest, ReplicationSkipTestNeverSkipsAMove) {
  std::mt19937_64 rng(23);
  int skipped = 0, moves_found = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int R = 2 + static_cast<int>(rng() % 5), spr = 1 + static_cast<int>(rng() % 4);
    const int E = spr + static_cast<int>(rng() % (2 * spr + 3)), P = R * spr;
    if (P < E) continue;
    // Counts: every expert once, the spare slots to random experts below R replicas.
    std::vector<int32_t> cnt(E, 1);
    for (int k = E; k < P; ++k) {
      int e = static_cast<int>(rng() % E);
      while (cnt[e] >= R) e = (e + 1) % E;
      ++cnt[e];
    }
    // Slots: each expert's replicas on distinct ranks with room, fullest-need first; retry on a dead end.
    std::vector<int32_t> slot(P, -1);
    std::vector<uint8_t> has(static_cast<size_t>(E) * R, 0);
    std::vector<int> fill(R, 0);
    bool ok = true;
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return cnt[a] > cnt[b]; });
    for (int e : order) {
      for (int c = 0; c < cnt[e] && ok; ++c) {
        std::vector<int> open;
        for (int r = 0; r < R; ++r) {
          if (fill[r] < spr && !has[static_cast<size_t>(e) * R + r]) open.push_back(r);
        }
        if (open.empty()) {
          ok = false;
          break;
        }
        const int r = open[rng() % open.size()];
        slot[r * spr + fill[r]++] = e;
        has[static_cast<size_t>(e) * R + r] = 1;
      }
    }
    if (!ok) continue;
    std::vector<double> load(E);
    std::lognormal_distribution<double> skewed(0.0, trial % 3 == 0 ? 0.3 : 1.2);
    for (auto& v : load) v = trial % 5 == 0 ? static_cast<double>(rng() % 4) : skewed(rng);
    std::vector<double> rank_load(R, 0.0);
    for (int s = 0; s < P; ++s) rank_load[s / spr] += load[slot[s]] / cnt[slot[s]];
    const double eps = 1e-12 * std::accumulate(load.begin(), load.end(), 0.0);
    const int rmax = static_cast<int>(std::max_element(rank_load.begin(), rank_load.end()) - rank_load.begin());
    const double limit = rank_load[rmax] - eps;
    // Every move: x's replica on q becomes a new replica of y.
    bool found = false;
    for (int q = 0; q < R && !found; ++q) {
      for (int k = 0; k < spr && !found; ++k) {
        const int x = slot[q * spr + k];
        if (cnt[x] < 2) continue;
        for (int y = 0; y < E && !found; ++y) {
          if (y == x || cnt[y] >= R || has[static_cast<size_t>(y) * R + q]) continue;
          if (q != rmax && !has[static_cast<size_t>(y) * R + rmax]) continue;  // must touch the maximum
          const double dx = load[x] / (cnt[x] - 1) - load[x] / cnt[x], dy = load[y] / cnt[y] - load[y] / (cnt[y] + 1);
          double worst = rank_load[q] - load[x] / cnt[x] + load[y] / (cnt[y] + 1);
          for (int r = 0; r < R; ++r) {
            if (r == q) continue;
            const bool hx = has[static_cast<size_t>(x) * R + r], hy = has[static_cast<size_t>(y) * R + r];
            if (hx || hy) worst = std::max(worst, rank_load[r] + (hx ? dx : 0.0) - (hy ? dy : 0.0));
          }
          found = worst < limit;
        }
      }
    }
    const bool may = placement_internal::ReplicationMayImprove(
        {slot.data(), cnt.data(), load.data(), rank_load.data(), has.data(), E, R, spr, eps});
    if (found) {
      ++moves_found;
      EXPECT_TRUE(may) << "trial " << trial << ": a move exists but the skip test skips it";
    }
    skipped += !may;
  }
  EXPECT_GT(skipped, 100);  // the test does skip
  EXPECT_GT(moves_found, 100);
}
// The guarantee of kEldr's bottleneck search (step 3 of eldr_placement.cc), checked by brute force on small
// random layers placed on one node (no node steps after the search): no swap of two replicas between the most
// loaded rank and another, and no re-replication touching it (x's replica on q becomes a new replica of y),
// leaves every rank it touches below the bottleneck, with no expert twice on a rank.
TEST(PlacementTest, EldrEndsWhereNoSwapOrReReplicationLowersTheBottleneck) {
  std::mt19937_64 rng(41);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int R = 2 + static_cast<int>(rng() % 4), spr = 1 + static_cast<int>(rng() % 4);
    const int P = R * spr, E = std::max(spr, P - static_cast<int>(rng() % (P / 2 + 1)));
    const int L = 3;
    std::vector<double> load(static_cast<size_t>(L) * E);
    std::lognormal_distribution<double> skewed(0.0, 1.0);
    for (auto& v : load) v = trial % 4 == 0 ? static_cast<double>(1 + rng() % 5) : skewed(rng);
    const PlacementProblem p = Problem(L, E, P, R, 1, 1, load);
    const Placement pl = PlaceOrDie(p, PlacementAlgorithm::kEldr);
    ExpectValid(p, pl, "trial " + std::to_string(trial));
    for (int l = 0; l < L; ++l) {
      const int32_t* slot = pl.phy2log.data() + static_cast<size_t>(l) * P;
      const int32_t* cnt = pl.logcnt.data() + static_cast<size_t>(l) * E;
      const double* w = load.data() + static_cast<size_t>(l) * E;
      std::vector<double> rank_load(R, 0.0);
      std::vector<std::vector<char>> has(R, std::vector<char>(E, 0));
      for (int s = 0; s < P; ++s) {
        rank_load[s / spr] += w[slot[s]] / cnt[slot[s]];
        has[s / spr][slot[s]] = 1;
      }
      std::vector<double> sorted = rank_load;
      std::sort(sorted.begin(), sorted.end());
      const double total = std::accumulate(w, w + E, 0.0), tol = 1e-9 * total;
      if (R > 1 && sorted[R - 1] - sorted[R - 2] <= tol) continue;  // near-tied maximum: which rank is "the" one
      const int rmax = static_cast<int>(std::max_element(rank_load.begin(), rank_load.end()) - rank_load.begin());
      const double limit = rank_load[rmax] - tol;
      const std::string what = "trial " + std::to_string(trial) + " layer " + std::to_string(l);
      ++checked;
      for (int i = 0; i < spr; ++i) {
        const int a = slot[rmax * spr + i];
        for (int q = 0; q < R; ++q) {
          if (q == rmax || has[q][a]) continue;
          for (int j = 0; j < spr; ++j) {
            const int b = slot[q * spr + j];
            if (has[rmax][b]) continue;
            const double wa = w[a] / cnt[a], wb = w[b] / cnt[b];
            EXPECT_FALSE(rank_load[rmax] - wa + wb < limit && rank_load[q] + wa - wb < limit)
                << what << ": swapping expert " << a << " (rank " << rmax << ") with " << b << " (rank " << q
                << ") lowers the bottleneck";
          }
        }
      }
      for (int q = 0; q < R; ++q) {
        for (int k = 0; k < spr; ++k) {
          const int x = slot[q * spr + k];
          if (cnt[x] < 2) continue;
          for (int y = 0; y < E; ++y) {
            if (y == x || cnt[y] >= R || has[q][y] || (q != rmax && !has[rmax][y])) continue;
            const double dx = w[x] / (cnt[x] - 1) - w[x] / cnt[x], dy = w[y] / cnt[y] - w[y] / (cnt[y] + 1);
            double worst = rank_load[q] - w[x] / cnt[x] + w[y] / (cnt[y] + 1);
            for (int r = 0; r < R; ++r) {
              if (r == q || (!has[r][x] && !has[r][y])) continue;
              worst = std::max(worst, rank_load[r] + (has[r][x] ? dx : 0.0) - (has[r][y] ? dy : 0.0));
            }
            EXPECT_FALSE(worst < limit) << what << ": moving a replica of expert " << x << " on rank " << q
                                        << " to expert " << y << " lowers the bottleneck";
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 600);
}

TEST(PlacementTest, BalancednessMatchesHandComputation) {
  // Layer 0: ranks [0 1 | 2 3] with loads 4 3 2 1: ranks carry 7 and 3, mean 5, max 7.
  // Layer 1: ranks [0 3 | 1 2] with loads 6 2 2 0: ranks carry 6 and 4, mean 5, max 6.
  auto pl = PlacementFromPhy2Log(2, 4, 2, {0, 1, 2, 3, 0, 3, 1, 2});
  ASSERT_TRUE(pl.ok()) << pl.status().message();
  EXPECT_NEAR(Balancedness(*pl, {4, 3, 2, 1, 6, 2, 2, 0}), (5.0 + 5.0) / (7.0 + 6.0), 1e-15);
  // Replicas share their expert's load: expert 0 (load 6) in slots 0 and 2: ranks 3 + 2 = 5 and 3 + 1 = 4.
  auto rep = PlacementFromPhy2Log(1, 3, 2, {0, 1, 0, 2});
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->logcnt, (std::vector<int32_t>{2, 1, 1}));
  EXPECT_NEAR(Balancedness(*rep, {6, 2, 1}), 4.5 / 5.0, 1e-15);
  // A zero-load layer adds nothing to either sum; all zero is perfect.
  EXPECT_NEAR(Balancedness(*pl, {4, 3, 2, 1, 0, 0, 0, 0}), 5.0 / 7.0, 1e-15);
  EXPECT_EQ(Balancedness(*pl, std::vector<double>(8, 0.0)), 1.0);
}

TEST(PlacementTest, ZeroLoadLayersArePlaced) {
  std::vector<double> load = SkewedLoad(3, 16, 7);
  std::fill(load.begin() + 16, load.begin() + 32, 0.0);  // layer 1 all zero (as GLM's layer "46")
  const PlacementProblem p = Problem(3, 16, 24, 4, 2, 4, load);
  for (PlacementAlgorithm a : kAll) ExpectValid(p, PlaceOrDie(p, a), PlacementAlgorithmName(a));
  // eplb.py: every redundant slot of the node goes to the node's first expert (torch.max of zeros).
  const Placement global = PlaceOrDie(p, PlacementAlgorithm::kDeepSeekGlobal);
  EXPECT_EQ(global.logcnt[16 + 0], 9);
  // eldr spreads them over distinct experts.
  const Placement eldr = PlaceOrDie(p, PlacementAlgorithm::kEldr);
  for (int e = 0; e < 16; ++e) EXPECT_LE(eldr.logcnt[16 + e], 2);
}

TEST(PlacementTest, EldrKeepsGroupsOnNodesWhenThatCostsNoBalance) {
  // Uniform loads, no spare slots: whole groups on nodes are perfectly balanced, so eldr must find them.
  const PlacementProblem p = Problem(2, 16, 16, 4, 2, 4, std::vector<double>(32, 1.0));
  const Placement pl = PlaceOrDie(p, PlacementAlgorithm::kEldr);
  EXPECT_DOUBLE_EQ(Balancedness(pl, p.load), 1.0);
  EXPECT_DOUBLE_EQ(GroupLocality(pl, p.load, 4, 2), 1.0);
  // The hierarchy always keeps groups whole.
  const PlacementProblem q = Problem(4, 64, 80, 16, 4, 8, SkewedLoad(4, 64, 3));
  EXPECT_DOUBLE_EQ(GroupLocality(PlaceOrDie(q, PlacementAlgorithm::kDeepSeekHierarchical), q.load, 8, 4), 1.0);
  // One hot group: the hierarchy must keep it on one node and pays in balance; eldr does not.
  std::vector<double> hot(16, 1.0);
  for (int e = 0; e < 4; ++e) hot[e] = 6.0;
  const PlacementProblem h = Problem(1, 16, 16, 4, 2, 4, hot);
  const double hier = Balancedness(PlaceOrDie(h, PlacementAlgorithm::kDeepSeekHierarchical), hot);
  const double eldr = Balancedness(PlaceOrDie(h, PlacementAlgorithm::kEldr), hot);
  EXPECT_LT(hier, 0.8);
  EXPECT_DOUBLE_EQ(eldr, 1.0);
}

TEST(PlacementTest, CountMovesByHand) {
  // Ranks of 2 slots. Reordering inside a rank moves no weights; it changes slots.
  auto from = PlacementFromPhy2Log(1, 4, 2, {0, 1, 2, 3}).value();
  auto same_ranks = PlacementFromPhy2Log(1, 4, 2, {1, 0, 3, 2}).value();
  MoveStats m = CountMoves(from, same_ranks, 1000);
  EXPECT_EQ(m.moved_experts, 0);
  EXPECT_EQ(m.moved_bytes, 0);
  EXPECT_EQ(m.changed_slots, 4);
  // Experts 0 and 2 trade ranks: two weights cross.
  auto traded = PlacementFromPhy2Log(1, 4, 2, {2, 1, 0, 3}).value();
  m = CountMoves(from, traded, 1000);
  EXPECT_EQ(m.moved_experts, 2);
  EXPECT_EQ(m.moved_bytes, 2000);
  EXPECT_EQ(m.changed_slots, 2);
  // A replica of expert 0 replaces the second replica of expert 1 on rank 1: one copy.
  auto two_of_1 = PlacementFromPhy2Log(1, 3, 2, {0, 1, 2, 1}).value();
  auto two_of_0 = PlacementFromPhy2Log(1, 3, 2, {0, 1, 0, 2}).value();
  EXPECT_EQ(CountMoves(two_of_1, two_of_0).moved_experts, 1);
  EXPECT_EQ(CountMoves(two_of_1, two_of_0).changed_slots, 2);
  EXPECT_EQ(CountMoves(from, from).moved_experts, 0);
}

TEST(PlacementTest, EldrMovesNothingWhenTheLoadDidNotChange) {
  uint64_t seed = 50;
  for (const Shape& s : kShapes) {
    const PlacementProblem p = Problem(4, s.E, s.P, s.R, s.N, s.G, SkewedLoad(4, s.E, seed++));
    const Placement first = PlaceOrDie(p, PlacementAlgorithm::kEldr);
    const Placement again = PlaceOrDie(p, PlacementAlgorithm::kEldr, &first);
    const MoveStats m = CountMoves(first, again);
    EXPECT_EQ(m.moved_experts, 0) << "E=" << s.E << " P=" << s.P << " R=" << s.R;
    EXPECT_EQ(m.changed_slots, 0);
    EXPECT_EQ(again.phy2log, first.phy2log);
  }
}

TEST(PlacementTest, EldrKeepsAPreviousPlacementThatAlreadyMeetsTheCap) {
  // Re-planning a re-plan with the same load: the previous placement (a re-plan, with replica counts of its own)
  // already keeps the bottleneck within (1 + move_slack) x the fresh one, so it is the answer and nothing moves.
  // The hand case was found by review: it used to move 2 experts at the same balancedness (0.944444).
  {
    PlacementProblem p = Problem(1, 8, 12, 4, 1, 1, {8, 1, 9, 9, 4, 2, 3, 5});
    const Placement a = PlaceOrDie(p, PlacementAlgorithm::kEldr);
    p.load = {1, 7, 8, 1, 9, 3, 4, 1};
    const Placement b = PlaceOrDie(p, PlacementAlgorithm::kEldr, &a);
    const Placement c = PlaceOrDie(p, PlacementAlgorithm::kEldr, &b);
    EXPECT_EQ(CountMoves(b, c).moved_experts, 0);
    EXPECT_EQ(c.phy2log, b.phy2log);
    EXPECT_EQ(c.logcnt, b.logcnt);
  }
  std::mt19937_64 rng(91);
  int checked = 0;
  for (int scenario = 0; scenario < 300; ++scenario) {
    const Shape& s = kShapes[scenario % (sizeof(kShapes) / sizeof(kShapes[0]))];
    const int L = 2;
    PlacementProblem p = Problem(L, s.E, s.P, s.R, s.N, s.G, SkewedLoad(L, s.E, 1000 + scenario));
    p.move_slack = scenario % 3 == 0 ? 0.0 : 0.005 * (scenario % 3);
    const Placement a = PlaceOrDie(p, PlacementAlgorithm::kEldr);
    for (double& x : p.load) x *= std::uniform_real_distribution<double>(0.7, 1.3)(rng);
    const Placement b = PlaceOrDie(p, PlacementAlgorithm::kEldr, &a);
    const Placement c = PlaceOrDie(p, PlacementAlgorithm::kEldr, &b);
    ASSERT_EQ(CountMoves(b, c).moved_experts, 0) << "scenario " << scenario << " E=" << s.E << " R=" << s.R;
    ASSERT_EQ(c.phy2log, b.phy2log) << "scenario " << scenario;
    ++checked;
  }
  EXPECT_EQ(checked, 300);
}

TEST(PlacementTest, EldrPreviousPlacementCutsMovesWithoutCostingBalance) {
  int64_t fresh_moves = 0, kept_moves = 0;
  uint64_t seed = 70;
  for (const Shape& s : kShapes) {
    const int L = 6;
    PlacementProblem p = Problem(L, s.E, s.P, s.R, s.N, s.G, SkewedLoad(L, s.E, seed++));
    const Placement before = PlaceOrDie(p, PlacementAlgorithm::kEldr);
    // The load drifts by up to ±20%.
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> drift(0.8, 1.2);
    for (auto& v : p.load) v *= drift(rng);
    const Placement fresh = PlaceOrDie(p, PlacementAlgorithm::kEldr);
    const Placement kept = PlaceOrDie(p, PlacementAlgorithm::kEldr, &before);
    ExpectValid(p, kept, "kept");
    EXPECT_FALSE(HasDuplicateOnRank(kept));
    // Every layer's bottleneck is at most the one placed without a previous placement.
    EXPECT_GE(Balancedness(kept, p.load), Balancedness(fresh, p.load) - 1e-12);
    const int64_t f = CountMoves(before, fresh).moved_experts, k = CountMoves(before, kept).moved_experts;
    EXPECT_LE(k, f) << "E=" << s.E << " P=" << s.P << " R=" << s.R;
    fresh_moves += f;
    kept_moves += k;
  }
  EXPECT_LT(kept_moves, fresh_moves / 2) << "fresh " << fresh_moves << " kept " << kept_moves;
}

// Per-layer load of the most loaded rank, computed here from the definition.
std::vector<double> LayerBottlenecks(const Placement& pl, const std::vector<double>& load) {
  const int P = pl.num_slots, E = pl.num_experts, spr = P / pl.num_ranks;
  std::vector<double> out(pl.num_layers, 0.0);
  for (int l = 0; l < pl.num_layers; ++l) {
    for (int r = 0; r < pl.num_ranks; ++r) {
      double rank_load = 0;
      for (int k = 0; k < spr; ++k) {
        const int e = pl.phy2log[l * P + r * spr + k];
        rank_load += load[l * E + e] / pl.logcnt[l * E + e];
      }
      out[l] = std::max(out[l], rank_load);
    }
  }
  return out;
}

TEST(PlacementTest, EldrMoveSlackTradesBoundedBalanceForFewerMoves) {
  PlacementProblem p = Problem(8, 64, 80, 16, 4, 8, SkewedLoad(8, 64, 91));
  const Placement before = PlaceOrDie(p, PlacementAlgorithm::kEldr);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> drift(0.9, 1.1);
  for (auto& v : p.load) v *= drift(rng);
  const std::vector<double> fresh = LayerBottlenecks(PlaceOrDie(p, PlacementAlgorithm::kEldr), p.load);
  std::vector<int64_t> moves;
  for (double slack : {0.0, 0.01, 0.05}) {
    p.move_slack = slack;
    const Placement kept = PlaceOrDie(p, PlacementAlgorithm::kEldr, &before);
    ExpectValid(p, kept, "slack");
    EXPECT_FALSE(HasDuplicateOnRank(kept));
    const std::vector<double> got = LayerBottlenecks(kept, p.load);
    for (int l = 0; l < p.num_layers; ++l) EXPECT_LE(got[l], fresh[l] * (1 + slack) * (1 + 1e-9)) << "layer " << l;
    moves.push_back(CountMoves(before, kept).moved_experts);
  }
  EXPECT_LE(moves.back(), moves.front()) << "5% slack should not move more than none";
  p.move_slack = -0.1;
  auto bad = Place(p, PlacementAlgorithm::kEldr, &before);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("move slack"), std::string::npos);
}

// The move_slack contract on many shapes: with a previous placement no layer's bottleneck exceeds (1 + slack) times
// the one the fresh placement of the same load reaches, home-node swaps included (they may lower the fresh one).
TEST(PlacementTest, EldrMoveSlackCapHoldsOnRandomShapes) {
  std::mt19937_64 rng(17);
  int checked = 0;
  for (int scenario = 0; scenario < 2000; ++scenario) {  // main before the fix failed scenario 1787
    const int N = std::vector<int>{1, 2, 4}[rng() % 3], R = N * static_cast<int>(1 + rng() % 4);
    const int G = std::vector<int>{1, 2, 4, 8}[rng() % 4], E = G * static_cast<int>(2 + rng() % 6);
    const int spr = std::min(E, static_cast<int>(1 + (E + R - 1) / R + rng() % 3));  // slots per rank <= E
    const int P = R * spr;
    if (P < E) continue;
    const int L = 1 + static_cast<int>(rng() % 3);
    PlacementProblem p = Problem(L, E, P, R, N, G, SkewedLoad(L, E, rng(), 0.5 + 0.2 * (rng() % 8)));
    const Placement before = PlaceOrDie(p, PlacementAlgorithm::kEldr);
    std::uniform_real_distribution<double> drift(0.8, 1.2);
    for (auto& v : p.load) v *= drift(rng);
    const std::vector<double> fresh = LayerBottlenecks(PlaceOrDie(p, PlacementAlgorithm::kEldr), p.load);
    for (double slack : {0.0, 0.005}) {
      p.move_slack = slack;
      const std::vector<double> got = LayerBottlenecks(PlaceOrDie(p, PlacementAlgorithm::kEldr, &before), p.load);
      for (int l = 0; l < L; ++l) {
        ASSERT_LE(got[l], fresh[l] * (1 + slack) * (1 + 1e-9))
            << "scenario " << scenario << " L " << L << " E " << E << " P " << P << " R " << R << " N " << N << " G "
            << G << " slack " << slack << " layer " << l;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 3000);
}

// kEldr places layers on several threads (ELDR_NUM_THREADS): the result must be the single-threaded one.
TEST(PlacementTest, EldrPlacementDoesNotDependOnTheThreadCount) {
  const PlacementProblem p = Problem(64, 128, 160, 32, 4, 8, SkewedLoad(64, 128, 11));
  PlacementProblem drifted = p;
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> drift(0.8, 1.2);
  for (auto& v : drifted.load) v *= drift(rng);
  ScopedEnv env("ELDR_NUM_THREADS", "1");
  auto place = [&](const char* threads, const PlacementProblem& problem, const Placement* previous) {
    env.Set(threads);
    return PlaceOrDie(problem, PlacementAlgorithm::kEldr, previous);
  };
  const Placement one = place("1", p, nullptr);
  const Placement again_one = place("1", drifted, &one);
  for (const char* threads : {"2", "3", "4"}) {
    const Placement many = place(threads, p, nullptr);
    EXPECT_EQ(many.phy2log, one.phy2log) << threads << " threads";
    EXPECT_EQ(many.log2phy, one.log2phy) << threads << " threads";
    const Placement again = place(threads, drifted, &one);
    EXPECT_EQ(again.phy2log, again_one.phy2log) << threads << " threads, with a previous placement";
  }
}

// PlaceHooks: on_layer counts every layer once, 1..L in order and never two calls at once; a failed check stops the
// placement (no layer starts after it) and is returned as it is. On one thread and on four.
TEST(PlacementTest, HooksCountLayersAndAFailedCheckStopsThePlacement) {
  const int L = 64;
  const PlacementProblem p = Problem(L, 32, 40, 8, 2, 8, SkewedLoad(L, 32, 5));
  ScopedEnv env("ELDR_NUM_THREADS", "1");
  for (const char* threads : {"1", "4"}) {
    env.Set(threads);
    for (PlacementAlgorithm algo : kAll) {
      std::vector<int> seen;
      std::atomic<int> in_call{0}, overlaps{0};
      PlaceHooks hooks;
      hooks.on_layer = [&](int done) {
        if (in_call.fetch_add(1) != 0) ++overlaps;
        seen.push_back(done);
        in_call.fetch_sub(1);
      };
      auto placed = Place(p, algo, nullptr, &hooks);
      ASSERT_TRUE(placed.ok()) << placed.status().message();
      std::vector<int> expected(L);
      std::iota(expected.begin(), expected.end(), 1);
      EXPECT_EQ(seen, expected) << PlacementAlgorithmName(algo) << ", " << threads << " threads";
      EXPECT_EQ(overlaps.load(), 0);
      EXPECT_EQ(placed.value().phy2log, PlaceOrDie(p, algo).phy2log) << "the hooks change nothing";

      // Every check after the fourth layer is placed fails: the layers placed are those four and at most one in
      // progress on each other thread (which finishes it, or for eldr may leave it unfinished and uncounted).
      std::atomic<int> layers_done{0};
      hooks.check = [&] { return layers_done.load() >= 4 ? Status::ResourceExhausted("stop here") : Status::Ok(); };
      hooks.on_layer = [&](int done) { layers_done = done; };
      auto stopped = Place(p, algo, nullptr, &hooks);
      ASSERT_FALSE(stopped.ok()) << PlacementAlgorithmName(algo);
      EXPECT_EQ(stopped.status().code(), StatusCode::kResourceExhausted);
      EXPECT_EQ(stopped.status().message(), "stop here");
      EXPECT_GE(layers_done.load(), 4);
      EXPECT_LE(layers_done.load(), 4 + std::atoi(threads) - 1) << PlacementAlgorithmName(algo) << ", " << threads;
    }
  }
}

// kEldr polls the check inside a layer too (its bottleneck search): with one layer, a check that fails from its second
// call on stops the placement although the layer had started; the DeepSeek variants check between layers only.
TEST(PlacementTest, EldrStopsInsideALayer) {
  const PlacementProblem p = Problem(1, 128, 160, 32, 4, 8, SkewedLoad(1, 128, 3));
  for (PlacementAlgorithm algo : kAll) {
    int calls = 0;
    PlaceHooks hooks;
    hooks.check = [&] { return ++calls >= 2 ? Status::ResourceExhausted("stop inside") : Status::Ok(); };
    auto placed = Place(p, algo, nullptr, &hooks);
    if (algo == PlacementAlgorithm::kEldr) {
      ASSERT_FALSE(placed.ok());
      EXPECT_EQ(placed.status().message(), "stop inside");
    } else {
      EXPECT_TRUE(placed.ok()) << PlacementAlgorithmName(algo) << ": " << placed.status().message();
      EXPECT_EQ(calls, 1) << PlacementAlgorithmName(algo);
    }
  }
}

// The memory a placement takes is checked before it is allocated (ELDR_MEMORY_BUDGET stands for the machine):
// eldr's [E, R] tables at E = 8192, R = 2048 are 5 * 2^24 bytes = 84 MB, over a 64 MB budget and under 1 GB; the
// DeepSeek variants need no such table. A log2phy whose width is only known after placing is checked too: with no
// load, deepseek-global gives every redundant slot to expert 0 (4 * L * E * (P - E + 1) bytes = 2.1 GB here).
TEST(PlacementTest, MemoryIsCheckedBeforeItIsAllocated) {
  ScopedEnv budget("ELDR_MEMORY_BUDGET", "64M");
  const PlacementProblem big = Problem(1, 8192, 16384, 2048, 1, 1, std::vector<double>(8192, 1.0));
  EXPECT_GT(PlacementMemoryBytes(big, PlacementAlgorithm::kEldr, false), 5.0 * 8192 * 2048);
  EXPECT_LT(PlacementMemoryBytes(big, PlacementAlgorithm::kEldr, false), 1e9);
  EXPECT_LT(PlacementMemoryBytes(big, PlacementAlgorithm::kDeepSeekGlobal, false), 1e7);
  auto refused = Place(big, PlacementAlgorithm::kEldr);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("eldr placement of L = 1 layers x E = 8192 experts into P = 16384 slots "
                                            "on R = 2048 ranks: needs"),
            std::string::npos)
      << refused.status().message();
  EXPECT_TRUE(Place(big, PlacementAlgorithm::kDeepSeekGlobal).ok());
  const PlacementProblem zero = Problem(1, 16384, 32768, 1, 1, 1, std::vector<double>(16384, 0.0));
  auto wide = Place(zero, PlacementAlgorithm::kDeepSeekGlobal);
  ASSERT_FALSE(wide.ok());
  EXPECT_NE(wide.status().message().find("log2phy [L = 1, E = 16384, max replicas = 16385]"), std::string::npos)
      << wide.status().message();
  budget.Set("1G");
  EXPECT_TRUE(Place(big, PlacementAlgorithm::kEldr).ok());
}

// kEldr checks log2phy too, on both of its paths: written by the calling thread while the workers finish (L >= 32
// layers on two threads) and at the end (one thread). One hot expert in every layer is replicated on all R = 1024
// ranks, so log2phy is [L = 32, E = 1025, 1024] = 134 MB, over a 100 MB budget; the scratch (E x R tables, 5.2 MB a
// thread) is not.
TEST(PlacementTest, EldrChecksItsLog2PhyOnBothPaths) {
  const int L = 32, E = 1025, R = 1024, P = 2 * R;
  std::vector<double> load(static_cast<size_t>(L) * E, 1.0);
  for (int l = 0; l < L; ++l) load[static_cast<size_t>(l) * E] = 1e6;
  const PlacementProblem p = Problem(L, E, P, R, 1, 1, load);
  ScopedEnv budget("ELDR_MEMORY_BUDGET", "100M");
  for (const char* threads : {"1", "2"}) {
    ScopedEnv env("ELDR_NUM_THREADS", threads);
    auto placed = Place(p, PlacementAlgorithm::kEldr);
    ASSERT_FALSE(placed.ok()) << threads << " threads";
    EXPECT_NE(placed.status().message().find("log2phy [L = 32, E = 1025, max replicas = 1024]"), std::string::npos)
        << placed.status().message();
  }
}

// On several threads the calling thread writes log2phy for the layers already placed at the widest replica count
// seen so far, while the others place their last layers; a layer placed after that with more replicas makes the
// end rewrite log2phy whole. Here only the last layer has a hot expert (many replicas), so which of the two
// happens depends on which thread takes it: the result must be the single-threaded one either way, every time.
TEST(PlacementTest, EldrLog2PhyIsRightWhenTheLastLayerIsTheWidest) {
  const int L = 64, E = 64, P = 96, R = 16;
  std::vector<double> load(static_cast<size_t>(L) * E, 1.0);
  load[static_cast<size_t>(L - 1) * E + 5] = 500.0;  // layer 63, expert 5: the most replicas of the placement
  const PlacementProblem p = Problem(L, E, P, R, 2, 4, load);
  ScopedEnv env("ELDR_NUM_THREADS", "1");
  const Placement one = PlaceOrDie(p, PlacementAlgorithm::kEldr);
  ExpectValid(p, one, "one thread");
  const int widest = *std::max_element(one.logcnt.end() - E, one.logcnt.end());
  ASSERT_EQ(one.max_replicas, widest);
  ASSERT_GT(widest, *std::max_element(one.logcnt.begin(), one.logcnt.end() - E)) << "only the last layer is wide";
  for (const char* threads : {"2", "4"}) {
    env.Set(threads);
    for (int round = 0; round < 20; ++round) {
      const Placement many = PlaceOrDie(p, PlacementAlgorithm::kEldr);
      ExpectValid(p, many, std::string(threads) + " threads");
      EXPECT_EQ(many.max_replicas, one.max_replicas) << threads << " threads, round " << round;
      EXPECT_EQ(many.log2phy, one.log2phy) << threads << " threads, round " << round;
    }
  }
}

TEST(PlacementTest, EldrAcceptsAPreviousPlacementWithDuplicates) {
  // Re-planning from the public algorithm's placement, which may hold two replicas of one expert on a rank.
  const PlacementProblem p = ReadmeProblem();
  const Placement global = PlaceOrDie(p, PlacementAlgorithm::kDeepSeekGlobal);
  ASSERT_TRUE(HasDuplicateOnRank(global));
  const Placement eldr = PlaceOrDie(p, PlacementAlgorithm::kEldr, &global);
  ExpectValid(p, eldr, "from global");
  EXPECT_FALSE(HasDuplicateOnRank(eldr));
  EXPECT_LT(CountMoves(global, eldr).moved_experts, p.num_layers * p.num_slots);
}

TEST(PlacementTest, PlacementFromPhy2LogRejectsBadTables) {
  EXPECT_FALSE(PlacementFromPhy2Log(1, 4, 2, {0, 1, 2, 4}).ok());  // expert 4 of 4
  EXPECT_FALSE(PlacementFromPhy2Log(1, 4, 2, {0, 1, 2, 2}).ok());  // expert 3 missing
  EXPECT_FALSE(PlacementFromPhy2Log(1, 4, 3, {0, 1, 2, 3}).ok());  // 4 slots on 3 ranks
  auto ok = PlacementFromPhy2Log(1, 3, 2, {2, 0, 2, 1});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->max_replicas, 2);
  EXPECT_EQ(ok->log2phy, (std::vector<int32_t>{1, -1, 3, -1, 0, 2}));
}

// ---- load readers ----

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("eldr_placement_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(PlacementTest, ReadsTheExpertLoadProfiles) {
  const std::string dir = std::string(ELDR_SOURCE_DIR) + "/bench/data/expert-load-profiles/";
  int L = 0, E = 0;
  auto glm = ReadLoadJson(dir + "GLM-4.5-Air_expert_scores_summary.json", "token_scores", &L, &E);
  ASSERT_TRUE(glm.ok()) << glm.status().message();
  EXPECT_EQ(L, 46);  // keys "1".."46"
  EXPECT_EQ(E, 128);
  EXPECT_DOUBLE_EQ((*glm)[0], 0.017);  // token_scores["1"]["0"]
  double last = 0;
  for (int e = 0; e < E; ++e) last += (*glm)[45 * E + e];
  EXPECT_EQ(last, 0.0);  // layer "46" is all zeros
  const PlacementProblem p = Problem(L, E, 160, 32, 4, 8, *glm);
  for (PlacementAlgorithm a : kAll) ExpectValid(p, PlaceOrDie(p, a), PlacementAlgorithmName(a));

  auto qwen = ReadLoadJson(dir + "Qwen3-235B-A22B-Instruct-2507_expert_scores_summary.json", "token_scores", &L, &E);
  ASSERT_TRUE(qwen.ok()) << qwen.status().message();
  EXPECT_EQ(L, 94);
  EXPECT_EQ(E, 128);
  EXPECT_DOUBLE_EQ((*qwen)[0], 0.0262);
}

TEST(PlacementTest, JsonReaderReportsBadFiles) {
  int L = 0, E = 0;
  auto missing = ReadLoadJson(TempPath("missing.json"), "token_scores", &L, &E);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  const std::string path = TempPath("bad.json");
  const std::vector<std::pair<std::string, StatusCode>> cases = {
      {"{not json", StatusCode::kCorrupt},
      {R"({"gate_scores": {}})", StatusCode::kCorrupt},
      {R"({"token_scores": {"1": {"0": 0.5, "2": 0.5}}})", StatusCode::kCorrupt},  // expert 1 missing
      {R"({"token_scores": {"1": {"0": 0.5, "1": 0.5}, "2": {"0": 1}}})", StatusCode::kCorrupt},
      {R"({"token_scores": {"1": {"0": 0.5, "1": "x"}}})", StatusCode::kCorrupt},
      {R"({"token_scores": {"1": {"0": 0.5, "1": -0.1}}})", StatusCode::kInvalidArgument},
  };
  for (const auto& [text, code] : cases) {
    WriteText(path, text);
    auto r = ReadLoadJson(path, "token_scores", &L, &E);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), code) << text << ": " << r.status().message();
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  }
  // A missing expert is named as missing, in whichever layer lacks it (the first one included), with the expert
  // count taken from the largest key of any layer.
  const std::vector<std::pair<std::string, std::string>> missing_cases = {
      {R"({"token_scores": {"1": {"0": 0.5, "2": 0.5}}})",
       R"(token_scores["1"] lacks expert "1" (every layer needs the experts 0..2)"},
      {R"({"token_scores": {"1": {"0": 0.5, "1": 0.5}, "2": {"0": 1}}})",
       R"(token_scores["2"] lacks expert "1" (every layer needs the experts 0..1)"},
      {R"({"token_scores": {"0": {"0": 1, "1": 1}, "1": {"0": 1, "1": 1, "2": 1}}})",
       R"(token_scores["0"] lacks expert "2")"},
      {R"({"token_scores": {"0": {"1": 1}, "1": {}}})", R"(token_scores["0"] lacks expert "0")"},
      {R"({"token_scores": {"0": {"70000": 1}}})",
       R"(token_scores["0"] has expert key "70000"; expert keys are whole numbers 0..65534)"},
      {R"({"token_scores": {"0": {}}})", "no layer of token_scores has an expert"},
  };
  for (const auto& [text, message] : missing_cases) {
    WriteText(path, text);
    auto r = ReadLoadJson(path, "token_scores", &L, &E);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(path + ": " + message), std::string::npos) << r.status().message();
  }
  // Layer ids sort numerically ("10" after "9") and need not start at 0.
  WriteText(path, R"({"token_scores": {"10": {"0": 3, "1": 4}, "9": {"1": 2, "0": 1}}})");
  auto ok = ReadLoadJson(path, "token_scores", &L, &E);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(L, 2);
  EXPECT_EQ(E, 2);
  EXPECT_EQ(*ok, (std::vector<double>{1, 2, 3, 4}));

  // Either member can be read; both are checked whichever is read, and no other member name is taken.
  WriteText(path, R"({"token_scores": {"0": {"0": 1, "1": 3}}, "gate_scores": {"0": {"0": 0.2, "1": 0.1, "2": 0.7}}})");
  auto tokens = ReadLoadJson(path, "token_scores", &L, &E);
  ASSERT_TRUE(tokens.ok()) << tokens.status().message();
  EXPECT_EQ(*tokens, (std::vector<double>{1, 3}));
  EXPECT_EQ(E, 2);
  auto gates = ReadLoadJson(path, "gate_scores", &L, &E);
  ASSERT_TRUE(gates.ok()) << gates.status().message();
  EXPECT_EQ(*gates, (std::vector<double>{0.2, 0.1, 0.7}));
  EXPECT_EQ(L, 1);
  EXPECT_EQ(E, 3);
  EXPECT_EQ(ReadLoadJson(path, "scores", &L, &E).status().code(), StatusCode::kInvalidArgument);
  const std::vector<std::pair<std::string, std::string>> damaged_gates = {
      {R"({"token_scores": {"0": {"0": 1}}, "gate_scores": 5})", R"("gate_scores" must be an object)"},
      {R"({"token_scores": {"0": {"0": 1}}, "gate_scores": {"0": {"0": -1}}})", R"(gate_scores["0"]["0"] is)"},
      {R"({"token_scores": {"0": {"0": 1}}, "gate_scores": {"x": {}}})", R"(gate_scores["x"] must be)"},
  };
  for (const auto& [text, message] : damaged_gates) {
    WriteText(path, text);
    auto r = ReadLoadJson(path, "token_scores", &L, &E);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(path + ": " + message), std::string::npos) << r.status().message();
  }
  WriteText(path, R"({"token_scores": {"0": {"0": -1}}, "gate_scores": {"0": {"0": 1}}})");
  auto damaged_tokens = ReadLoadJson(path, "gate_scores", &L, &E);
  ASSERT_FALSE(damaged_tokens.ok());
  EXPECT_NE(damaged_tokens.status().message().find(path + R"(: token_scores["0"]["0"] is)"), std::string::npos)
      << damaged_tokens.status().message();
  WriteText(path, R"({"token_scores": {"0": {"0": 1}}})");
  EXPECT_EQ(ReadLoadJson(path, "gate_scores", &L, &E).status().code(), StatusCode::kCorrupt);
  std::filesystem::remove(path);
}

TEST(PlacementTest, ReadsLoadFromHdf5) {
  const std::string path = TempPath("load.h5");
  {
    auto f = h5::File::Create(path, path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    ASSERT_TRUE(f->Write<float>("/load", {1, 2, 3, 4, 5, 6}, {2, 3}).ok());
    ASSERT_TRUE(f->Write<float>("/flat", {1, 2, 3}, {3}).ok());
    ASSERT_TRUE(f->Write<double>("/negative", {1, -2}, {1, 2}).ok());
    ASSERT_TRUE(f->Close().ok());
  }
  int L = 0, E = 0;
  auto load = ReadLoadHdf5(path, "/load", &L, &E);
  ASSERT_TRUE(load.ok()) << load.status().message();
  EXPECT_EQ(L, 2);
  EXPECT_EQ(E, 3);
  EXPECT_EQ(*load, (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_FALSE(ReadLoadHdf5(path, "/flat", &L, &E).ok());
  EXPECT_EQ(ReadLoadHdf5(path, "/nothing", &L, &E).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ReadLoadHdf5(path, "/negative", &L, &E).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadLoadHdf5(TempPath("none.h5"), "/load", &L, &E).status().code(), StatusCode::kNotFound);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace eldr
