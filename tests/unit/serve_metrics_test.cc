// Serving metrics against hand-computed values and numpy's percentile definition; arrivals' statistics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <span>
#include <string>
#include <string_view>

#include "runtime/common/json_util.h"
#include "runtime/cost/cost_model.h"
#include "runtime/job/metrics.h"
#include "runtime/job/workload.h"

namespace eldr {
namespace {

TEST(Metrics, PercentileIsNumpyLinear) {
  // numpy.percentile([1, 2, 3, 4], 99) = 3.97; median 2.5; p0 = 1; p100 = 4.
  std::vector<double> v = {1, 2, 3, 4};
  EXPECT_NEAR(Percentile(v, 99), 3.97, 1e-12);
  EXPECT_NEAR(Percentile(v, 50), 2.5, 1e-12);
  EXPECT_EQ(Percentile(v, 0), 1);
  EXPECT_EQ(Percentile(v, 100), 4);
  auto d = Summarize({4, 1, 3, 2}, {99, 90});
  EXPECT_NEAR(d.mean, 2.5, 1e-12);
  EXPECT_NEAR(d.std, std::sqrt(1.25), 1e-12);  // population std, as numpy
  EXPECT_NEAR(d.percentiles[1].second, 3.7, 1e-12);
}

TEST(Metrics, SummarizeSelectsTheSameOrderStatisticsAsASort) {
  // Summarize reads its percentiles by selection; a full sort and Percentile are the reference, on random
  // values with ties (integers 0..9), of every small size and a few large ones, at the ends and between ranks.
  const std::vector<double> ps = {0, 1, 25, 50, 90, 99, 99.9, 100};
  uint64_t state = 12345;
  const auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>((state >> 33) % 10);
  };
  for (size_t n : {1, 2, 3, 4, 5, 7, 8, 13, 100, 1001, 65537}) {
    std::vector<double> v(n);
    for (double& x : v) x = next() + (n > 100 ? 0.001 * next() : 0.0);
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    const Distribution d = Summarize(v, ps);
    ASSERT_EQ(d.percentiles.size(), ps.size());
    EXPECT_EQ(d.median, Percentile(sorted, 50)) << n;
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_EQ(d.percentiles[i].first, ps[i]);
      EXPECT_EQ(d.percentiles[i].second, Percentile(sorted, ps[i])) << "n " << n << " p " << ps[i];
    }
    double sum = 0;
    for (double x : sorted) sum += x;
    EXPECT_NEAR(d.mean, sum / static_cast<double>(n), 1e-9 * (1 + sum));
  }
}

TEST(Metrics, ServingSummaryByHand) {
  // Request a: arrives 0, tokens at 0.5, 0.7, 1.0 → TTFT 500 ms, TPOT (1.0 − 0.5)/2 = 250 ms, ITLs 200, 300.
  // Request b: arrives 1, tokens at 1.2, 1.3 → TTFT 200 ms, TPOT 100 ms, ITL 100.
  // Request c: failed.
  RequestRecord a{"a", "x", 0, 10, 3, 0.0, {0.5, 0.7, 1.0}, {1, 2, 3}, true, ""};
  RequestRecord b{"b", "y", 1, 20, 2, 1.0, {1.2, 1.3}, {4, 5}, true, ""};
  RequestRecord c{"c", "y", -1, 5, 0, 0.5, {}, {}, false, "rank 3 died"};
  auto j = SummarizeServing({a, b, c}, {});
  EXPECT_EQ(j["completed"], 2);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["total_input_tokens"], 30);
  EXPECT_EQ(j["total_output_tokens"], 5);
  EXPECT_NEAR(j["duration"].get<double>(), 1.3, 1e-12);
  EXPECT_NEAR(j["request_throughput"].get<double>(), 2 / 1.3, 1e-9);
  EXPECT_NEAR(j["output_throughput"].get<double>(), 5 / 1.3, 1e-9);
  EXPECT_NEAR(j["mean_ttft_ms"].get<double>(), 350, 1e-9);
  EXPECT_NEAR(j["median_ttft_ms"].get<double>(), 350, 1e-9);
  EXPECT_NEAR(j["p99_ttft_ms"].get<double>(), 200 + 0.99 * 300, 1e-9);
  EXPECT_NEAR(j["mean_tpot_ms"].get<double>(), 175, 1e-9);
  EXPECT_NEAR(j["median_itl_ms"].get<double>(), 200, 1e-9);
  EXPECT_NEAR(j["mean_e2el_ms"].get<double>(), (1000 + 300) / 2.0, 1e-9);
  auto r = RequestRecordJson(c);
  EXPECT_EQ(r["error"], "rank 3 died");
  EXPECT_FALSE(r.contains("ttft_ms"));
}

