// Distinct experts per step (DESIGN.md §3): Σ over MoE layers ℓ of |∪ over the tokens of the decode batch of
// top-k(ℓ)|. The one implementation of the figure: the executor (serve's decode steps), the simulator,
// `eldr route`'s replay and `eldr trace stats` all count through ExpertUnion.
//
// An ExpertUnion holds, per MoE layer, the set of experts the tokens added so far route to, as a bitset of
// num_words() = ⌈E/64⌉ 64-bit words per layer: a step clears it, adds its tokens (their top-k ids, or a
// token's precomputed set from TokenExpertSet, which is faster when a token is counted in many steps), then
// reads Total() (the figure) or Layer(ℓ) (one layer's term).
//
// Thread safety: an ExpertUnion is not shared between threads; distinct objects are independent.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace eldr {

class ExpertUnion {
 public:
  // REQUIRES: num_layers >= 0, num_experts >= 1.
  ExpertUnion(int num_layers, int num_experts);

  // Empties every layer's set (the start of a step).
  void Clear();
  // Adds one token's routing. topk: [L, top_k] expert ids in [0, E), layer-major, as in a routing trace row.
  void AddToken(const uint16_t* topk, int top_k);
  void AddToken(const int32_t* topk, int top_k);
  // Adds one token's set [L, num_words()], as TokenExpertSet builds it.
  void AddTokenSet(const uint64_t* token_set);

  // Σ over layers of the set sizes: the distinct experts of the step.
  int64_t Total() const;
  // The set size at layer ℓ. REQUIRES: 0 <= layer < num_layers.
  int Layer(int layer) const;

  int num_layers() const { return num_layers_; }
  int num_words() const { return num_words_; }

 private:
  int num_layers_;
  int num_words_;
  std::vector<uint64_t> bits_;  // [L, num_words]
};

// One token's sets for ExpertUnion::AddTokenSet: sets the bits of topk [L, top_k] in out [L, ⌈E/64⌉], which the
// caller zeroes first. REQUIRES: ids in [0, num_experts).
void TokenExpertSet(const uint16_t* topk, int num_layers, int num_experts, int top_k, uint64_t* out);

// Distinct experts per step at matched batch: the figure grows with the batch (more tokens touch more experts), so
// two policies whose decoders run different batches are compared batch size by batch size. Add() records one decode
// step (batch > 0); Rows() gives, per batch size seen, its steps and mean distinct experts, ascending in batch.
struct BatchDistinctRow {
  int64_t batch = 0;
  int64_t steps = 0;
  double mean_distinct_experts = 0;
};
class DistinctByBatch {
 public:
  // Steps with batch <= 0 are ignored (nothing ran).
  void Add(int64_t batch, int64_t distinct_experts);
  void Merge(const DistinctByBatch& other);
  std::vector<BatchDistinctRow> Rows() const;
  int64_t steps() const;

 private:
  std::map<int64_t, std::pair<int64_t, double>> by_batch_;  // batch -> (steps, Σ distinct)
};

// The matched-batch ratio of `policy` against `reference`: Σ_b w_b · mean_p(b) / mean_ref(b) / Σ_b w_b over the
// batch sizes b both ran, with w_b = the policy's steps at b. covered (optional) receives the share of the policy's
// steps at those batch sizes (1: every step matched). 0 when no batch size is shared (covered = 0).
double MatchedBatchRatio(const std::vector<BatchDistinctRow>& policy, const std::vector<BatchDistinctRow>& reference,
                         double* covered = nullptr);

}  // namespace eldr
