// Shared by the placement algorithms; not part of the public interface (placement/placement.h).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
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

// FinishPlacement's parts: the largest logcnt, and one layer's log2phy rows written into a log2phy already sized
// [L, E, max_replicas] and -1 filled (placement->max_replicas set, at least the layer's largest logcnt; ELDR_CHECK
// otherwise). replica_rank_row [P] or null as in FinishPlacement; next: [E] scratch.
int MaxReplicas(const Placement& placement);
void FillLog2PhyLayer(Placement* placement, int layer, const int32_t* replica_rank_row, int32_t* next);

// PlaceHooks (null: none) for the algorithms' threads: the first failed check is kept, and every later
// Continue() is false. Thread-safe.
class LayerHooks {
 public:
  explicit LayerHooks(const PlaceHooks* hooks) : hooks_(hooks) {}
  // Before a layer: false when the placement must stop (a check failed, now or earlier).
  bool Continue();
  // After a layer.
  void LayerDone();
  // Whether a check failed (any thread may ask, at any time).
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }
  // The failed check's status, else OK. Call after the threads stopped.
  Status status() const { return status_; }

 private:
  const PlaceHooks* hooks_;
  std::mutex mu_;
  std::atomic<bool> stopped_{false};
  Status status_;
  int layers_done_ = 0;
};

// CheckMemoryBudget (runtime/common/memory_budget.h) for `bytes` of 64 MiB or more; OK below.
Status CheckPlacementMemory(double bytes, const std::string& what);

// CheckPlacementMemory of log2phy [L, E, max_replicas] (known once the replica counts are).
Status CheckLog2PhyMemory(int num_layers, int num_experts, int max_replicas);

// eplb.py rebalance_experts_hierarchical with the given groups and nodes (1 and 1 for the global policy).
// REQUIRES: ValidateProblem passed and num_groups % num_nodes == 0. Errors: a failed hook check, or
// CheckLog2PhyMemory's.
Result<Placement> PlaceDeepSeek(const PlacementProblem& problem, int num_groups, int num_nodes, LayerHooks* hooks);

// The kEldr algorithm. REQUIRES: ValidateProblem passed, P / R <= E, `previous` null or of the same shape.
// Errors as PlaceDeepSeek's.
Result<Placement> PlaceEldr(const PlacementProblem& problem, const Placement* previous, LayerHooks* hooks);

// One layer of a kEldr placement in progress, as the bottleneck search sees it.
struct RankState {
  const int32_t* slot = nullptr;      // [R, P/R] expert in each slot, no expert twice on a rank
  const int32_t* cnt = nullptr;       // [E] replicas, >= 1
  const double* load = nullptr;       // [E]; a replica of e carries load[e] / cnt[e]
  const double* rank_load = nullptr;  // [R] the loads of the ranks' replicas, summed
  const uint8_t* has = nullptr;       // [E, R] 1 where the rank holds the expert
  int num_experts = 0, num_ranks = 0, slots_per_rank = 0;
  double eps = 0;  // the search's tolerance: a move must end every rank it touches below
                   // max(rank_load) - eps
};

// A necessary condition, in O(E + P/R * (R + P/R * replicas)) (plus O(R) per candidate pair, which are
// rare), for the re-replication search of kEldr to find a move: false proves that no move exists, so the
// search is skipped. A re-replication takes the replica of an expert x (cnt >= 2) on rank q and gives the slot
// to a new replica of y (cnt < R, not on q); it must touch the most loaded rank (x or y on it) and leave every
// rank it touches below the limit. Every other rank t of x grows by dx = load/(cnt-1) - load/cnt of x, less
// dy = load/cnt - load/(cnt+1) of y where t holds y. If dx >= limit - (lightest rank) for every such x, each of
// x's ranks but q must hold y (at most one rank of x lacks y), and a rank t holding both needs
// dy > L_t + dx - limit; if no (x, y, t) passes, no move can. Loose by eps against rounding.
// tests/unit/placement_test.cc checks it against every move, by brute force.
bool ReplicationMayImprove(const RankState& state);

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
    bool operator()(const std::pair<double, int>& a, const std::pair<double, int>& b) const {
      return (a.first > b.first) | ((a.first == b.first) & (a.second > b.second));  // branch-free
    }
  };
  std::vector<std::pair<double, int>> heap_;  // (load, pack), a min-heap
};

