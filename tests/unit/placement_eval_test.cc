// eldr place evaluate: rank loads and balancedness of one step against hand-computed values (replicas
// split an expert's load, layers are summed before dividing), the contiguous placement, the round-robin
// decode steps, a whole replay on a hand-built trace and calibration, reading /placement, and invariants on
// a synthetic trace with strong domain structure (per-cluster placement at least as balanced as contiguous).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "placement/placement.h"
#include "runtime/calib/calibrate.h"
#include "runtime/calib/calibration.h"
#include "runtime/common/hdf5.h"
#include "runtime/eval/placement_replay.h"
#include "runtime/trace/synth.h"

namespace eldr {
namespace {

namespace fs = std::filesystem;

Placement FromPhy2Log(int L, int E, int R, std::vector<int32_t> phy2log) {
  auto p = PlacementFromPhy2Log(L, E, R, std::move(phy2log));
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.ok() ? std::move(p).value() : Placement{};
}

TEST(RankLoad, HandComputedSingleLayer) {
  // E = 4, R = 2, k = 1: two tokens on expert 0 and two on expert 1. Filled element by element: GCC 12.2 at
  // -O2 with AVX-512 (-march=native here) can miscompile the literal {2, 2, 0, 0} into {2, 2, 2, 2}.
  std::vector<double> load(4, 0.0);
  load[0] = load[1] = 2;
  auto contiguous = ContiguousPlacement(1, 4, 2);
  ASSERT_TRUE(contiguous.ok()) << contiguous.status().message();
  // Contiguous: rank 0 holds experts {0, 1} (load 4), rank 1 holds {2, 3} (load 0): mean 2, max 4.
  RankLoadSummary s = SummarizeRankLoad(contiguous.value(), load.data());
  EXPECT_DOUBLE_EQ(s.balancedness(), 0.5);
  EXPECT_DOUBLE_EQ(s.mean_max_rank_load(), 4.0);
  EXPECT_DOUBLE_EQ(s.mean_rank_load(), 2.0);
  EXPECT_DOUBLE_EQ(Balancedness(contiguous.value(), load), 0.5);
  // Experts 0 and 1 on different ranks: 2 and 2.
  const Placement split = FromPhy2Log(1, 4, 2, {0, 2, 1, 3});
  s = SummarizeRankLoad(split, load.data());
  EXPECT_DOUBLE_EQ(s.balancedness(), 1.0);
  EXPECT_DOUBLE_EQ(s.mean_max_rank_load(), 2.0);
}

TEST(RankLoad, ReplicasShareTheirExpertsLoadEvenly) {
  // Six tokens on expert 0, which has three replicas: one on rank 0, two on rank 1 → loads 2 and 4.
  const std::vector<double> load = {6, 0, 0, 0};
  const Placement p = FromPhy2Log(1, 4, 2, {0, 1, 2, 0, 3, 0});
  const RankLoadSummary s = SummarizeRankLoad(p, load.data());
  EXPECT_DOUBLE_EQ(s.mean_rank_load(), 3.0);
  EXPECT_DOUBLE_EQ(s.mean_max_rank_load(), 4.0);
  EXPECT_DOUBLE_EQ(s.balancedness(), 0.75);
}

TEST(RankLoad, LayersAreSummedBeforeDividing) {
  // Layer 0 {2, 2, 0, 0}: mean 2, max 4. Layer 1 {1, 0, 1, 0}: ranks 1 and 1, mean 1, max 1.
  // DESIGN.md §3: (2 + 1) / (4 + 1) = 0.6, not the mean of the ratios (0.75).
  const std::vector<double> load = {2, 2, 0, 0, 1, 0, 1, 0};
  auto contiguous = ContiguousPlacement(2, 4, 2);
  ASSERT_TRUE(contiguous.ok());
  const RankLoadSummary s = SummarizeRankLoad(contiguous.value(), load.data());
  EXPECT_DOUBLE_EQ(s.balancedness(), 0.6);
  EXPECT_DOUBLE_EQ(s.mean_max_rank_load(), 2.5);
  // No load at all: perfectly balanced by definition.
  const std::vector<double> zero(8, 0.0);
  EXPECT_DOUBLE_EQ(SummarizeRankLoad(contiguous.value(), zero.data()).balancedness(), 1.0);
}

TEST(ContiguousPlacement, ExpertOnRankEOverEPerR) {
  auto p = ContiguousPlacement(3, 8, 4);
  ASSERT_TRUE(p.ok());
  const Placement& pl = p.value();
  EXPECT_EQ(pl.num_slots, 8);
  EXPECT_EQ(pl.max_replicas, 1);
  for (int l = 0; l < 3; ++l) {
    for (int e = 0; e < 8; ++e) {
      const int slot = pl.log2phy[(l * 8 + e) * pl.max_replicas];
      EXPECT_EQ(slot / pl.slots_per_rank(), e / 2) << "layer " << l << " expert " << e;
      EXPECT_EQ(pl.logcnt[l * 8 + e], 1);
    }
  }
  auto bad = ContiguousPlacement(2, 64, 12);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("E = 64 to be a multiple of ranks R = 12"), std::string::npos)
      << bad.status().message();
}

// A trace with L = 1, E = 4, k = 1, from (prompt experts, decode experts) per request.
Trace HandTrace(const std::vector<std::pair<std::vector<int>, std::vector<int>>>& requests) {
  Trace t;
  t.shape = {"hand", 1, 4, 1};
  int64_t offset = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& [prompt, decode] = requests[i];
    TraceRequest r;
    r.id = "r" + std::to_string(i);
    r.prompt_len = static_cast<int64_t>(prompt.size());
    r.num_tokens = r.prompt_len + static_cast<int64_t>(decode.size());
    r.offset = offset;
    offset += r.num_tokens;
    t.requests.push_back(r);
    for (int e : prompt) t.topk_ids.push_back(static_cast<uint16_t>(e));
    for (int e : decode) t.topk_ids.push_back(static_cast<uint16_t>(e));
  }
  EXPECT_TRUE(ValidateTrace(t, "hand").ok());
  return t;
}

