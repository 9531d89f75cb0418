#!/usr/bin/python3
"""The pure pieces of bench/eval (bench/eval_lib.py) against hand-computed cases; runs no simulation."""
import os
import sys
import random
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import eval_lib as lib  # noqa: E402


class StratifiedSplit(unittest.TestCase):
    def test_each_domain_splits_in_halves_and_the_folds_partition_the_requests(self):
        domains = ["a"] * 5 + ["b"] * 4 + ["c"] * 1 + ["a", "b"]  # a: 6, b: 5, c: 1
        for seed in range(5):
            A, B = lib.stratified_split(domains, seed)
            self.assertEqual(sorted(A + B), list(range(len(domains))))
            self.assertFalse(set(A) & set(B))
            self.assertEqual(A, sorted(A))
            count = lambda idx, d: sum(1 for i in idx if domains[i] == d)
            self.assertEqual((count(A, "a"), count(B, "a")), (3, 3))
            self.assertEqual((count(A, "b"), count(B, "b")), (3, 2))  # ceil(5/2) to A
            self.assertEqual((count(A, "c"), count(B, "c")), (1, 0))

    def test_seeded(self):
        domains = ["x"] * 20
        self.assertEqual(lib.stratified_split(domains, 3), lib.stratified_split(domains, 3))
        self.assertNotEqual(lib.stratified_split(domains, 3), lib.stratified_split(domains, 4))


class BestAndRatios(unittest.TestCase):
    def test_best_balancer_is_the_lowest_median_over_seeds_per_metric(self):
        runs = {"jsq": [{"m": 2.0, "p": 5.0}, {"m": 2.2, "p": 5.0}, {"m": 9.0, "p": 5.0}],  # median m 2.2
                "p2c": [{"m": 2.1, "p": 4.0}, {"m": 2.3, "p": 4.0}, {"m": 2.3, "p": 4.0}],  # median m 2.3
                "round_robin": [{"m": 3.0, "p": 3.0}] * 3,
                "eldr": [{"m": 1.0, "p": 1.0}] * 3}  # not a balancer
        self.assertEqual(lib.best_balancer(runs, "m"), "jsq")
        self.assertEqual(lib.best_balancer(runs, "p"), "round_robin")
        with self.assertRaises(ValueError):
            lib.best_balancer({"eldr": runs["eldr"]}, "m")

    def test_seed_ratios_pair_by_sample(self):
        ref = [{"sample": "s0", "v": 2.0}, {"sample": "s1", "v": 4.0}, {"sample": "s2", "v": 0.0}]
        runs = [{"sample": "s1", "v": 3.0}, {"sample": "s0", "v": 1.0}, {"sample": "s2", "v": 1.0},
                {"sample": "s9", "v": 1.0}]
        self.assertEqual(lib.seed_ratios(runs, ref, lambda r: r["v"]), [0.75, 0.5, None, None])
        st = lib.ratio_stats([0.75, 0.5, None, 1.5])
        self.assertEqual(st, {"median": 0.75, "min": 0.5, "max": 1.5, "n": 3, "ci": None})
        self.assertIsNone(lib.ratio_stats([None]))

    def test_median_ci_takes_the_binomial_order_statistics(self):
        # n = 10: P(Bin(10, 1/2) <= 1) = 11/1024, so [x_2, x_9] covers 1 - 22/1024 = 97.9 %; [x_3, x_8] would
        # cover 1 - 2·56/1024 = 89.1 %. n = 50: [x_18, x_33] (the published table's ranks for 95 %).
        lo, hi, cov = lib.median_ci(list(range(10, 0, -1)))
        self.assertEqual((lo, hi), (2, 9))
        self.assertAlmostEqual(cov, 1 - 22 / 1024)
        lo, hi, cov = lib.median_ci(list(range(1, 51)))
        self.assertEqual((lo, hi), (18, 33))
        self.assertGreaterEqual(cov, 0.95)
        self.assertIsNone(lib.median_ci([1, 2, 3, 4, 5]))  # [min, max] covers 1 - 2/32 = 93.75 %
        self.assertEqual(lib.median_ci([1, 2, 3, 4, 5, 6])[:2], (1, 6))  # 1 - 2/64 = 96.9 %
        # Large n (2^n beyond a float): the normal approximation's ranks, n/2 ∓ 1.96·sqrt(n)/2 ≈ 956 and 1045.
        lo, hi, cov = lib.median_ci(list(range(1, 2001)))
        self.assertTrue(955 <= lo <= 960 and 1041 <= hi <= 1046 and cov >= 0.95, (lo, hi, cov))
        # By simulation: the interval holds the true median 0 in at least ~95 % of 2000 normal samples of 50.
        rng = random.Random(3)
        hits = 0
        for _ in range(2000):
            lo, hi, _ = lib.median_ci([rng.gauss(0, 1) for _ in range(50)])
            hits += lo <= 0 <= hi
        self.assertGreater(hits / 2000, 0.95)

    def test_clairvoyant_fraction(self):
        self.assertAlmostEqual(lib.clairvoyant_fraction(0.9, 0.8), 0.5)
        self.assertAlmostEqual(lib.clairvoyant_fraction(1.1, 0.8), -0.5)  # worse than the balancer
        self.assertIsNone(lib.clairvoyant_fraction(0.9, 1.0))  # the ceiling shows no gain
        self.assertIsNone(lib.clairvoyant_fraction(None, 0.8))


