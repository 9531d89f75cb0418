#include "runtime/calib/balanced_kmeans.h"

#include <lemon/network_simplex.h>
#include <lemon/static_graph.h>

#include <Eigen/Dense>
#include <cmath>
#include <limits>
#include <random>

#include "runtime/common/check.h"
#include "runtime/common/progress.h"
#include "runtime/common/signals.h"

namespace eldr {

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

double UniformReal(std::mt19937_64& rng) { return (rng() >> 11) * (1.0 / 9007199254740992.0); }

// The transportation graph of both assignments: points 0..n-1, clusters n..n+k-1, sink n+k; arcs point→cluster
// (index i·k + c), then cluster→sink (index n·k + c). StaticDigraph wants arcs sorted by source.
std::vector<std::pair<int, int>> BuildAssignmentGraph(int n, int k, lemon::StaticDigraph* g) {
  std::vector<std::pair<int, int>> arcs;
  arcs.reserve(static_cast<size_t>(n) * k + k);
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < k; ++c) arcs.emplace_back(i, n + c);
  }
  for (int c = 0; c < k; ++c) arcs.emplace_back(n + c, n + k);
  g->build(n + k + 1, arcs.begin(), arcs.end());
  return arcs;
}

}  // namespace

std::vector<int32_t> CapacitatedAssignment(const std::vector<double>& cost, int n, int k, int capacity) {
  ELDR_CHECK(static_cast<int64_t>(k) * capacity >= n, "capacity " << capacity << " x " << k << " < " << n);
  ELDR_CHECK(cost.size() == static_cast<size_t>(n) * k, "cost must be [n, k]");
  lemon::StaticDigraph g;
  const std::vector<std::pair<int, int>> arcs = BuildAssignmentGraph(n, k, &g);

  using Cost = int64_t;
  lemon::StaticDigraph::ArcMap<int> upper(g);
  lemon::StaticDigraph::ArcMap<Cost> arc_cost(g);
  lemon::StaticDigraph::NodeMap<int> supply(g, 0);
  constexpr double kScale = 1e9;
  for (int a = 0; a < static_cast<int>(arcs.size()); ++a) {
    auto arc = g.arc(a);
    if (a < n * k) {
      upper[arc] = 1;
      arc_cost[arc] = static_cast<Cost>(std::llround(cost[a] * kScale));
    } else {
      upper[arc] = capacity;
      arc_cost[arc] = 0;
    }
  }
  for (int i = 0; i < n; ++i) supply[g.node(i)] = 1;
  supply[g.node(n + k)] = -n;

  using Solver = lemon::NetworkSimplex<lemon::StaticDigraph, int, Cost>;
  Solver solver(g);
  solver.upperMap(upper).costMap(arc_cost).supplyMap(supply);
  auto rc = solver.run();
  ELDR_CHECK(rc == Solver::OPTIMAL,
             "min-cost flow of the capacitated assignment is not optimal (status " << static_cast<int>(rc) << ")");
  std::vector<int32_t> assignment(n, -1);
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < k; ++c) {
      if (solver.flow(g.arc(i * k + c)) > 0) {
        assignment[i] = c;
        break;
      }
    }
    ELDR_CHECK(assignment[i] >= 0, "point " << i << " left unassigned by the flow");
  }
  return assignment;
}

namespace {

// Rounds the split points of a basic flow (see the header): `arcs[i]` lists the clusters point i sends weight
// to. Points with one cluster keep it; each tree of the support is walked from a cluster root, and a split
// point reached from its parent cluster goes to its first child cluster (cheapest first).
std::vector<int32_t> RoundForest(const std::vector<std::vector<int>>& arcs, const std::vector<double>& cost, int n,
                                 int k) {
  std::vector<int32_t> out(n, -1);
  std::vector<std::vector<int>> split_of(k);  // cluster → split points touching it
  for (int i = 0; i < n; ++i) {
    if (arcs[i].size() == 1) out[i] = arcs[i][0];
    if (arcs[i].size() < 2) continue;
    for (int c : arcs[i]) split_of[c].push_back(i);
  }
  std::vector<uint8_t> cluster_seen(k, 0);
  for (int root = 0; root < k; ++root) {
    if (cluster_seen[root]) continue;
    cluster_seen[root] = 1;
    std::vector<int> queue{root};
    while (!queue.empty()) {
      const int c = queue.back();
      queue.pop_back();
      for (int i : split_of[c]) {
        if (out[i] >= 0) continue;  // already reached from its parent
        int pick = -1;
        for (int child : arcs[i]) {
          if (child == c || cluster_seen[child]) continue;
          if (pick < 0 || cost[static_cast<size_t>(i) * k + child] < cost[static_cast<size_t>(i) * k + pick]) {
            pick = child;
          }
        }
        for (int child : arcs[i]) {
          if (child == c || cluster_seen[child]) continue;
          cluster_seen[child] = 1;
          queue.push_back(child);
        }
        out[i] = pick >= 0 ? pick : c;  // no unseen child only off a forest (not a basic flow)
      }
    }
  }
  return out;
}

}  // namespace

