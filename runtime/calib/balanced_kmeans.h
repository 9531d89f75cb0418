// Balanced spherical k-means (DESIGN.md §3): capacity by point count (Hungarian) or by point weight.
//
// Points are unit vectors (signatures); the distance to a centroid μ_k is d = 1 − s·μ_k. Every assignment
// step solves exactly "each point to one cluster, each cluster at most ⌈N/K⌉ points, minimise Σ d" — the
// Hungarian assignment on replicated centroid slots — as a min-cost flow (LEMON's network simplex on the
// transportation graph points → clusters → sink), which reaches the same optimum much faster.
// k-means++ seeding from a fixed seed, `restarts` independent runs, the lowest objective kept.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/common/status.h"

namespace eldr {

// Exact optimum of the capacitated assignment. cost: [n, k] row-major; every cluster takes at most
// `capacity` points. REQUIRES: n <= k * capacity. Returns the cluster of each point ([n]).
// Costs are scaled to integers with a resolution of 1e-9 per point for the flow solver, so the returned
// objective is within n·1e-9 of the real-valued optimum.
std::vector<int32_t> CapacitatedAssignment(const std::vector<double>& cost, int n, int k, int capacity);

// Work-balanced assignment: each point i carries a weight w_i (its decode tokens), each cluster takes at most
// `capacity` weight, minimise Σ_i w_i·cost[i, c(i)]. With weights this is a generalised assignment problem
// (NP-hard), so it is solved as its min-cost-flow relaxation — supply w_i at point i, unit cost cost[i, c] per
// unit of weight, cluster arcs of capacity `capacity` — by LEMON's network simplex, whose optimal basic flow
// splits a point over several clusters only along a forest (at most K − 1 points are split). Each split point
// is then rounded to a child cluster of its tree rooted at a cluster, so every cluster receives at most one
// rounded point beyond the whole points it already held.
// GUARANTEE: every cluster's Σ w ≤ capacity + max_i w_i; relaxed_objective (the relaxation's optimum) is a
// lower bound of the exact problem's optimum. No bound on the rounded objective beyond that.
// cost: [n, k] row-major; weight: [n], each >= 1. REQUIRES: Σ w ≤ k·capacity.
// Costs are scaled to integers with a resolution of 1e-6 per unit of weight.
struct WeightedAssignment {
  std::vector<int32_t> assignment;  // [n]
  double relaxed_objective = 0;     // Σ over arcs of flow · cost of the relaxation
};
WeightedAssignment WeightedCapacitatedAssignment(const std::vector<double>& cost, const std::vector<int64_t>& weight,
                                                 int n, int k, int64_t capacity);

struct BalancedKMeansOptions {
  int num_clusters = 1;  // K
  int restarts = 4;
  int max_iterations = 100;
  uint64_t seed = 0;
  bool balanced = true;   // false: plain spherical k-means (ablation)
  bool progress = false;  // progress bar on a terminal
  // [n], each >= 1, or null: with `balanced`, clusters are balanced by Σ weight (capacity ⌈Σw/K⌉, through
  // WeightedCapacitatedAssignment) instead of by count. Borrowed for the call.
  const std::vector<int64_t>* weights = nullptr;
};

struct BalancedKMeansResult {
  std::vector<float> centroids;     // [K, D], unit norm (zero if a cluster ended empty)
  std::vector<int32_t> assignment;  // [N]
  std::vector<int64_t> sizes;       // [K]
  double objective = 0;             // Σ over points of 1 − s·μ_assigned
  int iterations = 0;               // of the kept restart
  int restart = 0;                  // which restart was kept
};

// points: [n, d], row-major. InvalidArgument if K < 1 or K > n, or a value is not finite.
Result<BalancedKMeansResult> BalancedKMeans(const std::vector<float>& points, int n, int d,
                                            const BalancedKMeansOptions& options);

// Cluster capacity ⌈n/K⌉.
inline int ClusterCapacity(int n, int k) { return (n + k - 1) / k; }

}  // namespace eldr