class MatchedBatch(unittest.TestCase):
    def test_the_hand_case_of_distinct_experts_test(self):
        # The case of tests/unit/distinct_experts_test.cc: (3·0.8 + 1·0.75) / 4 = 0.7875, covered 4/5.
        row = lambda b, s, m: {"batch": b, "steps": s, "mean_distinct_experts": m}
        policy = [row(2, 3, 8.0), row(4, 1, 12.0), row(8, 1, 20.0)]
        reference = [row(1, 7, 3.0), row(2, 5, 10.0), row(4, 2, 16.0)]
        ratio, covered = lib.matched_batch_ratio(policy, reference)
        self.assertAlmostEqual(ratio, 0.7875)
        self.assertAlmostEqual(covered, 0.8)
        self.assertEqual(lib.matched_batch_ratio([row(3, 2, 5.0)], reference), (None, 0.0))


class CalibrationKinds(unittest.TestCase):
    def test_each_row_runs_on_its_calibration(self):
        # eldr and eldr_tail on `eldr calibrate`'s default (balanced by work), the published band on count balance
        # as published, the clairvoyant on decode features (balanced by work), eldr_count on count balance; any
        # other calibrated policy on the default.
        expect = {"eldr": "work", "eldr_tail": "work", "locality_top1": "work", "eldr_paper": "count",
                  "eldr_count": "count", "clairvoyant": "decode"}
        self.assertEqual({p: lib.calibration_of(p) for p in expect}, expect)
        base = ["jsq", "p2c", "round_robin", "domain", "eldr", "eldr_paper", "eldr_tail", "clairvoyant"]
        self.assertEqual(lib.calibration_kinds(base), {"work", "count", "decode"})
        self.assertEqual(lib.calibration_kinds(["jsq", "eldr"]), {"work", "decode"})
        self.assertEqual(lib.calibration_kinds(["jsq", "p2c"]), {"decode"})


