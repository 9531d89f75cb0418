#include "runtime/signature/quality.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <unordered_set>

#include "runtime/common/parallel.h"

namespace eldr {

RequestPairs SampleRequestPairs(int n, int64_t max_pairs, uint64_t seed) {
  RequestPairs p;
  const int64_t total = static_cast<int64_t>(n) * (n - 1) / 2;
  if (max_pairs <= 0 || total <= max_pairs) {
    p.first.reserve(total);
    p.second.reserve(total);
    for (int i = 0; i < n; ++i) {
      for (int j = i + 1; j < n; ++j) {
        p.first.push_back(i);
        p.second.push_back(j);
      }
    }
    p.all_pairs = true;
    return p;
  }
  p.all_pairs = false;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ULL);
  std::unordered_set<uint64_t> seen;
  seen.reserve(max_pairs * 2);
  while (static_cast<int64_t>(p.first.size()) < max_pairs) {
    int a = static_cast<int>(rng() % n), b = static_cast<int>(rng() % n);
    if (a == b) continue;
    if (a > b) std::swap(a, b);
    if (!seen.insert(static_cast<uint64_t>(a) * n + b).second) continue;
    p.first.push_back(a);
    p.second.push_back(b);
  }
  return p;
}

std::vector<double> AverageRanks(const std::vector<double>& values) {
  const size_t n = values.size();
  std::vector<uint32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0u);
  std::sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) { return values[a] < values[b]; });
  std::vector<double> ranks(n);
  size_t i = 0;
  while (i < n) {
    size_t j = i + 1;
    while (j < n && values[idx[j]] == values[idx[i]]) ++j;
    const double r = 0.5 * static_cast<double>(i + 1 + j);  // mean of ranks i+1 .. j
    for (size_t m = i; m < j; ++m) ranks[idx[m]] = r;
    i = j;
  }
  return ranks;
}

namespace {
double Pearson(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = x.size();
  if (n < 2) return std::numeric_limits<double>::quiet_NaN();
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) {
    mx += x[i];
    my += y[i];
  }
  mx /= n;
  my /= n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < n; ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  if (sxx <= 0 || syy <= 0) return std::numeric_limits<double>::quiet_NaN();
  return sxy / std::sqrt(sxx * syy);
}
}  // namespace

double SpearmanCorrelation(const std::vector<double>& x, const std::vector<double>& y) {
  return Pearson(AverageRanks(x), AverageRanks(y));
}

double CosineDistance(const float* a, const float* b, size_t n) {
  // Eight double lanes per sum, added pairwise at the end (a fixed order; one sequential accumulator per sum was
  // bound by the add latency: issue 15).
  typedef double Double8 __attribute__((vector_size(64)));
  typedef float Float8 __attribute__((vector_size(32)));
  Double8 ab8 = {}, aa8 = {}, bb8 = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Float8 af, bf;
    std::memcpy(&af, a + i, sizeof af);
    std::memcpy(&bf, b + i, sizeof bf);
    const Double8 x = __builtin_convertvector(af, Double8), y = __builtin_convertvector(bf, Double8);
    ab8 += x * y;
    aa8 += x * x;
    bb8 += y * y;
  }
  const auto total = [](const Double8& v) { return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])); };
  double ab = total(ab8), aa = total(aa8), bb = total(bb8);
  for (; i < n; ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  if (aa <= 0 || bb <= 0) return 1.0;
  return 1.0 - ab / std::sqrt(aa * bb);
}

std::vector<double> SignatureQuality::DecodeRanks(const std::vector<float>& decode_profile, size_t row_size,
                                                  const RequestPairs& pairs) {
  std::vector<double> decode_dist(pairs.size());
  ParallelFor(static_cast<int64_t>(pairs.size()), [&](int64_t p) {
    decode_dist[p] = CosineDistance(decode_profile.data() + pairs.first[p] * row_size,
                                    decode_profile.data() + pairs.second[p] * row_size, row_size);
  });
  return AverageRanks(decode_dist);
}

SignatureQuality::SignatureQuality(const std::vector<float>& features, const std::vector<float>& decode_profile,
                                   int num_requests, int num_layers, int num_experts, const RequestPairs& pairs)
    : SignatureQuality(features, DecodeRanks(decode_profile, static_cast<size_t>(num_layers) * num_experts, pairs),
                       num_requests, num_layers, num_experts, pairs) {}