TEST(Metrics, RequestLineIsWhatNlohmannDumps) {
  // AppendRequestLine against the json object it replaces, on random records: doubles of every magnitude,
  // 0, -0, NaN and inf, strings with quotes, backslashes, control bytes, UTF-8 and invalid UTF-8, failed and
  // untimed records, with and without tokens.
  const std::vector<std::string> strings = {"",          "r1",   "esft-intent-084#0",      "a\"b",        "back\\slash",
                                            "tab\there", "nl\n", std::string("nul\0x", 5), "caf\xc3\xa9", "bad\xff\xfe",
                                            "\x7f"};
  const std::vector<double> specials = {0.0,
                                        -0.0,
                                        1e-7,
                                        1e-5,
                                        123456789012345678.0,
                                        1e300,
                                        -2.5,
                                        std::numeric_limits<double>::quiet_NaN(),
                                        std::numeric_limits<double>::infinity()};
  uint64_t state = 99;
  const auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 11;
  };
  const auto real = [&] {
    const uint64_t k = next() % 4;
    if (k == 0) return specials[next() % specials.size()];
    const double u = static_cast<double>(next()) / 9007199254740992.0;  // [0, 1)
    return k == 1 ? u : k == 2 ? u * 1e4 : std::ldexp(u, static_cast<int>(next() % 200) - 100);
  };
  for (int i = 0; i < 3000; ++i) {
    RequestRecord r;
    r.id = strings[next() % strings.size()];
    r.domain = strings[next() % strings.size()];
    r.decoder = static_cast<int>(next() % 5) - 1;
    r.prompt_len = static_cast<int64_t>(next() % 100000);
    r.arrival = real();
    const int n = static_cast<int>(next() % 4);
    for (int t = 0; t < n; ++t) {
      r.token_times.push_back(real());
      r.tokens.push_back(static_cast<int32_t>(next() % 200000) - 100);
    }
    r.output_len = n;
    r.success = next() % 3 != 0;
    if (!r.success) r.error = strings[next() % strings.size()];
    for (bool with_tokens : {false, true}) {
      std::string line;
      AppendRequestLine(line, r, with_tokens);
      ASSERT_EQ(line, DumpJsonLine(RequestRecordJson(r, with_tokens)) + "\n") << i;
    }
  }
}

