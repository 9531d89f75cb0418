// The job's frontend (runtime/job/frontend.h) against hand-computed cases: admission within max_concurrency to
// the least-outstanding prefill rank, holding while every decoder is at its cap and releasing in order when one
// frees, finish accounting (tokens, failures, slots), per-decoder statistics and the routing statistics.
#include "runtime/job/frontend.h"

#include <gtest/gtest.h>

#include <limits>

namespace eldr {
namespace {

// A trace of `n` requests (domain "x"); only the labels and the prompt lengths matter to the frontend.
JobRequests Requests(int n, std::vector<int64_t> output_len) {
  JobRequests in;
  in.trace.shape = {"tiny", 1, 4, 1};
  for (int i = 0; i < n; ++i) {
    TraceRequest r;
    r.id = "r" + std::to_string(i);
    r.domain = "x";
    r.prompt_len = 3;
    r.num_tokens = 3;
    in.trace.requests.push_back(r);
    in.order.push_back(i);
  }
  in.output_len = std::move(output_len);
  return in;
}

JobConfig Job(RoutingPolicy policy, int prefill, int decoders, int64_t cap) {
  JobConfig c;
  c.path = "test.yaml";
  c.prefill_ranks = prefill;
  c.decode_ranks = decoders;
  c.policy = policy;
  c.admission_cap = cap;
  c.request_rate = std::numeric_limits<double>::infinity();
  return c;
}

// L = 1, E = 4, all layers selected, idf 1; centroid k = e_k (as in router_test).
Calibration TinyCalibration(int K) {
  Calibration c;
  c.shape = {"tiny", 1, 4, 1};
  c.signature = {SignatureVariant::kCount, 1, 4, {1, 1, 1, 1}, {1}};
  c.num_clusters = K;
  c.tau = 0.1;
  for (int k = 0; k < K; ++k) {
    for (int e = 0; e < 4; ++e) c.centroids.push_back(e == k ? 1.f : 0.f);
  }
  return c;
}

// Records what the frontend asks to send.
struct Sent {
  std::vector<std::pair<int64_t, int>> prefill, routes;  // (request, prefill rank) / (request, decoder)
  FrontendActions Actions() {
    return {[this](int64_t r, int p) { prefill.emplace_back(r, p); },
            [this](int64_t r, int d) { routes.emplace_back(r, d); }};
  }
};

using Pairs = std::vector<std::pair<int64_t, int>>;
const std::vector<float> kNoCounts(4, 0.f);

TEST(Frontend, HoldsAtTheCapAndReleasesInOrder) {
  // jsq, 2 decoders with admission cap 1: requests 0 and 1 take decoders 0 and 1 (jsq tie → lower index);
  // 2 and 3 are held. Finishing 1 frees decoder 1 → 2 goes there (3 still held: both at cap again); finishing
  // 0 frees decoder 0 → 3 goes there.
  const JobConfig c = Job(RoutingPolicy::kJsq, 1, 2, 1);
  const JobRequests in = Requests(4, {2, 2, 2, 2});
  Sent sent;
  auto f = Frontend::Create(c, in, in.trace.shape, nullptr, sent.Actions());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->arrivals(), (std::vector<double>{0, 0, 0, 0}));
  EXPECT_EQ(f->DueBy(0.0), 4);
  f->Admit(4, 0.0);
  EXPECT_EQ(sent.prefill, (Pairs{{0, 0}, {1, 0}, {2, 0}, {3, 0}}));
  EXPECT_EQ(f->prefill_outstanding(0), 4);
  for (int64_t r = 0; r < 4; ++r) f->OnFirstToken(r, 0.1 * static_cast<double>(r + 1), 7, kNoCounts);
  EXPECT_EQ(sent.routes, (Pairs{{0, 0}, {1, 1}}));
  EXPECT_EQ(f->prefill_outstanding(0), 0);
  f->OnToken(1, 0.5, 8);
  f->Finish(1, 0.5, true);
  EXPECT_EQ(sent.routes, (Pairs{{0, 0}, {1, 1}, {2, 1}}));
  f->OnToken(0, 0.6, 8);
  f->Finish(0, 0.6, true);
  EXPECT_EQ(sent.routes, (Pairs{{0, 0}, {1, 1}, {2, 1}, {3, 0}}));
  EXPECT_EQ(f->decoder_in_flight(0), 1);
  EXPECT_EQ(f->decoder_in_flight(1), 1);
  EXPECT_EQ(f->num_done(), 2);
  EXPECT_FALSE(f->done());
}

TEST(Frontend, AHeldRequestWaitsBehindEarlierHeldOnes) {
  // Cap 1, one decoder: 0 routes, 1 is held; when 2's counts come the decoder is still busy, and once 0
  // finishes the release goes in order: 1 first (2 stays held: the decoder is at its cap again).
  const JobConfig c = Job(RoutingPolicy::kRoundRobin, 1, 1, 1);
  const JobRequests in = Requests(3, {1, 1, 1});
  Sent sent;
  auto f = Frontend::Create(c, in, in.trace.shape, nullptr, sent.Actions());
  ASSERT_TRUE(f.ok());
  f->Admit(3, 0.0);
  for (int64_t r = 0; r < 3; ++r) f->OnFirstToken(r, 1.0, std::nullopt, kNoCounts);
  f->Finish(0, 1.1, true);
  EXPECT_EQ(sent.routes, (Pairs{{0, 0}, {1, 0}}));
  f->Finish(1, 1.2, true);
  f->Finish(2, 1.3, true);
  EXPECT_EQ(sent.routes, (Pairs{{0, 0}, {1, 0}, {2, 0}}));
  EXPECT_TRUE(f->done());
}

TEST(Frontend, MaxConcurrencyAndLeastOutstandingPrefill) {
  // max_concurrency 2, 2 prefill ranks, all three due at 0 (rate inf): 0 → p0, 1 → p1, 2 waits. 0 fails at
  // prefill (no token) at 0.6: p0 has 0 outstanding, the slot frees, and 2 goes to p0 at the next Admit (0.7).
  // Arrivals are when each was due: 0 and 1 at 0 (sent later, at 0.5), 2 when the slot freed (0.6).
  JobConfig c = Job(RoutingPolicy::kRoundRobin, 2, 1, 0);
  c.max_concurrency = 2;
  const JobRequests in = Requests(3, {3, 3, 3});
  Sent sent;
  auto f = Frontend::Create(c, in, in.trace.shape, nullptr, sent.Actions());
  ASSERT_TRUE(f.ok());
  f->Admit(3, 0.5);
  EXPECT_EQ(sent.prefill, (Pairs{{0, 0}, {1, 1}}));
  EXPECT_EQ(f->sent(), 2);
  f->Finish(0, 0.6, false, "prefill 0: too long");
  EXPECT_EQ(f->prefill_outstanding(0), 0);
  EXPECT_EQ(f->prefill_outstanding(1), 1);
  f->Admit(3, 0.7);
  EXPECT_EQ(sent.prefill, (Pairs{{0, 0}, {1, 1}, {2, 0}}));
  const RequestRecord& r0 = f->records()[0];
  EXPECT_FALSE(r0.success);
  EXPECT_EQ(r0.error, "prefill 0: too long");
  EXPECT_EQ(r0.output_len, 0);
  EXPECT_EQ(r0.decoder, -1);
  EXPECT_DOUBLE_EQ(r0.arrival, 0.0);
  EXPECT_DOUBLE_EQ(f->records()[1].arrival, 0.0);
  EXPECT_DOUBLE_EQ(f->records()[2].arrival, 0.6);
  EXPECT_EQ(f->records()[2].id, "r2");
  EXPECT_EQ(f->records()[2].prompt_len, 3);
}

TEST(Frontend, ArrivalIsWhenTheRequestWasDueNotWhenItWasSent) {
  // Open loop at 2 req/s (seeded Poisson arrivals, read back): a request sent late (a caller that admits in
  // portions, as serve's rank 0 does under a burst) keeps its scheduled arrival, so its TTFT holds the wait.
  JobConfig c = Job(RoutingPolicy::kRoundRobin, 1, 1, 0);
  c.request_rate = 2;
  const JobRequests in = Requests(4, {1, 1, 1, 1});
  Sent sent;
  auto f = Frontend::Create(c, in, in.trace.shape, nullptr, sent.Actions());
  ASSERT_TRUE(f.ok());
  const std::vector<double> a = f->arrivals();
  ASSERT_EQ(a.size(), 4u);
  f->Admit(2, a[3] + 1);  // two sent in this portion, late
  f->Admit(4, a[3] + 2);  // the rest in the next
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(f->records()[i].arrival, a[i]) << i;
  // A first token at a[3] + 3: TTFT counts from the scheduled arrival.
  f->OnFirstToken(0, a[3] + 3, 1, kNoCounts);
  EXPECT_DOUBLE_EQ(f->records()[0].ttft(), a[3] + 3 - a[0]);

  // Closed loop, max_concurrency 1, all due at 0: each request is due when the slot it takes was freed (the
  // finish before it), even when the caller admits it later; never later than the send.
  JobConfig cl = Job(RoutingPolicy::kRoundRobin, 1, 1, 0);
  cl.max_concurrency = 1;
  Sent sent2;
  auto g = Frontend::Create(cl, in, in.trace.shape, nullptr, sent2.Actions());
  ASSERT_TRUE(g.ok());
  g->Admit(4, 0.25);  // 0 goes (due at 0)
  g->Finish(0, 1.0, false, "x");
  g->Admit(4, 1.5);  // 1 goes: its slot freed at 1.0
  g->Finish(1, 2.0, false, "x");
  g->Admit(4, 2.0);  // 2 at 2.0
  EXPECT_EQ(g->sent(), 3);
  EXPECT_DOUBLE_EQ(g->records()[0].arrival, 0.0);
  EXPECT_DOUBLE_EQ(g->records()[1].arrival, 1.0);
  EXPECT_DOUBLE_EQ(g->records()[2].arrival, 2.0);
}

TEST(Frontend, KeepsAtMostKPrefillQueueOutstandingPerPrefillRank) {
  // 2 prefill ranks, 200 requests all due at 0: 64 go to each (alternating, fewest outstanding first); the rest
  // wait, and each first token (or a failure before it) lets exactly one more go, to the rank that freed. Every
  // request keeps its scheduled arrival (0), however late it is sent.
  static_assert(Frontend::kPrefillQueue == 64);
  const JobConfig c = Job(RoutingPolicy::kRoundRobin, 2, 1, 0);
  const JobRequests in = Requests(200, std::vector<int64_t>(200, 1));
  Sent sent;
  auto f = Frontend::Create(c, in, in.trace.shape, nullptr, sent.Actions());
  ASSERT_TRUE(f.ok());
  f->Admit(200, 0.0);
  ASSERT_EQ(f->sent(), 128);
  EXPECT_EQ(f->prefill_outstanding(0), 64);
  EXPECT_EQ(f->prefill_outstanding(1), 64);
  f->Admit(200, 1.0);  // nothing freed: nothing more goes
  EXPECT_EQ(f->sent(), 128);
  f->OnFirstToken(1, 2.0, 7, kNoCounts);  // request 1 went to rank 1
  f->Admit(200, 2.0);
  EXPECT_EQ(f->sent(), 129);
  EXPECT_EQ(sent.prefill.back(), (std::pair<int64_t, int>{128, 1}));
  f->Finish(0, 3.0, false, "prefill 0 (rank 1): failed");  // before its first token: rank 0 frees one
  f->Admit(200, 3.0);
  EXPECT_EQ(f->sent(), 130);
  EXPECT_EQ(sent.prefill.back(), (std::pair<int64_t, int>{129, 0}));
  for (int64_t i = 0; i < f->sent(); ++i) EXPECT_DOUBLE_EQ(f->records()[i].arrival, 0.0) << i;
}

TEST(Frontend, FinishAccounting) {
  // Request 0: 3 output tokens; a 4th report is ignored. Request 1 fails at its decoder after its first token:
  // its decoder's slot frees and its prefill is not counted twice.
  const JobConfig c = Job(RoutingPolicy::kRoundRobin, 1, 2, 0);
  const JobRequests in = Requests(2, {3, 4});
  Sent sent;
  auto f = Frontend::Create(c, in, in.trace.shape, nullptr, sent.Actions());
  ASSERT_TRUE(f.ok());
  f->Admit(2, 0.0);
  f->OnFirstToken(0, 1.0, 10, kNoCounts);
  f->OnFirstToken(1, 1.5, 20, kNoCounts);
  EXPECT_EQ(f->prefill_outstanding(0), 0);
  f->OnToken(0, 2.0, 11);
  f->OnToken(0, 3.0, 12);
  f->OnToken(0, 4.0, 13);  // beyond output_len
  f->Finish(0, 3.0, true);
  f->Finish(1, 3.5, false, "decode 1 (rank 3): KV blocks arrived corrupted");
  f->OnToken(1, 3.6, 21);  // a token that arrives after the failure: ignored (the router released the request)
  EXPECT_EQ(f->prefill_outstanding(0), 0);
  EXPECT_EQ(f->decoder_in_flight(0), 0);
  EXPECT_EQ(f->decoder_in_flight(1), 0);
  EXPECT_TRUE(f->done());
  const RequestRecord& r0 = f->records()[0];
  EXPECT_TRUE(r0.success);
  EXPECT_EQ(r0.output_len, 3);
  EXPECT_EQ(r0.token_times, (std::vector<double>{1.0, 2.0, 3.0}));
  EXPECT_EQ(r0.tokens, (std::vector<int32_t>{10, 11, 12}));
  EXPECT_EQ(r0.decoder, 0);
  const RequestRecord& r1 = f->records()[1];
  EXPECT_FALSE(r1.success);
  EXPECT_EQ(r1.output_len, 1);
  EXPECT_EQ(r1.token_times.size(), 1u);
  EXPECT_EQ(r1.tokens, (std::vector<int32_t>{20}));
  EXPECT_EQ(r1.decoder, 1);
  EXPECT_EQ(r1.error, "decode 1 (rank 3): KV blocks arrived corrupted");
}

TEST(Frontend, AbandonUnfinishedMarksWhatIsLeft) {
  JobConfig c = Job(RoutingPolicy::kRoundRobin, 1, 1, 0);
  c.max_concurrency = 2;
  c.request_rate = 10;  // request 2's scheduled arrival is after 0
  const JobRequests in = Requests(3, {2, 2, 2});
  Sent sent;
  auto f = Frontend::Create(c, in, in.trace.shape, nullptr, sent.Actions());
  ASSERT_TRUE(f.ok());
  f->Admit(3, 0.0);  // 0 and 1 sent
  f->OnFirstToken(0, 1.0, 1, kNoCounts);
  f->OnToken(0, 2.0, 2);
  f->Finish(0, 2.0, true);
  f->AbandonUnfinished("never sent", "unfinished");
  EXPECT_TRUE(f->records()[0].success);
  EXPECT_EQ(f->records()[1].error, "unfinished");
  EXPECT_EQ(f->records()[2].error, "never sent");
  EXPECT_FALSE(f->records()[2].success);
  // Never sent, it still arrived when it was scheduled, not at a default 0.
  EXPECT_GT(f->arrivals()[2], 0.0);
  EXPECT_DOUBLE_EQ(f->records()[2].arrival, f->arrivals()[2]);
}

TEST(Frontend, DecoderStatisticsWithEpGroups) {
  // ep_size 2, 1 prefill rank: decoder k's leader is rank 1 + 1 + 2k. Decoder 0 reports steps with batch
  // {2, 0 (ignored), 1, 3}, distinct {5, -, 4, 6} and EP loads {2,4}, {6,0}, {1,2} with balancedness 0.5, 1.0,
  // 0.9: steps 3, batch 6, distinct 15, mean loads {3, 2}, mean balancedness 0.8, p1 = 0.5 + 0.02·(0.9 − 0.5).
  JobConfig c = Job(RoutingPolicy::kRoundRobin, 1, 2, 0);
  c.ep_size = 2;
  const JobRequests in = Requests(1, {2});
  Sent sent;
  auto f = Frontend::Create(c, in, in.trace.shape, nullptr, sent.Actions());
  ASSERT_TRUE(f.ok());
  const std::vector<int64_t> l1 = {2, 4}, l2 = {6, 0}, l3 = {1, 2};
  f->OnDecodeStep(0, 2, 5, l1, 0.5);
  f->OnDecodeStep(0, 0, 0, {}, 0.0);
  f->OnDecodeStep(0, 1, 4, l2, 1.0);
  f->OnDecodeStep(0, 3, 6, l3, 0.9);
  const std::vector<DecoderStats> s = f->DecoderStatistics();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].decoder, 0);
  EXPECT_EQ(s[0].leader_rank, 2);
  EXPECT_EQ(s[1].decoder, 1);
  EXPECT_EQ(s[1].leader_rank, 4);
  EXPECT_EQ(s[0].steps, 3);
  EXPECT_DOUBLE_EQ(s[0].batch_sum, 6);
  EXPECT_DOUBLE_EQ(s[0].distinct_sum, 15);
  EXPECT_EQ(s[0].ep_size, 2);
  EXPECT_EQ(s[0].mean_rank_load, (std::vector<double>{3, 2}));
  EXPECT_DOUBLE_EQ(s[0].mean_balancedness, 0.8);
  EXPECT_NEAR(s[0].p1_balancedness, 0.508, 1e-12);
  // By batch: one step each at batch 1 (4 experts), 2 (5) and 3 (6); the empty step is not a row.
  const std::vector<BatchDistinctRow> rows = s[0].by_batch.Rows();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].batch, 1);
  EXPECT_DOUBLE_EQ(rows[0].mean_distinct_experts, 4);
  EXPECT_EQ(rows[2].batch, 3);
  EXPECT_DOUBLE_EQ(rows[2].mean_distinct_experts, 6);
  EXPECT_EQ(s[1].steps, 0);
  EXPECT_TRUE(s[1].by_batch.Rows().empty());
  EXPECT_EQ(s[1].mean_rank_load, (std::vector<double>{0, 0}));
}

