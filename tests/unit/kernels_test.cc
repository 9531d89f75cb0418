// Every CPU kernel against a naive reference written here from the definitions, on random shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "kernels/ops.h"

namespace eldr::kernels {
namespace {

std::vector<float> Random(size_t n, std::mt19937_64& rng, float scale = 1.f) {
  std::normal_distribution<float> g(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

void ExpectNear(const std::vector<float>& a, const std::vector<float>& b, float tol, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol * (1 + std::abs(b[i]))) << what << " at " << i;
}

TEST(Kernels, Bf16RoundTrip) {
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f)), 1.0f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even → 1.
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  std::mt19937_64 rng(1);
  for (float x : Random(1000, rng)) EXPECT_NEAR(Bf16ToFloat(FloatToBf16(x)), x, std::abs(x) / 128);
}

TEST(Kernels, RmsNorm) {
  std::mt19937_64 rng(2);
  const int T = 5, H = 37;
  auto x = Random(T * H, rng), w = Random(H, rng);
  std::vector<float> out(T * H), ref(T * H);
  RmsNorm({x.data(), w.data(), out.data(), T, H, 1e-5f});
  for (int t = 0; t < T; ++t) {
    double ms = 0;
    for (int i = 0; i < H; ++i) ms += x[t * H + i] * x[t * H + i];
    ms /= H;
    for (int i = 0; i < H; ++i) ref[t * H + i] = static_cast<float>(x[t * H + i] / std::sqrt(ms + 1e-5) * w[i]);
  }
  ExpectNear(out, ref, 1e-5f, "rmsnorm");
}

TEST(Kernels, RopeMatchesFormulaAndIsRelative) {
  std::mt19937_64 rng(3);
  const int T = 4, Hq = 2, Hk = 1, D = 8;
  auto q = Random(T * Hq * D, rng), k = Random(T * Hk * D, rng);
  auto q0 = q, k0 = k;
  std::vector<int32_t> pos = {0, 1, 7, 100};
  ApplyRope({q.data(), k.data(), pos.data(), T, Hq, Hk, D, 10000.f});
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < Hq; ++h) {
      for (int i = 0; i < D / 2; ++i) {
        const double f = pos[t] * std::pow(10000.0, -2.0 * i / D);
        const float a = q0[(t * Hq + h) * D + i], b = q0[(t * Hq + h) * D + i + D / 2];
        EXPECT_NEAR(q[(t * Hq + h) * D + i], a * std::cos(f) - b * std::sin(f), 1e-4);
        EXPECT_NEAR(q[(t * Hq + h) * D + i + D / 2], b * std::cos(f) + a * std::sin(f), 1e-4);
      }
    }
  }
  // q·k after RoPE depends only on the position difference.
  std::vector<float> qa = q0, ka = k0, qb = q0, kb = k0;
  std::vector<int32_t> pa = {3, 3, 3, 3}, pb = {10, 10, 10, 10};
  std::vector<int32_t> pka = {1, 1, 1, 1}, pkb = {8, 8, 8, 8};
  std::vector<float> dummy(T * Hk * D), dq(T * Hq * D);
  ApplyRope({qa.data(), dummy.data(), pa.data(), T, Hq, Hk, D, 10000.f});
  ApplyRope({dq.data(), ka.data(), pka.data(), T, Hq, Hk, D, 10000.f});
  ApplyRope({qb.data(), dummy.data(), pb.data(), T, Hq, Hk, D, 10000.f});
  ApplyRope({dq.data(), kb.data(), pkb.data(), T, Hq, Hk, D, 10000.f});
  float da = 0, db = 0;
  for (int i = 0; i < D; ++i) {
    da += qa[i] * ka[i];
    db += qb[i] * kb[i];
  }
  EXPECT_NEAR(da, db, 1e-4);
}

