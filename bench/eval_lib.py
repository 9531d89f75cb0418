"""Pure pieces of bench/eval (no eldr runs), kept apart so tests/bench/eval_lib_test.py can check them quickly.

- stratified_split: the seeded 2-fold split of a trace's requests, stratified by domain;
- saturation_scan: jsq's saturation rate by a scan (the rule of bench/tables, with K and the run as arguments);
- best_balancer / ratio_stats / seed_ratios: "the best of jsq, p2c and round_robin per cell" and the per-seed
  ratios to it, reported as the median over seeds with the min-max spread and median_ci's 95 % interval;
- matched_batch_ratio: distinct experts per step at matched batch (the definition of MatchedBatchRatio in
  runtime/common/distinct_experts.h, a second implementation over the metrics.json rows);
- clairvoyant_fraction: the share of the clairvoyant router's median reduction a policy reaches;
- calibration_of / calibration_kinds: which calibration (work, count or decode) each policy row runs on.
"""
import math
import random
import statistics

BALANCERS = ["jsq", "p2c", "round_robin"]
LOAD_POLICIES = {"random", "round_robin", "jsq", "p2c", "domain"}  # need no calibration
CLAIRVOYANT = "clairvoyant"
# Rows that run the `eldr` policy on another calibration: row -> its calibration kind. eldr_count (a --policies
# row): the default eldr on a count-balanced calibration (calibrate --balance count).
PSEUDO = {CLAIRVOYANT: "decode", "eldr_count": "count"}
# The calibration each calibrated policy runs on by default: `eldr calibrate`'s default, balanced by decode work,
# except the published band, which the paper fitted balanced by request count (`--balance count`).
HOME_CALIBRATION = {"eldr": "work", "eldr_tail": "work", "eldr_paper": "count"}
OTHER_BALANCE = {"work": "count", "count": "work"}


def calibration_of(policy):
    """The calibration kind a calibrated policy row runs on: "work" (`eldr calibrate`'s default), "count"
    (--balance count) or "decode" (the clairvoyant's)."""
    return PSEUDO.get(policy) or HOME_CALIBRATION.get(policy, "work")


def calibration_kinds(policies):
    """The calibration kinds a list of bench/eval policy rows needs (the clairvoyant's always)."""
    return {"decode"} | {calibration_of(p) for p in policies if p not in LOAD_POLICIES}


