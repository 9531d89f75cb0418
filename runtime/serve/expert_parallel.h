// Expert-parallel (EP) decode groups (DESIGN.md §2): decoder k of a job with decode.ep_size G is the G ranks
// [1 + P + k·G, 1 + P + (k+1)·G) of the job. The first, the leader, is the decode worker proper (continuous
// batching, attention, KV, the only rank rank 0 and the prefill ranks talk to); the other G − 1 are
// expert-only members. Each MoE layer of a decode step goes:
//   1. the leader's gate picks every token's top-k logical experts (as on one rank);
//   2. dispatch: every (token, slot) pair is given a physical replica of its expert through the placement's
//      log2phy (replica choice below), hence an EP rank (slot / (P/G)); the leader broadcasts the layer's
//      header to the group and sends each member its rows (MPI_Ialltoallv on the group's communicator);
//   3. every rank, the leader included, computes SwiGLU of the physical experts it holds over the rows it got
//      (batch-invariant products: kernels::ExpertFfnParams);
//   4. combine: the members return their output rows (MPI_Ialltoallv); the leader puts every row back at its
//      (token, slot) position and accumulates Σ_j weight[t, j] · y[t, j] in slot order j = 0..k−1, exactly as
//      the single-rank path (kernels::MoeExperts → kernels::MoeCombine) does. With the row-wise products of
//      step 3 each row is bit-identical to the one a single-rank decoder computes, so the group's hidden
//      states, logits and greedy tokens equal a single-rank decoder's exactly.
// Members wait for the leader's next layer header or a stop header (polling, no spinning).
//
// Replica choice: the pairs routed to logical expert e at a layer, in ascending pair order (token t, slot j),
// go round-robin over e's replicas: the i-th pair to log2phy[l][e][i mod logcnt[l][e]]. Each replica thus gets
// ⌊n/c⌋ or ⌈n/c⌉ of the expert's n rows (the equal share placement/placement.h assumes), and the choice depends
// only on the step's routing, so every run makes the same one.
//
// Weights: each rank must hold the weights of the physical experts on it. Every rank of the job loads the
// whole model (synthetic weights are generated deterministically from the seed, identically on every rank;
// a safetensors file is memory-mapped, so a member only pages in the experts it computes). Members check
// that every row they get is for one of their own slots.
//
// Per-step rank loads: the leader counts the rows (token·expert activations) each EP rank computes, summed
// over the MoE layers of a step, and the step's balancedness Σ_layers mean-over-ranks ÷ Σ_layers
// max-over-ranks (DESIGN.md §3).
//
// Compute: the rows run on a compute backend (kernels/backend.h: ExpertFfn per slot run, MoeCombine), the CPU
// backend unless one is given. CPU/MPI only: the rows travel through host memory, so the backend must have
// host memory (checked); the NCCL path for GPU builds is not implemented.
//
// Thread safety: one thread per process; the leader's backend is called by its executor's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "placement/placement.h"
#include "runtime/comm/transport.h"
#include "runtime/common/status.h"
#include "runtime/job/job_config.h"
#include "runtime/model/expert_backend.h"
#include "runtime/model/model_config.h"
#include "runtime/model/weights.h"

namespace eldr {

// The placement decoder `decoder` uses (decode.placement, on decode.ep_size ranks, for the model's MoE layers).
// InvalidArgument, one line naming the config or the file: contiguous with E % G != 0; a file without
// /placement, with another rank count ("is for R EP ranks but decode.ep_size is G"), or whose phy2log does not
// fit the model's MoE layers and experts; a missing file.
Result<Placement> LoadDecoderPlacement(const JobConfig& config, const ModelConfig& model, int decoder);

// Where the rows of one MoE layer go.
struct EpDispatchPlan {
  std::vector<int32_t> slot;           // [num_tokens * top_k] physical slot of each (token, slot j) pair
  std::vector<int32_t> order;          // [num_tokens * top_k] pairs sorted by (EP rank, physical slot, pair)
  std::vector<int64_t> rows_per_rank;  // [G] pairs each EP rank computes; rank r's are order[offset[r] ...]
  std::vector<int64_t> offset;         // [G + 1] prefix sums of rows_per_rank
};
// The replica choice above. REQUIRES: topk ids in [0, E), moe_layer in [0, L).
EpDispatchPlan PlanDispatch(const Placement& placement, int moe_layer, const int32_t* topk_ids /* [T, k] */,
                            int num_tokens, int top_k);

// The loads a leader recorded over one decode step.
struct EpStepLoad {
  std::vector<int64_t> rank_load;  // [G] rows computed on each EP rank, Σ over MoE layers
  double sum_mean = 0;             // Σ_layers mean-over-ranks rows
  double sum_max = 0;              // Σ_layers max-over-ranks rows
  double balancedness() const { return sum_max > 0 ? sum_mean / sum_max : 1.0; }
};

// The leader's ExpertBackend.
class EpExpertBackend : public ExpertBackend {
 public:
  // REQUIRES: group.rank() == 0, group.size() == placement.num_ranks, the placement is for the model's MoE
  // layers and experts; compute.host_memory(); weights, placement, group and compute outlive the backend.
  EpExpertBackend(const ModelWeights& weights, const Placement& placement, GroupComm& group,
                  kernels::Backend& compute = kernels::CpuBackend());
  Status RunExperts(const MoeLayerCall& call) override;
  // Ends the members' loops (RunEpMember returns OK). Call once, when the decoder shuts down.
  void StopMembers();
  // The loads since the last call (or construction), and starts a new step.
  EpStepLoad TakeStepLoad();

 private:
  const ModelWeights& w_;
  const Placement& placement_;
  GroupComm& group_;
  kernels::Backend& compute_;
  std::unique_ptr<kernels::Stream> stream_;  // for calls that bring none
  int64_t placement_hash_;                   // members check it against their own placement
  EpStepLoad step_;
};

// A member's loop: computes its rows of every layer the leader dispatches until the leader stops it.
// REQUIRES: group.rank() > 0 and as for EpExpertBackend.
Status RunEpMember(const ModelWeights& weights, const Placement& placement, GroupComm& group,
                   kernels::Backend& compute = kernels::CpuBackend());

}  // namespace eldr