TEST(FormDecodeSteps, RoundRobinOverRequestsCutIntoBatches) {
  // Decode lengths 3, 1, 2 (prompt lengths 2, 1, 1). The stream is r0t0 r1t0 r2t0 r0t1 r2t1 r0t2.
  const Trace t = HandTrace({{{0, 0}, {1, 1, 1}}, {{2}, {3}}, {{0}, {2, 2}}});
  const int64_t r0 = 2, r1 = 5 + 1, r2 = 7 + 1;  // first decode row of each request (offset + prompt_len)
  using Steps = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(FormDecodeSteps(t, {0, 1, 2}, 2), (Steps{{r0, r1}, {r2, r0 + 1}, {r2 + 1, r0 + 2}}));
  // Batch 4: one full step; the two tokens left are not a full batch and are dropped.
  EXPECT_EQ(FormDecodeSteps(t, {0, 1, 2}, 4), (Steps{{r0, r1, r2, r0 + 1}}));
  // Fewer tokens than a batch: the one (short) step.
  EXPECT_EQ(FormDecodeSteps(t, {0, 1, 2}, 10), (Steps{{r0, r1, r2, r0 + 1, r2 + 1, r0 + 2}}));
  // The requests' order is the batching order.
  EXPECT_EQ(FormDecodeSteps(t, {2, 0}, 3), (Steps{{r2, r0, r2 + 1}}));
  EXPECT_TRUE(FormDecodeSteps(t, {}, 3).empty());
}

// A calibration for HandTrace's shape: count signatures over the one layer, K = 2 centroids on experts 0
// and 2, so a prompt on expert 0 or 1 goes to cluster 0 and one on 2 or 3 to cluster 1.
Calibration HandCalibration() {
  Calibration c;
  c.shape = {"hand", 1, 4, 1};
  c.signature.variant = SignatureVariant::kCount;
  c.signature.num_layers = 1;
  c.signature.num_experts = 4;
  c.signature.idf = {1, 1, 1, 1};
  c.signature.layer_mask = {1};
  c.num_clusters = 2;
  c.centroids = {0.8f, 0.6f, 0, 0, 0, 0, 0.8f, 0.6f};
  c.sizes = {1, 1};
  c.expert_load = {0.5f, 0.5f, 0, 0, 0, 0, 0.5f, 0.5f};
  return c;
}