TEST(Frontend, RoutingStatistics) {
  // eldr, τ = 0.1, centroids e0 and e1, cap 2. Counts (1,0,0,0): d = {0, 1}, B = {0} → 0. (1,1,0,0): d = {0.29,
  // 0.29}, B = {0, 1}, loads {1, 0} → 1. (0,0,1,0): d = {1, 1}, B = {0, 1}, loads {1, 1} → 0 (lower index).
  // (1,0,0,0) again: B = {0}, decoder 0 at its cap → fallback to the least-loaded eligible, 1.
  // band sizes 1 + 2 + 2 + 1 = 6 over 4 requests, 1 fallback, requests per decoder {2, 2}.
  JobConfig c = Job(RoutingPolicy::kEldrPaper, 1, 2, 2);
  c.tau = 0.1;
  const Calibration calib = TinyCalibration(2);
  const JobRequests in = Requests(4, {2, 2, 2, 2});
  Sent sent;
  auto f = Frontend::Create(c, in, calib.shape, &calib, sent.Actions());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  f->Admit(4, 0.0);
  f->OnFirstToken(0, 1.0, 0, {1, 0, 0, 0});
  f->OnFirstToken(1, 1.0, 0, {1, 1, 0, 0});
  f->OnFirstToken(2, 1.0, 0, {0, 0, 1, 0});
  f->OnFirstToken(3, 1.0, 0, {1, 0, 0, 0});
  EXPECT_EQ(sent.routes, (Pairs{{0, 0}, {1, 1}, {2, 0}, {3, 1}}));
  EXPECT_DOUBLE_EQ(f->routing().tau, 0.1);
  EXPECT_EQ(f->routing().band_sum, 6);
  EXPECT_EQ(f->routing().band_n, 4);
  EXPECT_EQ(f->routing().fallbacks, 1);
  const std::vector<DecoderStats> s = f->DecoderStatistics();
  EXPECT_EQ(s[0].requests, 2);
  EXPECT_EQ(s[1].requests, 2);
  EXPECT_EQ(f->records()[3].decoder, 1);
}

