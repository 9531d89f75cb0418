// The /placement group of calibration.h5 (DESIGN.md §5): expert placements for the decoder clusters of the
// calibration, written by `eldr place calib`, read by `eldr place evaluate` and by the expert-parallel decode
// groups of `eldr serve` (decode.placement). This file is its one writer, its one reader and its one fallback
// rule.
//
// Layout (R EP ranks, P physical slots per layer, L MoE layers, E experts, K clusters of /clusters):
//   /placement                  attributes algorithm (string: deepseek-global, deepseek-hierarchical or eldr),
//                               num_ranks R, num_slots P, num_nodes N, num_groups G, num_clusters K (int64)
//   /placement/cluster_<k>/     k = 0..K-1: the placement of cluster k's load /clusters/expert_load[k]
//       phy2log   int32 [L, P]  logical expert in each physical slot; slots [r·P/R, (r+1)·P/R) on rank r
//       log2phy   int32 [L, E, max_replicas]  slots of each expert, -1 padded
//       logcnt    int32 [L, E]  replicas of each expert (>= 1, summing to P in a layer)
//       attribute balancedness (double): DESIGN.md §3 balancedness of the placement on its own load
//   /placement/global/          the same for the global load Σ_k sizes[k] · /clusters/expert_load[k]
//                               (GlobalExpertLoad: every member request weighs the same)
// phy2log is authoritative: readers rebuild logcnt and log2phy (ascending slots) from it; log2phy and logcnt
// are written for other tools (h5py, an inference engine's EPLB loader), so readers refuse a file where they are
// present and contradict phy2log (log2phy's rows may list an expert's slots in any order), and one whose
// num_clusters differs from its own /clusters (a /placement left from another clustering). Readers require num_ranks,
// num_slots and /placement/global; algorithm, num_nodes, num_groups and num_clusters are optional (files
// written by hand or by earlier versions lack some of them; nodes and groups default to 1).
//
// Fallback rule (the one rule, for every reader): cluster k uses /placement/cluster_<k> when the file has it,
// else /placement/global. A file without /placement has no placement: asking a decoder for one is an error
// naming the command that writes it, never a silent contiguous placement (decode.placement: contiguous says
// that explicitly).
//
// Thread safety: every function is reentrant; nothing is shared between calls.
#pragma once

#include <string>
#include <vector>

#include "placement/placement.h"
#include "runtime/calib/calibration.h"
#include "runtime/common/status.h"

namespace eldr {

// What to place: the EP group's shape and the algorithm (PlacementProblem without the load).
struct PlacementSpec {
  int num_ranks = 0;   // R
  int num_slots = 0;   // P
  int num_nodes = 1;   // N
  int num_groups = 1;  // G
  PlacementAlgorithm algorithm = PlacementAlgorithm::kEldr;
};

// The global load [L, E]: Σ_k sizes[k] · /clusters/expert_load[k].
std::vector<double> GlobalExpertLoad(const Calibration& calib);

// One placement per cluster and the global one, as `eldr place calib` computes and writes them.
struct ClusterPlacements {
  PlacementSpec spec;
  std::vector<Placement> per_cluster;  // [K], from /clusters/expert_load[k]
  Placement global;                    // from GlobalExpertLoad
  std::vector<double> balancedness;    // [K + 1]: cluster k on its own load, then global on the global load
};

// Places every cluster's load and the global load with `spec` (the global load computed once). Errors are
// Place's (InvalidArgument naming the values, ResourceExhausted, a failed hook check). `hooks` (optional) as
// Place's, over the K + 1 placements together: on_layer counts up to (K + 1) * L.
Result<ClusterPlacements> PlaceClusters(const Calibration& calib, const PlacementSpec& spec,
                                        const PlaceHooks* hooks = nullptr);

// Writes `placements` as /placement of a copy of `calib_path` renamed onto `out_path` (which may be
// calib_path: the file is then updated atomically). A /placement already there is replaced. IoError naming
// out_path when it cannot be written.
Status WritePlacements(const ClusterPlacements& placements, const std::string& calib_path, const std::string& out_path);

// What a file's /placement holds for a range of clusters, the fallback rule applied.
struct StoredPlacements {
  bool present = false;   // false: the file has no /placement group (the other fields are empty)
  std::string algorithm;  // as stored, "" when the file does not say
  int num_ranks = 0, num_slots = 0, num_nodes = 1, num_groups = 1;
  Placement global;
  std::vector<Placement> per_cluster;  // [cluster_end − cluster_begin]: cluster cluster_begin + i
  std::vector<int> from_global;        // the clusters of the range without cluster_<k> (they use global)

  // True when the file was written for exactly this spec (R, P, N, G and the algorithm's name).
  bool Matches(const PlacementSpec& spec) const;
};

// Reads /placement of `path` for clusters [cluster_begin, cluster_end), each by the fallback rule. The
// placements must fit L = num_layers MoE layers of E = num_experts experts. present = false (and OK) when
// the file has no /placement. Corrupt, naming the file and the object: a missing or out-of-range num_ranks
// or num_slots, no /placement/global, a phy2log that is not [L, P] or not a placement of E experts on R ranks,
// a logcnt or log2phy that contradicts it, a num_clusters other than the file's /clusters count, a member other than
// global and cluster_k (k below the file's cluster count), a balancedness attribute that is not a number in [0, 1].
// REQUIRES: 0 <= cluster_begin <= cluster_end.
Result<StoredPlacements> ReadPlacements(const std::string& path, int num_layers, int num_experts, int cluster_begin,
                                        int cluster_end);

}  // namespace eldr