SignatureQuality::SignatureQuality(const std::vector<float>& features, std::vector<double> decode_ranks,
                                   int num_requests, int num_layers, int num_experts, const RequestPairs& pairs)
    : num_requests_(num_requests),
      num_layers_(num_layers),
      num_pairs_(pairs.size()),
      pairs_(pairs),
      decode_ranks_(std::move(decode_ranks)) {
  const int L = num_layers, E = num_experts, N = num_requests;
  const size_t P = num_pairs_;
  const size_t row = static_cast<size_t>(L) * E;
  layer_dot_.assign(static_cast<size_t>(L) * P, 0.0);
  layer_norm2_.assign(static_cast<size_t>(L) * N, 0.0);
  ParallelFor(L, [&](int64_t l) {
    // Copy layer l of every request into one contiguous [N, E] slice so that the pair loop, which visits
    // requests in random order, reads from cache instead of striding through the whole [N, L, E] array.
    std::vector<float> slice(static_cast<size_t>(N) * E);
    for (int i = 0; i < N; ++i) {
      const float* x = features.data() + i * row + l * E;
      std::copy(x, x + E, slice.begin() + static_cast<size_t>(i) * E);
      double s = 0;
      for (int e = 0; e < E; ++e) s += static_cast<double>(x[e]) * x[e];
      layer_norm2_[l * N + i] = s;
    }
    for (size_t p = 0; p < P; ++p) {
      const Eigen::Map<const Eigen::VectorXf> a(slice.data() + static_cast<size_t>(pairs_.first[p]) * E, E);
      const Eigen::Map<const Eigen::VectorXf> b(slice.data() + static_cast<size_t>(pairs_.second[p]) * E, E);
      layer_dot_[l * P + p] = a.dot(b);  // vectorised (a sequential float sum was latency-bound: issue 15)
    }
  });
  decode_rank_mean_ = 0;
  for (double r : decode_ranks_) decode_rank_mean_ += r;
  decode_rank_mean_ /= std::max<size_t>(P, 1);
  decode_rank_ss_ = 0;
  for (double r : decode_ranks_) decode_rank_ss_ += (r - decode_rank_mean_) * (r - decode_rank_mean_);
}

namespace {

// Ranks (ties averaged) of non-negative distances. The greedy search ranks #pairs values ~L²/2 times, so
// this sorts the float bit patterns (non-negative floats order like their bits) with a 3-pass LSD radix
// sort of 11-bit digits instead of a comparison sort. Values equal as floats count as ties.
struct RankScratch {
  std::vector<uint32_t> key, idx, key2, idx2;
};

void FastAverageRanks(const std::vector<double>& values, RankScratch* s, std::vector<double>* ranks) {
  const size_t n = values.size();
  s->key.resize(n);
  s->idx.resize(n);
  s->key2.resize(n);
  s->idx2.resize(n);
  ranks->resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(std::max(0.0, values[i]));
    std::memcpy(&s->key[i], &v, sizeof(uint32_t));
    s->idx[i] = static_cast<uint32_t>(i);
  }
  constexpr int kBits = 11;
  constexpr uint32_t kBuckets = 1u << kBits;
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass * kBits;
    uint32_t count[kBuckets + 1] = {0};
    for (size_t i = 0; i < n; ++i) ++count[((s->key[i] >> shift) & (kBuckets - 1)) + 1];
    for (uint32_t b = 0; b < kBuckets; ++b) count[b + 1] += count[b];
    for (size_t i = 0; i < n; ++i) {
      const uint32_t pos = count[(s->key[i] >> shift) & (kBuckets - 1)]++;
      s->key2[pos] = s->key[i];
      s->idx2[pos] = s->idx[i];
    }
    s->key.swap(s->key2);
    s->idx.swap(s->idx2);
  }
  size_t i = 0;
  while (i < n) {
    size_t j = i + 1;
    while (j < n && s->key[j] == s->key[i]) ++j;
    const double r = 0.5 * static_cast<double>(i + 1 + j);
    for (size_t m = i; m < j; ++m) (*ranks)[s->idx[m]] = r;
    i = j;
  }
}

}  // namespace

