#!/usr/bin/env bash
# End-to-end tests of `eldr simulate`: the metrics JSON and per-request JSONL of a job config, determinism,
# the cost-model fit from serve step logs and from moe_layer_bench JSON, the shipped derived H200 models,
# scale (512 decoders), and bad input (one line on stderr, non-zero exit, no output file).
# Usage: simulate_test.sh /path/to/eldr /path/to/source
set -u
ELDR="$1"
SRC="$2"
PY=/usr/bin/python3
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
source "$SRC/tests/lib.sh"

"$ELDR" simulate --help | grep -q -- "--fit" && ok "simulate --help" || bad "simulate --help"

# A tiny-model job: 3 domains, 3 decoders, an inline cost model.
"$ELDR" trace synth --domains 3 --requests 90 --layers 2 --experts 8 --top-k 2 --prompt-len 8:24 --output-len 4:12 \
  --seed 2 --out trace.h5 >/dev/null
"$ELDR" calibrate --trace trace.h5 -K 3 --out cal3.h5 --quiet
cat > job.yaml <<YAML
topology: {prefill_ranks: 1, decode_ranks: 3}
model: {config: $SRC/configs/models/tiny.yaml, weights: synthetic, gate: replay}
routing: {policy: eldr, tau: 0.1, calibration: cal3.h5}
kv_cache: {block_size: 4, prefill_blocks: 256, decode_blocks: 256}
decode: {max_batch: 8}
workload: {trace: trace.h5, num_requests: 300, request_rate: 50, seed: 1}
output: {dir: run}
simulate:
  decode: {a: 2.0e-3, b: 1.0e-4, c: 1.0e-5, d: 1.0e-7}
  prefill: {a: 1.0e-3, b: 1.0e-5}
  kv_transfer: {latency_s: 1.0e-4, bandwidth_Bps: 1.0e9}
  control_latency_s: 5.0e-5
YAML
run_ok "simulate the job" "$ELDR" simulate -c job.yaml --quiet
$PY - <<'PY' && ok "metrics.json: vLLM keys, every request completed, per-decoder figures" || bad "metrics.json content"
import json
m = json.load(open("run/metrics.json"))
need = ["completed", "failed", "request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms",
        "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms",
        "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms", "policy", "tau",
        "mean_distinct_experts_per_step", "decoders"]
missing = [k for k in need if k not in m]
assert not missing, missing
assert m["completed"] == 300 and m["failed"] == 0, (m["completed"], m["failed"])
assert m["simulated"] is True and m["policy"] == "eldr" and abs(m["tau"] - 0.1) < 1e-12
assert sum(d["requests"] for d in m["decoders"]) == 300
assert len(open("run/requests.jsonl").read().splitlines()) == 300
# the step model's floor: every TPOT is at least a + b*(top_k per layer * layers) + c
assert m["median_tpot_ms"] >= (2e-3 + 1e-4 * 4 + 1e-5) * 1e3
PY
"$ELDR" simulate -c job.yaml --json --no-output > a.json && "$ELDR" simulate -c job.yaml --json --no-output > b.json
$PY -c "
import json
a, b = json.load(open('a.json')), json.load(open('b.json'))
for m in (a, b): m.pop('wall_seconds'); m.pop('date')  # provenance: the second it ran
assert a == b
" && ok "same config, same metrics" || bad "same config, same metrics"
for p in random round_robin jsq p2c domain locality_top1; do
  "$ELDR" simulate -c job.yaml --policy $p --json --no-output > p.json 2>err.txt &&
    $PY -c "import json; m = json.load(open('p.json')); assert m['completed'] == 300 and m['policy'] == '$p'" &&
    ok "policy $p" || bad "policy $p" "$(cat err.txt)"
done

# metrics.json's per_domain and distinct_by_batch account for every request and every decode step.
$PY - <<'PY' && ok "metrics.json: per_domain and distinct_by_batch" || bad "metrics.json: per_domain and distinct_by_batch"
import json
m = json.load(open("run/metrics.json"))
assert sum(d["requests"] for d in m["per_domain"].values()) == 300, m["per_domain"]
assert sum(d["completed"] for d in m["per_domain"].values()) == 300
rows = m["distinct_by_batch"]
assert [r["batch"] for r in rows] == sorted(r["batch"] for r in rows) and all(r["batch"] >= 1 for r in rows)
assert sum(r["steps"] for r in rows) == sum(d["steps"] for d in m["decoders"])
mean = sum(r["steps"] * r["mean_distinct_experts"] for r in rows) / sum(r["steps"] for r in rows)
assert abs(mean - m["mean_distinct_experts_per_step"]) < 1e-9 * mean
assert m["route_on"] == "prefill"
PY

