#!/usr/bin/python3
"""Side-by-side table of eldr serve metrics JSON files: launch/compare.py run-a/metrics.json run-b/metrics.json ..."""
import json
import sys

ROWS = [("completed", "completed", 0), ("failed", "failed", 0), ("median TPOT (ms)", "median_tpot_ms", 2),
        ("p99 TPOT (ms)", "p99_tpot_ms", 2), ("mean TPOT (ms)", "mean_tpot_ms", 2),
        ("median TTFT (ms)", "median_ttft_ms", 1), ("p99 TTFT (ms)", "p99_ttft_ms", 1),
        ("output tok/s", "output_throughput", 1), ("distinct experts / step", "mean_distinct_experts_per_step", 1),
        ("distinct experts / token", "distinct_experts_per_token", 2)]


def main():
    runs = []
    for path in sys.argv[1:]:
        try:
            with open(path) as f:
                runs.append(json.load(f))
        except (OSError, ValueError) as e:
            sys.exit(f"compare: {path}: {e}")
    if not runs:
        sys.exit("usage: launch/compare.py metrics.json [metrics.json ...]")
    names = [r.get("policy", "?") for r in runs]
    print(f"{'':26s}" + "".join(f"{n:>14s}" for n in names))
    for label, key, dec in ROWS:
        cells = "".join(f"{r.get(key, float('nan')):>14.{dec}f}" for r in runs)
        print(f"{label:26s}{cells}")
    base = runs[-1]
    for r in runs[:-1]:
        for key in ("median_tpot_ms", "p99_tpot_ms"):
            if base.get(key):
                print(f"{r['policy']} vs {base['policy']} {key}: {100.0 * (r[key] / base[key] - 1):+.1f}%")


if __name__ == "__main__":
    main()
