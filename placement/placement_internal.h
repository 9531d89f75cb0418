// Shared by the placement algorithms; not part of the public interface (placement/placement.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "placement/placement.h"
#include "runtime/common/status.h"

namespace eldr::placement_internal {

// Checks that hold for every algorithm: counts >= 1, load [L, E] finite and >= 0, P >= E, P % R == 0,
// R % N == 0, E % G == 0. InvalidArgument naming the values otherwise.
Status ValidateProblem(const PlacementProblem& problem);

// A placement of the problem's shape with phy2log [L, P] and logcnt [L, E] allocated (values unset).
Placement NewPlacement(const PlacementProblem& problem);

// Sets max_replicas and fills log2phy from phy2log and logcnt. replica_rank [L, P] gives each slot's index
// in its expert's log2phy row (eplb.py's phyrank); null lists slots in ascending order.
// REQUIRES: phy2log and logcnt consistent (ELDR_CHECK).
void FinishPlacement(Placement* placement, const std::vector<int32_t>* replica_rank);

// eplb.py rebalance_experts_hierarchical with the given groups and nodes (1 and 1 for the global policy).
// REQUIRES: ValidateProblem passed and num_groups % num_nodes == 0.
Placement PlaceDeepSeek(const PlacementProblem& problem, int num_groups, int num_nodes);

// The kEldr algorithm. REQUIRES: ValidateProblem passed, P / R <= E, `previous` null or of the same shape.
Placement PlaceEldr(const PlacementProblem& problem, const Placement* previous);

// The packs (ranks) that still have room, lightest first: the top is the pack with the lowest load and,
// among equal loads, the lowest index ("the lightest pack that is not full" of balanced packing).
// O(log n) per operation instead of a scan over all packs; storage is kept between uses.
class PackHeap {
 public:
  void Clear() { heap_.clear(); }
  bool empty() const { return heap_.empty(); }
  int Top() const { return heap_.front().second; }
  void Pop() {
    std::pop_heap(heap_.begin(), heap_.end(), Later());
    heap_.pop_back();
  }
  void Push(int pack, double load) {
    heap_.emplace_back(load, pack);
    std::push_heap(heap_.begin(), heap_.end(), Later());
  }

 private:
  struct Later {
    bool operator()(const std::pair<double, int>& a, const std::pair<double, int>& b) const { return a > b; }
  };
  std::vector<std::pair<double, int>> heap_;  // (load, pack), a min-heap
};

// Minimum-cost perfect matching of an n x n integer cost matrix (Hungarian algorithm with potentials,
// O(n^3)). Buffers are kept between calls so that placing many layers does not allocate per layer.
class Assignment {
 public:
  // cost: [n, n] row-major. Writes row -> column into row_to_col [n].
  void Solve(const int64_t* cost, int n, int32_t* row_to_col);

 private:
  std::vector<int64_t> u_, v_, minv_;
  std::vector<int32_t> p_, way_;
  std::vector<char> used_;
};

}  // namespace eldr::placement_internal