# The clairvoyant ceiling: a decode-token calibration only with --route-on decode, and the other way round.
run_ok "calibrate --features decode" "$ELDR" calibrate --trace trace.h5 -K 3 --features decode --out cal3d.h5 --quiet
run_ok "simulate --route-on decode" "$ELDR" simulate -c job.yaml --calib cal3d.h5 --route-on decode --no-output --quiet
expect_error "a decode calibration without --route-on decode" "cal3d.h5: fitted on decode tokens .*--route-on decode" - \
  "$ELDR" simulate -c job.yaml --calib cal3d.h5 --no-output --quiet
expect_error "--route-on decode with a prefill calibration" "cal3.h5: fitted on prefill tokens; .*--features decode" - \
  "$ELDR" simulate -c job.yaml --route-on decode --no-output --quiet
expect_error "--route-on bogus" "--route-on 'bogus' must be prefill or decode" - \
  "$ELDR" simulate -c job.yaml --route-on bogus --no-output --quiet
expect_error "--features bogus" "signature features 'bogus' must be prefill or decode" cal3x.h5 \
  "$ELDR" calibrate --trace trace.h5 -K 3 --features bogus --out cal3x.h5 --quiet
"$ELDR" inspect cal3d.h5 --json | $PY -c "import json, sys; assert json.load(sys.stdin)['features'] == 'decode'" &&
  ok "inspect shows the decode features" || bad "inspect shows the decode features"

# --fit from a serve step log with known coefficients (the tiny model: 2 MoE layers).
$PY - <<'PY'
with open("steps.jsonl", "w") as f:
    for i in range(60):
        d, b, c = 4 + i % 13, 1 + i % 7, 50 + 11 * i
        f.write('{"kind":"decode","worker":0,"time":0,"seconds":%r,"batch":%d,"distinct_experts":%d,"context_tokens":%d}\n'
                % (1e-3 + 5e-5 * d + 2e-4 * b + 3e-7 * c, b, d, c))
        f.write('{"kind":"prefill","worker":0,"time":0,"seconds":%r,"prompt_tokens":%d}\n' % (4e-3 + 2e-5 * (i + 1), i + 1))
PY
run_ok "fit to a step log" "$ELDR" simulate --fit steps.jsonl --model "$SRC/configs/models/tiny.yaml" -o fit.yaml
grep -qE "decode: \{a: 0.001, b: 5e-05, c: 0.0002, d: 3e-07\}" fit.yaml && grep -qE "prefill: \{a: 0.004, b: 2e-05\}" fit.yaml &&
  ok "fit recovers the coefficients" || bad "fit recovers the coefficients" "$(cat fit.yaml)"
run_ok "simulate with the fitted model" "$ELDR" simulate -c job.yaml --cost-model fit.yaml --no-output --quiet
# --json carries b at a fixed batch: in this log distinct experts vary at every batch size, the time is exact, so
# the within-batch slope is the generating 5e-05 s and the partial correlation 1; 60 steps over 7 batch sizes of
# one worker: 7 groups.
"$ELDR" simulate --fit steps.jsonl --model "$SRC/configs/models/tiny.yaml" --json -o fitw.json 2>err.txt &&
  grep -q "within batch sizes (60 steps in 7 groups of one worker's batch size" err.txt && $PY -c "
import json
w = json.load(open('fitw.json'))['within_batch']
assert w['steps'] == 60 and w['groups'] == 7, w
assert abs(w['b'] - 5e-5) < 1e-12 and abs(w['d'] - 3e-7) < 1e-13 and abs(w['partial_r'] - 1) < 1e-9, w
" && ok "fit --json: b at a fixed batch" || bad "fit --json: b at a fixed batch" "$(cat err.txt fitw.json)"

