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

}  // namespace

std::vector<int32_t> CapacitatedAssignment(const std::vector<double>& cost, int n, int k, int capacity) {
  ELDR_CHECK(static_cast<int64_t>(k) * capacity >= n, "capacity " << capacity << " x " << k << " < " << n);
  ELDR_CHECK(cost.size() == static_cast<size_t>(n) * k, "cost must be [n, k]");
  // Nodes: points 0..n-1, clusters n..n+k-1, sink n+k. StaticDigraph wants arcs sorted by source.
  lemon::StaticDigraph g;
  std::vector<std::pair<int, int>> arcs;
  arcs.reserve(static_cast<size_t>(n) * k + k);
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < k; ++c) arcs.emplace_back(i, n + c);
  }
  for (int c = 0; c < k; ++c) arcs.emplace_back(n + c, n + k);
  g.build(n + k + 1, arcs.begin(), arcs.end());

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

// One restart. Returns the objective.
BalancedKMeansResult RunOnce(const Eigen::Map<const RowMatrix>& X, const BalancedKMeansOptions& o,
                             std::mt19937_64& rng) {
  const int n = static_cast<int>(X.rows()), d = static_cast<int>(X.cols()), K = o.num_clusters;
  const int capacity = o.balanced ? ClusterCapacity(n, K) : n;
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
    if (o.balanced) {
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
