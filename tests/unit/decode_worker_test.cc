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

// The KV handoff (protocol.h): offers carry no KV; blocks are allocated before the KV is asked for; a decoder that
// is full when a request is routed to it reserves nothing, holds no KV on the host, and reserves it (FIFO) only
// when a finished request frees the blocks; the tokens equal a single-executor run.
TEST(DecodeWorker, FullDecoderReservesBeforeItReceives) {
  ModelWeights w = TinyWeights();
  // Prompt 6 + output 5 → positions 0..9 → 3 blocks of 4 each; 4 blocks hold one request, not two.
  DecodeWorker worker(w, {4, 4, 8});
  std::map<int64_t, DecodeWork> kv_at_prefill;  // the KV stays with the "prefill rank" until asked for
  std::map<int64_t, std::vector<int32_t>> got;
  for (int64_t id = 0; id < 3; ++id) {
    DecodeWork d = Prefilled(w, id, Prompt(6, 40 + id), 5);
    DecodeWork offer = d;
    offer.kv.clear();
    kv_at_prefill[id] = std::move(d);
    ASSERT_TRUE(worker.Offer(std::move(offer)).ok());
    got[id] = {kv_at_prefill[id].first_token};
  }
  EXPECT_EQ(worker.Offer(Prefilled(w, 9, Prompt(6, 9), 5)).code(), StatusCode::kInvalidArgument);  // KV in an offer
  // Only the head fits: its 3 blocks are allocated before any KV arrives; the others wait as metadata.
  EXPECT_EQ(worker.Reserve(), (std::vector<int64_t>{0}));
  EXPECT_EQ(worker.blocks().num_free_blocks(), 1);
  EXPECT_EQ(worker.reserved(), 1);
  EXPECT_EQ(worker.queued(), 2);
  EXPECT_EQ(worker.queued_kv_floats(), 0);
  EXPECT_FALSE(worker.has_step_work());   // nothing runs until the KV is delivered
  EXPECT_TRUE(worker.Reserve().empty());  // full: asking again reserves nothing
  // KV that nobody reserved is refused; so is KV of the wrong size (and its reservation is released).
  EXPECT_EQ(worker.Deliver(1, kv_at_prefill[1].kv).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(worker.Deliver(0, kv_at_prefill[0].kv).ok());
  EXPECT_EQ(worker.reserved(), 0);
  EXPECT_EQ(worker.running(), 1);
  std::vector<int64_t> order;  // the order in which requests were reserved
  order.push_back(0);
  int steps = 0;
  while (worker.in_flight() > 0) {
    auto s = worker.Step();
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_LE(s->batch, 1);  // never two at once: the blocks bind
    for (const auto& t : s->tokens) got[t.id].push_back(t.token);
    std::vector<int64_t> now = worker.TakeReserved();
    for (int64_t id : worker.Reserve()) now.push_back(id);  // blocks the step freed
    for (int64_t id : now) {
      order.push_back(id);
      EXPECT_EQ(worker.blocks().num_free_blocks(), 1) << "blocks allocated before the KV of " << id << " arrives";
      ASSERT_TRUE(worker.Deliver(id, kv_at_prefill[id].kv).ok());
    }
    ASSERT_LT(++steps, 100);
  }
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2}));  // FIFO
  EXPECT_EQ(worker.blocks().num_free_blocks(), 4);
  for (int64_t id = 0; id < 3; ++id) EXPECT_EQ(got[id], SingleExecutorRun(w, Prompt(6, 40 + id), 5)) << id;
  // A reservation whose KV is unusable is cancelled: its blocks are free again.
  DecodeWork d = Prefilled(w, 7, Prompt(6, 7), 5);
  d.kv.clear();
  ASSERT_TRUE(worker.Offer(d).ok());
  EXPECT_EQ(worker.Reserve(), (std::vector<int64_t>{7}));
  worker.Cancel(7);
  EXPECT_EQ(worker.blocks().num_free_blocks(), 4);
  EXPECT_EQ(worker.in_flight(), 0);
  // A wrong-size delivery releases too.
  ASSERT_TRUE(worker.Offer(d).ok());
  EXPECT_EQ(worker.Reserve(), (std::vector<int64_t>{7}));
  EXPECT_EQ(worker.Deliver(7, std::vector<float>(3)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(worker.blocks().num_free_blocks(), 4);
}

}  // namespace
}  // namespace eldr
