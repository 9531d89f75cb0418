// The public DeepSeek EPLB algorithm (github.com/deepseek-ai/EPLB, eplb.py), one layer at a time:
//   1. tokens per group → balanced_packing onto nodes (whole groups, G/N per node);
//   2. per node, replicate_experts: each redundant slot goes to the expert with the highest load per
//      replica (lowest node-local index on ties, as torch.max);
//   3. per node, balanced_packing of the node's physical experts onto its ranks (P/R per rank).
// balanced_packing: heaviest first (stable descending sort: ties keep ascending index), each item into
// the lightest pack that is not full (lowest pack index on ties); with one item per pack it is the
// identity, as in eplb.py. The global policy is the same with one group and one node.
#include <algorithm>
#include <numeric>

#include "placement/placement_internal.h"
#include "runtime/common/check.h"

namespace eldr::placement_internal {

namespace {

// Scratch reused by every layer (no allocation inside the layer loop).
struct DeepSeekWorkspace {
  std::vector<int32_t> order;             // [max(G, P/N)] sort order
  std::vector<double> pack_weight;        // [max(N, R/N)]
  std::vector<int32_t> pack_items;        // [max(N, R/N)]
  std::vector<double> group_load;         // [G]
  std::vector<int32_t> group_pack;        // [G]
  std::vector<int32_t> group_rank;        // [G]
  std::vector<int32_t> log2mlog;          // [E] logical → node-major ("mlog") index
  std::vector<int32_t> mlog2log;          // [E]
  std::vector<double> mlog_load;          // [E/N] load of the node's experts in mlog order
  std::vector<double> per_replica;        // [E/N] load / replicas
  std::vector<int32_t> mlogcnt;           // [E] replicas per mlog index
  std::vector<int32_t> phy2mlog;          // [P/N]
  std::vector<int32_t> phyrank;           // [P/N]
  std::vector<double> phy_load;           // [P/N]
  std::vector<int32_t> phy_pack;          // [P/N]
  std::vector<int32_t> phy_rank_in_pack;  // [P/N]
  PackHeap heap;                          // packs with room
  std::vector<int32_t> tree;              // tournament storage of the replication
  RadixScratch radix;                     // sort scratch
};

// eplb.py balanced_packing for one row. weight: [n]; writes pack_index [n] and rank_in_pack [n].
// REQUIRES: n % num_packs == 0.
void BalancedPacking(const double* weight, int n, int num_packs, int32_t* pack_index, int32_t* rank_in_pack,
                     DeepSeekWorkspace& ws) {
  const int per_pack = n / num_packs;
  if (per_pack == 1) {
    for (int i = 0; i < n; ++i) {
      pack_index[i] = i;
      rank_in_pack[i] = 0;
    }
    return;
  }
  int32_t* order = ws.order.data();
  SortIndicesByDescendingKey(weight, n, order, &ws.radix);  // heaviest first, ties by index (stable sort)
  double* pw = ws.pack_weight.data();
  int32_t* pi = ws.pack_items.data();
  std::fill(pw, pw + num_packs, 0.0);
  std::fill(pi, pi + num_packs, 0);
  PackHeap& heap = ws.heap;
  heap.Clear();
  for (int p = 0; p < num_packs; ++p) heap.Push(p, 0.0);
  for (int k = 0; k < n; ++k) {
    const int item = order[k];
    const int best = heap.Top();
    heap.Pop();
    pack_index[item] = best;
    rank_in_pack[item] = pi[best];
    pw[best] += weight[item];
    if (++pi[best] < per_pack) heap.Push(best, pw[best]);
  }
}

// eplb.py replicate_experts for one row: num_log experts with load [num_log] into num_phy slots.
// Writes phy2log [num_phy], phyrank [num_phy] (replica index of each slot) and logcnt [num_log].
// Each step takes the largest load per replica, the lowest index among equal values (torch.max).
void ReplicateExperts(const double* load, int num_log, int num_phy, int32_t* phy2log, int32_t* phyrank, int32_t* logcnt,
                      double* per_replica, std::vector<int32_t>* tree) {
  for (int i = 0; i < num_log; ++i) {
    phy2log[i] = i;
    phyrank[i] = 0;
    logcnt[i] = 1;
    per_replica[i] = load[i];
  }
  auto better = [per_replica](int a, int b) {
    return per_replica[a] > per_replica[b] || (per_replica[a] == per_replica[b] && a < b);
  };
  Tournament<decltype(better)> tournament(better, tree);
  tournament.Build(num_log);
  for (int i = num_log; i < num_phy; ++i) {
    const int best = tournament.Best();
    phy2log[i] = best;
    phyrank[i] = logcnt[best];
    ++logcnt[best];
    per_replica[best] = load[best] / logcnt[best];
    tournament.Update(best);
  }
}

}  // namespace

Result<Placement> PlaceDeepSeek(const PlacementProblem& p, int num_groups, int num_nodes, LayerHooks* hooks) {
  const int L = p.num_layers, E = p.num_experts, P = p.num_slots, R = p.num_ranks;
  const int G = num_groups, N = num_nodes;
  ELDR_CHECK(E % G == 0 && G % N == 0 && R % N == 0 && P % R == 0 && P >= E,
             "invalid DeepSeek problem E = " << E << ", G = " << G << ", N = " << N << ", R = " << R << ", P = " << P);
  const int group_size = E / G, groups_per_node = G / N;
  const int experts_per_node = E / N, slots_per_node = P / N, ranks_per_node = R / N, spr = P / R;

  DeepSeekWorkspace ws;
  ws.order.resize(std::max(G, slots_per_node));
  ws.pack_weight.resize(std::max(N, ranks_per_node));
  ws.pack_items.resize(std::max(N, ranks_per_node));
  ws.group_load.resize(G);
  ws.group_pack.resize(G);
  ws.group_rank.resize(G);
  ws.log2mlog.resize(E);
  ws.mlog2log.resize(E);
  ws.mlog_load.resize(experts_per_node);
  ws.per_replica.resize(experts_per_node);
  ws.mlogcnt.resize(E);
  ws.phy2mlog.resize(slots_per_node);
  ws.phyrank.resize(slots_per_node);
  ws.phy_load.resize(slots_per_node);
  ws.phy_pack.resize(slots_per_node);
  ws.phy_rank_in_pack.resize(slots_per_node);

  Placement out = NewPlacement(p);
  std::vector<int32_t> replica_rank(static_cast<size_t>(L) * P);

  for (int l = 0; l < L; ++l) {
    if (!hooks->Continue()) return hooks->status();
    const double* load = p.load.data() + static_cast<size_t>(l) * E;
    // Step 1: whole groups onto nodes.
    for (int g = 0; g < G; ++g) {
      double s = 0;
      for (int i = 0; i < group_size; ++i) s += load[g * group_size + i];
      ws.group_load[g] = s;
    }
    BalancedPacking(ws.group_load.data(), G, N, ws.group_pack.data(), ws.group_rank.data(), ws);
    for (int e = 0; e < E; ++e) {
      const int g = e / group_size;
      const int mlog = (ws.group_pack[g] * groups_per_node + ws.group_rank[g]) * group_size + e % group_size;
      ws.log2mlog[e] = mlog;
      ws.mlog2log[mlog] = e;
    }
    for (int n = 0; n < N; ++n) {
      // Step 2: replicate within the node.
      const int32_t* node_mlog2log = ws.mlog2log.data() + n * experts_per_node;
      int32_t* node_cnt = ws.mlogcnt.data() + n * experts_per_node;
      for (int i = 0; i < experts_per_node; ++i) ws.mlog_load[i] = load[node_mlog2log[i]];
      ReplicateExperts(ws.mlog_load.data(), experts_per_node, slots_per_node, ws.phy2mlog.data(), ws.phyrank.data(),
                       node_cnt, ws.per_replica.data(), &ws.tree);
      // Step 3: the node's physical experts onto its ranks.
      for (int j = 0; j < slots_per_node; ++j) {
        const int m = ws.phy2mlog[j];
        ws.phy_load[j] = ws.mlog_load[m] / node_cnt[m];
      }
      BalancedPacking(ws.phy_load.data(), slots_per_node, ranks_per_node, ws.phy_pack.data(),
                      ws.phy_rank_in_pack.data(), ws);
      int32_t* row = out.phy2log.data() + static_cast<size_t>(l) * P + n * slots_per_node;
      int32_t* rrow = replica_rank.data() + static_cast<size_t>(l) * P + n * slots_per_node;
      for (int j = 0; j < slots_per_node; ++j) {
        const int slot = ws.phy_pack[j] * spr + ws.phy_rank_in_pack[j];
        row[slot] = node_mlog2log[ws.phy2mlog[j]];
        rrow[slot] = ws.phyrank[j];
      }
    }
    int32_t* cnt = out.logcnt.data() + static_cast<size_t>(l) * E;
    for (int e = 0; e < E; ++e) cnt[e] = ws.mlogcnt[ws.log2mlog[e]];
    hooks->LayerDone();
  }
  ELDR_RETURN_IF_ERROR(CheckLog2PhyMemory(L, E, MaxReplicas(out)));
  FinishPlacement(&out, &replica_rank);
  return out;
}

}  // namespace eldr::placement_internal