# A design that cannot separate two terms was fitted with R^2 1.000 and an arbitrary split between them (distinct
# experts exactly 50 per sequence: b vs c). Refused in one line naming the coefficients, the relation and the data
# that would identify them; a design that is nearly but not exactly collinear still fits.
collinear() {  # collinear FILE DISTINCT_EXPR BATCH_EXPR CONTEXT_EXPR PROMPT_EXPR (python expressions of i)
  $PY - "$@" <<'PY'
import sys
path, de, be, ce, pe = sys.argv[1:]
with open(path, "w") as f:
    for i in range(60):
        d, b, c, p = eval(de), eval(be), eval(ce), eval(pe)
        f.write('{"kind":"decode","worker":0,"time":0,"seconds":%r,"batch":%d,"distinct_experts":%d,"context_tokens":%d}\n'
                % (1e-3 + 5e-5 * d + 2e-4 * b + 3e-7 * c, b, d, c))
        f.write('{"kind":"prefill","worker":0,"time":0,"seconds":%r,"prompt_tokens":%d}\n' % (4e-3 + 2e-5 * p, p))
PY
}
collinear prop.jsonl "50 * (1 + i % 7)" "1 + i % 7" "50 + 11 * i" "i + 1"
expect_error "fit: distinct experts = 50 x batch" \
  "error: the decode steps cannot tell decode.b \(s per distinct expert\) from decode.c \(s per sequence\): distinct experts = 50·batch in all 60 of them \(a collinear design: every split between these terms fits equally well\); add decode steps where the distinct experts vary at a fixed batch \(e.g. same-domain and mixed batches of one size\)$" \
  fitc.yaml "$ELDR" simulate --fit prop.jsonl --model "$SRC/configs/models/deepseek-v2-lite.yaml" -o fitc.yaml
collinear affine.jsonl "3 + 2 * (1 + i % 7)" "1 + i % 7" "50 + 11 * i" "i + 1"
expect_error "fit: distinct experts = 3 + 2 x batch" \
  "error: the decode steps cannot tell decode.a \(s per step\), decode.b \(s per distinct expert\) and decode.c \(s per sequence\) apart: distinct experts = 3 \+ 2·batch in all 60 of them" \
  fitc.yaml "$ELDR" simulate --fit affine.jsonl --model "$SRC/configs/models/deepseek-v2-lite.yaml" -o fitc.yaml
collinear onebatch.jsonl "4 + i % 13" "4" "50 + 11 * i" "i + 1"
expect_error "fit: one batch size" \
  "error: the decode steps cannot tell decode.a \(s per step\) from decode.c \(s per sequence\): batch = 4 in all 60 of them .*; add decode steps where the batch varies$" \
  fitc.yaml "$ELDR" simulate --fit onebatch.jsonl --model "$SRC/configs/models/deepseek-v2-lite.yaml" -o fitc.yaml
collinear ctx.jsonl "4 + i % 13" "1 + i % 7" "100 * (1 + i % 7)" "i + 1"
expect_error "fit: context = 100 x batch" \
  "error: the decode steps cannot tell decode.c \(s per sequence\) from decode.d \(s per context token\): context tokens = 100·batch in all 60 of them .*; add decode steps where the context tokens vary at a fixed batch$" \
  fitc.yaml "$ELDR" simulate --fit ctx.jsonl --model "$SRC/configs/models/deepseek-v2-lite.yaml" -o fitc.yaml
collinear prompt.jsonl "4 + i % 13" "1 + i % 7" "50 + 11 * i" "16"
expect_error "fit: one prompt length" \
  "error: the prefills cannot tell prefill.a \(s per prefill\) from prefill.b \(s per computed prompt token\): computed prompt tokens = 16 in all 60 of them .*; add prefills where the computed prompt tokens vary, or give prefill.a and prefill.b with --prefill-from COST.yaml$" \
  fitc.yaml "$ELDR" simulate --fit prompt.jsonl --model "$SRC/configs/models/deepseek-v2-lite.yaml" -o fitc.yaml
printf 'decode: {a: 0.01, b: 0.01, c: 0.01, d: 0.01}\nprefill: {a: 0.007, b: 4e-06}\n' > prefill-cost.yaml
run_ok "fit: one prompt length, prefill terms given by --prefill-from" \
  "$ELDR" simulate --fit prompt.jsonl --model "$SRC/configs/models/deepseek-v2-lite.yaml" --prefill-from prefill-cost.yaml -o fitp.yaml
