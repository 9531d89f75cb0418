// The kEldr placement (placement/placement.h), one layer at a time. Balance comes first: every later step
// keeps each rank at or below the bottleneck M that steps 1-3 reach.
//   1. Replication: every redundant slot goes to the expert with the highest load per replica (ties: fewer
//      replicas, then lower id, so an all-zero layer spreads its redundant slots), capped at R replicas
//      because no rank may hold two replicas of one expert.
//   2. Packing by rounds: replicas heaviest first, R at a time; in each round the heaviest replica goes to the
//      lightest rank, the next to the next lightest, skipping a rank that holds the expert already (one that lacks
//      it is always left: an expert spans at most two rounds). Then two pairwise balancing passes: the i-th
//      heaviest rank and the i-th lightest take the exchange of two replicas that brings them closest to each
//      other (no rank rises above the maximum).
//   3. Bottleneck search: while a move lowers the most loaded rank and leaves every rank it touches below that
//      load, take the best one. Moves: swap two replicas between ranks; or give the slot of one replica of a
//      multi-replica expert to another expert (re-replication; a round is skipped where ReplicationMayImprove,
//      placement_internal.h, proves that none exists). Where the result stays more than 2 % above its lower
//      bound (the average rank load or the largest share), one more balancing pass and search, then a packing of
//      one replica at a time (each onto the lightest rank with room that lacks it) as another start. A further
//      start (see TryFromDuplicatePacking) learns from eplb.py's packing where that packing would have
//      duplicated an expert on a rank. The best start is kept (the first on ties); its bottleneck is M.
//   4. Node awareness, never at the cost of M: groups get home nodes (heaviest group first onto the
//      lightest node, as DeepSeek's first step); rank contents are moved to the nodes where they serve the
//      most load at home (ranks are interchangeable for balance), then swaps bring pairs of replicas home
//      while every rank stays <= M. Groups are not forced onto nodes.
//   5. With a previous placement, against the cap C = (1 + move_slack)·M: if the previous placement with its own
//      replica counts already keeps every rank <= C under the new load (every expert placed, none twice on a
//      rank), keep it (PreviousMeetsCap: zero moves). Otherwise start again from the previous ranks, keeping
//      every replica the new counts still want, place the rest heaviest first and repair the bottleneck down to
//      C preferring moves that copy fewer weights (balancing passes that copy no more weights, then the search).
//      If that cannot reach C, the same again from the previous ranks with balancing passes that ignore the
//      copies; if that cannot either, take the placement of steps 1-4 with its ranks relabelled to the old
//      ranks they overlap most (node to node, then rank to rank, exact assignments). Then swaps put experts
//      back on ranks that already hold their weights (<= C), and inside a rank experts keep their old slots.
// All scratch lives in one EldrLayerPlacer per thread; nothing is allocated per layer.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>

#include "placement/placement_internal.h"
#include "runtime/common/check.h"
#include "runtime/common/parallel.h"

namespace eldr::placement_internal {

namespace {

// Bounds on the local searches; each step strictly improves its objective, the caps only guard time.
constexpr int kSwapsPerSlot = 4;
constexpr int kMaxReplicationMoves = 32;
constexpr int kMaxPasses = 8;
constexpr int kPairSweeps = 2;
constexpr int kStayAwareRanks = 4;  // ranks searched for a cheaper swap when re-planning
constexpr int kStayAwareReplicationMoves = 4;
constexpr double kSecondStartGap = 1e-2;  // second start only above (1 + gap) x the average rank load
constexpr double kFallbackGap = 2e-2;     // packing lightest rank first only above (1 + gap) x the lower bound
constexpr double kSweepAgainGap = 2e-2;   // another pairwise pass and search above (1 + gap) x the lower bound
constexpr double kNoTarget = -1.0;        // bottleneck search runs until no move improves

// (load, rank), ordered by KeyIndexLess. A plain struct, unlike std::pair (whose assignment is user-provided),
// so that moving blocks of them in the sorted rank lists is a memmove.
struct LoadRank {
  double first;
  int32_t second;
};

class EldrLayerPlacer {
 public:
  // `hooks` (not null): polled inside the bottleneck search, where a large layer spends its time, so that a stop
  // takes effect within a layer; the layer is then left unfinished (Place returns the hook's status).
  EldrLayerPlacer(const PlacementProblem& p, LayerHooks* hooks)
      : hooks_(hooks),
        E_(p.num_experts),
        P_(p.num_slots),
        R_(p.num_ranks),
        N_(p.num_nodes),
        G_(p.num_groups),
        spr_(p.num_slots / p.num_ranks),
        rpn_(p.num_ranks / p.num_nodes),
        use_home_(p.num_nodes > 1 && p.num_groups > 1),
        move_slack_(p.move_slack) {
    cnt_.resize(E_);
    greedy_cnt_.resize(E_);
    best_cnt_.resize(E_);
    per_replica_.resize(E_);
    order_.resize(E_);
    home_.assign(E_, -1);
    slot_.resize(static_cast<size_t>(R_) * spr_);
    fill_.resize(R_);
    by_load_.resize(R_);
    rank_key_.resize(R_);
    open_key_.resize(R_);
    aside_.resize(R_);
    rank_load_.resize(R_);
    has_.resize(static_cast<size_t>(R_) * E_);
    ranks_of_.resize(static_cast<size_t>(E_) * R_);
    ranks_fill_.resize(E_);
    multi_.resize(E_);
    share_plus_.resize(E_);
    share_minus_.resize(E_);
    kept_.resize(E_);
    group_load_.resize(G_);
    group_order_.resize(G_);
    node_load_.resize(N_);
    node_groups_.resize(N_);
    home_load_.resize(static_cast<size_t>(R_) * N_);
    buckets_.resize(P_);
    bucket_start_.resize(static_cast<size_t>(N_) * N_ + 1);
    bucket_size_.resize(static_cast<size_t>(N_) * N_);
    rank_map_.resize(R_);
    tmp_slot_.resize(static_cast<size_t>(R_) * spr_);
    swap_wq_.resize(spr_);
    candidates_.resize(spr_);
    bucket_w_.resize(P_);
    bucket_r_.resize(P_);
    bucket_e_.resize(P_);
    swap_jq_.resize(spr_);
    swap_ia_.resize(spr_);
    swap_a_.resize(spr_);
    swap_wa_.resize(spr_ + 1);
    slot_w_.resize(static_cast<size_t>(R_) * SlotWidth());
    items_.resize(P_ + 1);
    taken_.resize(R_);
  }

  // Places one layer. load: [E]; previous: the previous phy2log row [P] or null.
  // Writes phy2log [P] and logcnt [E].
  void PlaceLayer(const double* load, const int32_t* previous, int32_t* phy2log, int32_t* logcnt) {
    load_ = load;
    stay_aware_ = false;
    double total = 0;
    for (int e = 0; e < E_; ++e) total += load[e];
    eps_ = 1e-12 * total;
    average_load_ = total / R_;
    Replicate();
    if (use_home_) AssignHomeNodes();
    std::copy(cnt_.begin(), cnt_.end(), greedy_cnt_.begin());
    Pack();
    PairSweeps(kPairSweeps);
    Improve(kNoTarget);
    if (AboveBound(kSweepAgainGap)) {
      PairSweeps(1);
      Improve(kNoTarget);
    }
    // A stop (the hooks' check failed) leaves the layer here, unfinished: PlaceEldr never marks it placed.
    if (hooks_->stopped()) return;
    TryLightestFirstPacking();
    TryFromDuplicatePacking();
    if (hooks_->stopped()) return;
    const double cap = MaxLoad() + eps_;
    if (use_home_) {
      RelabelRanksToHomeNodes();
      HomeSwaps(cap);
    }
    // Relative to the fresh placement's final bottleneck: the home-node swaps may have lowered it below `cap`.
    const double previous_cap = MaxLoad() * (1 + move_slack_) + eps_;
    if (previous != nullptr) {
      CountPrevious(previous);
      if (PreviousMeetsCap(previous, previous_cap)) {
        // Nothing to move: the placement in service already balances the new load within the cap.
        std::copy(previous, previous + P_, phy2log);
        for (int e = 0; e < E_; ++e) logcnt[e] = prev_total_[e];
        return;
      }
      fresh_slot_ = slot_;
      fresh_cnt_ = cnt_;
      stay_aware_ = true;
      StartFromPrevious(previous);
      PairSweeps(kPairSweeps);  // only exchanges that copy no more weights
      bool reached = Improve(previous_cap);
      if (hooks_->stopped()) return;
      if (!reached) {
        // Stuck above the cap: the search for balance alone from here, which still keeps most replicas where
        // they were (the fresh placement relabelled keeps fewer).
        StartFromPrevious(previous);
        stay_aware_ = false;
        PairSweeps(kPairSweeps);
        stay_aware_ = true;
        reached = Improve(previous_cap);
        if (hooks_->stopped()) return;
      }
      if (!reached) {
        slot_ = fresh_slot_;
        cnt_ = fresh_cnt_;
        Rebuild();
        MatchPrevious();
      }
      StaySwaps(previous_cap);
      KeepSlots(previous);
    }
    std::copy(slot_.begin(), slot_.end(), phy2log);
    std::copy(cnt_.begin(), cnt_.end(), logcnt);
  }

 private:
  int NodeOf(int r) const { return r / rpn_; }
  bool Has(int r, int e) const { return has_[static_cast<size_t>(e) * R_ + r] != 0; }
  int32_t& At(int r, int k) { return slot_[static_cast<size_t>(r) * spr_ + k]; }
  double MaxLoad() const { return MaxOf(rank_load_.data(), R_); }
  int ArgMaxLoad() const {
    return static_cast<int>(std::max_element(rank_load_.begin(), rank_load_.end()) - rank_load_.begin());
  }
  // Weights copied if e sits on rank r: 0 if r held e before (only meaningful with a previous placement).
  int Cost(int r, int e) const { return stay_aware_ && Held(r, e) ? 0 : 1; }

