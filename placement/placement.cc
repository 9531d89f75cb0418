// Entry point, validation, metrics and move counting shared by every placement algorithm.
#include "placement/placement.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "placement/placement_internal.h"
#include "runtime/common/check.h"
#include "runtime/common/memory_budget.h"
#include "runtime/common/parallel.h"

namespace eldr {

namespace placement_internal {

namespace {

std::string Str(int64_t v) { return std::to_string(v); }

}  // namespace

Status ValidateProblem(const PlacementProblem& p) {
  if (p.num_layers < 1 || p.num_experts < 1 || p.num_slots < 1 || p.num_ranks < 1 || p.num_nodes < 1 ||
      p.num_groups < 1) {
    return Status::InvalidArgument("placement needs layers L = " + Str(p.num_layers) +
                                   ", experts E = " + Str(p.num_experts) + ", slots P = " + Str(p.num_slots) +
                                   ", ranks R = " + Str(p.num_ranks) + ", nodes N = " + Str(p.num_nodes) +
                                   " and groups G = " + Str(p.num_groups) + " all >= 1");
  }
  const int64_t cells = static_cast<int64_t>(p.num_layers) * p.num_experts;
  if (static_cast<int64_t>(p.load.size()) != cells) {
    return Status::InvalidArgument("load has " + Str(static_cast<int64_t>(p.load.size())) + " values, expected [L = " +
                                   Str(p.num_layers) + ", E = " + Str(p.num_experts) + "] = " + Str(cells));
  }
  for (int64_t i = 0; i < cells; ++i) {
    const double v = p.load[i];
    if (!std::isfinite(v) || v < 0) {
      return Status::InvalidArgument("load of layer " + Str(i / p.num_experts) + ", expert " + Str(i % p.num_experts) +
                                     " is " + std::to_string(v) + "; loads must be finite and >= 0");
    }
  }
  if (p.num_slots < p.num_experts) {
    return Status::InvalidArgument("physical slots P = " + Str(p.num_slots) +
                                   " must be >= logical experts E = " + Str(p.num_experts));
  }
  if (p.num_slots % p.num_ranks != 0) {
    return Status::InvalidArgument("physical slots P = " + Str(p.num_slots) +
                                   " must be a multiple of ranks R = " + Str(p.num_ranks) + " (equal slots per rank)");
  }
  if (p.num_ranks % p.num_nodes != 0) {
    return Status::InvalidArgument("ranks R = " + Str(p.num_ranks) +
                                   " must be a multiple of nodes N = " + Str(p.num_nodes) + " (equal ranks per node)");
  }
  if (p.num_experts % p.num_groups != 0) {
    return Status::InvalidArgument("experts E = " + Str(p.num_experts) +
                                   " must be a multiple of groups G = " + Str(p.num_groups) + " (equal group sizes)");
  }
  return Status::Ok();
}

Placement NewPlacement(const PlacementProblem& p) {
  Placement out;
  out.num_layers = p.num_layers;
  out.num_experts = p.num_experts;
  out.num_slots = p.num_slots;
  out.num_ranks = p.num_ranks;
  out.phy2log.assign(static_cast<size_t>(p.num_layers) * p.num_slots, -1);
  out.logcnt.assign(static_cast<size_t>(p.num_layers) * p.num_experts, 0);
  return out;
}

int MaxReplicas(const Placement& pl) {
  int max_rep = 0;
  for (int32_t c : pl.logcnt) max_rep = std::max<int>(max_rep, c);
  return max_rep;
}

void FillLog2PhyLayer(Placement* pl, int l, const int32_t* replica_rank_row, int32_t* next) {
  const int E = pl->num_experts, P = pl->num_slots, max_rep = pl->max_replicas;
  std::fill(next, next + E, 0);
  const int32_t* row = pl->phy2log.data() + static_cast<size_t>(l) * P;
  const int32_t* cnt = pl->logcnt.data() + static_cast<size_t>(l) * E;
  int32_t* out = pl->log2phy.data() + static_cast<size_t>(l) * E * max_rep;
  for (int s = 0; s < P; ++s) {
    const int e = row[s];
    ELDR_CHECK(e >= 0 && e < E, "slot " << s << " of layer " << l << " holds expert " << e);
    const int k = replica_rank_row ? replica_rank_row[s] : next[e]++;
    ELDR_CHECK(k >= 0 && k < cnt[e] && k < max_rep && out[e * max_rep + k] < 0,
               "replica " << k << " of expert " << e << " in layer " << l << " is inconsistent with logcnt");
    out[e * max_rep + k] = s;
  }
}

void FinishPlacement(Placement* pl, const std::vector<int32_t>* replica_rank) {
  const int L = pl->num_layers, E = pl->num_experts, P = pl->num_slots;
  pl->max_replicas = MaxReplicas(*pl);
  pl->log2phy.assign(static_cast<size_t>(L) * E * pl->max_replicas, -1);
  std::vector<int32_t> next(E);  // ascending mode: replicas of each expert written so far in this layer
  for (int l = 0; l < L; ++l) {
    FillLog2PhyLayer(pl, l, replica_rank ? replica_rank->data() + static_cast<size_t>(l) * P : nullptr, next.data());
  }
}

bool LayerHooks::Continue() {
  if (stopped_.load(std::memory_order_acquire)) return false;
  if (hooks_ == nullptr || !hooks_->check) return true;
  Status s = hooks_->check();
  if (s.ok()) return true;
  std::lock_guard<std::mutex> lock(mu_);
  if (!stopped_.load(std::memory_order_relaxed)) {
    status_ = std::move(s);
    stopped_.store(true, std::memory_order_release);
  }
  return false;
}

void LayerHooks::LayerDone() {
  if (hooks_ == nullptr || !hooks_->on_layer) return;
  std::lock_guard<std::mutex> lock(mu_);
  hooks_->on_layer(++layers_done_);
}

Status CheckPlacementMemory(double bytes, const std::string& what) {
  // Reading the budget (/proc/meminfo) takes about as long as placing a small problem: below the floor, no check.
  constexpr double kFloor = 64.0 * (1 << 20);
  return bytes < kFloor ? Status::Ok() : CheckMemoryBudget(bytes, what);
}

Status CheckLog2PhyMemory(int num_layers, int num_experts, int max_replicas) {
  return CheckPlacementMemory(4.0 * num_layers * num_experts * max_replicas,
                              "the placement's log2phy [L = " + Str(num_layers) + ", E = " + Str(num_experts) +
                                  ", max replicas = " + Str(max_replicas) + "]");
}

void Assignment::Solve(const int64_t* cost, int n, int32_t* row_to_col) {
  // Kuhn–Munkres with potentials, 1-based with a virtual column 0 (rows are matched one at a time along
  // shortest augmenting paths).
  const int64_t inf = std::numeric_limits<int64_t>::max() / 4;
  u_.assign(n + 1, 0);
  v_.assign(n + 1, 0);
  p_.assign(n + 1, 0);
  way_.assign(n + 1, 0);
  minv_.resize(n + 1);
  used_.resize(n + 1);
  for (int i = 1; i <= n; ++i) {
    p_[0] = i;
    int j0 = 0;
    std::fill(minv_.begin(), minv_.end(), inf);
    std::fill(used_.begin(), used_.end(), 0);
    do {
      used_[j0] = 1;
      const int i0 = p_[j0];
      int64_t delta = inf;
      int j1 = 0;
      for (int j = 1; j <= n; ++j) {
        if (used_[j]) continue;
        const int64_t cur = cost[static_cast<size_t>(i0 - 1) * n + (j - 1)] - u_[i0] - v_[j];
        if (cur < minv_[j]) {
          minv_[j] = cur;
          way_[j] = j0;
        }
        if (minv_[j] < delta) {
          delta = minv_[j];
          j1 = j;
        }
      }
      for (int j = 0; j <= n; ++j) {
        if (used_[j]) {
          u_[p_[j]] += delta;
          v_[j] -= delta;
        } else {
          minv_[j] -= delta;
        }
      }
      j0 = j1;
    } while (p_[j0] != 0);
    do {
      const int j1 = way_[j0];
      p_[j0] = p_[j1];
      j0 = j1;
    } while (j0 != 0);
  }
  for (int j = 1; j <= n; ++j) row_to_col[p_[j] - 1] = j - 1;
}

}  // namespace placement_internal

Result<PlacementAlgorithm> ParsePlacementAlgorithm(const std::string& name) {
  if (name == "deepseek-global") return PlacementAlgorithm::kDeepSeekGlobal;
  if (name == "deepseek-hierarchical") return PlacementAlgorithm::kDeepSeekHierarchical;
  if (name == "eldr") return PlacementAlgorithm::kEldr;
  return Status::InvalidArgument("unknown placement algorithm '" + name +
                                 "'; choose deepseek-global, deepseek-hierarchical or eldr");
}

const char* PlacementAlgorithmName(PlacementAlgorithm algorithm) {
  switch (algorithm) {
    case PlacementAlgorithm::kDeepSeekGlobal:
      return "deepseek-global";
    case PlacementAlgorithm::kDeepSeekHierarchical:
      return "deepseek-hierarchical";
    case PlacementAlgorithm::kEldr:
      return "eldr";
  }
  ELDR_CHECK(false, "unknown PlacementAlgorithm " << static_cast<int>(algorithm));
  return "";
}

double PlacementMemoryBytes(const PlacementProblem& p, PlacementAlgorithm algorithm, bool with_previous) {
  const double L = p.num_layers, E = p.num_experts, P = p.num_slots, R = p.num_ranks, N = p.num_nodes;
  const double result = 4.0 * L * (P + E);  // phy2log and logcnt; log2phy: CheckLog2PhyMemory
  if (algorithm != PlacementAlgorithm::kEldr) {
    return result + 4.0 * L * P + 64.0 * (E + P + R + p.num_groups);  // replica_rank [L, P] and the workspace
  }
  // One EldrLayerPlacer per thread (eldr_placement.cc): the [E, R] membership tables (has_ and ranks_of_), about
  // a dozen [P] and [E] arrays, the [R, P/R rounded up to 8] slot loads, the [R, N] home loads and the [N, N]
  // buckets; with a previous placement also its [R, E] counts and the [R/N, R/N] and [N, N] assignment costs.
  const double threads = std::max(1, std::min(DefaultThreads(), p.num_layers / 16));
  const double slot_width = (p.num_slots / p.num_ranks + 7) / 8 * 8;
  double placer = 5.0 * E * R + 128.0 * E + 64.0 * P + 8.0 * R * slot_width + 8.0 * R * N + 8.0 * N * N + 128.0 * R;
  if (with_previous) placer += 4.0 * R * E + 8.0 * (R / N) * (R / N) + 8.0 * N * N;
  return result + 2.0 * L + threads * placer;
}

Result<Placement> Place(const PlacementProblem& problem, PlacementAlgorithm algorithm, const Placement* previous,
                        const PlaceHooks* hooks) {
  using placement_internal::PlaceDeepSeek;
  using placement_internal::PlaceEldr;
  ELDR_RETURN_IF_ERROR(placement_internal::ValidateProblem(problem));
  const PlacementProblem& p = problem;
  ELDR_RETURN_IF_ERROR(placement_internal::CheckPlacementMemory(
      PlacementMemoryBytes(p, algorithm, previous != nullptr),
      std::string(PlacementAlgorithmName(algorithm)) + " placement of L = " + std::to_string(p.num_layers) +
          " layers x E = " + std::to_string(p.num_experts) + " experts into P = " + std::to_string(p.num_slots) +
          " slots on R = " + std::to_string(p.num_ranks) + " ranks"));
  placement_internal::LayerHooks layer_hooks(hooks);
  switch (algorithm) {
    case PlacementAlgorithm::kDeepSeekGlobal:
      return PlaceDeepSeek(p, 1, 1, &layer_hooks);
    case PlacementAlgorithm::kDeepSeekHierarchical:
      if (p.num_groups % p.num_nodes != 0) {
        return Status::InvalidArgument(
            "deepseek-hierarchical packs whole groups onto nodes: groups G = " + std::to_string(p.num_groups) +
            " must be a multiple of nodes N = " + std::to_string(p.num_nodes) + " (use deepseek-global or eldr)");
      }
      return PlaceDeepSeek(p, p.num_groups, p.num_nodes, &layer_hooks);
    case PlacementAlgorithm::kEldr: {
      const int spr = p.num_slots / p.num_ranks;
      if (spr > p.num_experts) {
        return Status::InvalidArgument(
            "eldr keeps replicas of one expert on distinct ranks, so slots per rank P/R = " + std::to_string(spr) +
            " must be <= experts E = " + std::to_string(p.num_experts));
      }
      if (previous != nullptr && (previous->num_layers != p.num_layers || previous->num_experts != p.num_experts ||
                                  previous->num_slots != p.num_slots || previous->num_ranks != p.num_ranks ||
                                  previous->phy2log.size() != static_cast<size_t>(p.num_layers) * p.num_slots)) {
        return Status::InvalidArgument(
            "previous placement is [L = " + std::to_string(previous->num_layers) +
            ", E = " + std::to_string(previous->num_experts) + ", P = " + std::to_string(previous->num_slots) +
            ", R = " + std::to_string(previous->num_ranks) + "], the problem is [L = " + std::to_string(p.num_layers) +
            ", E = " + std::to_string(p.num_experts) + ", P = " + std::to_string(p.num_slots) +
            ", R = " + std::to_string(p.num_ranks) + "]");
      }
      if (!std::isfinite(p.move_slack) || p.move_slack < 0) {
        return Status::InvalidArgument("move slack " + std::to_string(p.move_slack) + " must be finite and >= 0");
      }
      if (previous != nullptr) {
        for (int32_t e : previous->phy2log) {
          if (e < 0 || e >= p.num_experts) {
            return Status::InvalidArgument("previous placement holds expert " + std::to_string(e) +
                                           ", outside [0, E = " + std::to_string(p.num_experts) + ")");
          }
        }
      }
      return PlaceEldr(p, previous, &layer_hooks);
    }
  }
  return Status::InvalidArgument("unknown placement algorithm " + std::to_string(static_cast<int>(algorithm)));
}

double Balancedness(const Placement& pl, const std::vector<double>& load) {
  ELDR_CHECK(load.size() == static_cast<size_t>(pl.num_layers) * pl.num_experts,
             "load must be [L, E] = [" << pl.num_layers << ", " << pl.num_experts << "]");
  return SummarizeRankLoad(pl, load.data()).balancedness();
}

RankLoadSummary SummarizeRankLoad(const Placement& pl, const double* load) {
  const int L = pl.num_layers, E = pl.num_experts, P = pl.num_slots, R = pl.num_ranks;
  ELDR_CHECK(R > 0 && P % R == 0, "slots P = " << P << " not a multiple of ranks R = " << R);
  ELDR_CHECK(pl.phy2log.size() == static_cast<size_t>(L) * P && pl.logcnt.size() == static_cast<size_t>(L) * E,
             "placement arrays do not match [L = " << L << ", E = " << E << ", P = " << P << "]");
  const int spr = P / R;
  RankLoadSummary out;
  out.num_layers = L;
  for (int l = 0; l < L; ++l) {
    const double* w = load + static_cast<size_t>(l) * E;
    const int32_t* cnt = pl.logcnt.data() + static_cast<size_t>(l) * E;
    const int32_t* row = pl.phy2log.data() + static_cast<size_t>(l) * P;
    double total = 0, max_rank = 0;
    for (int r = 0; r < R; ++r) {
      double rank_load = 0;
      for (int k = 0; k < spr; ++k) {
        const int e = row[r * spr + k];
        rank_load += w[e] / cnt[e];
      }
      total += rank_load;
      max_rank = std::max(max_rank, rank_load);
    }
    out.sum_mean_rank_load += total / R;
    out.sum_max_rank_load += max_rank;
  }
  return out;
}

Result<Placement> ContiguousPlacement(int num_layers, int num_experts, int num_ranks) {
  if (num_layers < 1 || num_experts < 1 || num_ranks < 1 || num_experts % num_ranks != 0) {
    return Status::InvalidArgument(
        "the contiguous placement (expert e on rank e / (E/R)) needs experts E = " + std::to_string(num_experts) +
        " to be a multiple of ranks R = " + std::to_string(num_ranks) + " (and L = " + std::to_string(num_layers) +
        " >= 1)");
  }
  std::vector<int32_t> phy2log(static_cast<size_t>(num_layers) * num_experts);
  for (size_t i = 0; i < phy2log.size(); ++i) phy2log[i] = static_cast<int32_t>(i % num_experts);
  return PlacementFromPhy2Log(num_layers, num_experts, num_ranks, std::move(phy2log));
}

double GroupLocality(const Placement& pl, const std::vector<double>& load, int num_groups, int num_nodes) {
  const int L = pl.num_layers, E = pl.num_experts, P = pl.num_slots, R = pl.num_ranks;
  ELDR_CHECK(load.size() == static_cast<size_t>(L) * E, "load must be [L, E] = [" << L << ", " << E << "]");
  ELDR_CHECK(num_groups > 0 && E % num_groups == 0, "E = " << E << " not a multiple of G = " << num_groups);
  ELDR_CHECK(num_nodes > 0 && R % num_nodes == 0 && P % R == 0, "R = " << R << " not a multiple of N = " << num_nodes);
  const int group_size = E / num_groups, slots_per_node = P / num_nodes;
  std::vector<double> served(static_cast<size_t>(num_groups) * num_nodes);
  double sum_best = 0, sum_total = 0;
  for (int l = 0; l < L; ++l) {
    std::fill(served.begin(), served.end(), 0.0);
    const double* w = load.data() + static_cast<size_t>(l) * E;
    const int32_t* cnt = pl.logcnt.data() + static_cast<size_t>(l) * E;
    const int32_t* row = pl.phy2log.data() + static_cast<size_t>(l) * P;
    for (int s = 0; s < P; ++s) {
      const int e = row[s];
      served[(e / group_size) * num_nodes + s / slots_per_node] += w[e] / cnt[e];
    }
    for (int g = 0; g < num_groups; ++g) {
      double best = 0, total = 0;
      for (int n = 0; n < num_nodes; ++n) {
        best = std::max(best, served[g * num_nodes + n]);
        total += served[g * num_nodes + n];
      }
      sum_best += best;
      sum_total += total;
    }
  }
  return sum_total > 0 ? sum_best / sum_total : 1.0;
}

MoveStats CountMoves(const Placement& from, const Placement& to, int64_t expert_bytes) {
  ELDR_CHECK(from.num_layers == to.num_layers && from.num_experts == to.num_experts && from.num_slots == to.num_slots &&
                 from.num_ranks == to.num_ranks,
             "placements of different shapes");
  const int L = to.num_layers, E = to.num_experts, P = to.num_slots, R = to.num_ranks;
  const int spr = P / R;
  MoveStats st;
  std::vector<int32_t> held(E, 0);  // replicas of each expert on the rank in `from`
  for (int l = 0; l < L; ++l) {
    const int32_t* a = from.phy2log.data() + static_cast<size_t>(l) * P;
    const int32_t* b = to.phy2log.data() + static_cast<size_t>(l) * P;
    for (int r = 0; r < R; ++r) {
      for (int k = 0; k < spr; ++k) ++held[a[r * spr + k]];
      for (int k = 0; k < spr; ++k) {
        int32_t& h = held[b[r * spr + k]];
        if (h > 0) {
          --h;
        } else {
          ++st.moved_experts;
        }
      }
      for (int k = 0; k < spr; ++k) held[a[r * spr + k]] = 0;
    }
    for (int s = 0; s < P; ++s) st.changed_slots += a[s] != b[s];
  }
  st.moved_bytes = static_cast<double>(st.moved_experts) * static_cast<double>(expert_bytes);
  return st;
}

Result<Placement> PlacementFromPhy2Log(int num_layers, int num_experts, int num_ranks, std::vector<int32_t> phy2log) {
  if (num_layers < 1 || num_experts < 1 || num_ranks < 1) {
    return Status::InvalidArgument("placement needs L = " + std::to_string(num_layers) + ", E = " +
                                   std::to_string(num_experts) + " and R = " + std::to_string(num_ranks) + " >= 1");
  }
  if (phy2log.size() % num_layers != 0) {
    return Status::InvalidArgument("phy2log has " + std::to_string(phy2log.size()) +
                                   " values, not a multiple of L = " + std::to_string(num_layers));
  }
  const int P = static_cast<int>(phy2log.size() / num_layers);
  if (P % num_ranks != 0) {
    return Status::InvalidArgument("physical slots P = " + std::to_string(P) +
                                   " must be a multiple of ranks R = " + std::to_string(num_ranks));
  }
  Placement pl;
  pl.num_layers = num_layers;
  pl.num_experts = num_experts;
  pl.num_slots = P;
  pl.num_ranks = num_ranks;
  pl.phy2log = std::move(phy2log);
  pl.logcnt.assign(static_cast<size_t>(num_layers) * num_experts, 0);
  for (int l = 0; l < num_layers; ++l) {
    for (int s = 0; s < P; ++s) {
      const int32_t e = pl.phy2log[static_cast<size_t>(l) * P + s];
      if (e < 0 || e >= num_experts) {
        return Status::InvalidArgument("phy2log[" + std::to_string(l) + ", " + std::to_string(s) + "] = " +
                                       std::to_string(e) + " is outside [0, E = " + std::to_string(num_experts) + ")");
      }
      ++pl.logcnt[static_cast<size_t>(l) * num_experts + e];
    }
    for (int e = 0; e < num_experts; ++e) {
      if (pl.logcnt[static_cast<size_t>(l) * num_experts + e] == 0) {
        return Status::InvalidArgument("expert " + std::to_string(e) + " of layer " + std::to_string(l) +
                                       " has no physical slot");
      }
    }
  }
  placement_internal::FinishPlacement(&pl, nullptr);
  return pl;
}

}  // namespace eldr
