// /placement of calibration.h5 (runtime/calib/placement_store.h): the global load against a hand-computed sum,
// the write/read round trip of `eldr place calib`, the fallback rule (cluster_k, else global) and corrupt
// groups as clear errors.
#include "runtime/calib/placement_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "runtime/calib/calibrate.h"
#include "runtime/common/hdf5.h"
#include "runtime/trace/synth.h"

namespace eldr {
namespace {

namespace fs = std::filesystem;

TEST(GlobalExpertLoad, SizeWeightedSumOfClusterLoads) {
  Calibration c;
  c.shape = {"hand", 1, 2, 1};
  c.num_clusters = 2;
  c.sizes = {3, 1};
  c.expert_load = {0.5f, 0.5f, 1.0f, 0.0f};  // [K = 2, L = 1, E = 2]
  // 3 · (0.5, 0.5) + 1 · (1, 0) = (2.5, 1.5).
  const std::vector<double> g = GlobalExpertLoad(c);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_DOUBLE_EQ(g[0], 2.5);
  EXPECT_DOUBLE_EQ(g[1], 1.5);
}

class PlacementStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("eldr_placement_store_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    SynthOptions o;
    o.num_domains = 3;
    o.num_requests = 60;
    o.num_layers = 3;
    o.num_experts = 16;
    o.top_k = 2;
    o.prompt_len_min = o.prompt_len_max = 8;
    o.output_len_min = o.output_len_max = 8;
    o.seed = 3;
    auto t = SynthesizeTrace(o);
    ASSERT_TRUE(t.ok()) << t.status().message();
    CalibrateOptions co;
    co.num_decoders = 3;
    co.progress = false;
    auto c = Calibrate(t.value(), co, nullptr);
    ASSERT_TRUE(c.ok()) << c.status().message();
    calib_ = std::move(c).value();
    path_ = (dir_ / "calib.h5").string();
    ASSERT_TRUE(WriteCalibration(calib_, path_).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }
  PlacementSpec Spec() const {
    PlacementSpec s;
    s.num_ranks = 4;
    s.num_slots = 20;
    return s;
  }
  fs::path dir_;
  Calibration calib_;
  std::string path_;
};

// PlaceClusters passes the hooks on: on_layer counts 1..(K + 1) * L over the K + 1 placements in order, and a
// check that fails once 4 layers are placed stops it there, with that status (the one thread here places a layer
// at a time: L = 3 < 16 layers per thread).
TEST_F(PlacementStoreTest, PlaceClustersCountsLayersOverAllPlacementsAndStops) {
  std::vector<int> seen;
  PlaceHooks hooks;
  hooks.on_layer = [&](int done) { seen.push_back(done); };
  ASSERT_TRUE(PlaceClusters(calib_, Spec(), &hooks).ok());
  std::vector<int> expected(4 * 3);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<int>(i) + 1;
  EXPECT_EQ(seen, expected);
  seen.clear();
  hooks.check = [&] { return seen.size() >= 4 ? Status::ResourceExhausted("stop") : Status::Ok(); };
  auto stopped = PlaceClusters(calib_, Spec(), &hooks);
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.status().message(), "stop");
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 3, 4}));
}

TEST_F(PlacementStoreTest, WriteThenReadRoundTrips) {
  auto placed = PlaceClusters(calib_, Spec());
  ASSERT_TRUE(placed.ok()) << placed.status().message();
  const ClusterPlacements& p = placed.value();
  ASSERT_EQ(p.per_cluster.size(), 3u);
  ASSERT_EQ(p.balancedness.size(), 4u);
  for (double b : p.balancedness) EXPECT_TRUE(b > 0 && b <= 1) << b;
  const std::string out = (dir_ / "placed.h5").string();
  ASSERT_TRUE(WritePlacements(p, path_, out).ok());
  auto stored = ReadPlacements(out, 3, 16, 0, 3);
  ASSERT_TRUE(stored.ok()) << stored.status().message();
  const StoredPlacements& s = stored.value();
  EXPECT_TRUE(s.present);
  EXPECT_TRUE(s.Matches(Spec()));
  EXPECT_EQ(s.algorithm, "eldr");
  EXPECT_TRUE(s.from_global.empty());
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(s.per_cluster[k].phy2log, p.per_cluster[k].phy2log) << k;
    EXPECT_EQ(s.per_cluster[k].logcnt, p.per_cluster[k].logcnt) << k;
  }
  EXPECT_EQ(s.global.phy2log, p.global.phy2log);
  PlacementSpec other = Spec();
  other.num_slots = 24;
  EXPECT_FALSE(s.Matches(other));
  // The written file is still a calibration, with the attributes of the layout.
  EXPECT_TRUE(ReadCalibration(out).ok());
  auto f = h5::File::OpenReadOnly(out);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f.value().ReadIntAttribute("/placement", "num_clusters").value(), 3);
  EXPECT_DOUBLE_EQ(f.value().ReadDoubleAttribute("/placement/global", "balancedness").value(), p.balancedness[3]);
  EXPECT_TRUE(f.value().Exists("/placement/cluster_2/log2phy"));
  // The source is untouched; writing in place replaces nothing but /placement.
  EXPECT_FALSE(ReadPlacements(path_, 3, 16, 0, 3).value().present);
  ASSERT_TRUE(WritePlacements(p, path_, path_).ok());
  EXPECT_TRUE(ReadPlacements(path_, 3, 16, 0, 3).value().Matches(Spec()));
}