  // Greedy replication: each step takes the expert below R replicas with the largest load per replica (ties:
  // fewer replicas, then lower id). The experts are kept in that order in order_ (one sort of the loads,
  // then each step moves the chosen expert down to its new place, the experts it passes up by one), which
  // leaves order_ as the heaviest-first order of the replicas that the packing needs.
  void Replicate() {
    for (int e = 0; e < E_; ++e) {
      cnt_[e] = 1;
      per_replica_[e] = load_[e];
    }
    SortByPerReplicaLoad();
    auto ahead = [this](int a, int b) {
      if (per_replica_[a] != per_replica_[b]) return per_replica_[a] > per_replica_[b];
      if (cnt_[a] != cnt_[b]) return cnt_[a] < cnt_[b];
      return a < b;
    };
    int32_t* order = order_.data();
    for (int k = E_; k < P_; ++k) {
      int i = 0;
      while (i < E_ && cnt_[order[i]] >= R_) ++i;
      ELDR_CHECK(i < E_, "no expert can take another replica (P = " << P_ << " > E * R)");
      const int best = order[i];
      ++cnt_[best];
      per_replica_[best] = load_[best] / cnt_[best];
      int j = i;  // the experts now ahead of `best` move up one place
      for (; j + 1 < E_ && ahead(order[j + 1], best); ++j) order[j] = order[j + 1];
      order[j] = best;
    }
  }

  void AssignHomeNodes() {
    const int group_size = E_ / G_, capacity = (G_ + N_ - 1) / N_;
    for (int g = 0; g < G_; ++g) {
      double s = 0;
      for (int i = 0; i < group_size; ++i) s += load_[g * group_size + i];
      group_load_[g] = s;
    }
    std::iota(group_order_.begin(), group_order_.end(), 0);
    std::sort(group_order_.begin(), group_order_.end(), [this](int32_t a, int32_t b) {
      return group_load_[a] > group_load_[b] || (group_load_[a] == group_load_[b] && a < b);
    });
    std::fill(node_load_.begin(), node_load_.end(), 0.0);
    std::fill(node_groups_.begin(), node_groups_.end(), 0);
    for (int g : group_order_) {
      int best = -1;
      for (int n = 0; n < N_; ++n) {
        if (node_groups_[n] < capacity && (best < 0 || node_load_[n] < node_load_[best])) best = n;
      }
      node_load_[best] += group_load_[g];
      ++node_groups_[best];
      for (int i = 0; i < group_size; ++i) home_[g * group_size + i] = best;
    }
  }

  void Put(int e, int r, int k) {
    At(r, k) = e;
    has_[static_cast<size_t>(e) * R_ + r] = 1;
    rank_load_[r] += per_replica_[e];
  }
  void Take(int r, int k) {
    const int e = At(r, k);
    has_[static_cast<size_t>(e) * R_ + r] = 0;
    rank_load_[r] -= per_replica_[e];
  }
  // Exchanges slot i of rank r1 with slot j of rank r2.
  void Swap(int r1, int i, int r2, int j) {
    const int a = At(r1, i), b = At(r2, j);
    Take(r1, i);
    Take(r2, j);
    Put(b, r1, i);
    Put(a, r2, j);
  }
  // Recomputes has_, rank_load_ and per_replica_ from slot_ and cnt_ (all ranks full).
  void Rebuild() {
    for (int e = 0; e < E_; ++e) per_replica_[e] = load_[e] / cnt_[e];
    RebuildRanks();
  }
  // The same when the counts (and so per_replica_) did not change, only the slots.
  void RebuildRanks() {
    std::memset(has_.data(), 0, has_.size());  // std::fill with an int 0 would loop byte by byte
    std::fill(rank_load_.begin(), rank_load_.end(), 0.0);
    for (int r = 0; r < R_; ++r) {
      fill_[r] = spr_;
      for (int k = 0; k < spr_; ++k) Put(At(r, k), r, k);
    }
  }

  // order_ = experts by descending load per replica, ascending id on ties.
  void SortByPerReplicaLoad() {
    SortIndicesByDescendingMagnitude(per_replica_.data(), E_, order_.data(), &magnitude_sort_);
  }

  void ClearRanks() {
    std::fill(fill_.begin(), fill_.end(), 0);
    std::fill(rank_load_.begin(), rank_load_.end(), 0.0);
    std::memset(has_.data(), 0, has_.size());  // std::fill with an int 0 would loop byte by byte
  }

  // The ranks with room while packing: open_key_ [R] holds a rank's load as an integer of the same order
  // (OrderedBits) if it has a free slot and is not set aside, else kClosed. Taking a replica writes one entry;
  // the lightest rank is two branch-free reductions over R entries (the minimum, then its lowest rank), which
  // vectorize, instead of moving the rank in a sorted list (O(R) moves) or up a tree (a dependent load per
  // level).
  static constexpr int64_t kClosed = std::numeric_limits<int64_t>::max();
  // A signed integer with the order of the double (== for equal doubles, -0.0 included). REQUIRES: not NaN.
  static int64_t OrderedBits(double x) {
    int64_t i = 0;
    if (x != 0) std::memcpy(&i, &x, sizeof i);
    return i ^ ((i >> 63) & std::numeric_limits<int64_t>::max());
  }
  int64_t OpenKey(int r) const { return fill_[r] < spr_ ? OrderedBits(rank_load_[r]) : kClosed; }
  // Every rank with a free slot takes part, after the slots were filled some way.
  void BuildOpenRanks() {
    for (int r = 0; r < R_; ++r) open_key_[r] = OpenKey(r);
  }
  void SetOpenKey(int r, int64_t key) { open_key_[r] = key; }
  // The lightest rank with room (lower rank on ties), or -1: the minimum key by a branch-free pass over the
  // ranks, four at a time with two independent accumulators (GCC/Clang vector extensions; plain code on any
  // target), then the first rank holding it. Shorter dependency chains than carrying (key, rank) pairs through
  // every step (the previous form): about 15 % less time here, by perf.
  int LightestOpen() const {
    typedef int64_t V4 __attribute__((vector_size(32)));
    const int64_t* key = open_key_.data();
    V4 m0 = {kClosed, kClosed, kClosed, kClosed}, m1 = m0;
    int r = 0;
    for (; r + 8 <= R_; r += 8) {
      V4 k0, k1;
      std::memcpy(&k0, key + r, sizeof k0);
      std::memcpy(&k1, key + r + 4, sizeof k1);
      m0 = k0 < m0 ? k0 : m0;
      m1 = k1 < m1 ? k1 : m1;
    }
    m0 = m1 < m0 ? m1 : m0;
    int64_t m = std::min(std::min(m0[0], m0[1]), std::min(m0[2], m0[3]));
    for (; r < R_; ++r) m = std::min(m, key[r]);
    if (m == kClosed) return -1;
    int best = 0;
    while (key[best] != m) ++best;
    return best;
  }

  // `copies` replicas of e, each onto the lightest rank with a free slot that lacks e; ties: the lower rank.
  // The ranks with room that hold e (`holds`: whether any might, else none does) are set aside while e is
  // placed. REQUIRES: the open ranks current (BuildOpenRanks).
  void PlaceCopies(int e, int copies, bool holds) {
    int num_aside = 0;
    if (holds) {
      for (int r = 0; r < R_; ++r) {
        if (fill_[r] < spr_ && Has(r, e)) {
          aside_[num_aside++] = r;
          SetOpenKey(r, kClosed);
        }
      }
    }
    for (int c = 0; c < copies; ++c) {
      const int r = LightestOpen();
      // Is the lightest rank with room (set-aside ranks included) one that holds e?
      for (int k = 0; k < num_aside && !skipped_; ++k) {
        const int x = aside_[k];
        if (fill_[x] < spr_ && (r < 0 || KeyIndexLess()(LoadRank{rank_load_[x], x}, LoadRank{rank_load_[r], r}))) {
          skipped_ = true;
        }
      }
      if (r >= 0) {
        Put(e, r, fill_[r]++);
        aside_[num_aside++] = r;
        SetOpenKey(r, kClosed);
      } else {
        Repair(e, 0, R_);  // every rank with room holds e
        num_aside = 0;
        for (int q = 0; q < R_; ++q) {
          open_key_[q] = OpenKey(q);
          if (open_key_[q] < kClosed && Has(q, e)) {
            aside_[num_aside++] = q;
            open_key_[q] = kClosed;
          }
        }
      }
    }
    for (int k = 0; k < num_aside; ++k) SetOpenKey(aside_[k], OpenKey(aside_[k]));
  }

