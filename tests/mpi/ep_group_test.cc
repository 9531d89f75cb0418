// Expert-parallel decode groups under mpirun -np 3 (label mpi): the replica choice on a hand-made placement,
// the EP MoE layer with G = 2 and G = 3 against the single-rank computation (bit for bit) and against a
// plain per-token loop (tolerance), with placements that replicate hot experts, and whole decode steps of the
// tiny model through an EP group = a single-rank decoder's logits. GoogleTest with a main that silences ranks
// other than 0 and fails if any rank fails (STYLE.md).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "placement/placement.h"
#include "runtime/kvcache/block_manager.h"
#include "runtime/model/executor.h"
#include "runtime/serve/expert_parallel.h"

namespace eldr {
namespace {

int WorldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int WorldSize() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// The tiny model (3 layers, the first dense; 8 experts, top-2, hidden 32, expert intermediate 16), fp32.
const ModelWeights& Tiny() {
  static const ModelWeights w = [] {
    auto c = LoadModelConfig(std::string(ELDR_SOURCE_DIR) + "/configs/models/tiny.yaml").value();
    return MakeSyntheticWeights(c, SyntheticWeightOptions{}).value();
  }();
  return w;
}

// Hand-made placement of the tiny model on 2 ranks, 5 slots each, the same in both MoE layers:
//   rank 0: slots 0-4 = experts 0 1 2 3 4;  rank 1: slots 5-9 = experts 0 5 6 7 1.
// Expert 0 has replicas in slots {0, 5}, expert 1 in {1, 9}.
Placement HandPlacement() {
  std::vector<int32_t> row = {0, 1, 2, 3, 4, 0, 5, 6, 7, 1};
  std::vector<int32_t> phy2log = row;
  phy2log.insert(phy2log.end(), row.begin(), row.end());
  return PlacementFromPhy2Log(2, 8, 2, phy2log).value();
}

// Tokens t0 {0, 1}, t1 {0, 2}, t2 {0, 3}, t3 {1, 2}.
const std::vector<int32_t> kHandIds = {0, 1, 0, 2, 0, 3, 1, 2};

TEST(EpGroup, ReplicaChoiceIsRoundRobinInPairOrder) {
  const EpDispatchPlan plan = PlanDispatch(HandPlacement(), 0, kHandIds.data(), 4, 2);
  // Expert 0's pairs p0, p2, p4 go to its replicas 0, 1, 0 = slots 0, 5, 0; expert 1's p1, p6 to slots 1, 9.
  EXPECT_EQ(plan.slot, (std::vector<int32_t>{0, 1, 5, 2, 0, 3, 9, 2}));
  EXPECT_EQ(plan.order, (std::vector<int32_t>{0, 4, 1, 3, 7, 5, 2, 6}));  // by slot, then pair
  EXPECT_EQ(plan.rows_per_rank, (std::vector<int64_t>{6, 2}));
  EXPECT_EQ(plan.offset, (std::vector<int64_t>{0, 6, 8}));
}

// out[t] += Σ_j w[t, j] · expert(x[t]), each expert's SwiGLU in double from the fp32 weights.
std::vector<float> NaiveMoe(const ModelWeights& w, int layer, const std::vector<float>& x,
                            const std::vector<int32_t>& ids, const std::vector<float>& wt, int T, int K,
                            std::vector<float> out) {
  const auto& ex = w.layers[layer].experts;
  const int H = ex.hidden, I = ex.intermediate;
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < K; ++j) {
      const int e = ids[t * K + j];
      const float* g = static_cast<const float*>(ex.gate_proj[e].data);
      const float* u = static_cast<const float*>(ex.up_proj[e].data);
      const float* d = static_cast<const float*>(ex.down_proj[e].data);
      std::vector<double> h(I);
      for (int i = 0; i < I; ++i) {
        double a = 0, b = 0;
        for (int k = 0; k < H; ++k) {
          a += static_cast<double>(g[i * H + k]) * x[t * H + k];
          b += static_cast<double>(u[i * H + k]) * x[t * H + k];
        }
        h[i] = a / (1 + std::exp(-a)) * b;
      }
      for (int o = 0; o < H; ++o) {
        double y = 0;
        for (int i = 0; i < I; ++i) y += static_cast<double>(d[o * I + i]) * h[i];
        out[t * H + o] += static_cast<float>(wt[t * K + j] * y);
      }
    }
  }
  return out;
}

struct LayerCase {
  int T = 0;
  std::vector<float> x, wt, base;  // [T, H], [T, K], [T, H]
  std::vector<int32_t> ids;        // [T, K]
};