TEST_F(PlacementStoreTest, MissingClusterUsesGlobalAndCorruptGroupsAreErrors) {
  const ClusterPlacements p = PlaceClusters(calib_, Spec()).value();
  ASSERT_TRUE(WritePlacements(p, path_, path_).ok());
  {
    auto f = h5::File::OpenReadWrite(path_, path_);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f.value().Remove("/placement/cluster_1").ok());
    ASSERT_TRUE(f.value().Close().ok());
  }
  auto s = ReadPlacements(path_, 3, 16, 0, 3);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s.value().from_global, std::vector<int>{1});
  EXPECT_EQ(s.value().per_cluster[1].phy2log, p.global.phy2log);
  EXPECT_EQ(s.value().per_cluster[2].phy2log, p.per_cluster[2].phy2log);
  // A cluster beyond the file's K (more decoders than clusters) also uses global.
  EXPECT_EQ(ReadPlacements(path_, 3, 16, 7, 8).value().per_cluster[0].phy2log, p.global.phy2log);
  {
    auto f = h5::File::OpenReadWrite(path_, path_);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f.value().Remove("/placement/global").ok());
    ASSERT_TRUE(f.value().Close().ok());
  }
  auto no_global = ReadPlacements(path_, 3, 16, 0, 3);
  ASSERT_FALSE(no_global.ok());
  EXPECT_EQ(no_global.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(no_global.status().message().find(path_ + ": /placement has no global/phy2log"), std::string::npos)
      << no_global.status().message();
  // An expert id outside [0, E): Corrupt naming the dataset.
  ClusterPlacements bad = p;
  bad.per_cluster[0].phy2log[0] = 99;
  ASSERT_TRUE(WritePlacements(bad, path_, path_).ok());
  auto out_of_range = ReadPlacements(path_, 3, 16, 0, 1);
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_NE(out_of_range.status().message().find(path_ + ": /placement/cluster_0/phy2log: "), std::string::npos)
      << out_of_range.status().message();
}