def stratified_split(domains, seed):
    """Two folds of request indices: per domain (sorted by name), the indices in a seeded shuffle, the first
    ceil(n/2) to fold A, the rest to fold B. Returns (A, B), each sorted ascending."""
    rng = random.Random(seed)
    a = []
    for d in sorted(set(domains)):
        idx = [i for i, x in enumerate(domains) if x == d]
        rng.shuffle(idx)
        a += idx[: (len(idx) + 1) // 2]
    a = sorted(a)
    taken = set(a)
    return a, [i for i in range(len(domains)) if i not in taken]


def sig2(x):
    """x rounded to 2 significant digits (request rates that read well)."""
    if x <= 0:
        return x
    p = 10 ** (math.floor(math.log10(x)) - 1)
    return round(x / p) * p


def is_saturated(s):
    """bench/tables' rule: a run is saturated when the last third of the arrivals has a median or p95 TPOT more than
    1.2x the middle third's (a queue that grows during the run), when any request fails, or when it completes
    under half the offered rate. s: {failed, request_throughput, rate, tpot_by_third: {middle, last}}."""
    t = s["tpot_by_third"]
    growth = max(t["last"][k] / t["middle"][k] for k in ("median_tpot_ms", "p95_tpot_ms"))
    s["queue_growth"] = growth
    return bool(s["failed"]) or s["request_throughput"] < 0.5 * s["rate"] or growth > 1.2


def saturation_scan(run, base_rate, max_steps=40):
    """The highest rate at which the runs are not saturated (is_saturated): halves base_rate until a run is not
    saturated, then up by 1.25x to the first saturated rate, then two bisections (geometric). run(rate) -> the
    summary of one run with its "rate". Returns (rate, steps) or raises RuntimeError when it never saturates."""
    steps = []
    r = base_rate
    s = run(sig2(r))
    steps.append(s)
    while is_saturated(s) and r > 1:
        r /= 2
        s = run(sig2(r))
        steps.append(s)
    ok, bad = s, None
    for _ in range(max_steps):
        s = run(sig2(ok["rate"] * 1.25))
        steps.append(s)
        if is_saturated(s):
            bad = s
            break
        ok = s
    if bad is None:
        raise RuntimeError(f"never saturated up to {ok['rate']} req/s")
    for _ in range(2):
        mid = run(sig2(math.sqrt(ok["rate"] * bad["rate"])))
        steps.append(mid)
        if mid["rate"] in (ok["rate"], bad["rate"]):
            break
        if is_saturated(mid):
            bad = mid
        else:
            ok = mid
    return ok["rate"], steps


def best_balancer(per_policy, key):
    """per_policy: {policy: [summary per seed]}. The balancer (of BALANCERS present) with the lowest median over
    seeds of `key`; ties go to the earlier of BALANCERS. Returns its name."""
    best = None
    for p in BALANCERS:
        if p not in per_policy:
            continue
        v = statistics.median(s[key] for s in per_policy[p])
        if best is None or v < best[0]:
            best = (v, p)
    if best is None:
        raise ValueError("no load balancer among the policies")
    return best[1]


def median_ci(values, level=0.95):
    """The distribution-free confidence interval of the median of iid samples: [x_(j), x_(n+1-j)] (order statistics,
    1-based) with the largest j whose coverage 1 - 2·P(Binomial(n, 1/2) <= j - 1) is >= level. Returns
    (low, high, coverage), or None when even [min, max] covers less than level (n < 6 at 0.95)."""
    v = sorted(values)
    n = len(v)
    best = None
    tail = 0  # 2^n · P(Binomial(n, 1/2) <= j - 1), exact (floats overflow at 2^1024)
    for j in range(1, n // 2 + 1):
        tail += math.comb(n, j - 1)
        coverage = 1 - 2 * tail / 2**n
        if coverage < level:
            break
        best = (v[j - 1], v[n - j], coverage)
    return best


def ratio_stats(values):
    """{median, min, max, n, ci} of the non-None values (None when there are none); ci: median_ci's [low, high] at
    95 %, or None for fewer than 6 values."""
    v = [x for x in values if x is not None]
    if not v:
        return None
    ci = median_ci(v)
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v),
            "ci": [ci[0], ci[1]] if ci else None}


def seed_ratios(runs, reference, value):
    """Per-seed ratios value(run) / value(reference run of the same seed). runs, reference: [summary] with a
    "sample" key each (the seed, or fold and seed) that pairs them. A missing or zero reference gives None."""
    ref = {r["sample"]: r for r in reference}
    out = []
    for r in runs:
        q = ref.get(r["sample"])
        a, b = (value(r), value(q)) if q is not None else (None, None)
        out.append(a / b if a is not None and b else None)
    return out


def matched_batch_ratio(policy_rows, reference_rows):
    """sum_b w_b * mean_p(b) / mean_ref(b) / sum_b w_b over batch sizes b both ran, w_b = the policy's steps at b.
    Rows: [{batch, steps, mean_distinct_experts}]. Returns (ratio, covered): covered = the share of the policy's
    steps at shared batch sizes; (None, 0.0) when none is shared."""
    ref = {r["batch"]: r["mean_distinct_experts"] for r in reference_rows
           if r["steps"] > 0 and r["mean_distinct_experts"] > 0}
    weighted = matched = total = 0.0
    for r in policy_rows:
        total += r["steps"]
        if r["batch"] in ref and r["steps"] > 0:
            weighted += r["steps"] * r["mean_distinct_experts"] / ref[r["batch"]]
            matched += r["steps"]
    return (weighted / matched if matched else None), (matched / total if total else 0.0)


def clairvoyant_fraction(policy_ratio, clairvoyant_ratio):
    """(1 - policy_ratio) / (1 - clairvoyant_ratio): the share of the clairvoyant router's median reduction
    against the best balancer that the policy reaches. None when the ceiling shows no reduction (ratio >= 0.995:
    nothing to reach) or a ratio is missing."""
    if policy_ratio is None or clairvoyant_ratio is None or clairvoyant_ratio >= 0.995:
        return None
    return (1 - policy_ratio) / (1 - clairvoyant_ratio)


