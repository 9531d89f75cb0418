// The capacitated assignment must be the true optimum: checked against brute force (every assignment
// that respects the capacity) and an independent O(n^3) Hungarian algorithm on replicated centroid
// slots, written here from the textbook (Kuhn–Munkres with potentials), sharing no code with the
// min-cost-flow solver under test.
#include "runtime/calib/balanced_kmeans.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

namespace eldr {
namespace {

double TotalCost(const std::vector<double>& cost, int k, const std::vector<int32_t>& a) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += cost[i * k + a[i]];
  return s;
}

// Brute force over all k^n assignments, skipping those that overflow a cluster.
double BruteForceOptimum(const std::vector<double>& cost, int n, int k, int capacity) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> a(n, 0), load(k, 0);
  std::function<void(int, double)> rec = [&](int i, double acc) {
    if (acc >= best) return;
    if (i == n) {
      best = acc;
      return;
    }
    for (int c = 0; c < k; ++c) {
      if (load[c] == capacity) continue;
      ++load[c];
      rec(i + 1, acc + cost[i * k + c]);
      --load[c];
    }
  };
  rec(0, 0.0);
  return best;
}

// Hungarian algorithm for a rectangular n x m (n <= m) cost matrix, minimising; returns row → column.
std::vector<int> Hungarian(const std::vector<std::vector<double>>& a) {
  const int n = static_cast<int>(a.size()), m = static_cast<int>(a[0].size());
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> u(n + 1, 0), v(m + 1, 0);
  std::vector<int> p(m + 1, 0), way(m + 1, 0);
  for (int i = 1; i <= n; ++i) {
    p[0] = i;
    int j0 = 0;
    std::vector<double> minv(m + 1, inf);
    std::vector<char> used(m + 1, false);
    do {
      used[j0] = true;
      const int i0 = p[j0];
      double delta = inf;
      int j1 = 0;
      for (int j = 1; j <= m; ++j) {
        if (used[j]) continue;
        const double cur = a[i0 - 1][j - 1] - u[i0] - v[j];
        if (cur < minv[j]) {
          minv[j] = cur;
          way[j] = j0;
        }
        if (minv[j] < delta) {
          delta = minv[j];
          j1 = j;
        }
      }
      for (int j = 0; j <= m; ++j) {
        if (used[j]) {
          u[p[j]] += delta;
          v[j] -= delta;
        } else {
          minv[j] -= delta;
        }
      }
      j0 = j1;
    } while (p[j0] != 0);
    do {
      const int j1 = way[j0];
      p[j0] = p[j1];
      j0 = j1;
    } while (j0);
  }
  std::vector<int> row_to_col(n, -1);
  for (int j = 1; j <= m; ++j) {
    if (p[j]) row_to_col[p[j] - 1] = j - 1;
  }
  return row_to_col;
}

double HungarianOptimum(const std::vector<double>& cost, int n, int k, int capacity) {
  // Replicate every cluster `capacity` times: slot s belongs to cluster s / capacity.
  std::vector<std::vector<double>> a(n, std::vector<double>(static_cast<size_t>(k) * capacity));
  for (int i = 0; i < n; ++i) {
    for (int s = 0; s < k * capacity; ++s) a[i][s] = cost[i * k + s / capacity];
  }
  const std::vector<int> r = Hungarian(a);
  double total = 0;
  for (int i = 0; i < n; ++i) total += a[i][r[i]];
  return total;
}

std::vector<double> RandomCost(int n, int k, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 2.0);
  std::vector<double> c(static_cast<size_t>(n) * k);
  for (auto& x : c) x = u(rng);
  return c;
}

void ExpectValid(const std::vector<int32_t>& a, int n, int k, int capacity) {
  ASSERT_EQ(static_cast<int>(a.size()), n);
  std::vector<int> load(k, 0);
  for (int32_t c : a) {
    ASSERT_GE(c, 0);
    ASSERT_LT(c, k);
    ++load[c];
  }
  for (int c = 0; c < k; ++c) EXPECT_LE(load[c], capacity);
}

TEST(CapacitatedAssignment, HandComputedCase) {
  // Both points prefer cluster 0, capacity 1: the one that loses less (point 1) moves to cluster 1.
  // cost = [[0.0, 1.0], [0.1, 0.2]] → best is p0→0, p1→1 with total 0.2.
  const std::vector<double> cost = {0.0, 1.0, 0.1, 0.2};
  const auto a = CapacitatedAssignment(cost, 2, 2, 1);
  EXPECT_EQ(a[0], 0);
  EXPECT_EQ(a[1], 1);
}

