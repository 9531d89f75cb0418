// The kEldr placement (placement/placement.h), one layer at a time:
//   1. Replication: every redundant slot goes to the expert with the highest load per replica (ties: fewer
//      replicas, then lower index, so an all-zero layer spreads its redundant slots), capped at R replicas
//      because no rank may hold two replicas of one expert.
//   2. Packing: replicas heaviest first, each onto the lightest rank that has a free slot and does not hold
//      the expert yet (ties: a rank on the expert's home node, then the lower rank). If every rank with a
//      free slot already holds the expert, an item of a full rank that lacks it moves to the free slot.
//   3. Bottleneck swaps: while a swap of an item on the most loaded rank with a lighter item elsewhere
//      lowers that rank's load, take the best one. This fixes the layer's bottleneck M.
//   4. Node awareness: groups get home nodes (heaviest group first onto the lightest node, as DeepSeek's
//      first step), but instead of forcing groups there, swaps move load onto home nodes only while
//      every rank stays <= M. Balance never pays for locality.
//   5. With a previous placement: new ranks are relabelled to the old ranks they overlap most (node to
//      node, then rank to rank, exact assignments), swaps put experts back on ranks that already hold
//      their weights (again <= M), and inside a rank experts keep their old slots.
#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "placement/placement_internal.h"
#include "runtime/common/check.h"

namespace eldr::placement_internal {

namespace {

// Bounds on the local searches; each step strictly improves its objective, the caps only guard time.
constexpr int kBottleneckSwapsPerSlot = 4;
constexpr int kMaxPasses = 8;

class EldrLayerPlacer {
 public:
  explicit EldrLayerPlacer(const PlacementProblem& p)
      : E_(p.num_experts),
        P_(p.num_slots),
        R_(p.num_ranks),
        N_(p.num_nodes),
        G_(p.num_groups),
        spr_(p.num_slots / p.num_ranks),
        rpn_(p.num_ranks / p.num_nodes),
        use_home_(p.num_nodes > 1 && p.num_groups > 1) {
    cnt_.resize(E_);
    per_replica_.resize(E_);
    order_.resize(E_);
    home_.assign(E_, -1);
    slot_.resize(static_cast<size_t>(R_) * spr_);
    fill_.resize(R_);
    rank_load_.resize(R_);
    has_.resize(static_cast<size_t>(R_) * E_);
    group_load_.resize(G_);
    group_order_.resize(G_);
    node_load_.resize(N_);
    node_groups_.resize(N_);
  }

  // Places one layer. load: [E]; previous: the previous phy2log row [P] or null.
  // Writes phy2log [P] and logcnt [E].
  void PlaceLayer(const double* load, const int32_t* previous, int32_t* phy2log, int32_t* logcnt) {
    total_load_ = 0;
    for (int e = 0; e < E_; ++e) total_load_ += load[e];
    eps_ = 1e-12 * total_load_;
    Replicate(load);
    if (use_home_) AssignHomeNodes(load);
    Pack();
    BottleneckSwaps();
    double bottleneck = 0;
    for (int r = 0; r < R_; ++r) bottleneck = std::max(bottleneck, rank_load_[r]);
    const double cap = bottleneck + eps_;
    if (use_home_) HomeSwaps(cap);
    if (previous != nullptr) {
      MatchPrevious(previous);
      StaySwaps(cap);
      KeepSlots(previous);
    }
    std::copy(slot_.begin(), slot_.end(), phy2log);
    std::copy(cnt_.begin(), cnt_.end(), logcnt);
  }

 private:
  int NodeOf(int r) const { return r / rpn_; }
  bool Has(int r, int e) const { return has_[static_cast<size_t>(r) * E_ + e] != 0; }

  void Replicate(const double* load) {
    for (int e = 0; e < E_; ++e) {
      cnt_[e] = 1;
      per_replica_[e] = load[e];
    }
    for (int k = E_; k < P_; ++k) {
      int best = -1;
      for (int e = 0; e < E_; ++e) {
        if (cnt_[e] >= R_) continue;
        if (best < 0 || per_replica_[e] > per_replica_[best] ||
            (per_replica_[e] == per_replica_[best] && cnt_[e] < cnt_[best])) {
          best = e;
        }
      }
      ELDR_CHECK(best >= 0, "no expert can take another replica (P = " << P_ << " > E * R)");
      ++cnt_[best];
      per_replica_[best] = load[best] / cnt_[best];
    }
  }