// logcnt and log2phy are copies written for other tools: where present they must say what phy2log says (in any
// slot order), and num_clusters must be the file's own cluster count. Each damage is made by hand below.
TEST_F(PlacementStoreTest, CopiesThatContradictPhy2LogAndAStaleClusterCountAreCorrupt) {
  const ClusterPlacements p = PlaceClusters(calib_, Spec()).value();
  const std::string g = "/placement/cluster_0";
  const Placement& pl = p.per_cluster[0];
  const hsize_t L = 3, E = 16, W = pl.max_replicas;
  ASSERT_GE(W, 2u) << "the test needs an expert with two replicas";
  // Replaces one dataset of cluster_0 (or removes it when `data` is empty) in a fresh copy of the placement.
  auto rewrite = [&](const std::string& name, const std::vector<int32_t>& data, const h5::Dims& dims) {
    ASSERT_TRUE(WritePlacements(p, path_, path_).ok());
    auto f = h5::File::OpenReadWrite(path_, path_);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f.value().Remove(g + "/" + name).ok());
    if (!data.empty()) {
      ASSERT_TRUE(f.value().Write(g + "/" + name, data, dims).ok());
    }
    ASSERT_TRUE(f.value().Close().ok());
  };
  auto error_of = [&] {
    auto s = ReadPlacements(path_, 3, 16, 0, 3);
    return s.ok() ? std::string("OK") : s.status().message();
  };
  // The first expert of layer 0 with two or more replicas, and its row of log2phy.
  int e2 = 0;
  while (pl.logcnt[e2] < 2) ++e2;
  const size_t row = static_cast<size_t>(e2) * W;

  // Its slots listed in reverse order (as the DeepSeek variants may list them): the same placement.
  std::vector<int32_t> log2phy = pl.log2phy;
  std::reverse(log2phy.begin() + row, log2phy.begin() + row + pl.logcnt[e2]);
  rewrite("log2phy", log2phy, {L, E, W});
  EXPECT_EQ(error_of(), "OK");
  // One of its slots replaced by a slot of another expert.
  log2phy = pl.log2phy;
  log2phy[row] = pl.log2phy[e2 == 0 ? W : 0];
  rewrite("log2phy", log2phy, {L, E, W});
  EXPECT_NE(error_of().find(path_ + ": " + g + "/log2phy[0, " + std::to_string(e2) + "] = ["), std::string::npos)
      << error_of();
  // A slot in the padding.
  log2phy = pl.log2phy;
  int e1 = 0;
  while (pl.logcnt[e1] != 1) ++e1;
  log2phy[static_cast<size_t>(e1) * W + 1] = pl.log2phy[row];
  rewrite("log2phy", log2phy, {L, E, W});
  EXPECT_NE(error_of().find(g + "/log2phy[0, " + std::to_string(e1) + "]"), std::string::npos) << error_of();
  // Another width.
  log2phy.assign(L * E * (W + 1), -1);
  rewrite("log2phy", log2phy, {L, E, W + 1});
  EXPECT_NE(error_of().find(g + "/log2phy is [3, 16, " + std::to_string(W + 1) + "]"), std::string::npos) << error_of();
  // A replica count moved from one expert to another (the sum still P).
  std::vector<int32_t> logcnt = pl.logcnt;
  --logcnt[e2];
  ++logcnt[e1];
  rewrite("logcnt", logcnt, {L, E});
  EXPECT_NE(error_of().find(path_ + ": " + g + "/logcnt[0, " + std::to_string(std::min(e1, e2)) + "]"),
            std::string::npos)
      << error_of();
  // Without the copies, phy2log alone is the placement.
  rewrite("logcnt", {}, {});
  {
    auto f = h5::File::OpenReadWrite(path_, path_);
    ASSERT_TRUE(f.value().Remove(g + "/log2phy").ok());
    ASSERT_TRUE(f.value().Close().ok());
  }
  auto alone = ReadPlacements(path_, 3, 16, 0, 3);
  ASSERT_TRUE(alone.ok()) << alone.status().message();
  EXPECT_EQ(alone.value().per_cluster[0].log2phy, pl.log2phy);
  // A /placement made for another clustering (here: four clusters, the file's /clusters has three).
  ASSERT_TRUE(WritePlacements(p, path_, path_).ok());
  {
    auto f = h5::File::OpenReadWrite(path_, path_);
    ASSERT_TRUE(f.value().WriteAttribute("/placement", "num_clusters", int64_t{4}).ok());
    ASSERT_TRUE(f.value().Close().ok());
  }
  EXPECT_NE(error_of().find(path_ + ": /placement was made for num_clusters = 4 clusters but /clusters has 3"),
            std::string::npos)
      << error_of();
}

// /placement holds global and cluster_0..cluster_{K-1}, each balancedness a number in [0, 1]: a stray group (left
// by another clustering or tool) or a damaged attribute is refused, each made by hand below.
TEST_F(PlacementStoreTest, StrayMembersAndDamagedBalancednessAreCorrupt) {
  const ClusterPlacements p = PlaceClusters(calib_, Spec()).value();
  auto damaged = [&](const std::function<void(h5::File&)>& damage) {
    EXPECT_TRUE(WritePlacements(p, path_, path_).ok());
    auto f = h5::File::OpenReadWrite(path_, path_);
    EXPECT_TRUE(f.ok());
    damage(f.value());
    EXPECT_TRUE(f.value().Close().ok());
    auto s = ReadPlacements(path_, 3, 16, 0, 3);
    return s.ok() ? std::string("OK") : s.status().message();
  };
  EXPECT_EQ(damaged([](h5::File&) {}), "OK");
  const std::vector<std::pair<std::function<void(h5::File&)>, std::string>> cases = {
      {[](h5::File& f) { ASSERT_TRUE(f.CreateGroup("/placement/cluster_3").ok()); },
       "/placement/cluster_3 is beyond the file's 3 clusters (cluster_0..cluster_2)"},
      {[](h5::File& f) { ASSERT_TRUE(f.CreateGroup("/placement/cluster_99").ok()); },
       "/placement/cluster_99 is beyond the file's 3 clusters"},
      {[](h5::File& f) { ASSERT_TRUE(f.CreateGroup("/placement/cluster_01").ok()); },
       "/placement has a member 'cluster_01'"},
      {[](h5::File& f) { ASSERT_TRUE(f.Write("/placement/notes", std::vector<int32_t>{1}, {1}).ok()); },
       "/placement has a member 'notes'"},
      {[](h5::File& f) {
         ASSERT_TRUE(f.WriteAttribute("/placement/cluster_1", "balancedness", std::string("0.9")).ok());
       },
       "/placement/cluster_1@balancedness is not a number"},
      {[](h5::File& f) { ASSERT_TRUE(f.WriteAttribute("/placement/global", "balancedness", 1.5).ok()); },
       "/placement/global@balancedness = 1.5"},
  };
  for (const auto& [damage, message] : cases) {
    const std::string error = damaged(damage);
    EXPECT_NE(error.find(path_ + ": " + message), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace eldr