WeightedAssignment WeightedCapacitatedAssignment(const std::vector<double>& cost, const std::vector<int64_t>& weight,
                                                 int n, int k, int64_t capacity) {
  ELDR_CHECK(cost.size() == static_cast<size_t>(n) * k, "cost must be [n, k]");
  ELDR_CHECK(weight.size() == static_cast<size_t>(n), "weight must be [n]");
  int64_t total = 0;
  for (int64_t w : weight) {
    ELDR_CHECK(w >= 1, "weights must be >= 1");
    total += w;
  }
  ELDR_CHECK(static_cast<int64_t>(k) * capacity >= total, "capacity " << capacity << " x " << k << " < " << total);
  lemon::StaticDigraph g;
  const std::vector<std::pair<int, int>> arcs = BuildAssignmentGraph(n, k, &g);
  using Cost = int64_t;
  lemon::StaticDigraph::ArcMap<int64_t> upper(g);
  lemon::StaticDigraph::ArcMap<Cost> arc_cost(g);
  lemon::StaticDigraph::NodeMap<int64_t> supply(g, 0);
  constexpr double kScale = 1e6;
  for (int a = 0; a < static_cast<int>(arcs.size()); ++a) {
    auto arc = g.arc(a);
    if (a < n * k) {
      upper[arc] = weight[a / k];
      arc_cost[arc] = static_cast<Cost>(std::llround(cost[a] * kScale));
    } else {
      upper[arc] = capacity;
      arc_cost[arc] = 0;
    }
  }
  for (int i = 0; i < n; ++i) supply[g.node(i)] = weight[i];
  supply[g.node(n + k)] = -total;
  using Solver = lemon::NetworkSimplex<lemon::StaticDigraph, int64_t, Cost>;
  Solver solver(g);
  solver.upperMap(upper).costMap(arc_cost).supplyMap(supply);
  auto rc = solver.run();
  ELDR_CHECK(rc == Solver::OPTIMAL,
             "min-cost flow of the weighted assignment is not optimal (status " << static_cast<int>(rc) << ")");
  WeightedAssignment res;
  std::vector<std::vector<int>> support(n);
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < k; ++c) {
      const int64_t f = solver.flow(g.arc(i * k + c));
      if (f <= 0) continue;
      support[i].push_back(c);
      res.relaxed_objective += static_cast<double>(f) * cost[static_cast<size_t>(i) * k + c];
    }
    ELDR_CHECK(!support[i].empty(), "point " << i << " left unassigned by the flow");
  }
  res.assignment = RoundForest(support, cost, n, k);
  return res;
}

