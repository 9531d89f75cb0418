// Expert-parallel decoders in the job config: decode.ep_size and decode.placement, the rank layout (world
// size, roles, leaders), the placement a decoder uses and its errors, and the per-decoder EP fields of the
// metrics JSON.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "runtime/common/hdf5.h"
#include "runtime/job/metrics.h"
#include "runtime/serve/expert_parallel.h"

namespace eldr {
namespace {

namespace fs = std::filesystem;

class EpConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("eldr_ep_config_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& decode_line) {
    const std::string p = (dir_ / "job.yaml").string();
    std::ofstream(p) << "topology: {prefill_ranks: 2, decode_ranks: 3}\n"
                     << "model: {config: " << ELDR_SOURCE_DIR << "/configs/models/tiny.yaml}\n"
                     << "routing: {policy: jsq, tau: 0.1, calibration: , admission_cap: 0, seed: 0}\n"
                     << "kv_cache: {block_size: 4, prefill_blocks: 64, decode_blocks: 64}\n"
                     << "workload: {trace: t.h5, request_rate: inf, seed: 0}\n"
                     << "output: {dir: run}\n"
                     << decode_line << "\n";
    return p;
  }
  ModelConfig Tiny() { return LoadModelConfig(std::string(ELDR_SOURCE_DIR) + "/configs/models/tiny.yaml").value(); }
  fs::path dir_;
};

TEST_F(EpConfig, DefaultsToOneRankPerDecoder) {
  auto c = LoadJobConfig(Write("decode: {max_batch: 4}"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->ep_size, 1);
  EXPECT_EQ(c->placement, "contiguous");
  EXPECT_EQ(c->world_size(), 6);
  EXPECT_EQ(c->RoleOf(3), "decode 0");
  EXPECT_EQ(c->RoleOf(5), "decode 2");
  EXPECT_EQ(c->DecoderLeaderRank(2), 5);
}

TEST_F(EpConfig, GroupsOfEpSizeRanksLedByTheirFirst) {
  auto c = LoadJobConfig(Write("decode: {max_batch: 4, ep_size: 2}"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  // 1 router + 2 prefill + 3 decoders x 2 = 9 ranks: decoder k is ranks 3 + 2k (leader) and 4 + 2k.
  EXPECT_EQ(c->world_size(), 9);
  const std::vector<std::string> roles = {"router",   "prefill 0",     "prefill 1", "decode 0",     "decode 0 ep 1",
                                          "decode 1", "decode 1 ep 1", "decode 2",  "decode 2 ep 1"};
  for (int r = 0; r < 9; ++r) EXPECT_EQ(c->RoleOf(r), roles[r]) << r;
  EXPECT_EQ(c->DecoderLeaderRank(0), 3);
  EXPECT_EQ(c->DecoderLeaderRank(2), 7);
  EXPECT_EQ(c->DecoderOfRank(2), -1);
  EXPECT_EQ(c->DecoderOfRank(4), 0);
  EXPECT_EQ(c->DecoderOfRank(7), 2);
  const Status st = CheckWorldSize(c.value(), 6);
  EXPECT_NE(st.message().find("needs 9 ranks (1 router + 2 prefill + 3 decode x 2 EP ranks) but the job has 6"),
            std::string::npos)
      << st.message();
  EXPECT_TRUE(CheckWorldSize(c.value(), 9).ok());
}

TEST_F(EpConfig, RejectsEpSizeBelowOne) {
  for (const char* bad : {"decode: {ep_size: 0}", "decode: {ep_size: -2}"}) {
    auto c = LoadJobConfig(Write(bad));
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().message().find("decode.ep_size must be an integer in [1, 1024]"), std::string::npos)
        << c.status().message();
  }
  EXPECT_NE(LoadJobConfig(Write("decode: {ep_size: two}"))
                .status()
                .message()
                .find("decode.ep_size must be an integer in [1, 1024], got 'two'"),
            std::string::npos);
}

TEST_F(EpConfig, ContiguousPlacementPutsExpertEOnRankEOverEPerRank) {
  auto c = LoadJobConfig(Write("decode: {ep_size: 4}")).value();
  const Placement p = LoadDecoderPlacement(c, Tiny(), 1).value();
  ASSERT_EQ(p.num_ranks, 4);
  ASSERT_EQ(p.num_slots, 8);
  for (int l = 0; l < 2; ++l) {
    for (int s = 0; s < 8; ++s) EXPECT_EQ(p.phy2log[l * 8 + s], s);  // rank r holds experts 2r, 2r + 1
  }
  c.ep_size = 3;
  const Status st = LoadDecoderPlacement(c, Tiny(), 0).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("E = 8 experts and decode.ep_size is 3"), std::string::npos) << st.message();
}

// A calibration-like file with /placement as `eldr place calib` writes it (no algorithm, nodes or groups): cluster_1
// and global.
TEST_F(EpConfig, PlacementFileUsesTheDecodersClusterElseGlobalAndChecksTheRankCount) {
  const std::string path = (dir_ / "calib.h5").string();
  {
    auto f = h5::File::Create(path, path).value();
    ASSERT_TRUE(f.CreateGroup("/placement").ok());
    ASSERT_TRUE(f.WriteAttribute("/placement", "num_ranks", int64_t{2}).ok());
    ASSERT_TRUE(f.WriteAttribute("/placement", "num_slots", int64_t{10}).ok());
    const std::vector<int32_t> global = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1};
    const std::vector<int32_t> cluster1 = {0, 1, 2, 3, 7, 4, 5, 6, 7, 0, 7, 1, 2, 3, 6, 4, 5, 6, 7, 0};
    ASSERT_TRUE(f.Write("/placement/global/phy2log", global, {2, 10}).ok());
    ASSERT_TRUE(f.Write("/placement/cluster_1/phy2log", cluster1, {2, 10}).ok());
    ASSERT_TRUE(f.Close().ok());
  }
  auto c = LoadJobConfig(Write("decode: {ep_size: 2, placement: calib.h5}")).value();
  EXPECT_EQ(c.placement, path);                                     // resolved next to the config
  const Placement p0 = LoadDecoderPlacement(c, Tiny(), 0).value();  // no cluster_0: global
  const Placement p1 = LoadDecoderPlacement(c, Tiny(), 1).value();
  EXPECT_EQ(p0.phy2log[8], 0);
  EXPECT_EQ(p0.logcnt[0], 2);
  EXPECT_EQ(p1.phy2log[4], 7);
  EXPECT_EQ(p1.logcnt[7], 2);
  c.ep_size = 5;
  const Status st = LoadDecoderPlacement(c, Tiny(), 0).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(path + ": /placement is for 2 EP ranks but decode.ep_size is 5"), std::string::npos)
      << st.message();
  c.placement = (dir_ / "missing.h5").string();
  EXPECT_NE(LoadDecoderPlacement(c, Tiny(), 0).status().message().find("missing.h5: no such file"), std::string::npos);
}