double SignatureQuality::RhoFromSums(const std::vector<double>& dot, const std::vector<double>& norm2) const {
  const size_t P = num_pairs_;
  thread_local std::vector<double> dist, ranks;
  thread_local RankScratch keys;
  dist.resize(P);
  for (size_t p = 0; p < P; ++p) {
    const double na = norm2[pairs_.first[p]], nb = norm2[pairs_.second[p]];
    dist[p] = (na > 0 && nb > 0) ? 1.0 - dot[p] / std::sqrt(na * nb) : 1.0;
  }
  FastAverageRanks(dist, &keys, &ranks);
  // Ranks 1..P (ties averaged) have mean (P+1)/2.
  const double mx = 0.5 * (static_cast<double>(P) + 1.0);
  double sxy = 0, sxx = 0;
  for (size_t p = 0; p < P; ++p) {
    sxy += (ranks[p] - mx) * (decode_ranks_[p] - decode_rank_mean_);
    sxx += (ranks[p] - mx) * (ranks[p] - mx);
  }
  if (sxx <= 0 || decode_rank_ss_ <= 0) return std::numeric_limits<double>::quiet_NaN();
  return sxy / std::sqrt(sxx * decode_rank_ss_);
}

double SignatureQuality::Rho(const std::vector<uint8_t>& mask) const {
  std::vector<double> dot(num_pairs_, 0.0), norm2(num_requests_, 0.0);
  for (int l = 0; l < num_layers_; ++l) {
    if (!mask[l]) continue;
    for (size_t p = 0; p < num_pairs_; ++p) dot[p] += layer_dot_[l * num_pairs_ + p];
    for (int i = 0; i < num_requests_; ++i) norm2[i] += layer_norm2_[l * num_requests_ + i];
  }
  return RhoFromSums(dot, norm2);
}

GreedyLayerSelection SignatureQuality::SelectLayersGreedy(void (*on_step)(void*, int), void* ctx) const {
  const int L = num_layers_;
  const size_t P = num_pairs_;
  GreedyLayerSelection out;
  std::vector<uint8_t> chosen(L, 0);
  std::vector<double> dot(P, 0.0), norm2(num_requests_, 0.0);
  for (int step = 0; step < L; ++step) {
    std::vector<int> candidates;
    for (int l = 0; l < L; ++l) {
      if (!chosen[l]) candidates.push_back(l);
    }
    std::vector<double> rho(candidates.size());
    ParallelFor(static_cast<int64_t>(candidates.size()), [&](int64_t c) {
      const int l = candidates[c];
      std::vector<double> d(P), n2(num_requests_);
      for (size_t p = 0; p < P; ++p) d[p] = dot[p] + layer_dot_[l * P + p];
      for (int i = 0; i < num_requests_; ++i) n2[i] = norm2[i] + layer_norm2_[l * num_requests_ + i];
      rho[c] = RhoFromSums(d, n2);
    });
    size_t best = 0;
    for (size_t c = 1; c < candidates.size(); ++c) {
      // NaN never wins; ties keep the lower layer index (candidates are ascending).
      if (!std::isnan(rho[c]) && (std::isnan(rho[best]) || rho[c] > rho[best])) best = c;
    }
    const int l = candidates[best];
    chosen[l] = 1;
    for (size_t p = 0; p < P; ++p) dot[p] += layer_dot_[l * P + p];
    for (int i = 0; i < num_requests_; ++i) norm2[i] += layer_norm2_[l * num_requests_ + i];
    out.layer_order.push_back(l);
    out.rho_curve.push_back(rho[best]);
    if (on_step) on_step(ctx, step + 1);
  }
  out.rho_all_layers = out.rho_curve.empty() ? std::numeric_limits<double>::quiet_NaN() : out.rho_curve.back();
  out.n_star = 1;
  for (int i = 1; i < L; ++i) {
    if (!std::isnan(out.rho_curve[i]) &&
        (std::isnan(out.rho_curve[out.n_star - 1]) || out.rho_curve[i] > out.rho_curve[out.n_star - 1])) {
      out.n_star = i + 1;
    }
  }
  return out;
}

}  // namespace eldr