TEST(CapacitatedAssignment, MatchesBruteForceOnSmallRandomCases) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 8);
    const int k = 1 + static_cast<int>(rng() % std::min(n, 4));
    const int capacity = ClusterCapacity(n, k);
    const auto cost = RandomCost(n, k, rng);
    const auto a = CapacitatedAssignment(cost, n, k, capacity);
    ExpectValid(a, n, k, capacity);
    EXPECT_NEAR(TotalCost(cost, k, a), BruteForceOptimum(cost, n, k, capacity), 1e-7) << "trial " << trial;
  }
}

TEST(CapacitatedAssignment, MatchesIndependentHungarianOnLargerCases) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 10 + static_cast<int>(rng() % 50);
    const int k = 2 + static_cast<int>(rng() % 7);
    const int capacity = ClusterCapacity(n, k) + static_cast<int>(rng() % 2);  // tight and loose capacities
    const auto cost = RandomCost(n, k, rng);
    const auto a = CapacitatedAssignment(cost, n, k, capacity);
    ExpectValid(a, n, k, capacity);
    EXPECT_NEAR(TotalCost(cost, k, a), HungarianOptimum(cost, n, k, capacity), 1e-6) << "trial " << trial;
  }
}

TEST(CapacitatedAssignment, TiedCostsStillRespectCapacity) {
  const int n = 9, k = 3;
  std::vector<double> cost(n * k, 0.5);
  const auto a = CapacitatedAssignment(cost, n, k, 3);
  ExpectValid(a, n, k, 3);
}

// Points on the unit sphere around `k` well-separated directions.
std::vector<float> ClusteredPoints(int per_cluster, int k, int d, uint64_t seed, std::vector<int>* truth) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.f, 0.05f);
  std::vector<float> pts;
  for (int c = 0; c < k; ++c) {
    for (int i = 0; i < per_cluster; ++i) {
      std::vector<float> x(d, 0.f);
      x[c % d] = 1.f;
      double norm = 0;
      for (auto& v : x) {
        v += std::abs(noise(rng));
        norm += v * v;
      }
      for (auto& v : x) pts.push_back(static_cast<float>(v / std::sqrt(norm)));
      truth->push_back(c);
    }
  }
  return pts;
}

