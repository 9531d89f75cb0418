// `eldr place evaluate`: replays the decode steps of a routing trace's requests through expert placements
// and measures how evenly each step's expert activations spread over the expert-parallel (EP) ranks of the
// decoder that serves them. It compares, for every decoder cluster of a calibration, three placements:
//  - contiguous:  no redundant slots, expert e on rank e / (E/R) (what an EP group does when nothing is placed);
//  - global:      one placement for every decoder, from all clusters' expert load together (EPLB as usual);
//  - per-cluster: cluster k's own placement, from /clusters/expert_load[k] (what eldr's routing makes possible).
//
// Replay, exactly:
//  1. Requests. A request is evaluated when it has prompt tokens (a signature) and decode tokens. With
//     `holdout_only`, requests whose id is among the calibration's members (/calibration/request_ids) are left
//     out: on the trace that was calibrated with `eldr calibrate --holdout F`, the rest are exactly its
//     held-out requests (the calibration set is stored, the held-out set is its complement among the usable
//     requests). Without it every usable request is evaluated (meant for a trace the calibration never saw);
//     the report counts how many of them are calibration members.
//  2. Decoder. Each request goes to the cluster of its nearest centroid: the Router with policy
//     locality_top1 (band width τ = 0, DESIGN.md §3) on the signature of its prompt counts, with no load, so
//     ties go to the smaller distance, then the lower index. eldr's band routing approximates this.
//  3. Decode steps. A decoder batches its requests' decode tokens (rows prompt_len .. num_tokens-1) round-
//     robin, as continuous batching interleaves them: token 0 of every request in trace order, then token 1
//     of those that have one, and so on; this stream is cut into steps of `batch_size` tokens. A final step
//     with fewer tokens is dropped (it is not a full batch) unless it is the cluster's only step.
//  4. Load. At MoE layer ℓ of a step, load(ℓ, e) = number of the step's tokens whose top-k at ℓ holds e; an
//     expert with logcnt replicas gives each replica an equal share (placement/placement.h). The step's
//     balancedness is DESIGN.md §3's Σ_ℓ mean-over-ranks load ÷ Σ_ℓ max-over-ranks load, and its max-rank
//     load is Σ_ℓ max-over-ranks load ÷ L, in activations (token-expert pairs) per layer. A perfectly
//     balanced step has max-rank load batch_size · k / R.
//  5. Statistics, per cluster and over all clusters' steps pooled: mean and p1 (1st percentile, numpy's
//     linear interpolation) of the per-step balancedness, and the mean per-step max-rank load.
//
// Thread safety: every function is reentrant; nothing is shared between calls.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "placement/placement.h"
#include "runtime/calib/calibration.h"
#include "runtime/calib/placement_store.h"
#include "runtime/common/status.h"
#include "runtime/trace/trace.h"

namespace eldr {

// The placements compared. All have the calibration's L and E and the same number of ranks R.
struct ComparedPlacements {
  Placement contiguous;                // P = E, expert e on rank e / (E/R)
  Placement global;                    // every cluster's load together
  std::vector<Placement> per_cluster;  // [K]
  std::string source;                  // where global and per-cluster came from, for the report
};

// Places per-cluster and global (calib/placement_store.h PlaceClusters) with `spec`, and builds the
// contiguous placement for spec.num_ranks. Errors (InvalidArgument from Place, E % R != 0) are prefixed with
// `calib_name`. The stored placements, when they match, come from ReadPlacements (the CLI chooses). `hooks` as
// PlaceClusters' (so a failed check's status, and Place's ResourceExhausted, are errors too).
Result<ComparedPlacements> PlaceForEvaluation(const Calibration& calib, const PlacementSpec& spec,
                                              const std::string& calib_name, const PlaceHooks* hooks = nullptr);

// Step 3 of the replay: the decode steps of one decoder whose requests are `request_indices` (rows of
// trace.requests, batched in this order). Returns the global token rows of each step.
// REQUIRES: batch_size >= 1, every index valid.
std::vector<std::vector<int64_t>> FormDecodeSteps(const Trace& trace, const std::vector<int32_t>& request_indices,
                                                  int batch_size);

struct PlacementReplayOptions {
  int batch_size = 16;        // decode tokens per step (B)
  bool holdout_only = false;  // leave out the calibration's members (step 1)
};

// Per-step statistics of one placement over a set of steps. NaN when there are no steps.
struct StepBalance {
  double mean_balancedness = 0;
  double p1_balancedness = 0;
  double mean_max_rank_load = 0;  // activations per layer on the most loaded rank
};

struct ClusterReplay {
  int cluster = -1;  // -1: every cluster's steps pooled
  int64_t requests = 0;
  int64_t decode_tokens = 0;
  int64_t steps = 0;
  StepBalance contiguous, global, per_cluster;
};

struct PlacementReplayReport {
  std::string trace_name, calib_name, placement_source;
  int num_clusters = 0, num_layers = 0, num_experts = 0, top_k = 0;
  int num_ranks = 0, num_slots = 0, batch_size = 0;
  bool holdout_only = false;
  int64_t num_requests = 0;             // evaluated
  int64_t num_calibration_members = 0;  // of the evaluated requests (0 with holdout_only)
  int64_t num_members_left_out = 0;     // holdout_only: usable requests left out as calibration members
  int64_t num_unusable = 0;             // requests without prompt or without decode tokens
  double balanced_max_rank_load = 0;    // batch_size · k / R
  std::vector<ClusterReplay> clusters;  // [K]
  ClusterReplay overall;

  nlohmann::json ToJson() const;
  std::string ToText() const;  // '#' header lines and a table
};

// Runs steps 1-5. FailedPrecondition when the trace's model shape differs from the calibration's (naming
// both files) or the calibration uses gate_prob signatures and the trace has no weights; InvalidArgument
// for batch_size < 1, placements of another shape, or no request to evaluate (naming the trace); InterruptStatus()
// when a signal arrived (runtime/common/signals.h; polled once per step).
Result<PlacementReplayReport> ReplayPlacements(const Trace& trace, const Calibration& calib,
                                               const ComparedPlacements& placements,
                                               const PlacementReplayOptions& options, const std::string& trace_name,
                                               const std::string& calib_name);

}  // namespace eldr