TEST(Kernels, LinearF32AndBf16) {
  std::mt19937_64 rng(4);
  const int T = 7, In = 33, Out = 19;
  auto x = Random(T * In, rng), w = Random(Out * In, rng);
  std::vector<uint16_t> wb(w.size());
  for (size_t i = 0; i < w.size(); ++i) wb[i] = FloatToBf16(w[i]);
  std::vector<float> y(T * Out), ref(T * Out), refb(T * Out);
  for (int t = 0; t < T; ++t) {
    for (int o = 0; o < Out; ++o) {
      double s = 0, sb = 0;
      for (int i = 0; i < In; ++i) {
        s += x[t * In + i] * w[o * In + i];
        sb += x[t * In + i] * Bf16ToFloat(wb[o * In + i]);
      }
      ref[t * Out + o] = static_cast<float>(s);
      refb[t * Out + o] = static_cast<float>(sb);
    }
  }
  Linear({x.data(), {DType::kF32, w.data(), Out, In}, y.data(), T});
  ExpectNear(y, ref, 1e-4f, "linear f32");
  Linear({x.data(), {DType::kBF16, wb.data(), Out, In}, y.data(), T});
  ExpectNear(y, refb, 1e-4f, "linear bf16");
}

TEST(Kernels, GateTopK) {
  std::mt19937_64 rng(5);
  const int T = 20, E = 16, K = 4;
  auto logits = Random(T * E, rng);
  logits[3] = logits[5];  // a tie
  std::vector<int32_t> ids(T * K);
  std::vector<float> w(T * K);
  for (bool renorm : {true, false}) {
    GateTopK({logits.data(), T, E, K, renorm, ids.data(), w.data()});
    for (int t = 0; t < T; ++t) {
      std::vector<double> p(E);
      double z = 0;
      for (int e = 0; e < E; ++e) z += p[e] = std::exp(logits[t * E + e]);
      for (auto& v : p) v /= z;
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
      double kept = 0;
      for (int j = 0; j < K; ++j) kept += p[order[j]];
      for (int j = 0; j < K; ++j) {
        EXPECT_EQ(ids[t * K + j], order[j]);
        EXPECT_NEAR(w[t * K + j], renorm ? p[order[j]] / kept : p[order[j]], 1e-6);
      }
    }
  }
}

TEST(Kernels, GroupByExpertIsAStablePermutation) {
  std::vector<int32_t> ids = {3, 1, 1, 0, 3, 2};  // T = 3, k = 2
  ExpertGrouping g;
  GroupByExpert(ids.data(), 3, 2, 5, &g);
  EXPECT_EQ(g.offsets, (std::vector<int32_t>{0, 1, 3, 4, 6, 6}));
  EXPECT_EQ(g.pairs, (std::vector<int32_t>{3, 1, 2, 5, 0, 4}));
  EXPECT_EQ(g.active_experts, (std::vector<int32_t>{0, 1, 2, 3}));
}

struct Experts {
  std::vector<std::vector<float>> gate, up, down;
  ExpertWeights view;
};

Experts RandomExperts(int E, int H, int I, std::mt19937_64& rng) {
  Experts x;
  for (int e = 0; e < E; ++e) {
    x.gate.push_back(Random(I * H, rng, 0.3f));
    x.up.push_back(Random(I * H, rng, 0.3f));
    x.down.push_back(Random(H * I, rng, 0.3f));
  }
  x.view.num_experts = E;
  x.view.hidden = H;
  x.view.intermediate = I;
  for (int e = 0; e < E; ++e) {
    x.view.gate_proj.push_back({DType::kF32, x.gate[e].data(), I, H});
    x.view.up_proj.push_back({DType::kF32, x.up[e].data(), I, H});
    x.view.down_proj.push_back({DType::kF32, x.down[e].data(), H, I});
  }
  return x;
}

std::vector<float> NaiveSwiGlu(const float* x, const float* g, const float* u, const float* d, int H, int I) {
  std::vector<float> h(I), y(H, 0.f);
  for (int i = 0; i < I; ++i) {
    double a = 0, b = 0;
    for (int k = 0; k < H; ++k) {
      a += g[i * H + k] * x[k];
      b += u[i * H + k] * x[k];
    }
    h[i] = static_cast<float>(a / (1 + std::exp(-a)) * b);
  }
  for (int o = 0; o < H; ++o) {
    double s = 0;
    for (int i = 0; i < I; ++i) s += d[o * I + i] * h[i];
    y[o] = static_cast<float>(s);
  }
  return y;
}