LayerCase RandomCase(int T, int H, int E, uint64_t seed, bool hot_expert_0) {  // top-2 routing
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  LayerCase c;
  c.T = T;
  c.x.resize(static_cast<size_t>(T) * H);
  c.base.resize(static_cast<size_t>(T) * H);
  for (auto& v : c.x) v = n(rng);
  for (auto& v : c.base) v = n(rng);
  for (int t = 0; t < T; ++t) {
    int a = hot_expert_0 ? 0 : static_cast<int>(rng() % E);
    int b = static_cast<int>(rng() % (E - 1));
    if (b >= a) ++b;
    c.ids.push_back(a);
    c.ids.push_back(b);
    const float p = 0.3f + 0.4f * static_cast<float>(rng() % 1000) / 1000.f;
    c.wt.push_back(p);
    c.wt.push_back(1 - p);
  }
  return c;
}

// Runs one MoE layer on an EP group of G = placement.num_ranks world ranks [0, G); the other world ranks sit
// out. On the leader: the EP output equals kernels::MoeExperts bit for bit and a per-token loop within 1e-5,
// and the recorded rank loads are returned.
EpStepLoad RunLayerOnGroup(const Placement& placement, int layer, int moe_layer, const LayerCase& c) {
  const ModelWeights& w = Tiny();
  const int G = placement.num_ranks, K = 2;
  const int rank = WorldRank();
  GroupComm group = GroupComm::Split(MPI_COMM_WORLD, rank < G ? 0 : -1, rank);
  EpStepLoad load;
  if (!group.valid()) return load;
  EXPECT_EQ(group.size(), G);
  if (group.rank() > 0) {
    EXPECT_TRUE(RunEpMember(w, placement, group).ok());
    return load;
  }
  EpExpertBackend ep(w, placement, group);
  std::vector<float> out = c.base;
  MoeLayerCall call;
  call.layer = layer;
  call.moe_layer = moe_layer;
  call.x = c.x.data();
  call.topk_ids = c.ids.data();
  call.topk_weights = c.wt.data();
  call.num_tokens = c.T;
  call.top_k = K;
  call.out = out.data();
  call.batch_invariant = true;
  EXPECT_TRUE(ep.RunExperts(call).ok());
  load = ep.TakeStepLoad();
  ep.StopMembers();
  std::vector<float> local = c.base;
  kernels::MoeExperts({c.x.data(), c.ids.data(), c.wt.data(), c.T, K, &w.layers[layer].experts, local.data(), true});
  EXPECT_EQ(std::memcmp(out.data(), local.data(), out.size() * sizeof(float)), 0)
      << "EP output differs from the local one";
  const std::vector<float> naive = NaiveMoe(w, layer, c.x, c.ids, c.wt, c.T, K, c.base);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], naive[i], 1e-5 * (1 + std::abs(naive[i]))) << i;
  return load;
}

TEST(EpGroup, TwoRanksHandPlacementMatchesLocalAndCountsRankLoads) {
  if (WorldSize() < 2) GTEST_SKIP() << "needs 2 ranks";
  LayerCase c;
  c.T = 4;
  c.ids = kHandIds;
  const int H = Tiny().config.hidden_size;
  for (int i = 0; i < 4 * H; ++i) {
    c.x.push_back(std::sin(0.37f * static_cast<float>(i)));
    c.base.push_back(0.01f * static_cast<float>(i % 7));
  }
  c.wt = {0.6f, 0.4f, 0.7f, 0.3f, 0.5f, 0.5f, 0.8f, 0.2f};
  const EpStepLoad load = RunLayerOnGroup(HandPlacement(), 1, 0, c);
  if (WorldRank() == 0) {
    EXPECT_EQ(load.rank_load, (std::vector<int64_t>{6, 2}));  // see ReplicaChoiceIsRoundRobinInPairOrder
    EXPECT_DOUBLE_EQ(load.sum_mean, 4.0);
    EXPECT_DOUBLE_EQ(load.sum_max, 6.0);
    EXPECT_NEAR(load.balancedness(), 4.0 / 6.0, 1e-12);
  }
}

// eldr's placement with redundant slots for a load where expert 0 is hot: it gets replicas on several ranks.
Placement PlacedWithReplicas(int G, int P) {
  PlacementProblem p;
  p.num_layers = 2;
  p.num_experts = 8;
  p.load = {40, 3, 5, 2, 8, 1, 6, 4, 9, 30, 2, 7, 1, 3, 5, 2};
  p.num_slots = P;
  p.num_ranks = G;
  auto placed = Place(p, PlacementAlgorithm::kEldr);
  EXPECT_TRUE(placed.ok()) << placed.status().message();
  return placed.value();
}