def ablation_variants(paper_taus=(0, 0.05, 0.2, 0.4), paper_eps=(0.1, 0.25, 0.5), tail_eps=(0.1, 0.5),
                      tail_taus=(0.2, 0.4), lambdas=(0, 0.25, 0.5, 1)):
    """The rows of bench/eval's ablation part: [{name, policy, calib, args}], calib one of None (a load policy),
    "work" (balanced by decode work, `eldr calibrate`'s default), "count" (`--balance count`) or "decode" (the
    clairvoyant's calibration, simulated with --route-on decode); args: the `eldr simulate` overrides. The defaults
    keep their policy's name (eldr: λ 0.75; eldr_paper: the calibration's τ, 0.1, ε 0; eldr_tail: τ 0.1, ε 0 →
    0.25), each on its HOME_CALIBRATION; every other row changes exactly one setting of its default and is named by
    it (the other balance: "count-balanced" or "work-balanced")."""
    v = [dict(name=p, policy=p, calib=None, args=[]) for p in BALANCERS + ["domain"]]

    def family(policy, sweeps):
        home = HOME_CALIBRATION[policy]
        v.append(dict(name=policy, policy=policy, calib=home, args=[]))
        for opt, label, values in sweeps:
            v.extend(dict(name=f"{policy} {label}={x:g}", policy=policy, calib=home, args=[opt, repr(float(x))])
                     for x in values)
        other = OTHER_BALANCE[home]
        v.append(dict(name=f"{policy} {other}-balanced", policy=policy, calib=other, args=[]))

    family("eldr", [("--harm-weight", "λ", lambdas)])
    family("eldr_paper", [("--tau", "τ", paper_taus), ("--load-bound", "ε", paper_eps)])
    family("eldr_tail", [("--tau", "τ", tail_taus), ("--load-bound", "ε", tail_eps)])
    v.append(dict(name="clairvoyant", policy="eldr", calib="decode", args=["--route-on", "decode"]))
    return v


def union_gap_at(batch, gaps):
    """The same-domain vs mixed union gap (a fraction) at decode batch `batch`, from gaps {B: gap} measured at a few
    batch sizes (eldr trace stats): linear in log2 B between the measured sizes, through (1, 0) below the smallest
    (a batch of one has no union to shrink), the largest size's gap above it."""
    pts = [(1, 0.0)] + sorted((b, g) for b, g in gaps.items() if b > 1)
    if batch <= 1:
        return 0.0
    for (b0, g0), (b1, g1) in zip(pts, pts[1:]):
        if batch <= b1:
            t = (math.log2(batch) - math.log2(b0)) / (math.log2(b1) - math.log2(b0))
            return g0 + t * (g1 - g0)
    return pts[-1][1]


def locality_cap(cost, rows, context_per_seq, gaps):
    """The TPOT reduction a router could get from locality alone, at the batches a balancer runs: per batch size B,
    the share of a decode step spent on distinct experts, s_B = b·U_B / (a + b·U_B + c·B + d·B·ctx) (the cost model
    t = a + b·distinct + c·batch + d·context, U_B the balancer's mean distinct experts per step at B, ctx the mean
    context per sequence), times the union gap at B (union_gap_at); averaged over the balancer's steps weighted by
    the tokens they make (steps_B·B: TPOT is per token). cost: {a, b, c, d}; rows: metrics.json distinct_by_batch.
    Returns {cap, share} (share: the same token-weighted mean of s_B) or None without steps."""
    wsum = cap = share = 0.0
    for r in rows:
        B, n, U = r["batch"], r["steps"], r["mean_distinct_experts"]
        if n <= 0 or B <= 0:
            continue
        t = cost["a"] + cost["b"] * U + cost["c"] * B + cost["d"] * B * context_per_seq
        s = cost["b"] * U / t
        w = n * B
        wsum += w
        share += w * s
        cap += w * s * union_gap_at(B, gaps)
    if wsum == 0:
        return None
    return {"cap": cap / wsum, "share": share / wsum}