grep -qE "decode: \{a: 0.001, b: 5e-05, c: 0.0002, d: 3e-07\}" fitp.yaml && grep -qE "prefill: \{a: 0.007, b: 4e-06\}" fitp.yaml &&
  grep -q "prefill given by prefill-cost.yaml" fitp.yaml && ok "--prefill-from: decode fitted, prefill as given" ||
  bad "--prefill-from: decode fitted, prefill as given" "$(cat fitp.yaml)"
expect_error "--prefill-from as the output" \
  "error: prefill-cost.yaml: --out is the same file as the input --prefill-from" \
  - "$ELDR" simulate --fit prompt.jsonl --model "$SRC/configs/models/deepseek-v2-lite.yaml" --prefill-from prefill-cost.yaml -o prefill-cost.yaml
grep -q "prefill: {a: 0.007, b: 4e-06}" prefill-cost.yaml && ok "--prefill-from kept when named as the output" ||
  bad "--prefill-from kept when named as the output" "$(cat prefill-cost.yaml)"
expect_error "--prefill-from without --fit" "error: --prefill-from applies only with --fit" \
  - "$ELDR" simulate --derive h200 --model "$SRC/configs/models/tiny.yaml" --prefill-from prefill-cost.yaml
collinear near.jsonl "50 * (1 + i % 7) + (i % 3 == 0)" "1 + i % 7" "50 + 11 * i" "i + 1"
run_ok "fit: distinct experts nearly 50 x batch (one expert more in a third of the steps)" \
  "$ELDR" simulate --fit near.jsonl --model "$SRC/configs/models/deepseek-v2-lite.yaml" -o fitn.yaml
grep -qE "decode: \{a: 0.001, b: 5e-05, c: 0.0002, d: 3e-07\}" fitn.yaml && ok "the nearly collinear fit recovers the coefficients" ||
  bad "the nearly collinear fit recovers the coefficients" "$(cat fitn.yaml)"

# --fit from moe_layer_bench JSON: per layer t = 1 ms + 20 us·distinct + 5 us·batch, BM_Read at 10 GB/s.
$PY - <<'PY'
import json
b = [{"name": "BM_Read", "run_type": "iteration", "real_time": 1.0, "time_unit": "ms", "GBps": 10.0}]
for n in (16, 32, 64, 128):
    for B in (16, 64):
        b.append({"name": f"BM_MoeLayer/{n}/{B}/real_time", "run_type": "iteration", "time_unit": "ms",
                  "real_time": 1.0 + 0.02 * n + 0.005 * B})
json.dump({"context": {}, "benchmarks": b}, open("bench.json", "w"))
PY
run_ok "fit to moe_layer_bench JSON" "$ELDR" simulate --fit bench.json --model "$SRC/configs/models/tiny.yaml" --json -o fit.json
# tiny: 2 MoE layers → a = 2 ms, b = 20 us, c = 10 us; d = KV bytes/token (2·3·2·8·4 = 384) / 10 GB/s.
$PY -c "
import json
m = json.load(open('fit.json'))
d = m['decode']
assert abs(d['a'] - 2e-3) < 1e-9 and abs(d['b'] - 2e-5) < 1e-11 and abs(d['c'] - 1e-5) < 1e-11, d
assert abs(d['d'] - 384 / 10e9) < 1e-15, d
" && ok "bench fit scaled to the model" || bad "bench fit scaled to the model" "$(cat fit.json)"

# A bench run that is not a time is refused by name (was: a missing real_time read as 0 s, an unknown unit as
# seconds, batch 0 and a 400-digit name fitted or "stod"); a file given twice would count twice; a step log of
# decode lines only would price every prefill at 0.
$PY - <<'PY'
import json
good = json.load(open("bench.json"))["benchmarks"]
def variant(name, i, change):
    b = [dict(x) for x in good]
    change(b[i])
    json.dump({"benchmarks": b}, open(name, "w"))
variant("b_notime.json", 1, lambda r: r.pop("real_time"))
variant("b_neg.json", 2, lambda r: r.update(real_time=-50))
variant("b_unit.json", 1, lambda r: r.update(time_unit="fortnight"))
variant("b_batch0.json", 1, lambda r: r.update(name="BM_MoeLayer/16/0/real_time"))
variant("b_long.json", 1, lambda r: r.update(name="BM_MoeLayer/" + "9" * 400 + "/1"))
variant("b_name.json", 1, lambda r: r.update(name=5))
with open("steps.jsonl") as f, open("decode_only.jsonl", "w") as o:
    o.writelines(l for l in f if '"kind":"decode"' in l.replace(" ", ""))