namespace {

// One restart. Returns the objective.
BalancedKMeansResult RunOnce(const Eigen::Map<const RowMatrix>& X, const BalancedKMeansOptions& o,
                             std::mt19937_64& rng) {
  const int n = static_cast<int>(X.rows()), d = static_cast<int>(X.cols()), K = o.num_clusters;
  const int capacity = o.balanced ? ClusterCapacity(n, K) : n;
  int64_t total_weight = 0;
  if (o.weights) {
    for (int64_t w : *o.weights) total_weight += w;
  }
  const int64_t weight_capacity = (total_weight + K - 1) / K;
  RowMatrix C(K, d);
  // k-means++ seeding on cosine distance: next centre drawn ∝ D(x)², D = distance to the nearest centre.
  std::vector<double> nearest(n, std::numeric_limits<double>::infinity());
  int first = static_cast<int>(rng() % n);
  C.row(0) = X.row(first);
  for (int c = 1; c < K; ++c) {
    Eigen::VectorXf sim = X * C.row(c - 1).transpose();
    double total = 0;
    for (int i = 0; i < n; ++i) {
      nearest[i] = std::min(nearest[i], std::max(0.0, 1.0 - static_cast<double>(sim[i])));
      total += nearest[i] * nearest[i];
    }
    int pick = static_cast<int>(rng() % n);
    if (total > 0) {
      double r = UniformReal(rng) * total, acc = 0;
      for (int i = 0; i < n; ++i) {
        acc += nearest[i] * nearest[i];
        if (acc >= r && nearest[i] > 0) {
          pick = i;
          break;
        }
      }
    }
    C.row(c) = X.row(pick);
  }

  BalancedKMeansResult res;
  res.assignment.assign(n, -1);
  std::vector<double> cost(static_cast<size_t>(n) * K);
  for (int it = 0; it < o.max_iterations; ++it) {
    RowMatrix S = X * C.transpose();  // [n, K] cosine similarities
    for (int i = 0; i < n; ++i) {
      for (int c = 0; c < K; ++c) cost[static_cast<size_t>(i) * K + c] = 1.0 - static_cast<double>(S(i, c));
    }
    std::vector<int32_t> assign;
    if (o.balanced && o.weights) {
      assign = WeightedCapacitatedAssignment(cost, *o.weights, n, K, weight_capacity).assignment;
    } else if (o.balanced) {
      assign = CapacitatedAssignment(cost, n, K, capacity);
    } else {
      assign.resize(n);
      for (int i = 0; i < n; ++i) {
        int best = 0;
        for (int c = 1; c < K; ++c) {
          if (cost[i * K + c] < cost[i * K + best]) best = c;
        }
        assign[i] = best;
      }
    }
    res.iterations = it + 1;
    const bool changed = assign != res.assignment;
    res.assignment = std::move(assign);
    // Update: centroid = renormalised mean of members; an empty cluster takes the point farthest from
    // its centre (that is not the only member of its cluster).
    RowMatrix sum = RowMatrix::Zero(K, d);
    std::vector<int64_t> sizes(K, 0);
    for (int i = 0; i < n; ++i) {
      sum.row(res.assignment[i]) += X.row(i);
      ++sizes[res.assignment[i]];
    }
    bool reseeded = false;
    for (int c = 0; c < K; ++c) {
      if (sizes[c] > 0) continue;
      int far = -1;
      double far_cost = -1;
      for (int i = 0; i < n; ++i) {
        const int a = res.assignment[i];
        if (sizes[a] > 1 && cost[i * K + a] > far_cost) {
          far_cost = cost[i * K + a];
          far = i;
        }
      }
      if (far < 0) break;
      --sizes[res.assignment[far]];
      sum.row(res.assignment[far]) -= X.row(far);
      res.assignment[far] = c;
      sizes[c] = 1;
      sum.row(c) = X.row(far);
      reseeded = true;
    }
    for (int c = 0; c < K; ++c) {
      const float norm = sum.row(c).norm();
      if (norm > 0) C.row(c) = sum.row(c) / norm;
    }
    if (!changed && !reseeded) break;
  }
  // Final objective against the final centroids with the final assignment.
  res.objective = 0;
  res.sizes.assign(K, 0);
  for (int i = 0; i < n; ++i) {
    const int c = res.assignment[i];
    res.objective += 1.0 - static_cast<double>(X.row(i).dot(C.row(c)));
    ++res.sizes[c];
  }
  res.centroids.assign(C.data(), C.data() + static_cast<size_t>(K) * d);
  return res;
}

}  // namespace

Result<BalancedKMeansResult> BalancedKMeans(const std::vector<float>& points, int n, int d,
                                            const BalancedKMeansOptions& o) {
  if (n < 1) return Status::InvalidArgument("balanced k-means needs at least one point");
  if (o.num_clusters < 1 || o.num_clusters > n) {
    return Status::InvalidArgument("number of clusters K = " + std::to_string(o.num_clusters) +
                                   " must be in [1, N = " + std::to_string(n) + "]");
  }
  if (points.size() != static_cast<size_t>(n) * d) return Status::InvalidArgument("points must be [N, D]");
  for (float v : points) {
    if (!std::isfinite(v)) return Status::InvalidArgument("a signature has a NaN or infinite value");
  }
  if (o.weights) {
    if (o.weights->size() != static_cast<size_t>(n)) return Status::InvalidArgument("weights must be [N]");
    for (int64_t w : *o.weights) {
      if (w < 1) return Status::InvalidArgument("clustering weights must be >= 1");
    }
  }
  if (o.restarts < 1 || o.max_iterations < 1) return Status::InvalidArgument("restarts and iterations must be >= 1");
  Eigen::Map<const RowMatrix> X(points.data(), n, d);
  std::mt19937_64 rng(o.seed);
  BalancedKMeansResult best;
  bool have = false;
  ProgressBar bar("balanced k-means", o.restarts, o.progress);
  for (int r = 0; r < o.restarts; ++r) {
    if (Interrupted()) return InterruptStatus();
    BalancedKMeansResult res = RunOnce(X, o, rng);
    res.restart = r;
    if (!have || res.objective < best.objective - 1e-12) {
      best = std::move(res);
      have = true;
    }
    bar.Update(r + 1);
  }
  return best;
}

}  // namespace eldr
