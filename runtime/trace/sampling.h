// Random sampling shared by the synthetic trace generators (synth.cc, synth_like.cc). Everything here is
// specified by this file (std::mt19937_64, whose output the standard fixes, and these distributions), never
// by the implementation-defined std distributions, so traces are the same with every standard library.
// Internal to runtime/trace/.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace eldr::trace_sampling {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Seed of the index-th generator of a stream: one part of a trace (e.g. weights) does not shift another.
inline uint64_t StreamSeed(uint64_t seed, uint64_t stream, uint64_t index) {
  return SplitMix64(SplitMix64(SplitMix64(seed) ^ stream) + index);
}

// Uniform in [0, n), n >= 1, without modulo bias (rejection).
inline uint64_t UniformBelow(std::mt19937_64& rng, uint64_t n) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t r;
  do {
    r = rng();
  } while (r >= limit);
  return r % n;
}

// Uniform in [0, 1) with 53 random bits.
inline double UniformUnit(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// Standard normal (Box–Muller; one of the pair is discarded, which keeps the draw stateless).
inline double StandardNormal(std::mt19937_64& rng) {
  const double u1 = 1.0 - UniformUnit(rng);  // (0, 1]
  const double u2 = UniformUnit(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// log of a Gamma(shape, 1) variate, shape > 0 (Marsaglia–Tsang; shape < 1 through Gamma(shape + 1)·U^(1/shape),
// kept in logs so that tiny shapes do not underflow to 0).
inline double LogGamma01(std::mt19937_64& rng, double shape) {
  double boost = 0;
  if (shape < 1) {
    boost = std::log(1.0 - UniformUnit(rng)) / shape;
    shape += 1;
  }
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = StandardNormal(rng);
    const double v0 = 1 + c * x;
    if (v0 <= 0) continue;
    const double v = v0 * v0 * v0;
    const double u = 1.0 - UniformUnit(rng);
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return std::log(d * v) + boost;
  }
}

// Walker/Vose alias table over n outcomes, built in exact integer arithmetic: every bucket holds 2^32
// units, so an outcome of probability 0 is never drawn and the build never leaves a bucket half-defined.
// A full bucket has threshold 2^32-1 and aliases itself.
struct AliasBucket {
  uint32_t thresh;  // the bucket's own outcome is drawn when the fraction is below this
  uint16_t alias;   // else this one
};

class AliasTable {
 public:
  explicit AliasTable(int n) : n_(n), units_(n), small_(n), large_(n) {}

  // p: [n], non-negative with a positive sum. table: [n] output.
  void Build(const double* p, AliasBucket* table) {
    constexpr int64_t kBucket = int64_t{1} << 32;
    double sum = 0;
    for (int i = 0; i < n_; ++i) sum += p[i];
    const double scale = static_cast<double>(n_) * static_cast<double>(kBucket) / sum;
    int64_t total = 0;
    int argmax = 0;
    for (int i = 0; i < n_; ++i) {
      units_[i] = static_cast<int64_t>(std::floor(p[i] * scale));
      total += units_[i];
      if (units_[i] > units_[argmax]) argmax = i;
    }
    units_[argmax] += static_cast<int64_t>(n_) * kBucket - total;  // rounding: units now sum to n * 2^32
    int num_small = 0, num_large = 0;
    for (int i = 0; i < n_; ++i) {
      if (units_[i] < kBucket) {
        small_[num_small++] = i;
      } else {
        large_[num_large++] = i;
      }
    }
    while (num_small > 0 && num_large > 0) {
      const int s = small_[--num_small];
      const int l = large_[num_large - 1];
      table[s] = AliasBucket{static_cast<uint32_t>(units_[s]), static_cast<uint16_t>(l)};
      units_[l] -= kBucket - units_[s];
      if (units_[l] < kBucket) {
        --num_large;
        small_[num_small++] = l;
      }
    }
    // With exact sums only full buckets remain; a leftover small one cannot occur but is made full anyway.
    for (int i = 0; i < num_large; ++i) table[large_[i]] = AliasBucket{UINT32_MAX, static_cast<uint16_t>(large_[i])};
    for (int i = 0; i < num_small; ++i) table[small_[i]] = AliasBucket{UINT32_MAX, static_cast<uint16_t>(small_[i])};
  }

 private:
  int n_;
  std::vector<int64_t> units_;
  std::vector<int> small_, large_;
};

// One 32-bit uniform u draws one outcome: the integer part of u·n / 2^32 picks the bucket and the
// fraction (uniform on a grid of step n / 2^32) is compared with the bucket's threshold. Branch-free:
// which side of the threshold a draw falls on is unpredictable.
inline uint16_t DrawAlias(uint32_t u, uint32_t n, const AliasBucket* table) {
  const uint64_t scaled = static_cast<uint64_t>(u) * n;
  const AliasBucket b = table[scaled >> 32];
  return static_cast<uint32_t>(scaled) < b.thresh ? static_cast<uint16_t>(scaled >> 32) : b.alias;
}

}  // namespace eldr::trace_sampling
