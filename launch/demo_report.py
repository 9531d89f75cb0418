#!/usr/bin/python3
"""The last screen of launch/demo: the serve runs side by side, the cost model fitted to their steps, the
simulator's predictions (the fitted CPU model and an H200 model) and what the numbers say about eldr vs jsq.

  launch/demo_report.py --runs RUN_eldr RUN_jsq RUN_round_robin --fit fit.json \\
      --sim-cpu sim-cpu-eldr.json ... --sim-h200 sim-h200-eldr.json ... [--json out.json]

RUN_* are `eldr serve --output-dir` directories (metrics.json, steps.jsonl); fit.json is `eldr simulate --fit ...
--json`; the sim files are `eldr simulate --json`. Only the standard library (a fresh machine has no numpy).
"""
import argparse
import json
import os
import statistics
import sys


def fail(msg):
    print(f"demo_report: error: {msg}", file=sys.stderr)
    sys.exit(1)


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")


def load_steps(run_dir):
    path = os.path.join(run_dir, "steps.jsonl")
    try:
        with open(path) as f:
            steps = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")
    return [s for s in steps if s.get("kind") == "decode"]


def run_figures(run_dir):
    m = load_json(os.path.join(run_dir, "metrics.json"))
    steps = load_steps(run_dir)
    if not steps:
        fail(f"{run_dir}/steps.jsonl: no decode steps")
    by_batch = {}
    for s in steps:
        by_batch.setdefault(s["batch"], []).append(s["distinct_experts"])
    decoders = {}
    for s in steps:
        decoders.setdefault(s["worker"], []).append(s)
    cpu = sum(s.get("cpu_seconds", 0.0) for s in steps)
    wall = sum(s["seconds"] for s in steps)
    return {
        "policy": m.get("policy", os.path.basename(run_dir)),
        "median_tpot_ms": m.get("median_tpot_ms", float("nan")),
        "p99_tpot_ms": m.get("p99_tpot_ms", float("nan")),
        "median_ttft_ms": m.get("median_ttft_ms", float("nan")),
        "completed": m.get("completed", 0),
        "failed": m.get("failed", 0),
        "mean_batch": statistics.mean(s["batch"] for s in steps),
        "distinct_per_step": statistics.mean(s["distinct_experts"] for s in steps),
        "by_batch": {b: (len(v), statistics.mean(v)) for b, v in by_batch.items()},
        "decode_cpu_s": cpu,
        "wall_over_cpu": wall / cpu if cpu > 0 else float("nan"),
        "decoders": [(w, statistics.mean(s["batch"] for s in v), statistics.mean(s["context_tokens"] for s in v),
                      statistics.mean(s["distinct_experts"] for s in v)) for w, v in sorted(decoders.items())],
    }


def matched_distinct(runs, min_steps=5):
    """Mean distinct experts per step at matched batch: per batch size held by every run (>= min_steps steps
    each), the run's mean, weighted by the steps all runs have at that size. Returns ({policy: value}, sizes)."""
    common = None
    for r in runs:
        sizes = {b for b, (n, _) in r["by_batch"].items() if n >= min_steps}
        common = sizes if common is None else common & sizes
    common = sorted(common or [])
    if not common:
        return {}, []
    weight = {b: sum(r["by_batch"][b][0] for r in runs) for b in common}
    total = sum(weight.values())
    return {r["policy"]: sum(weight[b] * r["by_batch"][b][1] for b in common) / total for r in runs}, common


def pct(a, b):
    return 100.0 * (a / b - 1.0) if b else float("nan")


def table(title, names, rows):
    print(title)
    print(f"{'':34s}" + "".join(f"{n:>13s}" for n in names))
    for label, cells in rows:
        print(f"{label:34s}" + "".join(f"{c:>13s}" for c in cells))