TEST(Metrics, StepLineIsWhatNlohmannDumps) {
  // AppendStepLine against the json object steps.jsonl was built from before (the reference, written out here):
  // decode and prefill steps, with and without a CPU time, numbers of every magnitude.
  uint64_t state = 7;
  const auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 11;
  };
  for (int i = 0; i < 2000; ++i) {
    StepRecord st;
    st.kind = next() % 2 ? "decode" : "prefill";
    st.worker = static_cast<int>(next() % 40);
    st.time = std::ldexp(static_cast<double>(next()), -static_cast<int>(next() % 80));
    st.seconds = static_cast<double>(next() % 100000) * 1e-6;
    st.batch = static_cast<int64_t>(next() % 300);
    st.distinct_experts = static_cast<int64_t>(next() % 100000);
    st.tokens = static_cast<int64_t>(next());
    st.cpu_seconds = next() % 3 == 0 ? -1.0 : static_cast<double>(next() % 1000) / 7.0;
    nlohmann::json j = {{"kind", st.kind}, {"worker", st.worker}, {"time", st.time}, {"seconds", st.seconds}};
    if (st.cpu_seconds >= 0) j["cpu_seconds"] = st.cpu_seconds;
    if (st.kind == "decode") {
      j["batch"] = st.batch;
      j["distinct_experts"] = st.distinct_experts;
      j["context_tokens"] = st.tokens;
    } else {
      j["prompt_tokens"] = st.tokens;
    }
    std::string line;
    AppendStepLine(line, st);
    ASSERT_EQ(line, DumpJsonLine(j) + "\n") << i;
    // Every field written is one the cost-model fit reads (cost_model.h kStepFields), and the other way round.
    std::set<std::string> written, read;
    const nlohmann::json parsed = nlohmann::json::parse(line);  // named: items() must not outlive it
    for (const auto& [key, value] : parsed.items()) written.insert(key);
    for (std::string_view f : kStepFields) read.emplace(f);
    for (std::string_view f : st.kind == "decode" ? std::span<const std::string_view>(kDecodeStepFields)
                                                  : std::span<const std::string_view>(kPrefillStepFields)) {
      read.emplace(f);
    }
    if (st.cpu_seconds < 0) read.erase("cpu_seconds");  // optional: written when measured
    ASSERT_EQ(written, read) << line;
  }
}

TEST(Metrics, PerDomainByHand) {
  // Domain x: a (TTFT 500 ms, TPOT 250 ms) and d (arrives 2, tokens 2.1, 2.2, 2.3, 2.4 → TTFT 100, TPOT 100 ms).
  //   median TPOT 175, mean 175, p99 = 100 + 0.99·150 = 248.5; median TTFT 300.
  // Domain y: b (TTFT 200, TPOT 100) and c (failed): 2 requests, 1 completed.
  // Unlabelled: e, one output token (TTFT 50 ms, no TPOT: 0).
  RequestRecord a{"a", "x", 0, 10, 3, 0.0, {0.5, 0.7, 1.0}, {}, true, ""};
  RequestRecord b{"b", "y", 1, 20, 2, 1.0, {1.2, 1.3}, {}, true, ""};
  RequestRecord c{"c", "y", -1, 5, 0, 0.5, {}, {}, false, "rank 3 died"};
  RequestRecord d{"d", "x", 1, 5, 4, 2.0, {2.1, 2.2, 2.3, 2.4}, {}, true, ""};
  RequestRecord e{"e", "", 0, 5, 1, 3.0, {3.05}, {}, true, ""};
  const nlohmann::json j = PerDomainSummary({a, b, c, d, e});
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j["x"]["requests"], 2);
  EXPECT_EQ(j["x"]["completed"], 2);
  EXPECT_NEAR(j["x"]["median_tpot_ms"].get<double>(), 175, 1e-9);
  EXPECT_NEAR(j["x"]["mean_tpot_ms"].get<double>(), 175, 1e-9);
  EXPECT_NEAR(j["x"]["p99_tpot_ms"].get<double>(), 248.5, 1e-9);
  EXPECT_NEAR(j["x"]["median_ttft_ms"].get<double>(), 300, 1e-9);
  EXPECT_EQ(j["y"]["requests"], 2);
  EXPECT_EQ(j["y"]["completed"], 1);
  EXPECT_NEAR(j["y"]["median_tpot_ms"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(j["y"]["median_ttft_ms"].get<double>(), 200, 1e-9);
  EXPECT_EQ(j["unlabelled"]["completed"], 1);
  EXPECT_EQ(j["unlabelled"]["median_tpot_ms"].get<double>(), 0.0);
  EXPECT_NEAR(j["unlabelled"]["median_ttft_ms"].get<double>(), 50, 1e-9);
}

TEST(Metrics, JobMetricsMergeEveryDecodersStepsByBatch) {
  // Decoder 0 ran batch 1 (3 experts) and batch 2 (5); decoder 1 ran batch 2 (7) and batch 2 (9).
  // Merged: batch 1: 1 step, mean 3; batch 2: 3 steps, mean (5 + 7 + 9) / 3 = 7.
  DecoderStats d0, d1;
  d0.decoder = 0;
  d1.decoder = 1;
  d0.by_batch.Add(1, 3);
  d0.by_batch.Add(2, 5);
  d1.by_batch.Add(2, 7);
  d1.by_batch.Add(2, 9);
  JobConfig c;
  RequestRecord a{"a", "x", 0, 10, 3, 0.0, {0.5, 0.7, 1.0}, {}, true, ""};
  const nlohmann::json j = JobMetrics(c, "tiny", {a}, {d0, d1}, {});
  const nlohmann::json& rows = j["distinct_by_batch"];
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["batch"], 1);
  EXPECT_EQ(rows[0]["steps"], 1);
  EXPECT_DOUBLE_EQ(rows[0]["mean_distinct_experts"].get<double>(), 3.0);
  EXPECT_EQ(rows[1]["batch"], 2);
  EXPECT_EQ(rows[1]["steps"], 3);
  EXPECT_DOUBLE_EQ(rows[1]["mean_distinct_experts"].get<double>(), 7.0);
  EXPECT_EQ(j["per_domain"]["x"]["requests"], 1);
}