TEST(ReplayPlacements, HandComputedTwoClusters) {
  // r0: cluster 0, decodes on experts 0, 1, 0, 1. r1: cluster 1, decodes on 2, 3. r2: cluster 0, on 1, 0.
  const Trace t = HandTrace({{{0, 1}, {0, 1, 0, 1}}, {{2}, {2, 3}}, {{0}, {1, 0}}, {{3}, {}}});
  Calibration c = HandCalibration();
  ComparedPlacements pl;
  pl.contiguous = ContiguousPlacement(1, 4, 2).value();   // ranks {0, 1}, {2, 3}
  pl.global = FromPhy2Log(1, 4, 2, {0, 1, 2, 3});         // the same
  pl.per_cluster = {FromPhy2Log(1, 4, 2, {0, 2, 1, 3}),   // cluster 0: experts 0 and 1 apart
                    FromPhy2Log(1, 4, 2, {0, 1, 2, 3})};  // cluster 1: 2 and 3 together on rank 1
  PlacementReplayOptions o;
  o.batch_size = 2;
  auto rep = ReplayPlacements(t, c, pl, o, "t.h5", "c.h5");
  ASSERT_TRUE(rep.ok()) << rep.status().message();
  const PlacementReplayReport& r = rep.value();
  EXPECT_EQ(r.num_requests, 3);
  EXPECT_EQ(r.num_unusable, 1);  // r3 has no decode token
  EXPECT_EQ(r.num_members_left_out, 0);
  EXPECT_DOUBLE_EQ(r.balanced_max_rank_load, 1.0);  // 2 tokens · k = 1 / R = 2
  ASSERT_EQ(r.clusters.size(), 2u);
  // Cluster 0: stream r0:0 r2:1 | r0:1 r2:0 | r0:0 r0:1 → every step one token on 0 and one on 1.
  const ClusterReplay& c0 = r.clusters[0];
  EXPECT_EQ(c0.requests, 2);
  EXPECT_EQ(c0.decode_tokens, 6);
  EXPECT_EQ(c0.steps, 3);
  EXPECT_DOUBLE_EQ(c0.contiguous.mean_balancedness, 0.5);
  EXPECT_DOUBLE_EQ(c0.contiguous.p1_balancedness, 0.5);
  EXPECT_DOUBLE_EQ(c0.contiguous.mean_max_rank_load, 2.0);
  EXPECT_DOUBLE_EQ(c0.global.mean_balancedness, 0.5);
  EXPECT_DOUBLE_EQ(c0.per_cluster.mean_balancedness, 1.0);
  EXPECT_DOUBLE_EQ(c0.per_cluster.mean_max_rank_load, 1.0);
  // Cluster 1: one step {2, 3}, both on rank 1 under all three placements.
  const ClusterReplay& c1 = r.clusters[1];
  EXPECT_EQ(c1.requests, 1);
  EXPECT_EQ(c1.steps, 1);
  EXPECT_DOUBLE_EQ(c1.contiguous.mean_balancedness, 0.5);
  EXPECT_DOUBLE_EQ(c1.per_cluster.mean_balancedness, 0.5);
  // Pooled: per-cluster steps 1, 1, 1, 0.5 → mean 0.875, p1 = 0.5 + 0.03 · (1 − 0.5) (linear, rank 0.03).
  EXPECT_EQ(r.overall.steps, 4);
  EXPECT_DOUBLE_EQ(r.overall.per_cluster.mean_balancedness, 0.875);
  EXPECT_NEAR(r.overall.per_cluster.p1_balancedness, 0.515, 1e-12);
  EXPECT_DOUBLE_EQ(r.overall.contiguous.mean_balancedness, 0.5);
  EXPECT_DOUBLE_EQ(r.overall.per_cluster.mean_max_rank_load, 1.25);

  // Held out: r0 is a calibration member, so only r2 (cluster 0) and r1 (cluster 1) are replayed.
  c.request_ids = {"r0"};
  o.holdout_only = true;
  rep = ReplayPlacements(t, c, pl, o, "t.h5", "c.h5");
  ASSERT_TRUE(rep.ok()) << rep.status().message();
  EXPECT_EQ(rep.value().num_requests, 2);
  EXPECT_EQ(rep.value().num_calibration_members, 0);
  EXPECT_EQ(rep.value().num_members_left_out, 1);
  EXPECT_EQ(rep.value().clusters[0].requests, 1);
  EXPECT_EQ(rep.value().clusters[0].steps, 1);
  // Without holdout_only the member is replayed and counted.
  o.holdout_only = false;
  EXPECT_EQ(ReplayPlacements(t, c, pl, o, "t.h5", "c.h5").value().num_calibration_members, 1);
  // A cluster that receives no request has no steps and no statistics.
  c.request_ids = {"r0", "r2"};
  o.holdout_only = true;
  rep = ReplayPlacements(t, c, pl, o, "t.h5", "c.h5");
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep.value().clusters[0].steps, 0);
  EXPECT_TRUE(std::isnan(rep.value().clusters[0].per_cluster.mean_balancedness));
  EXPECT_TRUE(rep.value().ToJson()["clusters"][0]["per_cluster"]["mean_balancedness"].is_null());
}

