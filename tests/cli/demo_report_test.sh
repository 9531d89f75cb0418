#!/usr/bin/env bash
# launch/demo_report.py (the last screen of launch/demo) on hand-made serve outputs: distinct experts at matched
# batch, the eldr vs jsq figures and the verdict, and bad input as one line with no output file.
# Usage: demo_report_test.sh /path/to/source
set -u
SRC="$1"
PY=/usr/bin/python3
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
source "$SRC/tests/lib.sh"
REPORT="$SRC/launch/demo_report.py"

# Three runs. eldr: batch 2 → 100 distinct, batch 4 → 180 (5 steps each); jsq: 120, 200, and 5 steps at batch 6
# (300) that no other run has; round_robin: 120, 200. Matched batch = sizes {2, 4}, 15 steps each:
# eldr (100 + 180)/2 = 140, jsq and round_robin 160 → eldr −12.5 %. TPOT: eldr 9, jsq 10, round_robin 10.2 ms.
$PY - <<'PY'
import json, os
runs = {"eldr": ({2: 100, 4: 180}, 9.0, 18.0), "jsq": ({2: 120, 4: 200, 6: 300}, 10.0, 20.0),
        "round_robin": ({2: 120, 4: 200}, 10.2, 20.0)}
for policy, (by_batch, median, p99) in runs.items():
    os.makedirs(policy)
    json.dump({"policy": policy, "median_tpot_ms": median, "p99_tpot_ms": p99, "median_ttft_ms": 5.0,
               "completed": 10, "failed": 0}, open(f"{policy}/metrics.json", "w"))
    with open(f"{policy}/steps.jsonl", "w") as f:
        for batch, distinct in by_batch.items():
            for i in range(5):
                f.write(json.dumps({"kind": "decode", "worker": i % 2, "time": 0, "seconds": 0.02, "cpu_seconds": 0.01,
                                    "batch": batch, "distinct_experts": distinct, "context_tokens": 100}) + "\n")
        f.write(json.dumps({"kind": "prefill", "worker": 0, "time": 0, "seconds": 0.1, "prompt_tokens": 9}) + "\n")
json.dump({"decode": {"a": 1e-3, "b": 2e-5, "c": 1e-4, "d": 0.0}, "decode_r2": 0.9, "decode_samples": 45,
           "within_batch": {"steps": 45, "groups": 3, "b": 2e-5, "b_se": 1e-6, "t": 20.0, "d": 0.0,
                            "partial_r": 0.5, "within_share": 0.01}}, open("fit.json", "w"))
PY
run_ok "report" $PY "$REPORT" --runs eldr jsq round_robin --fit fit.json --json report.json
$PY -c "
import json
r = json.load(open('report.json'))
m = r['matched_distinct']
assert abs(m['eldr'] - 140) < 1e-9 and abs(m['jsq'] - 160) < 1e-9 and abs(m['round_robin'] - 160) < 1e-9, m
assert abs(r['matched_distinct_gap_pct'] + 12.5) < 1e-9, r['matched_distinct_gap_pct']
assert abs(r['eldr_vs_jsq_median_pct'] + 10) < 1e-9 and abs(r['eldr_vs_jsq_p99_pct'] + 10) < 1e-9
assert abs(r['balancer_spread_pct'] - 2) < 1e-9, r['balancer_spread_pct']
# jsq's step by the model: 1 ms + 20 us x 206.67 (its mean over 15 steps) + 100 us x 4 = 5.533 ms, experts 74.7 %.
assert abs(r['expert_share'] - 2e-5 * 620 / 3 / (1e-3 + 2e-5 * 620 / 3 + 4e-4)) < 1e-12, r['expert_share']
" && ok "matched batch, ratios and expert share by hand" || bad "matched batch, ratios and expert share by hand" "$(cat report.json)"
grep -q "eldr wins here, beyond the spread between the balancers" out.txt && grep -q "b = 20.0 +- 1.0 us per expert" out.txt &&
  ok "verdict: a win beyond the balancers' spread" || bad "verdict: a win beyond the balancers' spread" "$(tail -8 out.txt)"

# Within the spread: round_robin 8 ms (−20 % vs jsq), eldr −10 %: not a win.
sed -i 's/"median_tpot_ms": 10.2/"median_tpot_ms": 8.0/' round_robin/metrics.json
run_ok "report, noisy run" $PY "$REPORT" --runs eldr jsq round_robin --fit fit.json
grep -q "eldr is faster, but by less than the balancers differ by" out.txt &&
  ok "verdict: within the balancers' spread" || bad "verdict: within the balancers' spread" "$(tail -8 out.txt)"

expect_error "missing run" "demo_report: error: nope/metrics.json" report2.json \
  $PY "$REPORT" --runs eldr nope --fit fit.json --json report2.json
finish