TEST(Kernels, MoeExpertsMatchesPerTokenLoop) {
  std::mt19937_64 rng(6);
  for (int trial = 0; trial < 5; ++trial) {
    const int T = 1 + static_cast<int>(rng() % 40), E = 6, K = 2, H = 24, I = 12;
    Experts ex = RandomExperts(E, H, I, rng);
    auto x = Random(T * H, rng);
    std::vector<int32_t> ids(T * K);
    std::vector<float> w(T * K);
    for (int t = 0; t < T; ++t) {
      ids[t * K] = static_cast<int32_t>(rng() % E);
      ids[t * K + 1] = (ids[t * K] + 1 + static_cast<int32_t>(rng() % (E - 1))) % E;
      w[t * K] = 0.7f;
      w[t * K + 1] = 0.3f;
    }
    std::vector<float> out(T * H, 1.f), ref(T * H, 1.f);  // accumulates into existing values
    MoeExperts({x.data(), ids.data(), w.data(), T, K, &ex.view, out.data()});
    for (int t = 0; t < T; ++t) {
      for (int j = 0; j < K; ++j) {
        const int e = ids[t * K + j];
        auto y = NaiveSwiGlu(x.data() + t * H, ex.gate[e].data(), ex.up[e].data(), ex.down[e].data(), H, I);
        for (int o = 0; o < H; ++o) ref[t * H + o] += w[t * K + j] * y[o];
      }
    }
    ExpectNear(out, ref, 1e-4f, "moe");
  }
}

// batch_invariant: a row's expert output is the same bits whichever rows share the call (what lets an EP
// group, whose replicas see subsets of an expert's rows, match a single-rank decoder); and it is the SwiGLU.
TEST(Kernels, ExpertFfnBatchInvariantRowsDoNotDependOnTheirNeighbours) {
  std::mt19937_64 rng(11);
  const int E = 3, H = 40, I = 24, n = 33;
  Experts ex = RandomExperts(E, H, I, rng);
  auto x = Random(n * H, rng);
  std::vector<float> all(n * H);
  ExpertFfn({x.data(), n, &ex.view, 2, all.data(), true});
  for (int begin : {0, 5, 17, 32}) {
    for (int count : {1, 3, 8}) {
      if (begin + count > n) continue;
      std::vector<float> part(count * H);
      ExpertFfn({x.data() + begin * H, count, &ex.view, 2, part.data(), true});
      ASSERT_EQ(std::memcmp(part.data(), all.data() + begin * H, part.size() * sizeof(float)), 0)
          << begin << "+" << count;
    }
  }
  for (int t = 0; t < n; t += 8) {
    auto y = NaiveSwiGlu(x.data() + t * H, ex.gate[2].data(), ex.up[2].data(), ex.down[2].data(), H, I);
    ExpectNear(std::vector<float>(all.begin() + t * H, all.begin() + (t + 1) * H), y, 1e-4f, "expert ffn");
  }
  // MoeExperts with batch_invariant agrees with the GEMM path within rounding.
  std::vector<int32_t> ids(n * 2);
  std::vector<float> w(n * 2, 0.5f);
  for (int t = 0; t < n; ++t) {
    ids[t * 2] = t % E;
    ids[t * 2 + 1] = (t + 1) % E;
  }
  std::vector<float> a(n * H, 0.f), b(n * H, 0.f);
  MoeExperts({x.data(), ids.data(), w.data(), n, 2, &ex.view, a.data(), true});
  MoeExperts({x.data(), ids.data(), w.data(), n, 2, &ex.view, b.data(), false});
  ExpectNear(a, b, 1e-5f, "batch-invariant vs GEMM");
}