TEST(ReplayPlacements, BadInputsAreClearErrors) {
  const Trace t = HandTrace({{{0}, {0, 1}}, {{2}, {2, 3}}});
  Calibration c = HandCalibration();
  ComparedPlacements pl;
  pl.contiguous = ContiguousPlacement(1, 4, 2).value();
  pl.global = pl.contiguous;
  pl.per_cluster = {pl.contiguous, pl.contiguous};
  PlacementReplayOptions o;
  // Another model shape.
  Trace other = t;
  other.shape.top_k = 2;
  auto r = ReplayPlacements(other, c, pl, o, "t.h5", "c.h5");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("t.h5: model shape"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("c.h5"), std::string::npos);
  // No batch.
  o.batch_size = 0;
  EXPECT_EQ(ReplayPlacements(t, c, pl, o, "t.h5", "c.h5").status().code(), StatusCode::kInvalidArgument);
  o.batch_size = 16;
  // Every request is a member: nothing held out.
  c.request_ids = {"r0", "r1"};
  o.holdout_only = true;
  r = ReplayPlacements(t, c, pl, o, "t.h5", "c.h5");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("t.h5: no held-out request"), std::string::npos) << r.status().message();
  // Placements of the wrong count or rank count.
  o.holdout_only = false;
  ComparedPlacements few = pl;
  few.per_cluster.pop_back();
  EXPECT_FALSE(ReplayPlacements(t, c, few, o, "t.h5", "c.h5").ok());
  ComparedPlacements mixed = pl;
  mixed.global = ContiguousPlacement(1, 4, 4).value();
  EXPECT_FALSE(ReplayPlacements(t, c, mixed, o, "t.h5", "c.h5").ok());
  // Ranks that do not divide the experts: no contiguous placement.
  PlacementSpec spec;
  spec.num_ranks = 3;
  spec.num_slots = 6;
  auto placed = PlaceForEvaluation(c, spec, "c.h5");
  ASSERT_FALSE(placed.ok());
  EXPECT_NE(placed.status().message().find("c.h5: "), std::string::npos);
  EXPECT_NE(placed.status().message().find("multiple of ranks R = 3"), std::string::npos);
}

class PlacementEvalFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("eldr_place_eval_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

Trace DomainTrace() {
  SynthOptions o;
  o.num_domains = 4;
  o.num_requests = 240;
  o.num_layers = 4;
  o.num_experts = 32;
  o.top_k = 2;
  o.prompt_len_min = o.prompt_len_max = 24;
  o.output_len_min = 24;
  o.output_len_max = 48;
  o.domain_affinity = 0.9;  // strong domain structure: most of a token's mass on its domain's experts
  o.shared_fraction = 0.02;
  o.request_affinity = 0.1;
  o.seed = 7;
  auto t = SynthesizeTrace(o);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

TEST_F(PlacementEvalFileTest, PerClusterBeatsContiguousOnStrongDomains) {
  const Trace t = DomainTrace();
  CalibrateOptions co;
  co.num_decoders = 4;
  co.holdout = 0.25;
  co.progress = false;
  auto calib = Calibrate(t, co, nullptr);
  ASSERT_TRUE(calib.ok()) << calib.status().message();
  const Calibration& c = calib.value();
  PlacementSpec spec;
  spec.num_ranks = 8;
  spec.num_slots = 40;
  auto pl = PlaceForEvaluation(c, spec, "c.h5");
  ASSERT_TRUE(pl.ok()) << pl.status().message();
  PlacementReplayOptions o;
  o.holdout_only = true;
  auto rep = ReplayPlacements(t, c, pl.value(), o, "t.h5", "c.h5");
  ASSERT_TRUE(rep.ok()) << rep.status().message();
  const PlacementReplayReport& r = rep.value();
  EXPECT_EQ(r.num_requests, 60);  // the held-out quarter of 240
  EXPECT_EQ(r.num_calibration_members, 0);
  int64_t requests = 0, steps = 0;
  for (const ClusterReplay& cl : r.clusters) {
    requests += cl.requests;
    steps += cl.steps;
    if (cl.steps == 0) continue;
    for (const StepBalance* b : {&cl.contiguous, &cl.global, &cl.per_cluster}) {
      EXPECT_GT(b->p1_balancedness, 0);
      EXPECT_LE(b->p1_balancedness, b->mean_balancedness + 1e-12);
      EXPECT_LE(b->mean_balancedness, 1.0);
      EXPECT_GE(b->mean_max_rank_load, r.balanced_max_rank_load - 1e-9);  // no rank below the mean at max
      EXPECT_LE(b->mean_max_rank_load, 16.0 * 2 + 1e-9);                  // a rank gets a token once per layer
    }
  }
  EXPECT_EQ(requests, 60);
  EXPECT_EQ(steps, r.overall.steps);
  EXPECT_GT(r.overall.steps, 20);
  // Domains concentrate a cluster's decode tokens on few experts: its own placement spreads them.
  EXPECT_GT(r.overall.per_cluster.mean_balancedness, r.overall.contiguous.mean_balancedness);
  EXPECT_GE(r.overall.per_cluster.mean_balancedness, r.overall.global.mean_balancedness);
  EXPECT_LT(r.overall.per_cluster.mean_max_rank_load, r.overall.contiguous.mean_max_rank_load);
  for (const ClusterReplay& cl : r.clusters) {
    if (cl.steps > 0) {
      EXPECT_GT(cl.per_cluster.mean_balancedness, cl.contiguous.mean_balancedness) << cl.cluster;
    }
  }
}

TEST_F(PlacementEvalFileTest, ReadsStoredPlacementsWithTheFallbackRule) {
  const Trace t = DomainTrace();
  CalibrateOptions co;
  co.num_decoders = 2;
  co.progress = false;
  auto calib = Calibrate(t, co, nullptr);
  ASSERT_TRUE(calib.ok()) << calib.status().message();
  const Calibration& c = calib.value();
  const std::string path = Path("c.h5");
  ASSERT_TRUE(WriteCalibration(c, path).ok());
  auto none = ReadPlacements(path, 4, 32, 0, 2);
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_FALSE(none.value().present);

  // A hand-written /placement (no algorithm, nodes or groups) with cluster_0 and global only.
  PlacementSpec spec;
  spec.num_ranks = 4;
  spec.num_slots = 36;
  auto placed = PlaceForEvaluation(c, spec, path);
  ASSERT_TRUE(placed.ok()) << placed.status().message();
  const ComparedPlacements& pl = placed.value();
  {
    auto f = h5::File::OpenReadWrite(path, path);
    ASSERT_TRUE(f.ok());
    h5::File& h = f.value();
    ASSERT_TRUE(h.CreateGroup("/placement").ok());
    ASSERT_TRUE(h.WriteAttribute("/placement", "num_slots", int64_t{36}).ok());
    ASSERT_TRUE(h.WriteAttribute("/placement", "num_ranks", int64_t{4}).ok());
    ASSERT_TRUE(h.Write("/placement/cluster_0/phy2log", pl.per_cluster[0].phy2log, {4, 36}).ok());
    ASSERT_TRUE(h.Write("/placement/global/phy2log", pl.global.phy2log, {4, 36}).ok());
    ASSERT_TRUE(h.Close().ok());
  }
  auto stored = ReadPlacements(path, 4, 32, 0, 2);
  ASSERT_TRUE(stored.ok()) << stored.status().message();
  const StoredPlacements& s = stored.value();
  EXPECT_TRUE(s.present);
  EXPECT_EQ(s.algorithm, "");
  EXPECT_EQ(s.num_ranks, 4);
  EXPECT_EQ(s.num_slots, 36);
  EXPECT_EQ(s.num_nodes, 1);
  EXPECT_FALSE(s.Matches(spec));  // the algorithm is not recorded
  ASSERT_EQ(s.per_cluster.size(), 2u);
  EXPECT_EQ(s.per_cluster[0].phy2log, pl.per_cluster[0].phy2log);
  EXPECT_EQ(s.per_cluster[0].logcnt, pl.per_cluster[0].logcnt);
  EXPECT_EQ(s.per_cluster[1].phy2log, pl.global.phy2log);  // no cluster_1: the global placement
  EXPECT_EQ(s.from_global, std::vector<int>{1});
  EXPECT_EQ(s.global.phy2log, pl.global.phy2log);
  // Only cluster 1 asked for (a decoder's read).
  auto one = ReadPlacements(path, 4, 32, 1, 2);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one.value().per_cluster.size(), 1u);
  EXPECT_EQ(one.value().per_cluster[0].phy2log, pl.global.phy2log);
  // Another model's layer count: Corrupt, naming the file and the dataset.
  auto other = ReadPlacements(path, 5, 32, 0, 2);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(other.status().message().find(path + ": /placement/global/phy2log is [4, 36], expected [L = 5, P = 36]"),
            std::string::npos)
      << other.status().message();
}

}  // namespace
}  // namespace eldr