TEST(BalancedKMeans, RecoversSeparatedClustersWithEqualSizes) {
  std::vector<int> truth;
  const int k = 4, per = 25, d = 8;
  const auto pts = ClusteredPoints(per, k, d, 3, &truth);
  BalancedKMeansOptions o;
  o.num_clusters = k;
  o.seed = 11;
  auto r = BalancedKMeans(pts, k * per, d, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  for (int c = 0; c < k; ++c) EXPECT_EQ(r->sizes[c], per);
  // Every true cluster maps to exactly one found cluster.
  for (int c = 0; c < k; ++c) {
    for (int i = 0; i < per; ++i) EXPECT_EQ(r->assignment[c * per + i], r->assignment[c * per]);
  }
  for (int c = 0; c < k; ++c) {
    double norm = 0;
    for (int x = 0; x < d; ++x) norm += r->centroids[c * d + x] * r->centroids[c * d + x];
    EXPECT_NEAR(norm, 1.0, 1e-5);
  }
}

TEST(BalancedKMeans, CapacityHoldsWhenDataIsUnbalanced) {
  // 30 points in one direction, 6 in another, K = 3: every cluster holds at most ceil(36/3) = 12.
  std::vector<int> truth;
  auto pts = ClusteredPoints(30, 1, 6, 5, &truth);
  auto more = ClusteredPoints(6, 2, 6, 6, &truth);
  pts.insert(pts.end(), more.begin() + 6 * 6, more.end());  // the second direction only
  const int n = 36;
  BalancedKMeansOptions o;
  o.num_clusters = 3;
  auto r = BalancedKMeans(pts, n, 6, o);
  ASSERT_TRUE(r.ok());
  for (auto s : r->sizes) EXPECT_LE(s, 12);
  int total = 0;
  for (auto s : r->sizes) total += static_cast<int>(s);
  EXPECT_EQ(total, n);
  // Unbalanced k-means is allowed to exceed the cap.
  o.balanced = false;
  auto u = BalancedKMeans(pts, n, 6, o);
  ASSERT_TRUE(u.ok());
  int64_t biggest = 0;
  for (auto s : u->sizes) biggest = std::max(biggest, s);
  EXPECT_GT(biggest, 12);
}

TEST(BalancedKMeans, DeterministicForASeed) {
  std::vector<int> truth;
  const auto pts = ClusteredPoints(20, 3, 5, 9, &truth);
  BalancedKMeansOptions o;
  o.num_clusters = 3;
  o.seed = 123;
  auto a = BalancedKMeans(pts, 60, 5, o);
  auto b = BalancedKMeans(pts, 60, 5, o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->assignment, b->assignment);
  EXPECT_EQ(a->centroids, b->centroids);
}

TEST(BalancedKMeans, EveryAssignmentIsOptimalForItsCentroids) {
  // At convergence, the assignment is the capacitated optimum against the final centroids.
  std::mt19937_64 rng(21);
  std::normal_distribution<float> g(0.f, 1.f);
  const int n = 40, d = 6, k = 5;
  std::vector<float> pts(n * d);
  for (int i = 0; i < n; ++i) {
    double norm = 0;
    for (int x = 0; x < d; ++x) {
      pts[i * d + x] = std::abs(g(rng));
      norm += pts[i * d + x] * pts[i * d + x];
    }
    for (int x = 0; x < d; ++x) pts[i * d + x] /= static_cast<float>(std::sqrt(norm));
  }
  BalancedKMeansOptions o;
  o.num_clusters = k;
  o.max_iterations = 1000;
  auto r = BalancedKMeans(pts, n, d, o);
  ASSERT_TRUE(r.ok());
  std::vector<double> cost(n * k);
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < k; ++c) {
      double s = 0;
      for (int x = 0; x < d; ++x) s += pts[i * d + x] * r->centroids[c * d + x];
      cost[i * k + c] = 1 - s;
    }
  }
  EXPECT_NEAR(TotalCost(cost, k, r->assignment), HungarianOptimum(cost, n, k, ClusterCapacity(n, k)), 1e-4);
}

// Work-balanced assignment: the rounding's guarantee (every cluster within capacity + max weight) and the
// relaxation's lower bound, against brute force over all k^n assignments.
std::vector<int64_t> WeightedLoads(const std::vector<int64_t>& w, int k, const std::vector<int32_t>& a) {
  std::vector<int64_t> load(k, 0);
  for (size_t i = 0; i < a.size(); ++i) load[a[i]] += w[i];
  return load;
}

TEST(WeightedCapacitatedAssignment, HandComputedCase) {
  // Weights {10, 1, 1}, K = 2, capacity 6. Point 0 costs {0, 1} per unit, points 1 and 2 {0, 0.5}. Cluster 1
  // must take 6 of the 12 units: points 1 and 2 whole (2 · 0.5) and 4 units of point 0 (4 · 1) → the
  // relaxation's optimum is 5 with point 0 split 6/4. No integral assignment fits capacity 6 (point 0 alone
  // is 10); the rounding stays within 6 + 10 = 16.
  const std::vector<double> cost = {0, 1, 0, 0.5, 0, 0.5};
  const std::vector<int64_t> w = {10, 1, 1};
  const WeightedAssignment r = WeightedCapacitatedAssignment(cost, w, 3, 2, 6);
  EXPECT_NEAR(r.relaxed_objective, 5.0, 1e-5);
  EXPECT_EQ(r.assignment[1], 1);
  EXPECT_EQ(r.assignment[2], 1);
  for (int64_t load : WeightedLoads(w, 2, r.assignment)) EXPECT_LE(load, 16);
  // Unit weights and capacity ⌈n/K⌉: the relaxation is integral, so this is CapacitatedAssignment's optimum.
  const std::vector<double> c2 = {0.1, 0.9, 0.2, 0.8, 0.3, 0.4, 0.7, 0.1};
  const std::vector<int64_t> ones(4, 1);
  const WeightedAssignment u = WeightedCapacitatedAssignment(c2, ones, 4, 2, 2);
  EXPECT_NEAR(TotalCost(c2, 2, u.assignment), TotalCost(c2, 2, CapacitatedAssignment(c2, 4, 2, 2)), 1e-9);
}