// The best of n items under a strict order `better(a, b)` (a beats b), kept in a tournament tree: Build is
// O(n), Update of one item O(log n), Best O(1). Used by the greedy replication, which asks for the expert
// with the most load per replica after every change of one expert. `tree` is caller-owned storage, reused
// across layers.
template <typename Better>
class Tournament {
 public:
  Tournament(Better better, std::vector<int32_t>* tree) : better_(better), tree_(*tree) {}
  void Build(int n) {
    leaves_ = 1;
    while (leaves_ < n) leaves_ *= 2;
    tree_.assign(2 * static_cast<size_t>(leaves_), -1);
    for (int i = 0; i < n; ++i) tree_[leaves_ + i] = i;
    for (int v = leaves_ - 1; v >= 1; --v) tree_[v] = Winner(tree_[2 * v], tree_[2 * v + 1]);
  }
  int Best() const { return tree_[1]; }
  // Call after item i changed.
  void Update(int i) {
    for (int v = (leaves_ + i) / 2; v >= 1; v /= 2) tree_[v] = Winner(tree_[2 * v], tree_[2 * v + 1]);
  }

 private:
  int Winner(int a, int b) const {
    if (a < 0) return b;
    if (b < 0) return a;
    return better_(b, a) ? b : a;
  }
  Better better_;
  std::vector<int32_t>& tree_;  // [2 * leaves] item at each node, -1 for padding
  int leaves_ = 1;
};

// order[0..n) = indices of `key` [n] by descending key, ascending index among equal keys (a stable sort).
// REQUIRES: keys >= 0 and not NaN. From 64 items on, an LSD radix sort on the upper half of the IEEE-754
// bits (monotone for non-negative doubles; bytes all keys share are skipped) and an insertion sort for
// keys that share it: few data-dependent branches, unlike a comparison sort, which mispredicts on most
// comparisons. `scratch` is caller-owned storage.
struct RadixScratch {
  std::vector<uint64_t> keys, keys_tmp;
  std::vector<int32_t> idx_tmp;
};
inline void SortIndicesByDescendingKey(const double* key, int n, int32_t* order, RadixScratch* scratch) {
  if (n < 64) {  // eight radix passes cost more than a short comparison sort
    for (int i = 0; i < n; ++i) order[i] = i;
    std::sort(order, order + n, [key](int32_t a, int32_t b) { return key[a] > key[b] || (key[a] == key[b] && a < b); });
    return;
  }
  std::vector<uint64_t>& k = scratch->keys;
  std::vector<uint64_t>& k2 = scratch->keys_tmp;
  std::vector<int32_t>& i2 = scratch->idx_tmp;
  k.resize(n);
  k2.resize(n);
  i2.resize(n);
  for (int i = 0; i < n; ++i) {
    uint64_t bits = 0;
    if (key[i] > 0) std::memcpy(&bits, &key[i], sizeof bits);
    k[i] = ~bits;  // ascending ~bits = descending key
    order[i] = i;
  }
  uint64_t* src_k = k.data();
  uint64_t* dst_k = k2.data();
  int32_t* src_i = order;
  int32_t* dst_i = i2.data();
  // Radix passes on the upper 32 bits only (sign, exponent and the top 20 mantissa bits) ...
  for (int shift = 32; shift < 64; shift += 8) {
    int count[257] = {};
    for (int i = 0; i < n; ++i) ++count[((src_k[i] >> shift) & 0xff) + 1];
    if (count[((src_k[0] >> shift) & 0xff) + 1] == n) continue;  // every key has this byte
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (int i = 0; i < n; ++i) {
      const int pos = count[(src_k[i] >> shift) & 0xff]++;
      dst_k[pos] = src_k[i];
      dst_i[pos] = src_i[i];
    }
    std::swap(src_k, dst_k);
    std::swap(src_i, dst_i);
  }
  // ... then an insertion sort on the full keys, which only has to reorder runs that share those bits
  // (strictly greater moves, so equal keys keep their index order).
  for (int i = 1; i < n; ++i) {
    const uint64_t key_i = src_k[i];
    if (key_i >= src_k[i - 1]) continue;
    const int32_t idx_i = src_i[i];
    int j = i;
    for (; j > 0 && src_k[j - 1] > key_i; --j) {
      src_k[j] = src_k[j - 1];
      src_i[j] = src_i[j - 1];
    }
    src_k[j] = key_i;
    src_i[j] = idx_i;
  }
  if (src_i != order) std::copy(src_i, src_i + n, order);
}

