#include "runtime/common/distinct_experts.h"

#include <algorithm>
#include <bit>

namespace eldr {

namespace {

int WordsFor(int num_experts) { return (num_experts + 63) / 64; }

template <typename Id>
void SetBits(const Id* topk, int num_layers, int num_words, int top_k, uint64_t* bits) {
  for (int l = 0; l < num_layers; ++l) {
    uint64_t* layer = bits + static_cast<size_t>(l) * num_words;
    const Id* ids = topk + static_cast<size_t>(l) * top_k;
    for (int j = 0; j < top_k; ++j) {
      const uint32_t e = static_cast<uint32_t>(ids[j]);
      layer[e / 64] |= uint64_t{1} << (e % 64);
    }
  }
}

}  // namespace

ExpertUnion::ExpertUnion(int num_layers, int num_experts)
    : num_layers_(num_layers),
      num_words_(WordsFor(num_experts)),
      bits_(static_cast<size_t>(num_layers) * num_words_, 0) {}

void ExpertUnion::Clear() { std::fill(bits_.begin(), bits_.end(), 0); }

void ExpertUnion::AddToken(const uint16_t* topk, int top_k) {
  SetBits(topk, num_layers_, num_words_, top_k, bits_.data());
}

void ExpertUnion::AddToken(const int32_t* topk, int top_k) {
  SetBits(topk, num_layers_, num_words_, top_k, bits_.data());
}

void ExpertUnion::AddTokenSet(const uint64_t* token_set) {
  for (size_t x = 0; x < bits_.size(); ++x) bits_[x] |= token_set[x];
}

int64_t ExpertUnion::Total() const {
  int64_t total = 0;
  for (uint64_t w : bits_) total += std::popcount(w);
  return total;
}

int ExpertUnion::Layer(int layer) const {
  int count = 0;
  const uint64_t* words = bits_.data() + static_cast<size_t>(layer) * num_words_;
  for (int w = 0; w < num_words_; ++w) count += std::popcount(words[w]);
  return count;
}

void TokenExpertSet(const uint16_t* topk, int num_layers, int num_experts, int top_k, uint64_t* out) {
  SetBits(topk, num_layers, WordsFor(num_experts), top_k, out);
}

void DistinctByBatch::Add(int64_t batch, int64_t distinct_experts) {
  if (batch <= 0) return;
  auto& [steps, sum] = by_batch_[batch];
  ++steps;
  sum += static_cast<double>(distinct_experts);
}

void DistinctByBatch::Merge(const DistinctByBatch& other) {
  for (const auto& [batch, v] : other.by_batch_) {
    auto& [steps, sum] = by_batch_[batch];
    steps += v.first;
    sum += v.second;
  }
}

std::vector<BatchDistinctRow> DistinctByBatch::Rows() const {
  std::vector<BatchDistinctRow> rows;
  for (const auto& [batch, v] : by_batch_) rows.push_back({batch, v.first, v.second / static_cast<double>(v.first)});
  return rows;
}

int64_t DistinctByBatch::steps() const {
  int64_t n = 0;
  for (const auto& [batch, v] : by_batch_) n += v.first;
  return n;
}

double MatchedBatchRatio(const std::vector<BatchDistinctRow>& policy, const std::vector<BatchDistinctRow>& reference,
                         double* covered) {
  std::map<int64_t, double> ref;
  for (const BatchDistinctRow& r : reference) {
    if (r.steps > 0 && r.mean_distinct_experts > 0) ref[r.batch] = r.mean_distinct_experts;
  }
  double weighted = 0, matched = 0, all = 0;
  for (const BatchDistinctRow& p : policy) {
    all += static_cast<double>(p.steps);
    auto it = ref.find(p.batch);
    if (it == ref.end() || p.steps <= 0) continue;
    weighted += static_cast<double>(p.steps) * p.mean_distinct_experts / it->second;
    matched += static_cast<double>(p.steps);
  }
  if (covered) *covered = all > 0 ? matched / all : 0.0;
  return matched > 0 ? weighted / matched : 0.0;
}

}  // namespace eldr
