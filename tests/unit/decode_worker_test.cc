// The decode worker: prefill on one executor, KV shipped to a worker, decode there = a single-executor run;
// continuous batching within max batch and KV capacity; every request completes exactly once.
#include "runtime/serve/decode_worker.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace eldr {
namespace {

ModelWeights TinyWeights() {
  auto c = LoadModelConfig(std::string(ELDR_SOURCE_DIR) + "/configs/models/tiny.yaml").value();
  return MakeSyntheticWeights(c, SyntheticWeightOptions{}).value();
}

std::vector<int32_t> Prompt(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % 64);
  return t;
}

// Prefill on a separate executor (a "prefill rank") and package the work for a decoder.
DecodeWork Prefilled(const ModelWeights& w, int64_t id, const std::vector<int32_t>& prompt, int64_t out_len) {
  Executor pre(w, 64, 4);
  BlockManager bm(64, 4);
  auto a = bm.AllocatePrompt(prompt).value();
  auto r = pre.Prefill(prompt, a.blocks, 0, nullptr, nullptr).value();
  DecodeWork d;
  d.id = id;
  d.prompt_len = static_cast<int64_t>(prompt.size());
  d.output_len = out_len;
  d.first_token = r.next_token;
  d.kv.resize(d.prompt_len * pre.KvFloatsPerToken());
  pre.ExportKv(a.blocks, static_cast<int>(prompt.size()), d.kv.data());
  return d;
}

// Reference: prefill and greedy decode on one executor.
std::vector<int32_t> SingleExecutorRun(const ModelWeights& w, const std::vector<int32_t>& prompt, int64_t out_len) {
  Executor ex(w, 64, 4);
  BlockManager bm(64, 4);
  auto a = bm.AllocatePrompt(prompt).value();
  std::vector<int32_t> out = {ex.Prefill(prompt, a.blocks, 0, nullptr, nullptr).value().next_token};
  std::vector<BlockId> table = a.blocks;
  for (int64_t i = 1; i < out_len; ++i) {
    const int32_t pos = static_cast<int32_t>(prompt.size() + i - 1);
    EXPECT_TRUE(bm.AppendSlot(&table, pos).ok());
    out.push_back(ex.Decode({{out.back(), pos, &table, nullptr}}).value().next_tokens[0]);
  }
  return out;
}

TEST(DecodeWorker, ShippedKvDecodesLikeASingleExecutor) {
  ModelWeights w = TinyWeights();
  DecodeWorker worker(w, {64, 4, 8});
  std::map<int64_t, std::vector<int32_t>> got, want;
  for (int i = 0; i < 3; ++i) {
    auto p = Prompt(5 + 4 * i, i);
    const int64_t id = i;
    DecodeWork d = Prefilled(w, id, p, 6 + i);
    got[id] = {d.first_token};
    want[id] = SingleExecutorRun(w, p, 6 + i);
    ASSERT_TRUE(worker.Submit(std::move(d)).ok());
  }
  while (worker.in_flight() > 0) {
    auto s = worker.Step().value();
    for (const auto& t : s.tokens) {
      EXPECT_EQ(t.index, static_cast<int64_t>(got[t.id].size()));
      got[t.id].push_back(t.token);
    }
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(worker.blocks().num_free_blocks(), 64);  // every block returned
}

TEST(DecodeWorker, BatchAndKvCapacityQueueButNeverDrop) {
  ModelWeights w = TinyWeights();
  // 10 blocks of 4 tokens; each request needs ceil((6 + 5 - 1) / 4) = 3 blocks → at most 3 at once by KV,
  // and max_batch 2 caps it further.
  DecodeWorker worker(w, {10, 4, 2});
  std::map<int64_t, int64_t> tokens;
  std::map<int64_t, int> finished;
  for (int i = 0; i < 7; ++i) {
    const int64_t id = 100 + i;
    ASSERT_TRUE(worker.Submit(Prefilled(w, id, Prompt(6, 100 + i), 5)).ok());
    tokens[id] = 1;
  }
  int max_running = 0, steps = 0;
  while (worker.in_flight() > 0) {
    auto s = worker.Step().value();
    max_running = std::max(max_running, s.batch);
    for (const auto& t : s.tokens) {
      ++tokens[t.id];
      if (t.finished) ++finished[t.id];
    }
    ASSERT_LT(++steps, 1000);
  }
  EXPECT_EQ(max_running, 2);
  for (const auto& [id, n] : tokens) {
    EXPECT_EQ(n, 5) << id;
    EXPECT_EQ(finished[id], 1) << id;
  }
  // KV capacity binds when the batch does not: 3 requests of 3 blocks fit in 10 blocks, not 4.
  DecodeWorker kv_bound(w, {10, 4, 8});
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(kv_bound.Submit(Prefilled(w, i, Prompt(6, i), 5)).ok());
  EXPECT_EQ(kv_bound.Step().value().batch, 3);
  EXPECT_EQ(kv_bound.queued(), 2);
  // A request that can never fit is refused at submission, with the numbers.
  auto st = kv_bound.Submit(Prefilled(w, 99, Prompt(40, 9), 20));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("needs 15 KV blocks"), std::string::npos) << st.message();
}

TEST(DecodeWorker, TeacherForcingAndReplay) {
  ModelWeights w = TinyWeights();
  const int Lm = w.config.num_moe_layers(), K = w.config.num_experts_per_tok;
  DecodeWorker worker(w, {32, 4, 4});
  DecodeWork d = Prefilled(w, 1, Prompt(7, 1), 4);
  d.forced_tokens = {5, 9, 2, 7};
  // Replay: step i routes every layer to experts {i, i + 1}.
  for (int i = 0; i < 3; ++i) {
    for (int l = 0; l < Lm; ++l) d.replay_ids.insert(d.replay_ids.end(), {uint16_t(i), uint16_t(i + 1)});
  }
  ASSERT_TRUE(worker.Submit(d).ok());
  // Reference with forced inputs on one executor.
  Executor ex(w, 64, 4);
  BlockManager bm(64, 4);
  auto p = Prompt(7, 1);
  auto a = bm.AllocatePrompt(p).value();
  ex.Prefill(p, a.blocks, 0, nullptr, nullptr).value();
  std::vector<BlockId> table = a.blocks;
  for (int step = 0; step < 3; ++step) {
    auto s = worker.Step().value();
    ASSERT_EQ(s.batch, 1);
    EXPECT_EQ(s.distinct_experts, 2 * Lm);  // two experts per layer, one token
    const int32_t pos = 7 + step;
    ASSERT_TRUE(bm.AppendSlot(&table, pos).ok());
    std::vector<uint16_t> ids(d.replay_ids.begin() + step * Lm * K, d.replay_ids.begin() + (step + 1) * Lm * K);
    GateReplay r{ids.data(), nullptr};
    auto ref = ex.Decode({{d.forced_tokens[step], pos, &table, &r}}).value();
    EXPECT_EQ(s.tokens[0].token, ref.next_tokens[0]);
  }
  EXPECT_EQ(worker.in_flight(), 0);
  // Malformed work is refused.
  DecodeWork bad = Prefilled(w, 2, Prompt(3, 2), 3);
  bad.kv.pop_back();
  EXPECT_EQ(worker.Submit(bad).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace eldr