PY
TINY="$SRC/configs/models/tiny.yaml"
expect_error "bench fit: no real_time" "b_notime.json: benchmarks\[1\] \(BM_MoeLayer/16/16/real_time\): real_time must be a time in \(0, 3600\] s, got none" \
  bf.yaml "$ELDR" simulate --fit b_notime.json --model "$TINY" -o bf.yaml
expect_error "bench fit: a negative time" "b_neg.json: benchmarks\[2\] .*real_time must be a time in \(0, 3600\] s, got -50 ms" \
  bf.yaml "$ELDR" simulate --fit b_neg.json --model "$TINY" -o bf.yaml
expect_error "bench fit: an unknown unit" "b_unit.json: benchmarks\[1\] .*time_unit must be ns, us, ms or s, got \"fortnight\"" \
  bf.yaml "$ELDR" simulate --fit b_unit.json --model "$TINY" -o bf.yaml
expect_error "bench fit: batch 0" "b_batch0.json: benchmarks\[1\] .*the batch must be in \[1, 1048576\], got 0" \
  bf.yaml "$ELDR" simulate --fit b_batch0.json --model "$TINY" -o bf.yaml
expect_error "bench fit: a 400-digit count (was: 'stod')" "b_long.json: benchmarks\[1\] .*distinct experts .* must be in \[0, 65535\]" \
  bf.yaml "$ELDR" simulate --fit b_long.json --model "$TINY" -o bf.yaml
expect_error "bench fit: a name that is a number (was: a JSON exception)" "b_name.json: benchmarks\[1\]: not a benchmark run" \
  bf.yaml "$ELDR" simulate --fit b_name.json --model "$TINY" -o bf.yaml
expect_error "--fit of one file twice" "steps.jsonl: given to --fit twice" bf.yaml \
  "$ELDR" simulate --fit steps.jsonl steps.jsonl --model "$TINY" -o bf.yaml
expect_error "--fit of decode steps only (was: prefill priced at 0)" "hold no prefill steps.*--prefill-from COST.yaml" \
  bf.yaml "$ELDR" simulate --fit decode_only.jsonl --model "$TINY" -o bf.yaml

# moe_layer_bench results without BM_Read would fit decode.d = 0 (the context term): refused, naming the run it needs.
$PY -c "
import json
b = json.load(open('bench.json'))
b['benchmarks'] = [r for r in b['benchmarks'] if not r['name'].startswith('BM_Read')]
json.dump(b, open('b_noread.json', 'w'))
"
expect_error "bench fit without BM_Read (was: decode.d = 0)" "no BM_Read run with GBps: decode.d .* would be fitted as 0" \
  bf.yaml "$ELDR" simulate --fit b_noread.json --model "$TINY" -o bf.yaml
# A binary file given to --fit is named as such (was: a JSON parse error quoting its raw bytes).
gzip -c steps.jsonl > steps.jsonl.gz
printf '\x89\x01 not json\n' > latin.jsonl
expect_error "--fit of an HDF5 file" "trace.h5: is an HDF5 file \(a trace or a calibration\?\), not text; --fit reads" \
  bf.yaml "$ELDR" simulate --fit trace.h5 --model "$TINY" -o bf.yaml
expect_error "--fit of a gzip file" "steps.jsonl.gz: is gzip-compressed, not text" \
  bf.yaml "$ELDR" simulate --fit steps.jsonl.gz --model "$TINY" -o bf.yaml
expect_error "--fit of a line with binary bytes: quoted as \\xNN" 'latin.jsonl:1: not a step record: not valid JSON .*\\x89' \
  bf.yaml "$ELDR" simulate --fit latin.jsonl --model "$TINY" -o bf.yaml
LC_ALL=C grep -q $'\x89' "$WORK/err.txt" && bad "no raw bytes in the --fit error" "$(cat -v "$WORK/err.txt")" \
  || ok "no raw bytes in the --fit error"