TEST(Workload, ArrivalsFollowRateAndBurstiness) {
  for (double burst : {1.0, 0.25}) {
    auto t = ArrivalTimes({20000, 50.0, burst, 7}).value();
    std::vector<double> gaps;
    for (size_t i = 1; i < t.size(); ++i) gaps.push_back(t[i] - t[i - 1]);
    double mean = 0, var = 0;
    for (double g : gaps) mean += g;
    mean /= gaps.size();
    for (double g : gaps) var += (g - mean) * (g - mean);
    var /= gaps.size();
    EXPECT_NEAR(mean, 1 / 50.0, 0.05 / 50.0);                  // rate
    EXPECT_NEAR(var / (mean * mean), 1 / burst, 0.1 / burst);  // CV² = 1/burstiness
  }
  auto all = ArrivalTimes({5, INFINITY, 1.0, 0}).value();
  EXPECT_EQ(all, std::vector<double>(5, 0.0));
  EXPECT_EQ(ArrivalTimes({5, 1.0, 1.0, 3}).value(), ArrivalTimes({5, 1.0, 1.0, 3}).value());
  EXPECT_FALSE(ArrivalTimes({5, 0.0, 1.0, 0}).ok());
  EXPECT_FALSE(ArrivalTimes({5, 1.0, -1.0, 0}).ok());
}

TEST(Workload, ArrivalsPastTheClocksResolutionAreRefused) {
  // 20 arrivals at 1e-14/s span ~2e15 s, where a double no longer resolves a 1e-4 s decode step.
  const auto far = ArrivalTimes({20, 1e-14, 1.0, 1});
  ASSERT_FALSE(far.ok());
  EXPECT_EQ(far.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(far.status().message().find("workload.request_rate 1e-14 spreads 20 arrivals over"), std::string::npos)
      << far.status().message();
  EXPECT_NE(far.status().message().find("raise the rate"), std::string::npos);
  // One request arrives at 0 whatever the rate; 1e-5/s over 20 requests spans ~1.4e6 s, inside 1e7 s.
  EXPECT_EQ(ArrivalTimes({1, 1e-14, 1.0, 1}).value(), std::vector<double>{0.0});
  const auto slow = ArrivalTimes({20, 1e-5, 1.0, 1});
  ASSERT_TRUE(slow.ok());
  EXPECT_LE(slow->back(), kMaxArrivalSpan);
  EXPECT_GT(slow->back(), 1e5);
}

}  // namespace
}  // namespace eldr