class AblationVariants(unittest.TestCase):
    def test_rows_change_one_setting_of_their_default(self):
        v = lib.ablation_variants(paper_taus=(0, 0.2), paper_eps=(0.25,), tail_eps=(0.5,), tail_taus=(), lambdas=(0, 1))
        by = {r["name"]: r for r in v}
        self.assertEqual(len(by), len(v))  # names are unique
        self.assertEqual([r["name"] for r in v],
                         ["jsq", "p2c", "round_robin", "domain",
                          "eldr", "eldr λ=0", "eldr λ=1", "eldr count-balanced",
                          "eldr_paper", "eldr_paper τ=0", "eldr_paper τ=0.2", "eldr_paper ε=0.25",
                          "eldr_paper work-balanced",
                          "eldr_tail", "eldr_tail ε=0.5", "eldr_tail count-balanced", "clairvoyant"])
        for p in ("jsq", "p2c", "round_robin", "domain"):
            self.assertEqual((by[p]["policy"], by[p]["calib"], by[p]["args"]), (p, None, []))
        # eldr and eldr_tail on `eldr calibrate`'s default (balanced by work), the published band on count balance;
        # each beside the other balance.
        for p, home, other in (("eldr", "work", "count"), ("eldr_tail", "work", "count"),
                               ("eldr_paper", "count", "work")):
            self.assertEqual((by[p]["policy"], by[p]["calib"], by[p]["args"]), (p, home, []))
            row = by[f"{p} {other}-balanced"]
            self.assertEqual((row["policy"], row["calib"], row["args"]), (p, other, []))
        self.assertEqual(by["eldr λ=1"]["calib"], "work")
        self.assertEqual(by["eldr λ=1"]["args"], ["--harm-weight", "1.0"])
        self.assertEqual(by["eldr_paper τ=0"]["args"], ["--tau", "0.0"])
        self.assertEqual((by["eldr_tail ε=0.5"]["policy"], by["eldr_tail ε=0.5"]["args"]),
                         ("eldr_tail", ["--load-bound", "0.5"]))
        self.assertEqual((by["clairvoyant"]["policy"], by["clairvoyant"]["calib"], by["clairvoyant"]["args"]),
                         ("eldr", "decode", ["--route-on", "decode"]))


class LocalityCap(unittest.TestCase):
    def test_union_gap_is_log_linear_through_one(self):
        gaps = {8: 0.18, 16: 0.21, 32: 0.20}
        self.assertEqual(lib.union_gap_at(1, gaps), 0.0)
        self.assertAlmostEqual(lib.union_gap_at(2, gaps), 0.06)  # log2 2 = 1/3 of the way from 1 to 8
        self.assertAlmostEqual(lib.union_gap_at(8, gaps), 0.18)
        self.assertAlmostEqual(lib.union_gap_at(11.3137085, gaps), 0.195)  # 2^3.5: half way from 8 to 16
        self.assertAlmostEqual(lib.union_gap_at(64, gaps), 0.20)

    def test_hand_case(self):
        # a = 1, b = 0.01, c = 0.1, d = 0.001, ctx = 100: B = 8, U = 100: t = 1 + 1 + 0.8 + 0.8 = 3.6, s = 1/3.6;
        # B = 16, U = 200: t = 1 + 2 + 1.6 + 1.6 = 6.2, s = 2/6.2. Token weights 10·8 = 80 and 5·16 = 80.
        cost = {"a": 1.0, "b": 0.01, "c": 0.1, "d": 0.001}
        rows = [{"batch": 8, "steps": 10, "mean_distinct_experts": 100.0},
                {"batch": 16, "steps": 5, "mean_distinct_experts": 200.0},
                {"batch": 4, "steps": 0, "mean_distinct_experts": 50.0}]
        r = lib.locality_cap(cost, rows, 100.0, {8: 0.2, 16: 0.1})
        self.assertAlmostEqual(r["share"], (1 / 3.6 + 2 / 6.2) / 2)
        self.assertAlmostEqual(r["cap"], (0.2 / 3.6 + 0.1 * 2 / 6.2) / 2)
        self.assertIsNone(lib.locality_cap(cost, [], 100.0, {8: 0.2}))


class Saturation(unittest.TestCase):
    def test_scan_finds_the_knee_of_a_queue_that_grows_above_100_per_s(self):
        def run(rate):
            growth = 1.0 if rate <= 100 else 1.5
            return {"rate": rate, "failed": 0, "request_throughput": rate,
                    "tpot_by_third": {"middle": {"median_tpot_ms": 1.0, "p95_tpot_ms": 1.0},
                                      "last": {"median_tpot_ms": growth, "p95_tpot_ms": growth}}}
        rate, steps = lib.saturation_scan(run, 160)
        self.assertLessEqual(rate, 100)
        self.assertGreater(rate, 100 / 1.25)  # within one 1.25x step below the knee
        self.assertTrue(lib.is_saturated(run(160)))
        self.assertFalse(lib.is_saturated(run(100)))
        self.assertTrue(lib.is_saturated(dict(run(50), failed=1)))
        self.assertTrue(lib.is_saturated(dict(run(50), request_throughput=20)))


if __name__ == "__main__":
    unittest.main()