  // Step 2, by rounds: the replicas heaviest first, R at a time; round t gives its heaviest replica to the
  // lightest rank, the next to the next lightest, and so on (one rank order per round instead of a search for
  // the lightest rank per replica). A rank that holds the replica's expert already is passed over for the
  // next one. One is always left: an expert's replicas are consecutive in items_ and at most R, so they span
  // at most two rounds, m at the end of one and the rest first in the next, where R - m ranks lack it.
  // REQUIRES: order_ = the experts heaviest replica first (Replicate).
  void Pack() {
    skipped_ = false;
    ClearRanks();
    int n = 0;
    for (int e : order_) {  // two copies written always (items_ has one entry to spare): no branch for most
      const int copies = cnt_[e];
      items_[n] = e;
      items_[n + 1] = e;
      for (int c = 2; c < copies; ++c) items_[n + c] = e;
      n += copies;
    }
    for (int r = 0; r < R_; ++r) Put(items_[r], r, 0);  // round 0: every rank empty, lower rank first
    for (int t = 1; t < spr_; ++t) {
      SortRanksByLoad();
      std::fill(taken_.begin(), taken_.end(), 0);
      const int32_t* round = items_.data() + static_cast<size_t>(t) * R_;
      int first = 0;  // the lightest rank of the round without a replica yet
      for (int k = 0; k < R_; ++k) {
        const int e = round[k];
        while (taken_[first]) ++first;
        int idx = first;
        while (idx < R_ && (taken_[idx] || Has(by_load_[idx].second, e))) ++idx;
        ELDR_CHECK(idx < R_, "no rank left in round " << t << " lacks expert " << e);
        if (idx != first) skipped_ = true;
        taken_[idx] = 1;
        Put(e, by_load_[idx].second, t);
      }
    }
    std::fill(fill_.begin(), fill_.end(), spr_);
  }

  // Step 2 the old way, replica by replica: heaviest first onto the lightest rank with a free slot that lacks
  // the expert (PlaceCopies).
  void PackLightestFirst() {
    SortByPerReplicaLoad();
    ClearRanks();
    BuildOpenRanks();
    for (int e : order_) PlaceCopies(e, cnt_[e], false);  // each expert comes once: no rank holds it yet
  }

  // Whether the bottleneck exceeds (1 + gap) times its lower bound: the average rank load or the largest share.
  bool AboveBound(double gap) const {
    return MaxLoad() > std::max(average_load_, MaxOf(per_replica_.data(), E_)) * (1 + gap);
  }
  // The largest of x [n] (n >= 1, no NaN), eight independent maxima at a time instead of one chain.
  static double MaxOf(const double* x, int n) {
    double m[8];
    for (int lane = 0; lane < 8; ++lane) m[lane] = x[0];
    int i = 0;
    for (; i + 8 <= n; i += 8) {
      for (int lane = 0; lane < 8; ++lane) m[lane] = std::max(m[lane], x[i + lane]);
    }
    for (; i < n; ++i) m[0] = std::max(m[0], x[i]);
    return *std::max_element(m, m + 8);
  }

  // A fallback start for the layers that the packing by rounds leaves far from the lower bound (the average
  // rank load or the largest share): the greedy replicas packed lightest rank first, then the bottleneck
  // search; the better of the two is kept (the first on ties).
  void TryLightestFirstPacking() {
    if (!AboveBound(kFallbackGap)) return;
    const double best_max = MaxLoad();
    std::copy(cnt_.begin(), cnt_.end(), best_cnt_.begin());
    best_slot_ = slot_;
    std::copy(greedy_cnt_.begin(), greedy_cnt_.end(), cnt_.begin());
    for (int e = 0; e < E_; ++e) per_replica_[e] = load_[e] / cnt_[e];
    const bool skipped = skipped_;
    PackLightestFirst();
    skipped_ = skipped_ || skipped;
    Improve(kNoTarget);
    if (MaxLoad() < best_max - eps_) return;
    Restore();
  }

  // Among ranks [first, last): every rank with a free slot holds e already. Some full rank r lacks e (e has
  // fewer replicas there than ranks),
  // and r holds an expert x that a free rank q lacks (r holds more distinct experts than q): x moves to
  // q, e takes its slot. The cheapest such exchange is taken.
  void Repair(int e, int first, int last) {
    int best_q = -1, best_r = -1, best_k = -1;
    double best_val = std::numeric_limits<double>::infinity();
    for (int q = first; q < last; ++q) {
      if (fill_[q] == spr_) continue;
      for (int r = first; r < last; ++r) {
        if (fill_[r] < spr_ || Has(r, e)) continue;
        for (int k = 0; k < spr_; ++k) {
          const int x = At(r, k);
          if (Has(q, x)) continue;
          const double val =
              std::max(rank_load_[r] - per_replica_[x] + per_replica_[e], rank_load_[q] + per_replica_[x]);
          if (val < best_val) {
            best_val = val;
            best_q = q;
            best_r = r;
            best_k = k;
          }
        }
      }
    }
    ELDR_CHECK(best_q >= 0, "no exchange places expert " << e << " without a duplicate on a rank");
    const int x = At(best_r, best_k);
    Take(best_r, best_k);
    Put(x, best_q, fill_[best_q]++);
    Put(e, best_r, best_k);
  }

  // Second start for step 3. The public algorithm packs the same greedy replicas heaviest first without
  // the distinct-rank rule; where that puts k copies of an expert on one rank, the rank effectively carries
  // k shares, which no distinct-rank placement with equal shares reproduces, and it sometimes balances
  // better than the first start. Here the copies are merged into one replica and each freed slot goes to
  // the expert whose extra replica leaves the lowest maximum; the bottleneck search then runs from there.
  // The better of the two starts is kept (the first on ties).
  void TryFromDuplicatePacking() {
    // Heaviest first onto the lightest rank with a free slot (duplicates allowed), as eplb.py.
    // Only where a packing passed over a rank because it held the expert (skipped_): a cheap hint that eplb.py's
    // packing meets a duplicate there, no longer a proof (the packing by rounds differs from eplb.py's even
    // without a skip); kept as the filter it was for the earlier packing.
    if (!skipped_) return;
    const double best_max = MaxLoad();
    if (best_max <= average_load_ * (1 + kSecondStartGap)) return;  // within 1% of the lower bound
    std::copy(cnt_.begin(), cnt_.end(), best_cnt_.begin());
    best_slot_ = slot_;
    std::copy(greedy_cnt_.begin(), greedy_cnt_.end(), cnt_.begin());
    for (int e = 0; e < E_; ++e) per_replica_[e] = load_[e] / cnt_[e];
    // order_ still holds the heaviest-first order of the greedy replicas (Replicate, or the fallback packing,
    // sorted it for the greedy counts).
    ClearRanks();
    BuildOpenRanks();
    bool duplicate = false;
    for (int e : order_) {
      const int copies = cnt_[e];
      for (int c = 0; c < copies; ++c) {
        const int best = LightestOpen();
        if (Has(best, e)) {
          duplicate = true;
          --cnt_[e];  // merged: the copy's slot stays free (-1) and its share goes back to the others
          At(best, fill_[best]++) = -1;
          rank_load_[best] += per_replica_[e];  // as eplb.py packs it (the copy's load)
        } else {
          Put(e, best, fill_[best]++);
        }
        SetOpenKey(best, OpenKey(best));
      }
    }
    if (!duplicate) {
      Restore();
      return;
    }
    // Shares changed with the merged counts: recompute the loads, then fill the free slots.
    for (int e = 0; e < E_; ++e) per_replica_[e] = load_[e] / cnt_[e];
    std::fill(rank_load_.begin(), rank_load_.end(), 0.0);
    for (int r = 0; r < R_; ++r) {
      for (int k = 0; k < spr_; ++k) {
        if (At(r, k) >= 0) rank_load_[r] += per_replica_[At(r, k)];
      }
    }
    for (int r = 0; r < R_; ++r) {
      for (int k = 0; k < spr_; ++k) {
        if (At(r, k) < 0) FillFreeSlot(r, k);
      }
    }
    Improve(kNoTarget);
    if (MaxLoad() < best_max - eps_) return;
    Restore();
  }

  void Restore() {
    std::copy(best_cnt_.begin(), best_cnt_.end(), cnt_.begin());
    slot_ = best_slot_;
    Rebuild();
  }

  // Slot k of rank r is free (-1): gives it a new replica of the expert, not on r yet, that leaves the lowest
  // maximum rank load (ties: the larger relief for its other replicas, then the lower id).
  void FillFreeSlot(int r, int k) {
    // The maximum over the other ranks after y sheds `relief` on its ranks: walk the ranks from the most
    // loaded down until one that does not hold y.
    SortRanksByLoad();
    int best = -1;
    double best_max = 0, best_relief = 0;
    for (int y = 0; y < E_; ++y) {
      if (Has(r, y) || cnt_[y] >= R_) continue;
      const double wy_new = load_[y] / (cnt_[y] + 1), relief = per_replica_[y] - wy_new;
      double m = rank_load_[r] + wy_new;
      for (int i = R_ - 1; i >= 0; --i) {
        const int q = by_load_[i].second;
        if (q == r) continue;
        if (!Has(q, y)) {
          m = std::max(m, rank_load_[q]);
          break;
        }
        m = std::max(m, rank_load_[q] - relief);
      }
      if (best < 0 || m < best_max || (m == best_max && relief > best_relief)) {
        best = y;
        best_max = m;
        best_relief = relief;
      }
    }
    ELDR_CHECK(best >= 0, "no expert can fill a free slot of rank " << r);
    // Apply: y gains a replica on r; its other ranks shed the relief.
    const double wy_new = load_[best] / (cnt_[best] + 1), relief = per_replica_[best] - wy_new;
    for (int q = 0; q < R_; ++q) {
      if (Has(q, best)) rank_load_[q] -= relief;
    }
    ++cnt_[best];
    per_replica_[best] = wy_new;
    Put(best, r, k);
  }

