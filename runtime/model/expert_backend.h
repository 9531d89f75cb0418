// The routed-expert part of a MoE layer, behind a small interface the executor calls once per MoE layer
// (DESIGN.md §2): after the gate has chosen each token's top-k experts and weights, a backend computes
//   out[t] += Σ_j topk_weights[t, j] · expert_{topk_ids[t, j]}(x[t])
// The default (LocalExpertBackend) computes every expert in this process with the compute backend's
// MoeExperts. An expert-parallel decode group's leader plugs in a backend that dispatches the rows to the ranks
// holding the experts and combines their results (runtime/serve/expert_parallel.h).
// An ExpertBackend decides where expert rows run; the compute backend (kernels/backend.h) runs them.
//
// Thread safety: called from the executor's thread only.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "runtime/common/status.h"
#include "runtime/model/weights.h"

namespace eldr {

// One MoE layer's call. Tensors are memory of the executor's compute backend (kernels/backend.h), on its
// `stream`, except host_topk_ids.
struct MoeLayerCall {
  int layer = 0;                           // model layer index, in [0, num_hidden_layers)
  int moe_layer = 0;                       // index among the MoE layers, in [0, num_moe_layers) (placements use it)
  const float* x = nullptr;                // [num_tokens, hidden] the normalised hidden states
  const int32_t* topk_ids = nullptr;       // [num_tokens, top_k] logical experts
  const int32_t* host_topk_ids = nullptr;  // host: [num_tokens, top_k] the same ids (dispatch is planned on the host)
  const float* topk_weights = nullptr;     // [num_tokens, top_k]
  int num_tokens = 0, top_k = 0;
  float* out = nullptr;               // [num_tokens, hidden], accumulated into (the residual stream)
  kernels::Stream* stream = nullptr;  // the executor's stream; the call's work is queued on it
  // Each row's expert outputs must not depend on the other rows (kernels::ExpertFfnParams); the executor
  // asks for it in decode steps, so a single-rank decoder and an EP group give identical tokens.
  bool batch_invariant = false;
};

class ExpertBackend {
 public:
  virtual ~ExpertBackend() = default;
  // REQUIRES: every topk id in [0, num_experts). A Status for failures a caller can report (a group rank
  // gone); bugs throw.
  virtual Status RunExperts(const MoeLayerCall& call) = 0;
};

// Every expert in this process: the compute backend's MoeExperts on the layer's weights. On the CPU the rows of
// each expert are combined per token in slot order j = 0..top_k-1 (kernels::MoeCombine).
class LocalExpertBackend : public ExpertBackend {
 public:
  // REQUIRES: weights (in the compute backend's memory) and compute outlive the backend.
  LocalExpertBackend(const ModelWeights& weights, kernels::Backend& compute) : w_(weights), compute_(compute) {}
  // REQUIRES: call.stream is a stream of `compute`.
  Status RunExperts(const MoeLayerCall& call) override {
    compute_.MoeExperts({call.x, call.topk_ids, call.topk_weights, call.num_tokens, call.top_k,
                         &w_.layers[call.layer].experts, call.out, call.batch_invariant},
                        *call.stream);
    return Status::Ok();
  }

 private:
  const ModelWeights& w_;
  kernels::Backend& compute_;
};

}  // namespace eldr