// order[0..n) = indices of `key` [n] by descending key, ascending index among equal keys (the order of
// SortIndicesByDescendingKey above). REQUIRES: keys >= 0 and not NaN. One counting pass over
// 256 buckets of the key's magnitude (15 octaves below the largest key, 16 steps each; everything smaller
// shares the last bucket), then an insertion sort that only reorders keys sharing a bucket: O(n + 256) plus
// the pairs that share a bucket, O(n²) when every key does (keys within ~6 % of each other, or all below 2^-15
// of the largest). About half the time of SortIndicesByDescendingKey's radix passes on 128 expert loads, whose
// histogram updates wait on each other. `scratch` is caller-owned storage.
struct MagnitudeSortScratch {
  std::vector<uint64_t> bits, sorted;
  std::vector<uint8_t> bucket;
};
inline void SortIndicesByDescendingMagnitude(const double* key, int n, int32_t* order, MagnitudeSortScratch* scratch) {
  scratch->bits.resize(n);
  scratch->sorted.resize(n);
  scratch->bucket.resize(n);
  uint64_t* bits = scratch->bits.data();
  uint64_t* sorted = scratch->sorted.data();
  uint8_t* bucket = scratch->bucket.data();
  uint64_t top = 0;
  for (int i = 0; i < n; ++i) {
    uint64_t b = 0;
    if (key[i] > 0) std::memcpy(&b, &key[i], sizeof b);  // monotone in the key for keys >= 0
    bits[i] = b;
    top = std::max(top, b);
  }
  const int64_t floor_exponent = static_cast<int64_t>(top >> 52) - 15;
  int count[257] = {};
  for (int i = 0; i < n; ++i) {
    const int64_t octave = static_cast<int64_t>(bits[i] >> 52) - floor_exponent;  // 1..15 for the top octaves
    const int64_t magnitude = octave > 0 ? (octave << 4) | static_cast<int64_t>((bits[i] >> 48) & 15) : 0;
    bucket[i] = static_cast<uint8_t>(255 - magnitude);  // heaviest first
    ++count[bucket[i] + 1];
  }
  for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
  for (int i = 0; i < n; ++i) {
    const int pos = count[bucket[i]]++;
    sorted[pos] = bits[i];
    order[pos] = i;
  }
  // Within a bucket the indices ascend; strictly heavier keys move forward, so equal keys keep that order.
  for (int i = 1; i < n; ++i) {
    const uint64_t b = sorted[i];
    if (b <= sorted[i - 1]) continue;
    const int32_t idx = order[i];
    int j = i;
    for (; j > 0 && sorted[j - 1] < b; --j) {
      sorted[j] = sorted[j - 1];
      order[j] = order[j - 1];
    }
    sorted[j] = b;
    order[j] = idx;
  }
}

// Strict weak order on (key, index) pairs: by key, then index. Spelled out because C++20's std::pair
// operator< goes through operator<=> and partial_ordering for double, which is several times slower in the
// packing loops.
struct KeyIndexLess {
  template <typename Pair>
  bool operator()(const Pair& a, const Pair& b) const {
    return (a.first < b.first) | ((a.first == b.first) & (a.second < b.second));  // branch-free
  }
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