// Attention against a contiguous naive implementation.
TEST(Kernels, PagedAttentionDecodeAndPrefillMatchContiguousAttention) {
  std::mt19937_64 rng(7);
  const int Hq = 4, Hk = 2, D = 8, bs = 4, num_blocks = 16, len = 11;
  std::vector<float> kc(num_blocks * bs * Hk * D, 0.f), vc(kc.size(), 0.f);
  PagedKv cache{kc.data(), vc.data(), num_blocks, bs, Hk, D};
  std::vector<int32_t> table = {9, 2, 14};  // scattered blocks
  auto k = Random(len * Hk * D, rng), v = Random(len * Hk * D, rng), q = Random(len * Hq * D, rng);
  std::vector<int32_t> pos(len);
  std::iota(pos.begin(), pos.end(), 0);
  WriteKv({cache, table.data(), pos.data(), k.data(), v.data(), len});
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  auto naive = [&](int t, int h) {  // query t attends to [0, t]
    const int kh = h / (Hq / Hk);
    std::vector<double> s(t + 1);
    double mx = -1e300, z = 0;
    for (int p = 0; p <= t; ++p) {
      double d = 0;
      for (int i = 0; i < D; ++i) d += q[(t * Hq + h) * D + i] * k[(p * Hk + kh) * D + i];
      s[p] = d * scale;
      mx = std::max(mx, s[p]);
    }
    for (auto& x : s) z += x = std::exp(x - mx);
    std::vector<float> o(D, 0.f);
    for (int p = 0; p <= t; ++p) {
      for (int i = 0; i < D; ++i) o[i] += static_cast<float>(s[p] / z) * v[(p * Hk + kh) * D + i];
    }
    return o;
  };
  // Prefill of positions [3, 11) with [0, 3) already cached.
  std::vector<float> out((len - 3) * Hq * D);
  PrefillAttention({q.data() + 3 * Hq * D, cache, table.data(), 3, len - 3, Hq, scale, out.data()});
  for (int t = 3; t < len; ++t) {
    for (int h = 0; h < Hq; ++h) {
      auto ref = naive(t, h);
      for (int i = 0; i < D; ++i) ASSERT_NEAR(out[((t - 3) * Hq + h) * D + i], ref[i], 1e-5);
    }
  }
  // Decode: two sequences sharing the cache layout, context lengths 11 and 5 (the second uses a prefix).
  std::vector<int32_t> tables = {9, 2, 14, 9, 2, 0};
  std::vector<int32_t> lens = {11, 5};
  std::vector<float> dq(2 * Hq * D), dout(2 * Hq * D);
  std::copy(q.begin() + 10 * Hq * D, q.begin() + 11 * Hq * D, dq.begin());
  std::copy(q.begin() + 4 * Hq * D, q.begin() + 5 * Hq * D, dq.begin() + Hq * D);
  PagedAttentionDecode({dq.data(), cache, tables.data(), lens.data(), 2, Hq, 3, scale, dout.data()});
  for (int h = 0; h < Hq; ++h) {
    auto r0 = naive(10, h), r1 = naive(4, h);
    for (int i = 0; i < D; ++i) {
      EXPECT_NEAR(dout[h * D + i], r0[i], 1e-5);
      EXPECT_NEAR(dout[(Hq + h) * D + i], r1[i], 1e-5);
    }
  }
}

TEST(Kernels, SignatureCountsPerBlock) {
  // 5 tokens, block size 2, top-2, E = 4: blocks {t0,t1}, {t2,t3}, {t4}.
  std::vector<int32_t> ids = {0, 1, 0, 2, 3, 1, 3, 0, 2, 1};
  const int64_t stride = 4;
  std::vector<int8_t> rows(3 * stride, 0);
  AccumulateSignatureCounts({ids.data(), 5, 2, 2, rows.data(), stride});
  EXPECT_EQ(rows, (std::vector<int8_t>{2, 1, 1, 0, 1, 1, 0, 2, 0, 1, 1, 0}));
}

}  // namespace
}  // namespace eldr::kernels
