// The CPU oracle's comparison helpers shared by the GPU tests (tests/gpu/*_test.cc), ggml test-backend-ops
// style: per-operation tolerances with their reasons, a Close() that reports the worst element, and random
// inputs (bf16-rounded where the GPU rounds them, so a tolerance covers only what the GPU does differently).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/ops.h"

namespace eldr::kernels::gpu_test {

// ---- per-operation tolerances ----
// A result passes when every element satisfies |got - want| <= max * (|want| + rms(want)) (relative where
// the result is large, scaled by its magnitude where it crosses zero) and rms(got - want) <= rms * rms(want).
// The MoE/MLP bounds come from emulating the GPU's bf16 rounding of gate/up/SwiGLU/expert outputs on the
// CPU at these shapes: error rms 0.22..0.42% of the result's rms, worst element 0.2..1.6% (so ~3x margin
// either way; a wrong row or layout gives errors of order 100%).
struct Tolerance {
  double max, rms;
};
constexpr Tolerance kTolRmsNorm{1e-5, 1e-5};     // fp32 block sum vs the CPU's double sum
constexpr Tolerance kTolRope{1e-5, 1e-5};        // both take cos/sin in double; fp32 rotation
constexpr Tolerance kTolLinear{5e-3, 1e-3};      // same bf16 inputs; fp32 accumulation in another order
constexpr Tolerance kTolGateWeight{1e-4, 1e-5};  // fp32 softmax vs the CPU's double; ids compared exactly
constexpr Tolerance kTolCombine{1e-5, 1e-5};     // fp32 sum of top_k terms in another order
constexpr Tolerance kTolMoe{5e-2, 1e-2};         // GPU stores gate, up, SwiGLU and expert outputs in bf16
constexpr Tolerance kTolMlp{5e-2, 1e-2};         // GPU stores gate, up and SwiGLU outputs in bf16
constexpr Tolerance kTolAttention{1e-3, 1e-4};   // same bf16 K/V values; fp32 online softmax vs two-pass

inline ::testing::AssertionResult Close(const std::vector<float>& got, const std::vector<float>& want, Tolerance tol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  double want_ss = 0, err_ss = 0;
  for (float w : want) want_ss += static_cast<double>(w) * w;
  const double rms = want.empty() ? 0 : std::sqrt(want_ss / want.size());
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    err_ss += err * err;
    const double allowed = tol.max * (std::abs(want[i]) + rms) + 1e-30;
    if (!(err <= allowed)) ++bad;  // NaN counts as bad
    const double ratio = std::isnan(err) ? INFINITY : err / allowed;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  const double err_rms = got.empty() ? 0 : std::sqrt(err_ss / got.size());
  if (bad == 0 && err_rms <= tol.rms * rms + 1e-30) return ::testing::AssertionSuccess();
  auto failure = ::testing::AssertionFailure();
  failure << "error rms " << err_rms << " vs result rms " << rms << " (bound " << tol.rms << " relative); ";
  failure << bad << " of " << got.size() << " elements beyond " << tol.max << " relative";
  if (!got.empty()) failure << "; worst at " << worst << ": got " << got[worst] << ", want " << want[worst];
  return failure;
}

inline std::vector<float> Random(size_t n, std::mt19937_64& rng, float scale = 1.f) {
  std::normal_distribution<float> g(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

inline std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = FloatToBf16(v[i]);
  return b;
}

inline std::vector<float> FromBf16(const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = Bf16ToFloat(b[i]);
  return v;
}

// The values the GPU sees after its bf16 rounding, as floats for the CPU.
inline std::vector<float> RoundToBf16(const std::vector<float>& v) { return FromBf16(ToBf16(v)); }

inline std::vector<float> Minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// top_k distinct experts per token, drawn from experts [0, hot).
inline std::vector<int32_t> RandomTopK(int num_tokens, int hot, int top_k, std::mt19937_64& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(num_tokens) * top_k), pool(hot);
  for (int t = 0; t < num_tokens; ++t) {
    std::iota(pool.begin(), pool.end(), 0);
    for (int j = 0; j < top_k; ++j) {
      const int pick = j + static_cast<int>(rng() % (hot - j));
      std::swap(pool[j], pool[pick]);
      ids[static_cast<size_t>(t) * top_k + j] = pool[j];
    }
  }
  return ids;
}

// Positive weights summing to 1 per token.
inline std::vector<float> RandomTopKWeights(int num_tokens, int top_k, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(0.05f, 1.f);
  std::vector<float> w(static_cast<size_t>(num_tokens) * top_k);
  for (int t = 0; t < num_tokens; ++t) {
    float s = 0;
    for (int j = 0; j < top_k; ++j) s += w[t * top_k + j] = u(rng);
    for (int j = 0; j < top_k; ++j) w[t * top_k + j] /= s;
  }
  return w;
}

}  // namespace eldr::kernels::gpu_test
