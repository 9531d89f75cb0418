// Batch invariance (kernels/ops.h): a token's result does not depend, bit for bit, on the other tokens of the
// call. This is what lets `eldr serve` (batched decode, prefix-cache hits) decode the same tokens as a
// single-sequence run (tests/mpi/serve_test.sh against serve_reference). Checked on the products themselves
// (every tile shape, a thread split, bf16) and on the executor: a batched decode step against each sequence
// alone, and a prefill after a prefix hit (partial and full) against a cold prefill, all with EXPECT_EQ on
// the floats, never a tolerance. The products are also checked against a double-precision brute force.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "runtime/kvcache/block_manager.h"
#include "runtime/model/executor.h"

namespace eldr {
namespace {

std::vector<float> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(BatchInvariance, LinearRowsDoNotDependOnTheirNeighbours) {
  // Shapes: columns a multiple of the SIMD width, and not; rows not a multiple of any register tile.
  for (auto [out, in] : {std::pair<int, int>{50, 37}, {67, 160}, {300, 161}}) {
    const std::vector<float> w = Random(static_cast<size_t>(out) * in, out + in);
    std::vector<uint16_t> wb(w.size());
    for (size_t i = 0; i < w.size(); ++i) wb[i] = kernels::FloatToBf16(w[i]);
    for (kernels::DType dtype : {kernels::DType::kF32, kernels::DType::kBF16}) {
      const kernels::WeightMatrix W{
          dtype, dtype == kernels::DType::kF32 ? static_cast<const void*>(w.data()) : wb.data(), out, in};
      // 1..9 tokens covers every token tile (4, 3, 2, 1) and their mixes; 70 crosses a token block and, with
      // the larger shapes, Linear's split over threads.
      for (int n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 33, 70}) {
        const std::vector<float> x = Random(static_cast<size_t>(n) * in, 1000 + n);
        std::vector<float> all(static_cast<size_t>(n) * out), one(out);
        kernels::Linear({x.data(), W, all.data(), n});
        for (int t = 0; t < n; ++t) {
          kernels::Linear({x.data() + static_cast<size_t>(t) * in, W, one.data(), 1});
          const std::vector<float> row(all.begin() + static_cast<size_t>(t) * out,
                                       all.begin() + static_cast<size_t>(t + 1) * out);
          ASSERT_EQ(row, one) << "shape " << out << "x" << in << ", n " << n << ", token " << t;
          for (int o = 0; o < out; ++o) {  // and it is the product (double-precision brute force)
            double ref = 0;
            for (int k = 0; k < in; ++k) {
              const double wk = dtype == kernels::DType::kF32
                                    ? w[static_cast<size_t>(o) * in + k]
                                    : kernels::Bf16ToFloat(wb[static_cast<size_t>(o) * in + k]);
              ref += wk * x[static_cast<size_t>(t) * in + k];
            }
            ASSERT_NEAR(one[o], ref, 1e-4 * (1 + std::abs(ref))) << o;
          }
        }
      }
    }
  }
}

TEST(BatchInvariance, MlpAndMoeRowsDoNotDependOnTheirNeighbours) {
  const int H = 40, I = 24, E = 6, K = 2, n = 11;
  const std::vector<float> gate = Random(I * H, 1), up = Random(I * H, 2), down = Random(H * I, 3);
  std::vector<std::vector<float>> eg, eu, ed;
  kernels::ExpertWeights experts;
  experts.num_experts = E;
  experts.hidden = H;
  experts.intermediate = I;
  for (int e = 0; e < E; ++e) {
    eg.push_back(Random(I * H, 10 + e));
    eu.push_back(Random(I * H, 20 + e));
    ed.push_back(Random(H * I, 30 + e));
  }
  for (int e = 0; e < E; ++e) {
    experts.gate_proj.push_back({kernels::DType::kF32, eg[e].data(), I, H});
    experts.up_proj.push_back({kernels::DType::kF32, eu[e].data(), I, H});
    experts.down_proj.push_back({kernels::DType::kF32, ed[e].data(), H, I});
  }
  const std::vector<float> x = Random(n * H, 4);
  std::vector<int32_t> ids(n * K);
  std::vector<float> wts(n * K);
  for (int t = 0; t < n; ++t) {  // most tokens share expert 0, so it gets a many-row product
    ids[t * K] = 0;
    ids[t * K + 1] = 1 + t % (E - 1);
    wts[t * K] = 0.7f;
    wts[t * K + 1] = 0.3f;
  }
  const kernels::WeightMatrix G{kernels::DType::kF32, gate.data(), I, H}, U{kernels::DType::kF32, up.data(), I, H},
      D{kernels::DType::kF32, down.data(), H, I};
  std::vector<float> mlp_all(n * H, 0.f), moe_all(n * H, 0.f);
  kernels::Mlp({x.data(), G, U, D, n, mlp_all.data()});
  kernels::MoeParams moe;
  moe.x = x.data();
  moe.topk_ids = ids.data();
  moe.topk_weights = wts.data();
  moe.num_tokens = n;
  moe.top_k = K;
  moe.experts = &experts;
  moe.out = moe_all.data();
  kernels::MoeExperts(moe);
  for (int t = 0; t < n; ++t) {
    std::vector<float> mlp_one(H, 0.f), moe_one(H, 0.f);
    kernels::Mlp({x.data() + t * H, G, U, D, 1, mlp_one.data()});
    moe.x = x.data() + t * H;
    moe.topk_ids = ids.data() + t * K;
    moe.topk_weights = wts.data() + t * K;
    moe.num_tokens = 1;
    moe.out = moe_one.data();
    kernels::MoeExperts(moe);
    EXPECT_EQ(std::vector<float>(mlp_all.begin() + t * H, mlp_all.begin() + (t + 1) * H), mlp_one) << t;
    EXPECT_EQ(std::vector<float>(moe_all.begin() + t * H, moe_all.begin() + (t + 1) * H), moe_one) << t;
  }
}

ModelWeights Tiny() {
  auto c = LoadModelConfig(std::string(ELDR_SOURCE_DIR) + "/configs/models/tiny.yaml");
  EXPECT_TRUE(c.ok()) << c.status().message();
  SyntheticWeightOptions o;
  o.seed = 7;
  return MakeSyntheticWeights(c.value(), o).value();
}

std::vector<int32_t> Prompt(int n, uint64_t seed, int vocab) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

TEST(BatchInvariance, BatchedDecodeEqualsEachSequenceAloneExactly) {
  ModelWeights w = Tiny();
  const int V = w.config.vocab_size, Lm = w.config.num_moe_layers(), K = w.config.num_experts_per_tok;
  const int num_seqs = 7;  // wider than every register tile, so a step mixes tile shapes
  Executor batched(w, 128, 4), alone(w, 128, 4);
  BlockManager bm(128, 4);
  std::vector<std::vector<BlockId>> tables;
  std::vector<int32_t> next;
  std::vector<std::vector<uint16_t>> replay_ids;
  std::vector<GateReplay> replays(num_seqs);
  for (int i = 0; i < num_seqs; ++i) {
    const auto p = Prompt(5 + 3 * i, 100 + i, V);
    auto a = bm.AllocatePrompt(p).value();
    auto r = batched.Prefill(p, a.blocks, 0, nullptr, nullptr).value();
    auto r2 = alone.Prefill(p, a.blocks, 0, nullptr, nullptr).value();
    ASSERT_EQ(r.last_logits, r2.last_logits);
    std::vector<BlockId> t = a.blocks;
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(bm.AppendSlot(&t, static_cast<int64_t>(p.size()) + s).ok());
    tables.push_back(t);
    next.push_back(r.next_token);
    // Odd sequences replay a routing (as serve's decode does), even ones compute theirs.
    std::vector<uint16_t> ids(Lm * K);
    for (int j = 0; j < Lm * K; ++j) ids[j] = static_cast<uint16_t>((i + j * 3) % w.config.num_experts);
    for (int l = 0; l < Lm; ++l) ids[l * K + 1] = static_cast<uint16_t>((ids[l * K] + 1) % w.config.num_experts);
    replay_ids.push_back(ids);
  }
  for (int i = 0; i < num_seqs; ++i) replays[i].ids = replay_ids[i].data();
  // Two steps; the second with a different batch (the first two finished), as continuous batching does.
  std::vector<int> live = {0, 1, 2, 3, 4, 5, 6};
  std::vector<int32_t> pos(num_seqs);
  for (int i = 0; i < num_seqs; ++i) pos[i] = 5 + 3 * i;
  for (int step = 0; step < 2; ++step) {
    std::vector<DecodeSequence> batch;
    for (int i : live) batch.push_back({next[i], pos[i], &tables[i], i % 2 ? &replays[i] : nullptr});
    auto all = batched.Decode(batch).value();
    for (size_t b = 0; b < live.size(); ++b) {
      auto one = alone.Decode({batch[b]}).value();
      const std::vector<float> row(all.logits.begin() + b * V, all.logits.begin() + (b + 1) * V);
      ASSERT_EQ(row, one.logits) << "step " << step << ", sequence " << live[b];
      EXPECT_EQ(all.next_tokens[b], one.next_tokens[0]);
    }
    for (size_t b = 0; b < live.size(); ++b) {
      next[live[b]] = all.next_tokens[b];
      ++pos[live[b]];
    }
    live = {2, 3, 4, 5, 6};
  }
}

TEST(BatchInvariance, PrefillAfterAPrefixHitEqualsAColdPrefillExactly) {
  ModelWeights w = Tiny();
  const int V = w.config.vocab_size;
  const auto p1 = Prompt(20, 5, V);  // 5 full blocks of 4
  auto p2 = p1;
  p2[17] = (p2[17] + 1) % V;  // same first 4 blocks (16 tokens), another tail
  // Serving side: one executor and block manager; p1, then p2 with a 16-token hit, then p1 again (a full hit:
  // only the last token is recomputed, as the prefill rank does).
  Executor ex(w, 64, 4);
  BlockManager bm(64, 4);
  auto a = bm.AllocatePrompt(p1).value();
  auto first = ex.Prefill(p1, a.blocks, 0, nullptr, nullptr).value();
  bm.Free(a.blocks);
  auto b = bm.AllocatePrompt(p2).value();
  ASSERT_EQ(b.num_cached_blocks, 4);
  auto partial = ex.Prefill(p2, b.blocks, 16, nullptr, nullptr).value();
  bm.Free(b.blocks);
  auto c = bm.AllocatePrompt(p1).value();
  ASSERT_EQ(c.num_cached_tokens(), 20);
  auto full = ex.Prefill(p1, c.blocks, 19, nullptr, nullptr).value();
  // Reference side: cold prefills in fresh executors.
  for (const auto& [prompt, got] :
       {std::pair{p2, partial.last_logits}, std::pair{p1, full.last_logits}, std::pair{p1, first.last_logits}}) {
    Executor cold(w, 64, 4);
    BlockManager bm2(64, 4);
    auto z = bm2.AllocatePrompt(prompt).value();
    EXPECT_EQ(cold.Prefill(prompt, z.blocks, 0, nullptr, nullptr).value().last_logits, got);
  }
}

TEST(BatchInvariance, DecodeOfTheLastTokenEqualsItsPrefillExactly) {
  ModelWeights w = Tiny();
  const auto tokens = Prompt(21, 3, w.config.vocab_size);
  Executor full(w, 32, 4), inc(w, 32, 4);
  BlockManager bm(32, 4);
  auto a = bm.AllocatePrompt(tokens).value();
  auto ref = full.Prefill(tokens, a.blocks, 0, nullptr, nullptr).value();
  const std::vector<int32_t> head(tokens.begin(), tokens.end() - 1);
  ASSERT_TRUE(inc.Prefill(head, a.blocks, 0, nullptr, nullptr).ok());
  auto d = inc.Decode({{tokens.back(), 20, &a.blocks, nullptr}}).value();
  EXPECT_EQ(ref.last_logits, d.logits);
}

}  // namespace
}  // namespace eldr
