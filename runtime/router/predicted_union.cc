#include "runtime/router/predicted_union.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/common/check.h"

namespace eldr {

namespace {
constexpr float kMaxProbability = 1.0f - 1e-6f;
constexpr uint64_t kStale = ~uint64_t{0};  // a growth_version_ no decoder reaches
}  // namespace

PredictedUnion::PredictedUnion(const std::vector<float>& profiles, int num_profiles,
                               const std::vector<uint8_t>& layer_mask, int num_layers, int num_experts,
                               int num_decoders)
    : num_profiles_(num_profiles) {
  ELDR_CHECK(static_cast<int>(layer_mask.size()) == num_layers, "layer mask size " << layer_mask.size());
  ELDR_CHECK(profiles.size() == static_cast<size_t>(num_profiles) * num_layers * num_experts,
             "profiles size " << profiles.size());
  std::vector<int> layers;
  for (int l = 0; l < num_layers; ++l) {
    if (layer_mask[l]) layers.push_back(l);
  }
  ELDR_CHECK(!layers.empty(), "the layer mask selects no layer");
  row_ = static_cast<int>(layers.size()) * num_experts;
  scale_ = static_cast<double>(num_layers) / static_cast<double>(layers.size());
  q_.resize(static_cast<size_t>(num_profiles) * row_);
  inverse_keep_.resize(q_.size());
  for (int p = 0; p < num_profiles; ++p) {
    for (size_t i = 0; i < layers.size(); ++i) {
      const float* src = profiles.data() + (static_cast<size_t>(p) * num_layers + layers[i]) * num_experts;
      for (int e = 0; e < num_experts; ++e) {
        const size_t j = static_cast<size_t>(p) * row_ + i * num_experts + e;
        q_[j] = std::clamp(src[e], 0.0f, kMaxProbability);
        inverse_keep_[j] = 1.0 / (1.0 - static_cast<double>(q_[j]));
      }
    }
  }
  keep_exact_.assign(static_cast<size_t>(num_decoders) * row_, 1.0);
  keep_.assign(keep_exact_.size(), 1.0f);
  union_.assign(num_decoders, 0.0);
  count_.assign(num_decoders, 0);
  version_.assign(num_decoders, 0);
  growth_.assign(static_cast<size_t>(num_profiles) * num_decoders, 0.0);
  growth_version_.assign(growth_.size(), kStale);
}

// Decoder k's products kd = keep_exact_[k] are multiplied entry by entry by the profile's factors (kAdd: 1 − q,
// in double from the float q, one array less to read; kRemove: the precomputed 1 / (1 − q), capped at 1 after;
// kReset: set to exactly 1), and in the same pass keep_[k] = float(kd) and U_k = scale · (|S|·E − Σ kd), the sum
// in eight double lanes added pairwise at the end (a fixed order, so the same value on every run; one
// accumulator was a 4-cycle dependency per entry).
template <PredictedUnion::UpdateKind kKind>
void PredictedUnion::Update(int k, int p) {
  typedef double Double8 __attribute__((vector_size(64)));
  typedef float Float8 __attribute__((vector_size(32)));
  double* kd = keep_exact_.data() + static_cast<size_t>(k) * row_;
  float* kp = keep_.data() + static_cast<size_t>(k) * row_;
  const float* q = q_.data() + static_cast<size_t>(p) * row_;
  const double* inv = inverse_keep_.data() + static_cast<size_t>(p) * row_;
  const auto apply = [](auto v, auto f) {
    if constexpr (kKind == UpdateKind::kAdd) return v * f;
    if constexpr (kKind == UpdateKind::kRemove) {
      const auto x = v * f;
      return x < 1 ? x : x * 0 + 1;  // min(1, kd / (1 − q)), lane by lane
    }
    if constexpr (kKind == UpdateKind::kReset) return v * 0 + 1;  // kd is finite: every lane 1
  };
  Double8 lane = {0, 0, 0, 0, 0, 0, 0, 0};
  int j = 0;
  for (; j + 8 <= row_; j += 8) {
    Double8 v, f;
    std::memcpy(&v, kd + j, sizeof v);
    if constexpr (kKind == UpdateKind::kRemove) {
      std::memcpy(&f, inv + j, sizeof f);
    } else {
      Float8 qf;
      std::memcpy(&qf, q + j, sizeof qf);
      f = 1.0 - __builtin_convertvector(qf, Double8);
    }
    v = apply(v, f);
    std::memcpy(kd + j, &v, sizeof v);
    const Float8 vf = __builtin_convertvector(v, Float8);
    std::memcpy(kp + j, &vf, sizeof vf);
    lane += v;
  }
  double untouched = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; j < row_; ++j) {
    const double f1 = kKind == UpdateKind::kRemove ? inv[j] : 1.0 - static_cast<double>(q[j]);
    Double8 v = {kd[j], 1, 1, 1, 1, 1, 1, 1}, f = {f1, 1, 1, 1, 1, 1, 1, 1};
    kd[j] = apply(v, f)[0];
    kp[j] = static_cast<float>(kd[j]);
    untouched += kd[j];
  }
  union_[k] = scale_ * (static_cast<double>(row_) - untouched);
  ++version_[k];
}

void PredictedUnion::Add(int k, int p) {
  ELDR_CHECK(k >= 0 && k < static_cast<int>(count_.size()) && p >= 0 && p < num_profiles_,
             "PredictedUnion::Add(" << k << ", " << p << ")");
  ++count_[k];
  Update<UpdateKind::kAdd>(k, p);
}

void PredictedUnion::Remove(int k, int p) {
  ELDR_CHECK(k >= 0 && k < static_cast<int>(count_.size()) && p >= 0 && p < num_profiles_ && count_[k] > 0,
             "PredictedUnion::Remove(" << k << ", " << p << ")");
  --count_[k];
  // An emptied decoder is reset to exactly 1: drop the rounding residue of the products.
  if (count_[k] == 0) {
    Update<UpdateKind::kReset>(k, p);
  } else {
    Update<UpdateKind::kRemove>(k, p);
  }
}

const double* PredictedUnion::Growths(int p) {
  ELDR_CHECK(p >= 0 && p < num_profiles_, "PredictedUnion::Growths(" << p << ")");
  const int K = static_cast<int>(count_.size());
  double* g = growth_.data() + static_cast<size_t>(p) * K;
  uint64_t* v = growth_version_.data() + static_cast<size_t>(p) * K;
  for (int k = 0; k < K; ++k) {
    if (v[k] == version_[k]) continue;
    g[k] = Growth(k, p);
    v[k] = version_[k];
    ++growth_evaluations_;
  }
  return g;
}

double PredictedUnion::Growth(int k, int p) const {
  Eigen::Map<const Eigen::VectorXf> keep(keep_.data() + static_cast<size_t>(k) * row_, row_);
  Eigen::Map<const Eigen::VectorXf> q(q_.data() + static_cast<size_t>(p) * row_, row_);
  return scale_ * static_cast<double>(keep.dot(q));
}

}  // namespace eldr