  // Pairwise balancing before the bottleneck search: the ranks sorted by load, the i-th heaviest and the i-th
  // lightest exchange the pair of replicas that brings them closest to their mean (both end strictly between
  // their old loads, so no rank rises above the maximum). One pass moves every rank towards the mean, where
  // the bottleneck search moves one rank per step.
  void PairSweeps(int sweeps) {
    for (int sweep = 0; sweep < sweeps; ++sweep) {
      SortRanksByLoad();
      bool changed = false;
      for (int i = 0; i < R_ / 2; ++i) {
        const int h = by_load_[R_ - 1 - i].second, l = by_load_[i].second;
        if (rank_load_[h] - rank_load_[l] <= 2 * eps_) break;  // the gaps shrink with i
        changed |= BalancePair(h, l);
      }
      if (!changed) break;
    }
  }

  // The best exchange between the heavier rank h and the lighter rank l (the lowest max of the two new
  // loads, both below h's load), taken if any; when re-planning, only exchanges that copy no more weights. The
  // P/R x P/R pairs are scored eight replicas of h at a time (one 512-bit vector where the target has them)
  // without branches on the loads; ties go to the lower slot of h, then of l. Returns whether a swap was made.
  bool BalancePair(int h, int l) {
    typedef double V8d __attribute__((vector_size(64)));
    typedef int64_t V8 __attribute__((vector_size(64)));
    constexpr double kInf = std::numeric_limits<double>::infinity();
    const double lh = rank_load_[h], ll = rank_load_[l];
    const double lo = eps_, hi = lh - ll - eps_, start = lh - eps_;
    const int32_t* h_slots = slot_.data() + static_cast<size_t>(h) * spr_;
    const int32_t* l_slots = slot_.data() + static_cast<size_t>(l) * spr_;
    const V8d lh8 = {lh, lh, lh, lh, lh, lh, lh, lh}, ll8 = {ll, ll, ll, ll, ll, ll, ll, ll};
    const V8d lo8 = {lo, lo, lo, lo, lo, lo, lo, lo}, hi8 = {hi, hi, hi, hi, hi, hi, hi, hi};
    double best_val = start;
    int best_k = -1, best_j = -1;
    for (int k0 = 0; k0 < spr_; k0 += 8) {
      V8d wa, best = {start, start, start, start, start, start, start, start};
      V8 open;         // h's replica may go to l: l lacks the expert (padding lanes: never)
      V8 a_cost = {};  // re-planning: copies for the replica of h on l, less those of keeping it on h
      V8 best_j8 = {-1, -1, -1, -1, -1, -1, -1, -1};
      for (int lane = 0; lane < 8; ++lane) {
        const int k = k0 + lane;
        wa[lane] = k < spr_ ? per_replica_[h_slots[k]] : -kInf;
        open[lane] = k < spr_ && !Has(l, h_slots[k]) ? -1 : 0;
        if (stay_aware_ && k < spr_) a_cost[lane] = Cost(l, h_slots[k]) - Cost(h, h_slots[k]);
      }
      for (int j = 0; j < spr_; ++j) {
        const int b = l_slots[j];
        if (Has(h, b)) continue;
        const double wb = per_replica_[b];
        const V8d d = wa - V8d{wb, wb, wb, wb, wb, wb, wb, wb};
        const V8d val = lh8 - d > ll8 + d ? lh8 - d : ll8 + d;
        V8 take = open & (d > lo8) & (d < hi8) & (val < best);
        if (stay_aware_) {
          const int64_t b_cost = Cost(h, b) - Cost(l, b);
          take &=
              a_cost + V8{b_cost, b_cost, b_cost, b_cost, b_cost, b_cost, b_cost, b_cost} <= V8{};  // no more copies
        }
        best = take ? val : best;
        best_j8 = take ? V8{j, j, j, j, j, j, j, j} : best_j8;
      }
      for (int lane = 0; lane < 8; ++lane) {  // the first lane of the lowest value; no branch on the data
        const bool take = (best_j8[lane] >= 0) & (best[lane] < best_val);
        best_val = take ? best[lane] : best_val;
        best_k = take ? k0 + lane : best_k;
        best_j = take ? static_cast<int>(best_j8[lane]) : best_j;
      }
    }
    if (best_k < 0) return false;
    Swap(h, best_k, l, best_j);
    return true;
  }

  // Bottleneck search (step 3) until the most loaded rank is <= target or no move lowers it.
  // Returns whether the maximum is <= target.
  bool Improve(double target) {
    // Repairing a previous placement down to a target gets a smaller budget: if it does not get there
    // quickly, the fresh placement (relabelled) is the fallback.
    int swaps_left = stay_aware_ ? P_ : kSwapsPerSlot * P_;
    const int max_rounds = stay_aware_ ? kStayAwareReplicationMoves : kMaxReplicationMoves;
    constexpr int kSwapsPerPoll = 64;  // a swap of a large layer takes ~1 ms (P = 32768, R = 1024)
    for (int round = 0; round <= max_rounds; ++round) {
      if (!hooks_->Continue()) return false;
      BuildSlotLoads();   // MayImprove reads them; a re-replication changes them
      SortRanksByLoad();  // kept sorted by the swaps: its last entry is the maximum
      while (swaps_left-- > 0 && by_load_.back().first > target && BottleneckSwap()) {
        if (swaps_left % kSwapsPerPoll == 0 && !hooks_->Continue()) return false;
      }
      if (MaxLoad() <= target) return true;
      if (round == max_rounds || !ReplicationMayImprove() || !ReplicationMove()) break;
    }
    return MaxLoad() <= target;
  }

  // slot_w_ row width: P/R rounded up to whole vectors of eight.
  int SlotWidth() const { return (spr_ + 7) / 8 * 8; }
  // slot_w_ = the load of each slot's replica, +inf in the padding (MayImprove's vectors, read whole).
  void BuildSlotLoads() {
    const int width = SlotWidth();
    for (int r = 0; r < R_; ++r) {
      double* w = slot_w_.data() + static_cast<size_t>(r) * width;
      for (int k = 0; k < width; ++k)
        w[k] = k < spr_ ? per_replica_[At(r, k)] : std::numeric_limits<double>::infinity();
    }
  }

  // Whether (cost, val) beats (best_cost, best_val): fewer weight copies first when re-planning from a
  // previous placement, then the lower new maximum.
  bool Better(int cost, double val, int best_cost, double best_val) const {
    if (stay_aware_ && cost != best_cost) return cost < best_cost;
    return val < best_val;
  }

  // Best swap of an item on the most loaded rank with a lighter item elsewhere that leaves both ranks below
  // its load. Returns false if there is none. Without a previous placement the other ranks are tried from
  // the lightest up and the search stops at the first rank that offers an improving swap (the best swap
  // with that rank is taken): most steps then cost O(spr²) instead of O(R·spr²).
  bool BottleneckSwap() {
    const int rmax = by_load_.back().second;
    SwapSearch s;
    s.rmax = rmax;
    s.lm = rank_load_[rmax];
    s.limit = s.lm - eps_;
    s.best_val = s.limit;
    s.a_slot = swap_ia_.data();
    s.a_expert = swap_a_.data();
    s.a_load = swap_wa_.data();
    // The replicas of the most loaded rank that can move (load > 0), read once for all ranks.
    // Sorted by ascending load (insertion sort of P/R entries; equal loads keep slot order), so that the
    // pair scan of each lighter rank can stop at the first replica that would lift that rank too high.
    s.num_a = 0;
    for (int i = 0; i < spr_; ++i) {
      const int a = At(rmax, i);
      const double wa = per_replica_[a];
      if (wa <= 0) continue;
      int k = s.num_a++;
      for (; k > 0 && s.a_load[k - 1] > wa; --k) {
        s.a_slot[k] = s.a_slot[k - 1];
        s.a_expert[k] = s.a_expert[k - 1];
        s.a_load[k] = s.a_load[k - 1];
      }
      s.a_slot[k] = i;
      s.a_expert[k] = a;
      s.a_load[k] = wa;
    }
    s.a_load[s.num_a] = std::numeric_limits<double>::infinity();  // sentinel of MayImprove
    // Ranks from the lightest up. Without a previous placement, stop at the first rank that offers an
    // improving swap; with one, look a little further for a swap that copies fewer weights, and stop at the
    // first that copies none.
    int ranks_with_swaps = 0, bq_index = -1;
    for (int idx = 0; idx < R_; ++idx) {
      const auto& [load, q] = by_load_[idx];
      if (load >= s.limit) break;
      const int before = s.bq;
      if (!MayImprove(q, s) || !SearchSwapsWith(q, s)) continue;
      if (s.bq != before) bq_index = idx;
      if (!stay_aware_ || s.best_cost <= 0 || ++ranks_with_swaps == kStayAwareRanks) break;
    }
    if (s.bi < 0) return false;
    Swap(rmax, s.bi, s.bq, s.bj);
    std::swap(slot_w_[static_cast<size_t>(rmax) * SlotWidth() + s.bi],
              slot_w_[static_cast<size_t>(s.bq) * SlotWidth() + s.bj]);
    Resort(rmax, bq_index);
    return true;
  }

