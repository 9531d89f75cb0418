#!/usr/bin/env bash
# Paired A/B of the routing benchmarks: OLD (another build's router_bench) against this tree's build/bench/router_bench,
# ROUNDS alternating rounds, so both binaries see the same spells of this shared VM. Prints, per benchmark, the
# medians over rounds of each binary's p50 / p99 and the median (min-max) of the per-round new/old ratios.
# Usage: bench/router_ab.sh OLD_ROUTER_BENCH [ROUNDS=5] [FILTER]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OLD="${1:?usage: bench/router_ab.sh OLD_ROUTER_BENCH [ROUNDS] [FILTER]}"
ROUNDS="${2:-5}"
FILTER="${3:-BM_RouteEndToEnd/K:(16|40)/layers:48/eldr:(0|1)|BM_RouteDecision/K:40/layers:48|BM_RouteDecisionEldr/K:40/layers:48/sigs:64}"
NEW="$ROOT/build/bench/router_bench"
[ -x "$OLD" ] || { echo "router_ab: $OLD is not an executable router_bench" >&2; exit 1; }
[ -x "$NEW" ] || { echo "router_ab: $NEW missing: run launch/build first" >&2; exit 1; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
for r in $(seq 1 "$ROUNDS"); do
  "$OLD" --benchmark_filter="$FILTER" --benchmark_min_time=0.3 --benchmark_format=json 2>/dev/null >"$TMP/old-$r.json"
  "$NEW" --benchmark_filter="$FILTER" --benchmark_min_time=0.3 --benchmark_format=json 2>/dev/null >"$TMP/new-$r.json"
done
python3 - "$TMP" "$ROUNDS" <<'PY'
import json, statistics as st, sys
tmp, n = sys.argv[1], int(sys.argv[2])
rows = {}
for r in range(1, n + 1):
    old = {x["name"]: x for x in json.load(open(f"{tmp}/old-{r}.json"))["benchmarks"]}
    new = {x["name"]: x for x in json.load(open(f"{tmp}/new-{r}.json"))["benchmarks"]}
    for k in old:
        if k in new:
            rows.setdefault(k, []).append((old[k]["p50_us"], new[k]["p50_us"], old[k]["p99_us"], new[k]["p99_us"]))
print(f"{'benchmark':46} {'old p50':>8} {'new p50':>8} {'new/old (min-max)':>20} {'old p99':>8} {'new p99':>8} {'new/old':>7}")
for k, v in rows.items():
    r50 = [b / a for a, b, _, _ in v]
    r99 = [d / c for _, _, c, d in v]
    med = lambda i: st.median(x[i] for x in v)
    print(f"{k:46} {med(0):8.1f} {med(1):8.1f} {st.median(r50):6.2f} ({min(r50):.2f}-{max(r50):.2f}) "
          f"{med(2):8.1f} {med(3):8.1f} {st.median(r99):7.2f}")
PY
