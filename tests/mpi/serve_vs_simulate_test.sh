#!/usr/bin/env bash
# The same Frontend (runtime/job/frontend.h) routes for `eldr serve` and `eldr simulate`: one job config, one
# workload, run by both; every request must go to the same decoder and metrics.json must carry the same routing
# statistics (per decoder: index, leader rank, requests; τ, mean band size, fallbacks). The policies are the
# reproducible ones of runtime/serve/serve.h, so serve's decisions do not depend on its timing: round_robin and
# locality_top1 with 1 prefill rank at request_rate inf, and eldr one request at a time (max_concurrency 1).
# Usage: serve_vs_simulate_test.sh /path/to/eldr /path/to/source
set -u
ELDR="$1"
SRC="$2"
PY=/usr/bin/python3
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
export ELDR_NUM_THREADS=1
MPIRUN=(timeout -k 5 300 mpirun --oversubscribe -x ELDR_NUM_THREADS)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
source "$SRC/tests/lib.sh"

"$ELDR" trace synth --domains 3 --requests 24 --layers 2 --experts 8 --top-k 2 --prompt-len 8:24 --output-len 1:10 \
  --seed 7 --out trace.h5 >/dev/null
"$ELDR" calibrate --trace trace.h5 -K 2 --out calib2.h5 --quiet

job() {  # job NAME POLICY REQUEST_RATE MAX_CONCURRENCY
  cat > "$1.yaml" <<YAML
topology: {prefill_ranks: 1, decode_ranks: 2}
model: {config: $SRC/configs/models/tiny.yaml, weights: synthetic, seed: 0, gate: replay}
routing: {policy: $2, calibration: $WORK/calib2.h5, tau: 0.1, seed: 1}
kv_cache: {block_size: 4, prefill_blocks: 64, decode_blocks: 24}
decode: {max_batch: 4}
workload: {trace: $WORK/trace.h5, request_rate: $3, max_concurrency: $4, seed: 3}
output: {dir: $WORK/out-$1}
watchdog_s: 60
simulate:
  decode: {a: 2.0e-3, b: 1.0e-4, c: 1.0e-5, d: 1.0e-7}
  prefill: {a: 1.0e-3, b: 1.0e-5}
  kv_transfer: {latency_s: 1.0e-4, bandwidth_Bps: 1.0e9}
  control_latency_s: 5.0e-5
YAML
}

same_routing() {  # SERVE_DIR SIM_DIR
  $PY - "$1" "$2" <<'PYEOF'
import json, sys
serve, sim = sys.argv[1], sys.argv[2]
def requests(d):
    return {r["id"]: r for r in map(json.loads, open(d + "/requests.jsonl"))}
a, b = requests(serve), requests(sim)
assert len(a) == 24 and set(a) == set(b), (len(a), len(b))
assert all(r["success"] for r in a.values()) and all(r["success"] for r in b.values())
diff = [i for i in a if a[i]["decoder"] != b[i]["decoder"]]
assert not diff, "decoders differ for " + ", ".join(diff)
assert len({r["decoder"] for r in a.values()}) == 2, "both decoders used"
ma, mb = json.load(open(serve + "/metrics.json")), json.load(open(sim + "/metrics.json"))
assert mb.get("simulated") is True and "simulated" not in ma
for k in ("policy", "tau", "mean_band_size", "fallbacks", "completed", "failed"):
    assert ma[k] == mb[k], (k, ma[k], mb[k])
key = lambda d: (d["decoder"], d["leader_rank"], d["requests"])
assert [key(d) for d in ma["decoders"]] == [key(d) for d in mb["decoders"]], (ma["decoders"], mb["decoders"])
assert [d["leader_rank"] for d in ma["decoders"]] == [2, 3], ma["decoders"]  # 1 + P + k
print("%s: %d requests, decoders %s, mean band %.3f, fallbacks %d" % (
    ma["policy"], len(a), [d["requests"] for d in ma["decoders"]], ma["mean_band_size"], ma["fallbacks"]))
PYEOF
}

for spec in "round_robin inf 0" "locality_top1 inf 0" "eldr 200 1"; do
  set -- $spec
  name="$1-$3"
  job "$name" "$1" "$2" "$3"
  if ! "${MPIRUN[@]}" -np 4 "$ELDR" serve -c "$name.yaml" --quiet >"$name.serve.log" 2>&1; then
    bad "$1: serve" "$(tail -3 "$name.serve.log")"; continue
  fi
  if ! "$ELDR" simulate -c "$name.yaml" --output-dir "$WORK/out-$name-sim" --quiet >"$name.sim.log" 2>&1; then
    bad "$1: simulate" "$(tail -3 "$name.sim.log")"; continue
  fi
  if out=$(same_routing "$WORK/out-$name" "$WORK/out-$name-sim" 2>&1); then
    ok "serve and simulate route alike: $out"
  else bad "serve and simulate route alike ($1, max_concurrency $3)" "$(echo "$out" | tail -2)"; fi
done
finish