TEST(EpMetrics, DecoderFieldsAppearOnlyWithEpSize) {
  JobConfig c;
  std::vector<RequestRecord> records(1);
  records[0].token_times = {1.0};
  DecoderStats plain;
  plain.decoder = 0;
  plain.leader_rank = 2;
  plain.requests = 1;
  plain.steps = 3;
  plain.batch_sum = 6;
  plain.distinct_sum = 9;
  DecoderStats one = plain;
  one.ep_size = 1;
  DecoderStats two = plain;
  two.ep_size = 2;
  two.mean_rank_load = {5.5, 2.5};
  two.mean_balancedness = 0.8;
  two.p1_balancedness = 0.6;
  const nlohmann::json j = JobMetrics(c, "tiny", records, {plain, one, two}, {});
  const auto& d = j["decoders"];
  EXPECT_FALSE(d[0].contains("ep_size"));  // not recorded
  EXPECT_EQ(d[1]["ep_size"], 1);
  EXPECT_FALSE(d[1].contains("mean_rank_load"));
  EXPECT_EQ(d[2]["ep_size"], 2);
  EXPECT_EQ(d[2]["mean_rank_load"], (std::vector<double>{5.5, 2.5}));
  EXPECT_DOUBLE_EQ(d[2]["mean_balancedness"].get<double>(), 0.8);
  EXPECT_DOUBLE_EQ(d[2]["p1_balancedness"].get<double>(), 0.6);
  EXPECT_EQ(j["topology"]["ep_size"], 1);
}

}  // namespace
}  // namespace eldr