  // by_load_ = (load, rank) ascending; the last entry is the most loaded rank.
  void SortRanksByLoad() { SortRanksByKey(rank_load_.data()); }
  // by_load_ = (key[r], r) for every rank, ascending by KeyIndexLess. key: [R], not NaN. Each rank's place is
  // the number of pairs below its own, counted without branches (R² comparisons, which cost less than the
  // mispredicted ones of a comparison sort of R entries): eight ranks at a time, one lane each, against every
  // key in turn, so the counts end in the lanes with no sum across lanes (one 512-bit operation per
  // comparison where the target has them, two 256-bit ones otherwise). The ranks past the last full eight
  // (R % 8 of them) are counted one at a time.
  void SortRanksByKey(const double* key) {
    typedef double V8d __attribute__((vector_size(64)));
    typedef int64_t V8 __attribute__((vector_size(64)));
    const int full = R_ - R_ % 8;
    for (int r0 = 0; r0 < full; r0 += 8) {
      V8d kr;
      std::memcpy(&kr, key + r0, sizeof kr);
      V8 below = {0, 0, 0, 0, 0, 0, 0, 0};  // -1 per pair below
      // Ranks j < r0 are below rank r on equal keys, ranks j >= r0 + 8 are not; among the eight, j < r.
      for (int j = 0; j < r0; ++j) {
        const double kj = key[j];
        below += V8d{kj, kj, kj, kj, kj, kj, kj, kj} <= kr;
      }
      const V8 r8 = {r0, r0 + 1, r0 + 2, r0 + 3, r0 + 4, r0 + 5, r0 + 6, r0 + 7};
      for (int j = r0; j < r0 + 8; ++j) {
        const double kj = key[j];
        const V8d kj8 = {kj, kj, kj, kj, kj, kj, kj, kj};
        below += (kj8 < kr) | ((kj8 == kr) & (V8{j, j, j, j, j, j, j, j} < r8));
      }
      for (int j = r0 + 8; j < R_; ++j) {
        const double kj = key[j];
        below += V8d{kj, kj, kj, kj, kj, kj, kj, kj} < kr;
      }
      for (int lane = 0; lane < 8; ++lane) by_load_[-below[lane]] = {kr[lane], r0 + lane};
    }
    for (int r = full; r < R_; ++r) {
      const double kr = key[r];
      int64_t pos = 0;
      for (int j = 0; j < R_; ++j) pos += (key[j] < kr) | ((key[j] == kr) & (j < r));
      by_load_[pos] = {kr, r};
    }
  }
  // After a swap between the most loaded rank `rmax` and the rank at entry `i`: moves both entries to their
  // new places (the order is total, so the result does not depend on which moves first).
  void Resort(int rmax, int i) {
    MoveEntry(i);
    i = R_ - 1;  // the maximum's entry, unless the other rank passed it
    while (by_load_[i].second != rmax) --i;
    MoveEntry(i);
  }
  // Moves entry i of by_load_ to the place of its rank's current load.
  void MoveEntry(int i) {
    const int r = by_load_[i].second;
    const LoadRank entry{rank_load_[r], r};
    while (i > 0 && KeyIndexLess()(entry, by_load_[i - 1])) {
      by_load_[i] = by_load_[i - 1];
      --i;
    }
    while (i + 1 < R_ && KeyIndexLess()(by_load_[i + 1], entry)) {
      by_load_[i] = by_load_[i + 1];
      ++i;
    }
    by_load_[i] = entry;
  }

  struct SwapSearch {
    int rmax = -1;
    double lm = 0, limit = 0, best_val = 0;
    int best_cost = std::numeric_limits<int>::max();
    int bi = -1, bq = -1, bj = -1;
    int num_a = 0;  // replicas of rmax with load > 0: slot, expert, load (point into the placer's scratch)
    int *a_slot = nullptr, *a_expert = nullptr;
    double* a_load = nullptr;
  };

  // A necessary condition for SearchSwapsWith(q, s) to find a swap, without branches on the data: some replica
  // b of q, with the lightest replica a of the maximum that is heavier (s.a_load ascending, +inf after the
  // last), keeps q below the limit. SearchSwapsWith tries exactly those a for b, from that one up, and q's new
  // load lq + wa − wb only grows with wa; it also skips pairs for reasons this test ignores, so a true here
  // may still find nothing. Most ranks of a search that ends without a swap fail here.
  bool MayImprove(int q, const SwapSearch& s) const {
    // Eight replicas b at a time (one 512-bit vector where the target has them): the lightest heavier a is the
    // minimum of the a > wb (+inf if none); padding lanes hold wb = +inf, whose test (inf - inf = NaN) fails.
    typedef double V8d __attribute__((vector_size(64)));
    typedef int64_t V8 __attribute__((vector_size(64)));
    constexpr double kInf = std::numeric_limits<double>::infinity();
    const double lq = rank_load_[q];
    const double* q_loads = slot_w_.data() + static_cast<size_t>(q) * SlotWidth();
    V8 may = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j0 = 0; j0 < spr_; j0 += 8) {
      V8d wb;
      std::memcpy(&wb, q_loads + j0, sizeof wb);
      V8d next = {kInf, kInf, kInf, kInf, kInf, kInf, kInf, kInf};
      for (int ia = 0; ia < s.num_a; ++ia) {
        const double a = s.a_load[ia];
        const V8d a8 = {a, a, a, a, a, a, a, a};
        next = (a8 > wb) & (a8 < next) ? a8 : next;
      }
      may |= lq + next - wb < s.limit;
    }
    int64_t any = 0;
    for (int lane = 0; lane < 8; ++lane) any |= may[lane];
    return any != 0;
  }

  // Updates s with the swaps between s.rmax and q; returns whether q offers any improving swap.
  bool SearchSwapsWith(int q, SwapSearch& s) {
    // A swap leaves q at lq + wa − wb > lq, so q must be below the limit (the best value when only the value
    // counts).
    const double lq = rank_load_[q];
    if (lq >= (stay_aware_ ? s.limit : s.best_val)) return false;
    bool any = false;
    const int32_t* q_slots = slot_.data() + static_cast<size_t>(q) * spr_;
    // q's replicas that rmax lacks, with their loads (the same for every replica of rmax).
    double* wq = swap_wq_.data();
    int* jq = swap_jq_.data();
    int num_b = 0;
    for (int j = 0; j < spr_; ++j) {
      const int b = q_slots[j];
      if (Has(s.rmax, b)) continue;
      wq[num_b] = per_replica_[b];
      jq[num_b++] = j;
    }
    // For each replica b of q, the replicas a of the maximum by ascending load: q's new load lq + wa − wb
    // only grows with wa, so the first a that takes q to the limit ends the scan for that b. The scan order
    // differs from slot order, so equal candidates are decided by slot order explicitly (as a scan in slot
    // order, i then j, would keep the first).
    for (int jb = 0; jb < num_b; ++jb) {
      const double wb = wq[jb];
      const int j = jq[jb];
      for (int ia = 0; ia < s.num_a; ++ia) {
        const double wa = s.a_load[ia];
        if (wb >= wa) continue;
        const double q_after = lq + wa - wb;
        if (q_after >= s.limit) break;
        const int a = s.a_expert[ia];
        if (Has(q, a)) continue;
        const double val = std::max(s.lm - wa + wb, q_after);
        if (val >= s.limit) continue;
        any = true;
        const int i = s.a_slot[ia];
        const int cost =
            stay_aware_ ? Cost(q, a) + Cost(s.rmax, q_slots[j]) - Cost(s.rmax, a) - Cost(q, q_slots[j]) : 0;
        const bool tie_first =
            s.bq == q && cost == s.best_cost && val == s.best_val && (i < s.bi || (i == s.bi && j < s.bj));
        if (s.bi < 0 || Better(cost, val, s.best_cost, s.best_val) || tie_first) {
          s.best_val = val;
          s.best_cost = cost;
          s.bi = i;
          s.bq = q;
          s.bj = j;
        }
      }
    }
    return any;
  }

  void BuildRanksOf() {
    std::fill(ranks_fill_.begin(), ranks_fill_.end(), 0);
    for (int r = 0; r < R_; ++r) {
      for (int k = 0; k < spr_; ++k) {
        const int e = At(r, k);
        ranks_of_[static_cast<size_t>(e) * R_ + ranks_fill_[e]++] = r;
      }
    }
  }
  const int32_t* RanksOf(int e) const { return ranks_of_.data() + static_cast<size_t>(e) * R_; }

  // The largest new load among the ranks touched when the replica of x on rank q becomes a replica of y.
  // Stops early once it reaches `stop`. REQUIRES: q holds x, not y; cnt_[x] >= 2; cnt_[y] < R.
  double MaxAfterReplication(int x, int q, int y, double stop) const {
    const double wy_new = share_plus_[y];
    const double dx = share_minus_[x] - per_replica_[x];  // growth on x's other ranks
    const double dy = per_replica_[y] - wy_new;           // relief on y's ranks
    double m = rank_load_[q] - per_replica_[x] + wy_new;
    const int32_t* ry = RanksOf(y);
    for (int k = 0; k < cnt_[y] && m < stop; ++k) {
      const int r = ry[k];
      m = std::max(m, rank_load_[r] - dy + (Has(r, x) ? dx : 0.0));
    }
    const int32_t* rx = RanksOf(x);
    for (int k = 0; k < cnt_[x] && m < stop; ++k) {
      const int r = rx[k];
      if (r != q && !Has(r, y)) m = std::max(m, rank_load_[r] + dx);
    }
    return m;
  }

  bool ReplicationMayImprove() const {
    return placement_internal::ReplicationMayImprove(
        {slot_.data(), cnt_.data(), load_, rank_load_.data(), has_.data(), E_, R_, spr_, eps_});
  }