TEST(Frontend, EldrTailHoldsDecodeWorkAndOverflowsByDistance) {
  // eldr_tail, τ = 0.1, centroids e0 and e1, cluster priors {7, 2} (no decode lengths: max(prior − g, 1)), ε = 0.25.
  // A request is routed when its prefill's token comes back, so it has g = 1 and holds 7 − 1 = 6. Request 0
  // (1,0,0,0): B = {0}, bound 1.25·(0 + 6)/2 = 3.75 → 0, which holds 6. Two tokens spend 2 → 4. Request 1 (same
  // cluster): bound 1.25·(4 + 6)/2 = 6.25 > 4 → 0 (holds 10). Request 2: bound 1.25·16/2 = 10, 0 holds 10 (and 2
  // requests, the count bound ceil(1.25·3/2)) → overflow to 1, the next-nearest. Finishing 0 releases its 4 left → 0
  // holds 6.
  JobConfig c = Job(RoutingPolicy::kEldrTail, 1, 2, 0);
  c.tau = 0.1;
  Calibration calib = TinyCalibration(2);
  calib.mean_decode_len = {7, 2};
  const JobRequests in = Requests(3, {10, 10, 10});
  Sent sent;
  auto f = Frontend::Create(c, in, calib.shape, &calib, sent.Actions());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  f->Admit(3, 0.0);
  f->OnFirstToken(0, 1.0, 0, {1, 0, 0, 0});
  EXPECT_DOUBLE_EQ(f->router().decoders()[0].work, 6);
  f->OnToken(0, 1.1, 0);
  f->OnToken(0, 1.2, 0);
  EXPECT_DOUBLE_EQ(f->router().decoders()[0].work, 4);
  f->OnFirstToken(1, 1.3, 0, {1, 0, 0, 0});
  EXPECT_DOUBLE_EQ(f->router().decoders()[0].work, 10);
  f->OnFirstToken(2, 1.4, 0, {1, 0, 0, 0});
  EXPECT_EQ(sent.routes, (Pairs{{0, 0}, {1, 0}, {2, 1}}));
  EXPECT_EQ(f->routing().fallbacks, 1);
  EXPECT_DOUBLE_EQ(f->router().decoders()[1].work, 6);
  f->Finish(0, 1.5, true);
  EXPECT_DOUBLE_EQ(f->router().decoders()[0].work, 6);
  EXPECT_EQ(f->decoder_in_flight(0), 1);
}

TEST(Frontend, LoadOnlyPoliciesCountNoBand) {
  const JobConfig c = Job(RoutingPolicy::kRoundRobin, 1, 3, 0);
  const JobRequests in = Requests(4, {1, 1, 1, 1});
  Sent sent;
  auto f = Frontend::Create(c, in, in.trace.shape, nullptr, sent.Actions());
  ASSERT_TRUE(f.ok());
  f->Admit(4, 0.0);
  for (int64_t r = 0; r < 4; ++r) f->OnFirstToken(r, 1.0, 0, kNoCounts);
  EXPECT_EQ(sent.routes, (Pairs{{0, 0}, {1, 1}, {2, 2}, {3, 0}}));
  EXPECT_EQ(f->routing().band_n, 0);
  EXPECT_EQ(f->routing().fallbacks, 0);
}

TEST(Frontend, SignaturePolicyNeedsACalibration) {
  const JobConfig c = Job(RoutingPolicy::kEldr, 1, 2, 0);
  const JobRequests in = Requests(1, {1});
  Sent sent;
  auto f = Frontend::Create(c, in, in.trace.shape, nullptr, sent.Actions());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("test.yaml: "), std::string::npos) << f.status().message();
}

}  // namespace
}  // namespace eldr