  void AssignHomeNodes(const double* load) {
    const int group_size = E_ / G_, capacity = (G_ + N_ - 1) / N_;
    for (int g = 0; g < G_; ++g) {
      double s = 0;
      for (int i = 0; i < group_size; ++i) s += load[g * group_size + i];
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
    slot_[static_cast<size_t>(r) * spr_ + k] = e;
    has_[static_cast<size_t>(r) * E_ + e] = 1;
    rank_load_[r] += per_replica_[e];
  }
  void Take(int r, int k) {
    const int e = slot_[static_cast<size_t>(r) * spr_ + k];
    has_[static_cast<size_t>(r) * E_ + e] = 0;
    rank_load_[r] -= per_replica_[e];
  }
  // Exchanges slot i of rank r1 with slot j of rank r2.
  void Swap(int r1, int i, int r2, int j) {
    const int a = slot_[static_cast<size_t>(r1) * spr_ + i], b = slot_[static_cast<size_t>(r2) * spr_ + j];
    Take(r1, i);
    Take(r2, j);
    Put(b, r1, i);
    Put(a, r2, j);
  }

  void Pack() {
    std::iota(order_.begin(), order_.end(), 0);
    std::sort(order_.begin(), order_.end(), [this](int32_t a, int32_t b) {
      return per_replica_[a] > per_replica_[b] || (per_replica_[a] == per_replica_[b] && a < b);
    });
    std::fill(fill_.begin(), fill_.end(), 0);
    std::fill(rank_load_.begin(), rank_load_.end(), 0.0);
    std::fill(has_.begin(), has_.end(), 0);
    for (int e : order_) {
      for (int c = 0; c < cnt_[e]; ++c) {
        int best = -1;
        bool best_home = false;
        for (int r = 0; r < R_; ++r) {
          if (fill_[r] == spr_ || Has(r, e)) continue;
          const bool at_home = home_[e] == NodeOf(r);
          if (best < 0 || rank_load_[r] < rank_load_[best] ||
              (rank_load_[r] == rank_load_[best] && at_home && !best_home)) {
            best = r;
            best_home = at_home;
          }
        }
        if (best >= 0) {
          Put(e, best, fill_[best]++);
        } else {
          Repair(e);
        }
      }
    }
  }

  // Every rank with a free slot holds e already. Some full rank r lacks e (e has < R replicas placed),
  // and r holds an expert x that a free rank q lacks (r holds more distinct experts than q): x moves to
  // q, e takes its slot. The cheapest such exchange is taken.
  void Repair(int e) {
    int best_q = -1, best_r = -1, best_k = -1;
    double best_val = std::numeric_limits<double>::infinity();
    for (int q = 0; q < R_; ++q) {
      if (fill_[q] == spr_) continue;
      for (int r = 0; r < R_; ++r) {
        if (fill_[r] < spr_ || Has(r, e)) continue;
        for (int k = 0; k < spr_; ++k) {
          const int x = slot_[static_cast<size_t>(r) * spr_ + k];
          if (Has(q, x)) continue;
          const double val = std::max(rank_load_[r] - per_replica_[x] + per_replica_[e],
                                      rank_load_[q] + per_replica_[x]);
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
    const int x = slot_[static_cast<size_t>(best_r) * spr_ + best_k];
    Take(best_r, best_k);
    Put(x, best_q, fill_[best_q]++);
    Put(e, best_r, best_k);
  }

  void BottleneckSwaps() {
    const int max_swaps = kBottleneckSwapsPerSlot * P_;
    for (int it = 0; it < max_swaps; ++it) {
      int rmax = 0;
      for (int r = 1; r < R_; ++r) {
        if (rank_load_[r] > rank_load_[rmax]) rmax = r;
      }
      const double lm = rank_load_[rmax];
      double best_val = lm - eps_;
      int bi = -1, bq = -1, bj = -1;
      for (int i = 0; i < spr_; ++i) {
        const int a = slot_[static_cast<size_t>(rmax) * spr_ + i];
        const double wa = per_replica_[a];
        if (wa <= 0) continue;
        for (int q = 0; q < R_; ++q) {
          // A swap leaves q at lq + wa − wb > lq, so q must already be below the best value found.
          if (q == rmax || rank_load_[q] >= best_val || Has(q, a)) continue;
          const double lq = rank_load_[q];
          for (int j = 0; j < spr_; ++j) {
            const int b = slot_[static_cast<size_t>(q) * spr_ + j];
            const double wb = per_replica_[b];
            if (wb >= wa || Has(rmax, b)) continue;
            const double val = std::max(lm - wa + wb, lq + wa - wb);
            if (val < best_val) {
              best_val = val;
              bi = i;
              bq = q;
              bj = j;
            }
          }
        }
      }
      if (bi < 0) break;
      Swap(rmax, bi, bq, bj);
    }
  }

  // Swaps that raise the load served on home nodes, keeping every rank <= cap.
  void HomeSwaps(double cap) {
    for (int pass = 0; pass < kMaxPasses; ++pass) {
      bool changed = false;
      for (int r1 = 0; r1 < R_; ++r1) {
        const int n1 = NodeOf(r1);
        for (int i = 0; i < spr_; ++i) {
          const int a = slot_[static_cast<size_t>(r1) * spr_ + i];
          const int h = home_[a];
          const double wa = per_replica_[a];
          if (h == n1 || wa <= 0) continue;
          double best_gain = eps_;
          int br = -1, bj = -1;
          for (int r2 = h * rpn_; r2 < (h + 1) * rpn_; ++r2) {
            if (Has(r2, a)) continue;
            for (int j = 0; j < spr_; ++j) {
              const int b = slot_[static_cast<size_t>(r2) * spr_ + j];
              const double wb = per_replica_[b];
              if (Has(r1, b) || rank_load_[r1] - wa + wb > cap || rank_load_[r2] + wa - wb > cap) continue;
              const double gain = wa + (home_[b] == n1 ? wb : 0.0) - (home_[b] == h ? wb : 0.0);
              if (gain > best_gain) {
                best_gain = gain;
                br = r2;
                bj = j;
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

  // --- previous placement ---

  void CountPrevious(const int32_t* previous) {
    prev_cnt_.assign(static_cast<size_t>(R_) * E_, 0);
    for (int s = 0; s < P_; ++s) ++prev_cnt_[static_cast<size_t>(s / spr_) * E_ + previous[s]];
  }
  bool Held(int r, int e) const { return prev_cnt_[static_cast<size_t>(r) * E_ + e] > 0; }

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

  void MatchPrevious(const int32_t* previous) {
    CountPrevious(previous);
    rank_map_.resize(R_);
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
    // Relabel: new rank r becomes old rank rank_map_[r].
    tmp_slot_.resize(slot_.size());
    for (int r = 0; r < R_; ++r) {
      std::copy_n(slot_.begin() + static_cast<size_t>(r) * spr_, spr_,
                  tmp_slot_.begin() + static_cast<size_t>(rank_map_[r]) * spr_);
    }
    slot_.swap(tmp_slot_);
    std::fill(has_.begin(), has_.end(), 0);
    std::fill(rank_load_.begin(), rank_load_.end(), 0.0);
    for (int r = 0; r < R_; ++r) {
      for (int k = 0; k < spr_; ++k) Put(slot_[static_cast<size_t>(r) * spr_ + k], r, k);
    }
  }

  // Swaps that put experts back on ranks that already hold their weights, keeping every rank <= cap.
  void StaySwaps(double cap) {
    for (int pass = 0; pass < kMaxPasses; ++pass) {
      bool changed = false;
      for (int r1 = 0; r1 < R_; ++r1) {
        for (int i = 0; i < spr_; ++i) {
          const int a = slot_[static_cast<size_t>(r1) * spr_ + i];
          if (Held(r1, a)) continue;
          const double wa = per_replica_[a];
          int best_gain = 0, br = -1, bj = -1;
          for (int r2 = 0; r2 < R_ && best_gain < 2; ++r2) {
            if (r2 == r1 || !Held(r2, a) || Has(r2, a)) continue;
            for (int j = 0; j < spr_; ++j) {
              const int b = slot_[static_cast<size_t>(r2) * spr_ + j];
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

  const int E_, P_, R_, N_, G_, spr_, rpn_;
  const bool use_home_;
  double total_load_ = 0, eps_ = 0;
  std::vector<int32_t> cnt_;           // [E] replicas
  std::vector<double> per_replica_;    // [E] load / replicas
  std::vector<int32_t> order_;         // [E]
  std::vector<int32_t> home_;          // [E] home node, -1 without groups or nodes
  std::vector<int32_t> slot_;          // [R, P/R] expert in each slot
  std::vector<int32_t> fill_;          // [R] slots used while packing
  std::vector<double> rank_load_;      // [R]
  std::vector<uint8_t> has_;           // [R, E] rank holds the expert
  std::vector<double> group_load_;     // [G]
  std::vector<int32_t> group_order_;   // [G]
  std::vector<double> node_load_;      // [N]
  std::vector<int32_t> node_groups_;   // [N]
  // Previous placement.
  std::vector<int32_t> prev_cnt_;      // [R, E] replicas on each rank before
  std::vector<int64_t> cost_;          // [R/N, R/N]
  std::vector<int64_t> node_cost_;     // [N, N]
  std::vector<int32_t> node_map_;      // [N]
  std::vector<int32_t> node_scratch_;  // [R/N]
  std::vector<int32_t> rank_map_;      // [R] new rank → old rank
  std::vector<int32_t> tmp_slot_;      // [R, P/R]
  std::vector<int32_t> row_;           // [P/R]
  std::vector<int32_t> deferred_;      // [P/R]
  Assignment assignment_, node_assignment_;
};

}  // namespace

Placement PlaceEldr(const PlacementProblem& p, const Placement* previous) {
  const int L = p.num_layers, E = p.num_experts, P = p.num_slots;
  ELDR_CHECK(P / p.num_ranks <= E, "slots per rank " << P / p.num_ranks << " > experts " << E);
  Placement out = NewPlacement(p);
  EldrLayerPlacer placer(p);
  for (int l = 0; l < L; ++l) {
    placer.PlaceLayer(p.load.data() + static_cast<size_t>(l) * E,
                      previous ? previous->phy2log.data() + static_cast<size_t>(l) * P : nullptr,
                      out.phy2log.data() + static_cast<size_t>(l) * P, out.logcnt.data() + static_cast<size_t>(l) * E);
  }
  FinishPlacement(&out, nullptr);
  return out;
}

}  // namespace eldr::placement_internal