  // Best re-replication that leaves every touched rank below the maximum: either an expert on the most
  // loaded rank gains a replica, or a replica on that rank makes room for another expert. Returns false if
  // there is none, or when the hooks stop the placement (nothing is changed then).
  bool ReplicationMove() {
    const int rmax = ArgMaxLoad();
    const double lm = rank_load_[rmax], limit = lm - eps_;
    BuildRanksOf();
    for (int e = 0; e < E_; ++e) {
      share_plus_[e] = load_[e] / (cnt_[e] + 1);
      share_minus_[e] = cnt_[e] > 1 ? load_[e] / (cnt_[e] - 1) : 0.0;
    }
    // Experts with several replicas, with the two largest loads among their ranks (for lower bounds).
    int num_multi = 0;
    for (int x = 0; x < E_; ++x) {
      if (cnt_[x] < 2) continue;
      const int32_t* rx = RanksOf(x);
      int top = rx[0];
      double second = -1;
      for (int k = 1; k < cnt_[x]; ++k) {
        if (rank_load_[rx[k]] > rank_load_[top]) {
          second = rank_load_[top];
          top = rx[k];
        } else {
          second = std::max(second, rank_load_[rx[k]]);
        }
      }
      multi_[num_multi++] = {x, top, second, share_minus_[x] - per_replica_[x]};
    }
    double best_val = limit;
    int best_cost = std::numeric_limits<int>::max();
    int bx = -1, bq = -1, by = -1;
    auto stop = [&] { return stay_aware_ ? limit : best_val; };
    auto consider = [&](int x, int q, int y) {
      const double val = MaxAfterReplication(x, q, y, stop());
      if (val >= limit) return;
      const int cost = stay_aware_ ? Cost(q, y) - Cost(q, x) : 0;
      if (bx < 0 || Better(cost, val, best_cost, best_val)) {
        best_val = val;
        best_cost = cost;
        bx = x;
        bq = q;
        by = y;
      }
    };
    // An expert y on the most loaded rank gains a replica, taken from x on rank q. Both searches poll the hooks
    // once per slot of that rank: one search of a large layer can take a second (E = 16384, R = 1024).
    for (int i = 0; i < spr_; ++i) {
      if (!hooks_->Continue()) return false;
      const int y = At(rmax, i);
      if (cnt_[y] >= R_ || load_[y] <= 0) continue;
      const double dy = per_replica_[y] - share_plus_[y];
      for (int m = 0; m < num_multi; ++m) {
        const MultiReplica& mx = multi_[m];
        const int x = mx.x;
        if (x == y) continue;
        const double dx = mx.dx;
        // The bound below is smallest for q = top (other = second): if it fails there it fails for every q
        // (floating-point addition is monotone), and x is skipped without reading its ranks.
        if (mx.second + dx - dy >= stop()) continue;
        const int32_t* rx = RanksOf(x);
        for (int k = 0; k < cnt_[x]; ++k) {
          const int q = rx[k];
          // Lower bound: x's most loaded other rank grows by dx (less dy if it also holds y).
          const double other = q == mx.top ? mx.second : rank_load_[mx.top];
          if (other + dx - dy >= stop() || Has(q, y)) continue;
          consider(x, q, y);
        }
      }
    }
    // A replica x on the most loaded rank makes room for a new replica of y.
    for (int i = 0; i < spr_; ++i) {
      if (!hooks_->Continue()) return false;
      const int x = At(rmax, i);
      if (cnt_[x] < 2) continue;
      const double room = per_replica_[x] - (lm - stop());  // y's new share must stay below this
      // x's most loaded other rank t grows by dx unless it holds y: if that alone reaches the limit, only the
      // experts of t can be y (the same value MaxAfterReplication computes, so nothing else is lost).
      const double dx = share_minus_[x] - per_replica_[x];
      const int32_t* rx = RanksOf(x);
      int t = -1;
      for (int k = 0; k < cnt_[x]; ++k) {
        if (rx[k] != rmax && (t < 0 || rank_load_[rx[k]] > rank_load_[t])) t = rx[k];
      }
      if (rank_load_[t] + dx >= limit) {
        int num_y = 0;
        for (int k = 0; k < spr_; ++k) candidates_[num_y++] = At(t, k);
        std::sort(candidates_.begin(), candidates_.begin() + num_y);  // ascending ids, as the full scan
        for (int k = 0; k < num_y; ++k) {
          const int y = candidates_[k];
          if (cnt_[y] >= R_ || share_plus_[y] >= room || Has(rmax, y)) continue;
          consider(x, rmax, y);
        }
        continue;
      }
      for (int y = 0; y < E_; ++y) {
        if (cnt_[y] >= R_ || share_plus_[y] >= room || Has(rmax, y)) continue;
        consider(x, rmax, y);
      }
    }
    if (bx < 0) return false;
    for (int k = 0; k < spr_; ++k) {
      if (At(bq, k) == bx) {
        At(bq, k) = by;
        break;
      }
    }
    --cnt_[bx];
    ++cnt_[by];
    Rebuild();
    return true;
  }

  // Swaps that bring two replicas home at once: a on node n1 homed at n2 with b on node n2 homed at n1,
  // keeping every rank <= cap and replicas of one expert on distinct ranks. Candidates are bucketed by
  // (node, home node), so a pass costs about P + N² + Σ |bucket|² instead of P * P/N.
  void HomeSwaps(double cap) {
    // A counting sort of the P slots into the N * N buckets, each in ascending slot order. Replicas at home go
    // to the bucket (n, n), which no pair reads: no branch on the data.
    std::fill(bucket_size_.begin(), bucket_size_.end(), 0);
    for (int r = 0; r < R_; ++r) {
      const size_t row = static_cast<size_t>(NodeOf(r)) * N_;
      for (int k = 0; k < spr_; ++k) ++bucket_size_[row + home_[At(r, k)]];
    }
    bucket_start_[0] = 0;
    for (size_t b = 0; b < bucket_size_.size(); ++b) {
      bucket_start_[b + 1] = bucket_start_[b] + bucket_size_[b];
      bucket_size_[b] = 0;
    }
    for (int r = 0; r < R_; ++r) {
      const size_t row = static_cast<size_t>(NodeOf(r)) * N_;
      for (int k = 0; k < spr_; ++k) {
        const size_t b = row + home_[At(r, k)];
        buckets_[bucket_start_[b] + bucket_size_[b]++] = r * spr_ + k;
      }
    }
    for (int n1 = 0; n1 < N_; ++n1) {
      for (int n2 = n1 + 1; n2 < N_; ++n2) {
        const size_t b1 = static_cast<size_t>(n1) * N_ + n2, b2 = static_cast<size_t>(n2) * N_ + n1;
        int32_t* there = buckets_.data() + bucket_start_[b2];  // on n2, homed at n1
        int num_there = bucket_size_[b2];
        // Their loads, which no swap changes, ranks and experts side by side for the scan.
        double* there_w = bucket_w_.data();
        int32_t* there_r = bucket_r_.data();
        int32_t* there_e = bucket_e_.data();
        for (int j = 0; j < num_there; ++j) {
          there_e[j] = slot_[there[j]];
          there_w[j] = per_replica_[there_e[j]];
          there_r[j] = there[j] / spr_;
        }
        const int32_t* here = buckets_.data() + bucket_start_[b1];  // on n1, homed at n2
        const int num_here = bucket_size_[b1];
        for (int i = 0; i < num_here && num_there > 0; ++i) {
          const int pos_a = here[i], r1 = pos_a / spr_;
          const int a = slot_[pos_a];
          const double wa = per_replica_[a], wb_max = cap - rank_load_[r1] + wa;
          const uint8_t* has_a = has_.data() + static_cast<size_t>(a) * R_;
          // The first of the heaviest b that fit (the scan keeps the first strictly heavier one), without
          // branches on the data.
          int best = -1;
          double best_wb = -1;
          for (int j = 0; j < num_there; ++j) {
            const double wb = there_w[j];
            const int r2 = there_r[j];
            const bool fits = (wb <= wb_max) & (rank_load_[r2] + wa - wb <= cap) & !has_a[r2] &
                              !has_[static_cast<size_t>(there_e[j]) * R_ + r1];
            const bool take = fits & (wb > best_wb);
            best = take ? j : best;
            best_wb = take ? wb : best_wb;
          }
          if (best < 0) continue;
          const int pos_b = there[best];
          Swap(r1, pos_a % spr_, there_r[best], pos_b % spr_);
          --num_there;  // both are home now
          there[best] = there[num_there];
          there_w[best] = there_w[num_there];
          there_r[best] = there_r[num_there];
          there_e[best] = there_e[num_there];
        }
      }
    }
  }

  // Ranks are interchangeable for balance, so their contents are moved to the node positions where they
  // serve the most load at home (greedy, each node taking R/N contents). Free: no load changes.
  void RelabelRanksToHomeNodes() {
    // home_load_[r, n] = load the content of rank r serves at home if placed on node n.
    std::fill(home_load_.begin(), home_load_.end(), 0.0);
    for (int r = 0; r < R_; ++r) {
      for (int k = 0; k < spr_; ++k) {
        const int e = At(r, k);
        home_load_[static_cast<size_t>(r) * N_ + home_[e]] += per_replica_[e];
      }
    }
    // Contents with the largest best value choose first; each takes its best node with a free position.
    for (int r = 0; r < R_; ++r) {
      const double* v = home_load_.data() + static_cast<size_t>(r) * N_;
      rank_key_[r] = -*std::max_element(v, v + N_);
    }
    SortRanksByKey(rank_key_.data());
    std::fill(node_groups_.begin(), node_groups_.end(), 0);  // contents given to each node so far
    for (const auto& [neg_best, r] : by_load_) {
      const double* v = home_load_.data() + static_cast<size_t>(r) * N_;
      int best = -1;  // the first node of the largest value with a free position; no branch on the data
      double best_v = 0;
      for (int n = 0; n < N_; ++n) {
        const bool take = (node_groups_[n] < rpn_) & ((best < 0) | (v[n] > best_v));
        best = take ? n : best;
        best_v = take ? v[n] : best_v;
      }
      rank_map_[r] = best * rpn_ + node_groups_[best]++;
    }
    Permute();
  }