TEST(WeightedCapacitatedAssignment, GuaranteeAndLowerBoundAgainstBruteForce) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.0, 2.0);
  int feasible_cases = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 8), k = 1 + static_cast<int>(rng() % 3);
    std::vector<double> cost(static_cast<size_t>(n) * k);
    for (double& c : cost) c = u(rng);
    std::vector<int64_t> w(n);
    int64_t total = 0, wmax = 0;
    for (int64_t& x : w) {
      x = 1 + static_cast<int64_t>(rng() % (trial % 2 ? 40 : 5));
      total += x;
      wmax = std::max(wmax, x);
    }
    // The tight capacity ⌈W/K⌉, or some slack.
    const int64_t capacity = (total + k - 1) / k + (trial % 3 == 0 ? static_cast<int64_t>(rng() % 10) : 0);
    const WeightedAssignment r = WeightedCapacitatedAssignment(cost, w, n, k, capacity);
    ASSERT_EQ(r.assignment.size(), static_cast<size_t>(n));
    for (int32_t a : r.assignment) ASSERT_TRUE(a >= 0 && a < k);
    for (int64_t load : WeightedLoads(w, k, r.assignment)) EXPECT_LE(load, capacity + wmax) << "trial " << trial;
    // Brute force: the exact optimum of Σ w_i cost[i, c] with every load ≤ capacity (when one exists).
    double best = std::numeric_limits<double>::infinity();
    std::vector<int32_t> a(n, 0);
    for (int64_t code = 0, num = static_cast<int64_t>(std::pow(k, n)); code < num; ++code) {
      int64_t x = code;
      for (int i = 0; i < n; ++i, x /= k) a[i] = static_cast<int32_t>(x % k);
      const auto loads = WeightedLoads(w, k, a);
      if (*std::max_element(loads.begin(), loads.end()) > capacity) continue;
      double obj = 0;
      for (int i = 0; i < n; ++i) obj += static_cast<double>(w[i]) * cost[static_cast<size_t>(i) * k + a[i]];
      best = std::min(best, obj);
    }
    if (std::isfinite(best)) {
      ++feasible_cases;
      // Integer costs at 1e-6 per unit of weight: the relaxation is within total · 1e-6 of its real optimum.
      EXPECT_LE(r.relaxed_objective, best + static_cast<double>(total) * 1e-6) << "trial " << trial;
    }
  }
  EXPECT_GT(feasible_cases, 100);
}

TEST(BalancedKMeans, WorkBalancedClustersHoldTheirWeightBound) {
  // Two tight groups of 6 points; group A's points weigh 10, group B's 1. Count-balanced clustering keeps the
  // groups (6 and 6 points, work 60 vs 6); work-balanced clustering (capacity ⌈66/2⌉ = 33) must move work so
  // that no cluster exceeds 33 + 10.
  std::vector<float> pts;
  std::vector<int64_t> w;
  for (int i = 0; i < 12; ++i) {
    const float a = i < 6 ? 1.f : 0.f;
    const float jitter = 0.01f * static_cast<float>(i % 6);
    float x = a + jitter, y = 1 - a + jitter;
    const float norm = std::sqrt(x * x + y * y);
    pts.push_back(x / norm);
    pts.push_back(y / norm);
    w.push_back(i < 6 ? 10 : 1);
  }
  BalancedKMeansOptions o;
  o.num_clusters = 2;
  o.weights = &w;
  auto r = BalancedKMeans(pts, 12, 2, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  for (int64_t load : WeightedLoads(w, 2, r->assignment)) EXPECT_LE(load, 43);
  std::vector<int64_t> bad(12, 1);
  bad[3] = 0;  // a weight below 1
  o.weights = &bad;
  EXPECT_EQ(BalancedKMeans(pts, 12, 2, o).status().code(), StatusCode::kInvalidArgument);
}

TEST(BalancedKMeans, RejectsBadInput) {
  std::vector<float> pts = {1, 0, 0, 1};
  BalancedKMeansOptions o;
  o.num_clusters = 3;
  EXPECT_EQ(BalancedKMeans(pts, 2, 2, o).status().code(), StatusCode::kInvalidArgument);  // K > N
  o.num_clusters = 0;
  EXPECT_EQ(BalancedKMeans(pts, 2, 2, o).status().code(), StatusCode::kInvalidArgument);  // K < 1
  o.num_clusters = 1;
  pts[0] = std::nanf("");
  EXPECT_EQ(BalancedKMeans(pts, 2, 2, o).status().code(), StatusCode::kInvalidArgument);  // NaN
}

}  // namespace
}  // namespace eldr