# A step record with a field serve does not write is refused by name (was: ignored).
sed '2s/}$/, "extra": 1}/' steps.jsonl > extra.jsonl
expect_error "--fit of a step record with an unknown field" "extra.jsonl:2: not a step record: unknown field 'extra'" \
  bf.yaml "$ELDR" simulate --fit extra.jsonl --model "$TINY" -o bf.yaml
# moe_layer_bench names its arguments (ArgNames): "BM_MoeLayer/experts:16/batch:16/min_time:1.000/real_time" fits as
# "BM_MoeLayer/16/16/real_time" does (was: refused as holding no BM_MoeLayer results).
$PY - <<'PY'
import json, re
b = json.load(open("bench.json"))
for r in b["benchmarks"]:
    m = re.match(r"BM_MoeLayer/(\d+)/(\d+)/real_time$", r["name"])
    if m: r["name"] = f"BM_MoeLayer/experts:{m[1]}/batch:{m[2]}/min_time:1.000/real_time"
json.dump(b, open("b_named.json", "w"))
bad = json.load(open("bench.json"))
bad["benchmarks"][1]["name"] = "BM_MoeLayer/16/16/" + "a" * 100000   # was: a segfault in std::regex
json.dump(bad, open("b_longtail.json", "w"))
bad["benchmarks"][1]["name"] = "BM_MoeLayer/-16/16/real_time"           # was: skipped without a word
json.dump(bad, open("b_negname.json", "w"))
bad["benchmarks"][1]["name"] = "BM_MoeLayer/16/16\u001b[31m\nX"        # ESC and a newline in a quoted name
json.dump(bad, open("b_esc.json", "w"))
PY
printf '\xef\xbb\xbf' | cat - b_named.json > b_bom.json
run_ok "fit to moe_layer_bench JSON that starts with a byte order mark (was: read as a step log)" \
  "$ELDR" simulate --fit b_bom.json --model "$TINY" -o bf.yaml
rm -f bf.yaml
run_ok "fit to moe_layer_bench JSON with named arguments" "$ELDR" simulate --fit b_named.json --model "$TINY" --json -o fitn.json
cmp -s <($PY -c "import json; print(json.load(open('fit.json'))['decode'])") \
  <($PY -c "import json; print(json.load(open('fitn.json'))['decode'])") \
  && ok "named arguments fit the same decode terms" || bad "named arguments fit the same decode terms"
run_ok "a 100000-character run name after the arguments (was: a segfault)" "$ELDR" simulate --fit b_longtail.json \
  --model "$TINY" -o bf.yaml
rm -f bf.yaml
expect_error "a BM_MoeLayer run whose arguments do not parse" \
  "b_negname.json: benchmarks\[1\] \(BM_MoeLayer/-16/16/real_time\): the distinct experts .* got -16" \
  bf.yaml "$ELDR" simulate --fit b_negname.json --model "$TINY" -o bf.yaml
expect_error "a quoted name with ESC and a newline: one line, escaped" \
  'b_esc.json: benchmarks\[1\] \(BM_MoeLayer/16/16\\x1b\[31m\\x0aX\): the batch must be' bf.yaml \
  "$ELDR" simulate --fit b_esc.json --model "$TINY" -o bf.yaml
expect_error "steps and bench results together (was: the bench file dropped)" \
  "bench.json \(moe_layer_bench results\) and steps.jsonl \(a step log\) fit the same decode terms" \
  bf.yaml "$ELDR" simulate --fit bench.json steps.jsonl --model "$TINY" -o bf.yaml
expect_error "--cores with bench results (was: written into the model)" "--cores undoes the sharing .* drop --cores" \
  bf.yaml "$ELDR" simulate --fit bench.json --cores 2 --model "$TINY" -o bf.yaml

# The three modes' options do not mix: one that another mode would ignore is refused (it was ignored silently:
# --fit with --derive fitted, --derive with -c derived, -c with --cores simulated without it).
expect_error "--fit and --derive" "--fit and --derive are two modes; give one" fitx.yaml \
  "$ELDR" simulate --fit bench.json --derive h200 --model "$SRC/configs/models/tiny.yaml" -o fitx.yaml
expect_error "--derive with -c" "--config does not apply with --derive" - \
  "$ELDR" simulate --derive h200 --model "$SRC/configs/models/tiny.yaml" -c job.yaml