  // Moves the content of rank r to rank rank_map_[r].
  void Permute() {
    for (int r = 0; r < R_; ++r) {
      std::copy_n(slot_.begin() + static_cast<size_t>(r) * spr_, spr_,
                  tmp_slot_.begin() + static_cast<size_t>(rank_map_[r]) * spr_);
    }
    slot_.swap(tmp_slot_);
    RebuildRanks();  // a permutation of the ranks: counts unchanged
  }

  // --- previous placement ---

  void CountPrevious(const int32_t* previous) {
    prev_cnt_.assign(static_cast<size_t>(R_) * E_, 0);
    for (int s = 0; s < P_; ++s) ++prev_cnt_[static_cast<size_t>(s / spr_) * E_ + previous[s]];
  }
  bool Held(int r, int e) const { return prev_cnt_[static_cast<size_t>(r) * E_ + e] > 0; }

  // True when the previous placement, with its own replica counts, is a valid eldr placement of this layer (every
  // expert on some rank, none twice on one rank) whose bottleneck under the new load is within `cap`: then it is
  // the answer, with zero moves. Fills prev_total_ [E] with its replica counts. REQUIRES: CountPrevious.
  bool PreviousMeetsCap(const int32_t* previous, double cap) {
    prev_total_.assign(E_, 0);
    for (int r = 0; r < R_; ++r) {
      for (int e = 0; e < E_; ++e) {
        const int32_t c = prev_cnt_[static_cast<size_t>(r) * E_ + e];
        if (c > 1) return false;
        prev_total_[e] += c;
      }
    }
    for (int e = 0; e < E_; ++e) {
      if (prev_total_[e] == 0) return false;
    }
    for (int r = 0; r < R_; ++r) {
      double sum = 0;
      for (int k = 0; k < spr_; ++k) {
        const int e = previous[static_cast<size_t>(r) * spr_ + k];
        sum += load_[e] / prev_total_[e];
      }
      if (sum > cap) return false;
    }
    return true;
  }

  // Best one-to-one matching of the ranks of new node `nn` onto the ranks of old node `on` by the number of
  // experts already in place; ties prefer keeping the rank index. Writes old rank of each new rank of the
  // node into map [rpn] and returns the overlap.
  int64_t MatchRanks(int nn, int on, int32_t* map) {
    const int n = rpn_;
    cost_.resize(static_cast<size_t>(n) * n);
    int64_t* cost = cost_.data();
    for (int a = 0; a < n; ++a) {
      const int r_new = nn * n + a;
      for (int b = 0; b < n; ++b) {
        const int r_old = on * n + b;
        int64_t overlap = 0;
        for (int k = 0; k < spr_; ++k) overlap += Held(r_old, slot_[static_cast<size_t>(r_new) * spr_ + k]);
        cost[a * n + b] = -(overlap * (n + 1) + (r_new == r_old ? 1 : 0));
      }
    }
    assignment_.Solve(cost, n, map);
    int64_t total = 0;
    for (int a = 0; a < n; ++a) total += -cost[a * n + map[a]] / (n + 1);
    for (int a = 0; a < n; ++a) map[a] += on * n;
    return total;
  }

  // Keeps every replica of the previous placement that the new counts still want (the first ones in rank
  // order when an expert lost replicas) and places the others heaviest first.
  void StartFromPrevious(const int32_t* previous) {
    ClearRanks();
    std::fill(kept_.begin(), kept_.end(), 0);
    for (int r = 0; r < R_; ++r) {
      for (int k = 0; k < spr_; ++k) {
        const int e = previous[static_cast<size_t>(r) * spr_ + k];
        if (Has(r, e) || kept_[e] >= cnt_[e]) continue;
        Put(e, r, fill_[r]++);
        ++kept_[e];
      }
    }
    SortByPerReplicaLoad();
    BuildOpenRanks();
    for (int e : order_) {
      if (kept_[e] < cnt_[e]) PlaceCopies(e, cnt_[e] - kept_[e], kept_[e] > 0);
    }
  }

  // Relabels the ranks of the current placement to the previous ranks they overlap most.
  void MatchPrevious() {
    if (N_ == 1) {
      MatchRanks(0, 0, rank_map_.data());
    } else {
      // The value of pairing new node i with old node j is its best rank matching.
      node_cost_.resize(static_cast<size_t>(N_) * N_);
      node_map_.resize(N_);
      std::vector<int32_t>& scratch = node_scratch_;
      scratch.resize(rpn_);
      for (int i = 0; i < N_; ++i) {
        for (int j = 0; j < N_; ++j) {
          const int64_t v = MatchRanks(i, j, scratch.data());
          node_cost_[i * N_ + j] = -(v * (N_ + 1) + (i == j ? 1 : 0));
        }
      }
      node_assignment_.Solve(node_cost_.data(), N_, node_map_.data());
      for (int i = 0; i < N_; ++i) MatchRanks(i, node_map_[i], rank_map_.data() + i * rpn_);
    }
    Permute();  // new rank r becomes old rank rank_map_[r]
  }

  // Swaps that put experts back on ranks that already hold their weights, keeping every rank <= cap.
  void StaySwaps(double cap) {
    for (int pass = 0; pass < kMaxPasses; ++pass) {
      bool changed = false;
      for (int r1 = 0; r1 < R_; ++r1) {
        for (int i = 0; i < spr_; ++i) {
          const int a = At(r1, i);
          if (Held(r1, a)) continue;
          const double wa = per_replica_[a];
          int best_gain = 0, br = -1, bj = -1;
          for (int r2 = 0; r2 < R_ && best_gain < 2; ++r2) {
            if (r2 == r1 || !Held(r2, a) || Has(r2, a)) continue;
            for (int j = 0; j < spr_; ++j) {
              const int b = At(r2, j);
              if (Held(r2, b) || Has(r1, b)) continue;
              const double wb = per_replica_[b];
              if (rank_load_[r1] - wa + wb > cap || rank_load_[r2] + wa - wb > cap) continue;
              const int gain = 1 + (Held(r1, b) ? 1 : 0);
              if (gain > best_gain) {
                best_gain = gain;
                br = r2;
                bj = j;
                if (gain == 2) break;
              }
            }
          }
          if (br >= 0) {
            Swap(r1, i, br, bj);
            changed = true;
          }
        }
      }
      if (!changed) break;
    }
  }

  // Inside each rank, an expert that the rank held before keeps its old slot.
  void KeepSlots(const int32_t* previous) {
    row_.resize(spr_);
    deferred_.resize(spr_);
    for (int r = 0; r < R_; ++r) {
      int32_t* cur = slot_.data() + static_cast<size_t>(r) * spr_;
      const int32_t* old = previous + static_cast<size_t>(r) * spr_;
      std::fill(row_.begin(), row_.end(), -1);
      int num_deferred = 0;
      for (int k = 0; k < spr_; ++k) {
        const int e = cur[k];
        int pos = -1;
        for (int j = 0; j < spr_; ++j) {
          if (old[j] == e && row_[j] < 0) {
            pos = j;
            break;
          }
        }
        if (pos >= 0) {
          row_[pos] = e;
        } else {
          deferred_[num_deferred++] = e;
        }
      }
      int d = 0;
      for (int j = 0; j < spr_; ++j) {
        if (row_[j] < 0) row_[j] = deferred_[d++];
      }
      std::copy(row_.begin(), row_.end(), cur);
    }
  }