TEST(EpGroup, TwoAndThreeRanksWithReplicasMatchLocal) {
  const int H = Tiny().config.hidden_size;
  for (int G : {2, 3}) {
    if (WorldSize() < G) {
      std::printf("skipping G = %d: needs %d ranks\n", G, G);
      continue;
    }
    const Placement pl = PlacedWithReplicas(G, G == 2 ? 10 : 12);
    ASSERT_GE(pl.logcnt[0], 2) << "the hot expert must be replicated for this test to mean something";
    ASSERT_GE(pl.logcnt[8 + 1], 2);
    for (int moe_layer : {0, 1}) {
      // 9 tokens, all with expert 0 (layer 0's hot one): more rows per expert than the GEMM threshold.
      const LayerCase c = RandomCase(9, H, 8, 100 + G * 10 + moe_layer, moe_layer == 0);
      const EpStepLoad load = RunLayerOnGroup(pl, 1 + moe_layer, moe_layer, c);
      if (WorldRank() == 0) {
        int64_t sum = 0;
        for (int64_t v : load.rank_load) sum += v;
        EXPECT_EQ(sum, 9 * 2);
        EXPECT_EQ(static_cast<int>(load.rank_load.size()), G);
      }
    }
  }
}

// Whole decode steps: the tiny model's executor with its MoE layers on a G-rank group gives the same logits,
// bit for bit, as a single-rank executor, for a batch of 6 sequences over 4 steps.
TEST(EpGroup, DecodeStepsEqualASingleRankDecoder) {
  const ModelWeights& w = Tiny();
  const int G = std::min(3, WorldSize());
  if (G < 2) GTEST_SKIP() << "needs 2 ranks";
  const Placement pl = PlacedWithReplicas(G, G == 2 ? 10 : 12);
  const int rank = WorldRank();
  GroupComm group = GroupComm::Split(MPI_COMM_WORLD, rank < G ? 0 : -1, rank);
  if (!group.valid()) return;
  if (group.rank() > 0) {
    EXPECT_TRUE(RunEpMember(w, pl, group).ok());
    return;
  }
  EpExpertBackend ep(w, pl, group);
  Executor single(w, 64, 4), grouped(w, 64, 4);
  BlockManager bm(64, 4);
  const int num_seqs = 6, steps = 4;
  std::vector<std::vector<BlockId>> tables(num_seqs);
  std::vector<int32_t> tokens(num_seqs), positions(num_seqs);
  std::mt19937_64 rng(7);
  for (int s = 0; s < num_seqs; ++s) {
    std::vector<int32_t> prompt(5 + s);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % w.config.vocab_size);
    tables[s] = bm.AllocateBlocks(4).value();  // 16 positions
    auto a = single.Prefill(prompt, tables[s], 0, nullptr, nullptr);
    auto b = grouped.Prefill(prompt, tables[s], 0, nullptr, nullptr);  // local experts: prefill is not EP
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->next_token, b->next_token);
    tokens[s] = a->next_token;
    positions[s] = static_cast<int32_t>(prompt.size());
  }
  grouped.set_expert_backend(&ep);
  int64_t activations = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<DecodeSequence> batch(num_seqs);
    for (int s = 0; s < num_seqs; ++s) batch[s] = {tokens[s], positions[s], &tables[s], nullptr};
    auto a = single.Decode(batch);
    auto b = grouped.Decode(batch);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->logits.size(), b->logits.size());
    EXPECT_EQ(std::memcmp(a->logits.data(), b->logits.data(), a->logits.size() * sizeof(float)), 0)
        << "step " << step << ": EP logits differ from the single-rank decoder's";
    EXPECT_EQ(a->next_tokens, b->next_tokens);
    EXPECT_EQ(a->topk_ids, b->topk_ids);
    const EpStepLoad load = ep.TakeStepLoad();
    for (int64_t v : load.rank_load) activations += v;
    EXPECT_GT(load.balancedness(), 0.0);
    EXPECT_LE(load.balancedness(), 1.0);
    for (int s = 0; s < num_seqs; ++s) {
      tokens[s] = a->next_tokens[s];
      ++positions[s];
    }
  }
  EXPECT_EQ(activations, int64_t{steps} * num_seqs * w.config.num_moe_layers() * w.config.num_experts_per_tok);
  ep.StopMembers();
}

}  // namespace
}  // namespace eldr