expect_error "--fit with --bandwidth" "--bandwidth applies only with --derive" - \
  "$ELDR" simulate --fit bench.json --model "$SRC/configs/models/tiny.yaml" --bandwidth 1e12
expect_error "a simulation with --cores" "--cores applies only with --fit" - "$ELDR" simulate -c job.yaml --cores 2 --no-output
expect_error "a simulation with -o" "--out applies only with --fit or --derive" - "$ELDR" simulate -c job.yaml -o x.yaml --no-output

# The shipped H200 models are what --derive produces.
for m in qwen3-30b-a3b deepseek-v2-lite; do
  "$ELDR" simulate --derive h200 --model "$SRC/configs/models/$m.yaml" -o derived.yaml 2>/dev/null
  if diff <(grep -v '^#' derived.yaml) <(grep -v '^#' "$SRC/configs/costs/h200-$m.yaml") >/dev/null; then
    ok "configs/costs/h200-$m.yaml is reproducible"
  else
    bad "configs/costs/h200-$m.yaml is reproducible"
  fi
done

# Scale: 512 decoders must run.
"$ELDR" trace synth --domains 8 --requests 2000 --layers 2 --experts 8 --top-k 2 --prompt-len 8:24 --output-len 4:12 \
  --seed 3 --out big.h5 >/dev/null
"$ELDR" calibrate --trace big.h5 -K 512 --restarts 1 --out cal512.h5 --quiet
"$ELDR" simulate -c job.yaml --trace big.h5 --calib cal512.h5 --policy eldr -K 512 --prefill 32 -n 20000 --rate 5000 \
  --json --no-output > big.json 2>err.txt && $PY -c "
import json
m = json.load(open('big.json'))
assert m['completed'] == 20000 and len(m['decoders']) == 512
assert sum(1 for d in m['decoders'] if d['requests'] > 0) == 512
" && ok "512 decoders (eldr routing), 20000 requests" || bad "512 decoders" "$(cat err.txt)"

# Bad input.
sed '/^simulate:/,$d' job.yaml > nosim.yaml
expect_error "no cost model" "no 'simulate:' section" - "$ELDR" simulate -c nosim.yaml --no-output
sed 's/, calibration: cal3.h5//' job.yaml > nocal.yaml
expect_error "eldr policy without calibration" "needs routing.calibration" - \
  "$ELDR" simulate -c nocal.yaml --no-output
expect_error "calibration of another K" "refit" - "$ELDR" simulate -c job.yaml -K 5 --no-output
printf 'decode: {a: -1}\n' > neg.yaml
expect_error "negative coefficient" "neg.yaml:1: decode.a must be in \[0, 3600\], got '-1'" - \
  "$ELDR" simulate -c job.yaml --cost-model neg.yaml --no-output
printf '{"kind":"decode","seconds":1}\n' > badsteps.jsonl
expect_error "malformed step log" "badsteps.jsonl:1: not a step record" fit2.yaml \
  "$ELDR" simulate --fit badsteps.jsonl --model "$SRC/configs/models/tiny.yaml" -o fit2.yaml
expect_error "missing trace" "nope.h5" - "$ELDR" simulate -c job.yaml --trace nope.h5 --no-output
expect_error "unknown policy" "policy" - "$ELDR" simulate -c job.yaml --policy fastest --no-output
expect_error "unwritable output (before the run)" "output.dir /proc/nope: nothing can be created in /proc" - "$ELDR" simulate -c job.yaml --output-dir /proc/nope --quiet
# Expert-parallel decoders are not modelled: refused, not simulated as ep_size 1 (and no metrics written).
sed 's/^decode: {max_batch: 8}/decode: {max_batch: 8, ep_size: 2}/' job.yaml > ep2.yaml
grep -q "ep_size: 2" ep2.yaml || bad "ep2.yaml has ep_size 2"
expect_error "decode.ep_size 2 refused" "ep2.yaml: decode.ep_size 2: eldr simulate does not model expert-parallel" \
  ep2run/metrics.json "$ELDR" simulate -c ep2.yaml --output-dir ep2run --quiet
"$ELDR" trace synth --domains 2 --requests 20 --layers 3 --experts 8 --top-k 2 --out other.h5 >/dev/null
expect_error "trace of another shape" "differs from the model" - \
  "$ELDR" simulate -c job.yaml --trace other.h5 --policy jsq --no-output

finish