  LayerHooks* const hooks_;
  const int E_, P_, R_, N_, G_, spr_, rpn_;
  const bool use_home_;
  const double move_slack_;              // PlacementProblem::move_slack
  const double* load_ = nullptr;         // [E] load of the layer being placed
  double eps_ = 0;                       // comparison tolerance, 1e-12 of the layer's load
  double average_load_ = 0;              // load / R, the lower bound of the bottleneck
  bool skipped_ = false;                 // a packing passed over a lighter rank: it held the expert
  bool stay_aware_ = false;              // moves are priced by the weights they copy (previous given)
  std::vector<int32_t> cnt_;             // [E] replicas
  std::vector<int32_t> greedy_cnt_;      // [E] replicas after step 1
  std::vector<int32_t> best_cnt_;        // [E] replicas of the best start so far
  std::vector<int32_t> best_slot_;       // [R, P/R] placement of the best start so far
  std::vector<double> per_replica_;      // [E] load / replicas
  std::vector<int32_t> order_;           // [E]
  std::vector<int32_t> items_;           // [P + 1] the replicas' experts, heaviest first, while packing
  std::vector<uint8_t> taken_;           // [R] by_load_ entry i took a replica in this round of packing
  MagnitudeSortScratch magnitude_sort_;  // for SortByPerReplicaLoad
  std::vector<int32_t> home_;            // [E] home node, -1 without groups or nodes
  std::vector<int32_t> slot_;            // [R, P/R] expert in each slot
  std::vector<int32_t> fill_;            // [R] slots used while packing
  std::vector<LoadRank> by_load_;        // [R] (load, rank) sorted for the swap search
  std::vector<double> rank_key_;         // [R] keys of the ranks' order when relabelling them
  std::vector<int64_t> open_key_;        // [R] OrderedBits(load) of a rank with room, kClosed if full or aside
  std::vector<int32_t> aside_;           // [R] ranks set aside while one expert is placed
  std::vector<double> rank_load_;        // [R]
  std::vector<uint8_t> has_;             // [E, R] the rank holds the expert
  std::vector<int32_t> ranks_of_;        // [E, R] ranks holding each expert (first cnt_ entries)
  std::vector<int32_t> ranks_fill_;      // [E]
  struct MultiReplica {
    int32_t x, top;  // an expert with >= 2 replicas; its most loaded rank
    double second;   // the load of its second most loaded rank
    double dx;       // growth of its other replicas if it loses one
  };
  std::vector<MultiReplica> multi_;    // [E]
  std::vector<double> share_plus_;     // [E] load / (replicas + 1) during a re-replication search
  std::vector<double> share_minus_;    // [E] load / (replicas - 1), 0 for one replica
  std::vector<double> group_load_;     // [G]
  std::vector<int32_t> group_order_;   // [G]
  std::vector<double> node_load_;      // [N]
  std::vector<int32_t> node_groups_;   // [N]
  std::vector<double> home_load_;      // [R, N] load a rank's content would serve at home on each node
  std::vector<int32_t> buckets_;       // [P] slots (r * P/R + k), bucket (n, h) = those on node n homed at node h
                                       // (unread if h = n), at [bucket_start_[n * N + h], ... + bucket_size_)
  std::vector<int32_t> bucket_start_;  // [N * N + 1]
  std::vector<int32_t> bucket_size_;   // [N, N]
  std::vector<double> bucket_w_;       // [P] loads of one bucket's replicas during HomeSwaps
  std::vector<int32_t> bucket_r_;      // [P] their ranks
  std::vector<int32_t> bucket_e_;      // [P] their experts
  // Previous placement.
  std::vector<int32_t> prev_cnt_;      // [R, E] replicas on each rank before
  std::vector<int32_t> kept_;          // [E] previous replicas kept
  std::vector<int32_t> prev_total_;    // [E] replicas of each expert in the previous placement
  std::vector<int32_t> fresh_slot_;    // [R, P/R] placement of steps 1-4
  std::vector<int32_t> fresh_cnt_;     // [E]
  std::vector<int64_t> cost_;          // [R/N, R/N]
  std::vector<int64_t> node_cost_;     // [N, N]
  std::vector<int32_t> node_map_;      // [N]
  std::vector<int32_t> node_scratch_;  // [R/N]
  std::vector<int32_t> rank_map_;      // [R] new rank → old rank
  std::vector<int32_t> tmp_slot_;      // [R, P/R]
  std::vector<double> swap_wq_;        // [P/R] loads of a lighter rank's replicas in the swap search
  std::vector<int> swap_jq_;           // [P/R] their slots
  std::vector<int> swap_ia_, swap_a_;  // [P/R] slots and experts of the most loaded rank's movable replicas
  std::vector<double> swap_wa_;        // [P/R + 1] their loads, then +inf
  std::vector<double> slot_w_;         // [R, SlotWidth()] loads of the slots' replicas during Improve, +inf padding
  std::vector<int32_t> candidates_;    // [P/R] experts of one rank, in the re-replication search
  std::vector<int32_t> row_;           // [P/R]
  std::vector<int32_t> deferred_;      // [P/R]
  Assignment assignment_, node_assignment_;
};

}  // namespace

bool ReplicationMayImprove(const RankState& st) {
  const int E = st.num_experts, R = st.num_ranks, spr = st.slots_per_rank;
  auto has = [&](int r, int e) { return st.has[static_cast<size_t>(e) * R + r] != 0; };
  auto share = [&](int e, int replicas) { return st.load[e] / replicas; };
  const int rmax = static_cast<int>(std::max_element(st.rank_load, st.rank_load + R) - st.rank_load);
  const double limit = st.rank_load[rmax] - st.eps;
  const double gap = limit - *std::min_element(st.rank_load, st.rank_load + R);
  for (int e = 0; e < E; ++e) {
    if (st.cnt[e] >= 2 && share(e, st.cnt[e] - 1) - share(e, st.cnt[e]) < gap + st.eps) return true;
  }
  // Rank t holds x (>= 2 replicas) and y (< R replicas): the necessary condition for that pair.
  auto passes = [&](int t, int x, int y) {
    if (st.cnt[x] < 2 || st.cnt[y] >= R) return false;
    const double need = st.rank_load[t] + (share(x, st.cnt[x] - 1) - share(x, st.cnt[x])) - limit - st.eps;
    if (share(y, st.cnt[y]) - share(y, st.cnt[y] + 1) <= need) return false;
    int lacking = 0;
    for (int r = 0; r < R; ++r) lacking += has(r, x) && !has(r, y);
    return lacking <= 1;
  };
  // x or y is on the most loaded rank: the pairs of every rank t that holds an expert z of that rank, with z
  // as x or as y (P/R experts times their ranks, instead of every pair of every rank).
  const int32_t* on_max = st.slot + static_cast<size_t>(rmax) * spr;
  for (int i = 0; i < spr; ++i) {
    const int z = on_max[i];
    for (int t = 0; t < R; ++t) {
      if (!has(t, z)) continue;
      const int32_t* on_t = st.slot + static_cast<size_t>(t) * spr;
      for (int j = 0; j < spr; ++j) {
        const int o = on_t[j];
        if (o != z && (passes(t, z, o) || passes(t, o, z))) return true;
      }
    }
  }
  return false;
}

Result<Placement> PlaceEldr(const PlacementProblem& p, const Placement* previous, LayerHooks* hooks) {
  const int L = p.num_layers, E = p.num_experts, P = p.num_slots;
  ELDR_CHECK(P / p.num_ranks <= E, "slots per rank " << P / p.num_ranks << " > experts " << E);
  Placement out = NewPlacement(p);
  // Layers are independent and each thread owns its placer (a placer keeps no state from one layer to the
  // next), so the placement is the same for any number of threads and any order. A layer takes tens of
  // microseconds and a thread about as long to start: a thread per kLayersPerThread layers at most. The threads
  // take the next unplaced layer from one counter: layers differ in cost by up to ~5x (the new start runs on few
  // of them), and a fixed share left one thread waiting for the other (wall 1.10-1.24 ms against 0.87 ms of
  // work each).
  constexpr int kLayersPerThread = 16;
  const int threads = std::max(1, std::min(DefaultThreads(), L / kLayersPerThread));
  std::atomic<int> next_layer{0};
  // placed[l]: layer l's phy2log and logcnt are written (release); max_count: the largest logcnt placed so far.
  std::unique_ptr<std::atomic<uint8_t>[]> placed(new std::atomic<uint8_t>[L]());
  std::atomic<int> max_count{0};
  auto place_share = [&](int) {
    EldrLayerPlacer placer(p, hooks);
    for (int l = next_layer.fetch_add(1, std::memory_order_relaxed); l < L && hooks->Continue();
         l = next_layer.fetch_add(1, std::memory_order_relaxed)) {
      int32_t* logcnt = out.logcnt.data() + static_cast<size_t>(l) * E;
      placer.PlaceLayer(p.load.data() + static_cast<size_t>(l) * E,
                        previous ? previous->phy2log.data() + static_cast<size_t>(l) * P : nullptr,
                        out.phy2log.data() + static_cast<size_t>(l) * P, logcnt);
      if (hooks->stopped()) break;  // the layer may be unfinished: never marked placed
      const int layer_max = *std::max_element(logcnt, logcnt + E);
      int seen = max_count.load(std::memory_order_relaxed);
      while (layer_max > seen && !max_count.compare_exchange_weak(seen, layer_max, std::memory_order_relaxed)) {
      }
      placed[l].store(1, std::memory_order_release);
      hooks->LayerDone();
    }
  };
  // The calling thread places share 0 itself (ParallelFor would start a thread for it and wait): one thread
  // start less per placement. A worker's exception is rethrown here after every thread joined.
  std::vector<std::thread> workers;
  std::exception_ptr first_error;
  std::mutex mu;
  auto keep_error = [&] {
    std::lock_guard<std::mutex> lock(mu);
    if (!first_error) first_error = std::current_exception();
  };
  for (int t = 1; t < threads; ++t) {
    workers.emplace_back([&, t] {
      try {
        place_share(t);
      } catch (...) {
        keep_error();
      }
    });
  }
  // While the workers finish their last layers, the calling thread writes log2phy for the layers already placed,
  // at the largest replica count seen so far; if a later layer raises it, log2phy is written again at the end.
  std::vector<uint8_t> written(L, 0);
  std::vector<int32_t> next(E);
  // The log2phy written early is checked against the memory budget too; when the check fails, the workers finish
  // their layers and the check is made again at the end.
  bool early_log2phy = false;
  try {
    place_share(0);
    early_log2phy = !workers.empty() && !hooks->stopped() &&
                    CheckLog2PhyMemory(L, E, std::max(1, max_count.load(std::memory_order_relaxed))).ok();
    if (early_log2phy) {
      out.max_replicas = std::max(1, max_count.load(std::memory_order_relaxed));
      out.log2phy.assign(static_cast<size_t>(L) * E * out.max_replicas, -1);
      for (int l = 0; l < L; ++l) {
        if (!placed[l].load(std::memory_order_acquire)) continue;
        const int32_t* logcnt = out.logcnt.data() + static_cast<size_t>(l) * E;
        if (*std::max_element(logcnt, logcnt + E) > out.max_replicas) continue;  // placed after the guess
        FillLog2PhyLayer(&out, l, nullptr, next.data());
        written[l] = 1;
      }
    }
  } catch (...) {
    keep_error();
  }
  for (std::thread& w : workers) w.join();
  if (first_error) std::rethrow_exception(first_error);
  ELDR_RETURN_IF_ERROR(hooks->status());
  if (!early_log2phy || MaxReplicas(out) != out.max_replicas) {
    ELDR_RETURN_IF_ERROR(CheckLog2PhyMemory(L, E, MaxReplicas(out)));
    FinishPlacement(&out, nullptr);
  } else {
    for (int l = 0; l < L; ++l) {
      if (!written[l]) FillLog2PhyLayer(&out, l, nullptr, next.data());
    }
  }
  return out;
}

}  // namespace eldr::placement_internal