def sim_figures(paths):
    out = {}
    for p in paths:
        m = load_json(p)
        out[m["policy"]] = m
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", required=True, help="eldr serve output directories")
    ap.add_argument("--fit", required=True, help="eldr simulate --fit ... --json output")
    ap.add_argument("--sim-cpu", nargs="*", default=[], help="eldr simulate --json outputs with the fitted model")
    ap.add_argument("--sim-h200", nargs="*", default=[], help="eldr simulate --json outputs with the H200 model")
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args()

    runs = [run_figures(d) for d in a.runs]
    names = [r["policy"] for r in runs]
    by = {r["policy"]: r for r in runs}
    matched, sizes = matched_distinct(runs)
    rows = [
        ("completed / failed", [f"{r['completed']} / {r['failed']}" for r in runs]),
        ("median TPOT (ms)", [f"{r['median_tpot_ms']:.2f}" for r in runs]),
        ("p99 TPOT (ms)", [f"{r['p99_tpot_ms']:.2f}" for r in runs]),
        ("median TTFT (ms)", [f"{r['median_ttft_ms']:.1f}" for r in runs]),
        ("mean decode batch", [f"{r['mean_batch']:.2f}" for r in runs]),
        ("distinct experts / step", [f"{r['distinct_per_step']:.1f}" for r in runs]),
        ("  at matched batch", [f"{matched.get(r['policy'], float('nan')):.1f}" for r in runs]),
        ("decode CPU (s, all steps)", [f"{r['decode_cpu_s']:.1f}" for r in runs]),
        ("step wall / CPU time", [f"{r['wall_over_cpu']:.2f}" for r in runs]),
    ]
    table("serve on this machine (same workload, arrivals and seed):", names, rows)
    for r in runs:
        per = ", ".join(f"decoder {w}: batch {b:.1f}, context {c:.0f}, distinct {e:.0f}" for w, b, c, e in r["decoders"])
        print(f"  {r['policy']:12s} {per}")
    if sizes:
        print(f"  (matched batch: the mean over batch sizes {sizes[0]}..{sizes[-1]} held by every run, weighted by "
              "their steps)")

    fit = load_json(a.fit)
    wb = fit.get("within_batch", {})
    dec = fit["decode"]
    print()
    print("cost model fitted to the three runs' steps (eldr simulate --fit, CPU time per step, non-negative least "
          "squares):")
    print(f"  decode step = a {dec['a'] * 1e3:.3f} ms + b {dec['b'] * 1e6:.2f} us x distinct experts + "
          f"c {dec['c'] * 1e6:.1f} us x sequences + d {dec['d'] * 1e9:.0f} ns x context tokens;  "
          f"R^2 = {fit['decode_r2']:.3f} over {fit['decode_samples']} steps")
    print(f"  at a fixed batch (steps grouped by run, decoder and batch size, context partialled out): "
          f"b = {wb.get('b', 0) * 1e6:.2f} "
          f"+- {wb.get('b_se', 0) * 1e6:.2f} us (t = {wb.get('t', 0):.1f}), partial r = {wb.get('partial_r', 0):.2f}, "
          f"from {100 * wb.get('within_share', 0):.1f}% of the distinct experts' variance")
    identified = dec["b"] > 0 and fit["decode_r2"] >= 0.8 and wb.get("t", 0) >= 3 and wb.get("b", 0) > 0
    base = by.get("jsq", runs[-1])
    mean_step = dec["a"] + dec["b"] * base["distinct_per_step"] + dec["c"] * base["mean_batch"]
    ctx = statistics.mean(c for _, _, c, _ in base["decoders"])
    mean_step += dec["d"] * ctx
    share = dec["b"] * base["distinct_per_step"] / mean_step if mean_step > 0 else 0.0
    print(f"  a {base['policy']} step (batch {base['mean_batch']:.1f}, {base['distinct_per_step']:.0f} distinct "
          f"experts, context {ctx:.0f}) is {mean_step * 1e3:.2f} ms by this model, {100 * share:.0f}% of it experts")

    sims = []
    for label, paths in (("this CPU as if quiet (the fitted model, 2 shared cores)", a.sim_cpu),
                         ("H200 (configs/costs/h200-deepseek-v2-lite.yaml, a GPU per rank)", a.sim_h200)):
        s = sim_figures(paths)
        if not s:
            continue
        sims.append((label, s))
        print()
        order = [n for n in names if n in s]
        rows = [("median TPOT (ms)", [f"{s[n]['median_tpot_ms']:.3f}" for n in order]),
                ("p99 TPOT (ms)", [f"{s[n]['p99_tpot_ms']:.3f}" for n in order]),
                ("distinct experts / step", [f"{s[n]['mean_distinct_experts_per_step']:.1f}" for n in order])]
        table(f"eldr simulate, same job and workload, {label}:", order, rows)
        if "eldr" in s and "jsq" in s:
            print(f"  eldr vs jsq: median {pct(s['eldr']['median_tpot_ms'], s['jsq']['median_tpot_ms']):+.1f}%, "
                  f"p99 {pct(s['eldr']['p99_tpot_ms'], s['jsq']['p99_tpot_ms']):+.1f}%")

    print()
    print("what the numbers say:")
    if identified:
        print(f"  - a decode step's time grows with its distinct experts at a fixed batch (b = "
              f"{wb['b'] * 1e6:.1f} +- {wb['b_se'] * 1e6:.1f} us per expert, t = {wb['t']:.1f}; pooled b "
              f"{dec['b'] * 1e6:.1f} us, R^2 {fit['decode_r2']:.2f}).")
    else:
        print(f"  - the fit does NOT identify a per-expert cost (b = {dec['b'] * 1e6:.2f} us, R^2 "
              f"{fit['decode_r2']:.2f}, at a fixed batch b = {wb.get('b', 0) * 1e6:.2f} +- "
              f"{wb.get('b_se', 0) * 1e6:.2f} us): no router can change TPOT through distinct experts here.")
    result = {"runs": runs, "matched_distinct": matched, "fit": fit, "expert_share": share}
    if "eldr" in by and "jsq" in by:
        e, j = by["eldr"], by["jsq"]
        gap = pct(matched.get("eldr", float("nan")), matched.get("jsq", float("nan")))
        med, p99 = pct(e["median_tpot_ms"], j["median_tpot_ms"]), pct(e["p99_tpot_ms"], j["p99_tpot_ms"])
        expect = share * gap
        result.update({"eldr_vs_jsq_median_pct": med, "eldr_vs_jsq_p99_pct": p99, "matched_distinct_gap_pct": gap,
                       "expected_tpot_pct": expect})
        print(f"  - eldr's steps touch {gap:+.1f}% distinct experts vs jsq at matched batch; with experts "
              f"{100 * share:.0f}% of a step that is worth about {expect:+.1f}% TPOT.")
        print(f"  - measured here: eldr vs jsq median TPOT {med:+.1f}%, p99 {p99:+.1f}% (decode CPU "
              f"{pct(e['decode_cpu_s'], j['decode_cpu_s']):+.1f}%).")
        ecx = [c for _, _, c, _ in e["decoders"]]
        ebt = [b for _, b, _, _ in e["decoders"]]
        # Two load balancers without locality: how far apart they land is this run's noise.
        rr = by.get("round_robin")
        noise = abs(pct(rr["median_tpot_ms"], j["median_tpot_ms"])) if rr else 0.0
        if rr:
            print(f"  - round_robin vs jsq, two balancers without locality: median {pct(rr['median_tpot_ms'], j['median_tpot_ms']):+.1f}%, "
                  f"p99 {pct(rr['p99_tpot_ms'], j['p99_tpot_ms']):+.1f}%: the noise of one run here.")
        result["balancer_spread_pct"] = noise
        if med < 0 and -med > noise:
            print(f"  - eldr wins here, beyond the spread between the balancers (the fit's share of experts expects "
                  f"{expect:+.1f}%; decode CPU, the work done, {pct(e['decode_cpu_s'], j['decode_cpu_s']):+.1f}%).")
        else:
            verdict = "is faster, but by less than the balancers differ by" if med < 0 else "does not win"
            print(f"  - eldr {verdict} on this machine. Why, in the fitted numbers:")
            print(f"    * the effect is small on a CPU: {100 * share:.0f}% of a step is experts (c = "
                  f"{dec['c'] * 1e6:.0f} us per sequence and d = {dec['d'] * 1e9:.0f} ns per context token are "
                  f"the rest), so about {expect:+.1f}% at best;")
            if len(ecx) > 1 and max(ecx) > 1.3 * min(ecx):
                print(f"    * eldr's decoders hold unequal contexts ({', '.join(f'{c:.0f}' for c in ecx)} tokens: "
                      f"the long domains share a cluster), costing {dec['d'] * 1e3 * (max(ecx) - min(ecx)):.2f} ms "
                      "per step on the longer one;")
            if len(ebt) > 1 and max(ebt) > 1.25 * min(ebt):
                print(f"    * eldr's decoder batches are unequal ({', '.join(f'{b:.1f}' for b in ebt)});")
            print(f"    * a step's wall time is {e['wall_over_cpu']:.1f}x / {j['wall_over_cpu']:.1f}x its CPU time "
                  "(eldr / jsq runs): the ranks and any other work on this machine share its cores, and that varies "
                  "from run to run by more than the effect. The H200 prediction above has no such noise.")
    for label, s in sims:
        if "eldr" in s and "jsq" in s:
            result.setdefault("simulated", {})[label] = {
                "median_pct": pct(s["eldr"]["median_tpot_ms"], s["jsq"]["median_tpot_ms"]),
                "p99_pct": pct(s["eldr"]["p99_tpot_ms"], s["jsq"]["p99_tpot_ms"])}
    if a.json:  # written whole or not at all
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1, default=str)
        os.replace(tmp, a.json)


if __name__ == "__main__":
    main()
