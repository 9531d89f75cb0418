#include "runtime/router/predicted_union.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

#include "runtime/common/check.h"

namespace eldr {

namespace {
constexpr float kMaxProbability = 1.0f - 1e-6f;
}

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
  log1m_q_.resize(q_.size());
  for (int p = 0; p < num_profiles; ++p) {
    for (size_t i = 0; i < layers.size(); ++i) {
      const float* src = profiles.data() + (static_cast<size_t>(p) * num_layers + layers[i]) * num_experts;
      for (int e = 0; e < num_experts; ++e) {
        const size_t j = static_cast<size_t>(p) * row_ + i * num_experts + e;
        q_[j] = std::clamp(src[e], 0.0f, kMaxProbability);
        log1m_q_[j] = std::log1p(-static_cast<double>(q_[j]));
      }
    }
  }
  log_keep_.assign(static_cast<size_t>(num_decoders) * row_, 0.0);
  keep_.assign(log_keep_.size(), 1.0f);
  union_.assign(num_decoders, 0.0);
  count_.assign(num_decoders, 0);
}

void PredictedUnion::Refresh(int k) {
  double* lk = log_keep_.data() + static_cast<size_t>(k) * row_;
  float* kp = keep_.data() + static_cast<size_t>(k) * row_;
  if (count_[k] == 0) std::fill(lk, lk + row_, 0.0);  // drop the rounding residue of the additions
  double untouched = 0;
  for (int j = 0; j < row_; ++j) {
    const double v = std::exp(lk[j]);
    kp[j] = static_cast<float>(v);
    untouched += v;
  }
  union_[k] = scale_ * (static_cast<double>(row_) - untouched);
}

void PredictedUnion::Add(int k, int p) {
  ELDR_CHECK(k >= 0 && k < static_cast<int>(count_.size()) && p >= 0 && p < num_profiles_,
             "PredictedUnion::Add(" << k << ", " << p << ")");
  double* lk = log_keep_.data() + static_cast<size_t>(k) * row_;
  const double* lq = log1m_q_.data() + static_cast<size_t>(p) * row_;
  for (int j = 0; j < row_; ++j) lk[j] += lq[j];
  ++count_[k];
  Refresh(k);
}

void PredictedUnion::Remove(int k, int p) {
  ELDR_CHECK(k >= 0 && k < static_cast<int>(count_.size()) && p >= 0 && p < num_profiles_ && count_[k] > 0,
             "PredictedUnion::Remove(" << k << ", " << p << ")");
  double* lk = log_keep_.data() + static_cast<size_t>(k) * row_;
  const double* lq = log1m_q_.data() + static_cast<size_t>(p) * row_;
  for (int j = 0; j < row_; ++j) lk[j] = std::min(0.0, lk[j] - lq[j]);
  --count_[k];
  Refresh(k);
}

double PredictedUnion::Growth(int k, int p) const {
  Eigen::Map<const Eigen::VectorXf> keep(keep_.data() + static_cast<size_t>(k) * row_, row_);
  Eigen::Map<const Eigen::VectorXf> q(q_.data() + static_cast<size_t>(p) * row_, row_);
  return scale_ * static_cast<double>(keep.dot(q));
}

}  // namespace eldr
