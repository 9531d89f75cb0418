#!/usr/bin/env bash
# Strict configuration and input bounds (issue 14, items 6, 8 and 10): every YAML key checked against its schema
# (unknown keys with the nearest valid one, types and ranges by dotted name, lists where a mapping belongs,
# duplicate keys), command-line overrides checked like the keys they replace, counts that size memory checked
# against the machine, writers refusing what readers reject, and the messages of item 10. Each case: non-zero
# exit, exactly one stderr line naming the key/option/file, no output file left.
# Usage: config_test.sh /path/to/eldr /path/to/source
set -u
ELDR="$1"
SRC="$2"
PY=/usr/bin/python3
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
source "$SRC/tests/lib.sh"

"$ELDR" trace synth --domains 2 --requests 40 --layers 2 --experts 8 --top-k 2 --prompt-len 8:16 --output-len 4:8 \
  --seed 1 --out trace.h5 >/dev/null
"$ELDR" calibrate --trace trace.h5 -K 2 --out cal2.h5 --quiet
cat > job.yaml <<YAML
topology: {prefill_ranks: 1, decode_ranks: 2}
model: {config: $SRC/configs/models/tiny.yaml, weights: synthetic, gate: replay}
routing: {policy: eldr, tau: 0.1, calibration: cal2.h5}
kv_cache: {block_size: 4, prefill_blocks: 256, decode_blocks: 256}
decode: {max_batch: 8}
workload: {trace: trace.h5, num_requests: 40, request_rate: 50, seed: 1}
output: {dir: run}
watchdog_s: 60
simulate:
  decode: {a: 2.0e-3, b: 1.0e-4, c: 1.0e-5, d: 1.0e-7}
  prefill: {a: 1.0e-3, b: 1.0e-5}
  kv_transfer: {latency_s: 1.0e-4, bandwidth_Bps: 1.0e9}
  control_latency_s: 5.0e-5
YAML
run_ok "the base job simulates" "$ELDR" simulate -c job.yaml --no-output --quiet

# ---- every shipped config still loads ----
for f in "$SRC"/configs/jobs/*.yaml; do
  run_ok "shipped job config $(basename "$f")" "$ELDR" serve --print-ranks -c "$f"
done
for f in "$SRC"/configs/models/*.yaml; do
  run_ok "shipped model config $(basename "$f")" "$ELDR" simulate --derive h200 --model "$f" -o "$WORK/derived.yaml"
done
for f in "$SRC"/configs/costs/*.yaml; do
  run_ok "shipped cost model $(basename "$f")" "$ELDR" simulate -c job.yaml --cost-model "$f" --no-output --quiet
done

# ---- job config schema (eldr serve --print-ranks reads the config without MPI; simulate reads it too) ----
bad_job() {  # NAME PATTERN SED-EXPRESSION
  sed "$3" job.yaml > bad.yaml
  expect_error "job: $1 (serve)" "$2" - "$ELDR" serve --print-ranks -c bad.yaml
  expect_error "job: $1 (simulate)" "$2" run/metrics.json "$ELDR" simulate -c bad.yaml --quiet
}
# A KV cache that holds no request of the workload fails every request: one line naming the key, no run. A value the
# command line set is named by its option too (job.yaml holds another).
expect_error "decode KV cache holds no request" \
  "job.yaml: kv_cache.decode_blocks \(--decode-blocks\) = 1 \(blocks of 4 tokens\) holds no request of the workload.*; raise kv_cache.decode_blocks \(--decode-blocks\) or lower workload.output_len$" \
  run/metrics.json \
  "$ELDR" simulate -c job.yaml --decode-blocks 1 --quiet
sed 's/prefill_blocks: 256/prefill_blocks: 1/' job.yaml > tinyprefill.yaml
expect_error "prefill KV cache holds no request" \
  "tinyprefill.yaml: kv_cache.prefill_blocks = 1 \(blocks of 4 tokens\) holds no request of the workload" \
  run/metrics.json "$ELDR" simulate -c tinyprefill.yaml --quiet
bad_job "misspelt top-level key" "bad.yaml:8: unknown key 'watchdgo_s' \(did you mean 'watchdog_s'\?\)" \
  's/^watchdog_s:/watchdgo_s:/'
bad_job "misspelt section key" "bad.yaml:5: unknown key 'decode.max_btach' \(did you mean 'max_batch'\?\)" \
  's/max_batch/max_btach/'
bad_job "misspelt section" "bad.yaml:3: unknown key 'routnig' \(did you mean 'routing'\?\)" 's/^routing:/routnig:/'
# A key with no value is a forgotten value, never its default (an empty watchdog_s ran with 120 s, an empty
# output.dir wrote ./run).
bad_job "watchdog_s with no value" "bad.yaml:8: watchdog_s has no value \(nothing after 'watchdog_s:', or ~\)" \
  's/^watchdog_s: 60/watchdog_s:/'
bad_job "output.dir with no value" "bad.yaml:7: output.dir has no value" 's/^output: {dir: run}/output: {dir: }/'
sed 's|^output: {dir: run}|output: {dir: /sys/eldr-run}|' job.yaml > sysdir.yaml
expect_error "output.dir where nothing can be created (simulate, before the run)" \
  "output.dir /sys/eldr-run: nothing can be created in /sys" - "$ELDR" simulate -c sysdir.yaml --quiet
bad_job "workload.num_requests as ~" "bad.yaml:6: workload.num_requests has no value" 's/num_requests: 40/num_requests: ~/'
bad_job "topology as a list" "bad.yaml:1: topology must be a mapping, got a list" \
  's/^topology: .*/topology: [1, 2]/'
bad_job "negative tau" "bad.yaml:3: routing.tau must be >= 0, got '-0.5'" 's/tau: 0.1/tau: -0.5/'
bad_job "nan tau" "bad.yaml:3: routing.tau must be >= 0, got '.nan' \(not a number\)" 's/tau: 0.1/tau: .nan/'
bad_job "fractional integer" "bad.yaml:5: decode.max_batch must be an integer in \[1, [0-9]+\], got '2.5'" \
  's/max_batch: 8/max_batch: 2.5/'
bad_job "out-of-range integer" "bad.yaml:1: topology.decode_ranks must be an integer in \[1, 65536\], got '99999999999'" \
  's/decode_ranks: 2/decode_ranks: 99999999999/'
bad_job "zero rate" "bad.yaml:6: workload.request_rate must be > 0 or inf, got '0'" 's/request_rate: 50/request_rate: 0/'
# A key that names a path is never empty; a file a key names that is missing is named by its key (README), in
# simulate as in serve, with the option that set it.
bad_job "empty output.dir" "bad.yaml: output.dir is empty; give a path" 's/dir: run}/dir: ""}/'
bad_job "empty workload.trace" "bad.yaml: workload.trace is empty; give a path" 's/trace: trace.h5,/trace: "",/'
sed 's/trace: trace.h5,/trace: nosuch.h5,/' job.yaml > missing.yaml
expect_error "missing trace named by its key" "^eldr: error: workload.trace: nosuch.h5: no such file" run/metrics.json \
  "$ELDR" simulate -c missing.yaml --quiet
expect_error "missing --trace named by key and option" "^eldr: error: workload.trace \(--trace\): nosuch.h5: no such file" \
  run/metrics.json "$ELDR" simulate -c job.yaml --trace nosuch.h5 --quiet
sed 's/calibration: cal2.h5/calibration: nocal.h5/' job.yaml > missing.yaml
expect_error "missing calibration named by its key" "^eldr: error: routing.calibration: nocal.h5: no such file" \
  run/metrics.json "$ELDR" simulate -c missing.yaml --quiet
sed "s#config: $SRC/configs/models/tiny.yaml#config: nomodel.yaml#" job.yaml > missing.yaml
expect_error "missing model config named by its key" "^eldr: error: model.config: nomodel.yaml: no such file" \
  run/metrics.json "$ELDR" simulate -c missing.yaml --quiet
{ sed '/^simulate:/,$d' job.yaml; echo "simulate: {cost_model: nocost.yaml}"; } > missing.yaml
expect_error "missing simulate.cost_model named by its key" \
  "^eldr: error: missing.yaml: simulate.cost_model: nocost.yaml: no such file" run/metrics.json \
  "$ELDR" simulate -c missing.yaml --quiet
# Sizes that would not fit in memory are one line naming them, before anything is allocated (the budget is set by
# ELDR_MEMORY_BUDGET so that the case does not depend on this machine).
expect_error "decode blocks past the memory budget" \
  "kv_cache.decode_blocks \(--decode-blocks\) = 1073741824 on 2 decoders \(36.5 GB\) \+ .*: needs 36.5 GB, this machine has 1.1 GB available \(as ELDR_MEMORY_BUDGET says\)" \
  run/metrics.json env ELDR_MEMORY_BUDGET=1G "$ELDR" simulate -c job.yaml --decode-blocks 1073741824 --quiet
expect_error "output tokens past the memory budget" \
  "the workload's 4000000000 output tokens \(workload.output_len \(--output-len\)\) \(160.0 GB\)" \
  run/metrics.json env ELDR_MEMORY_BUDGET=1G "$ELDR" simulate -c job.yaml --output-len 100000000 --decode-blocks 30000000 --quiet
expect_error "output_len past any KV cache" "--output-len: must be an integer in \[0, 136365211648\]" - \
  "$ELDR" simulate -c job.yaml --output-len 9223372036854775807 --quiet
# Below 1 s the watchdog would end a job before any rank counts as silent, naming none.
bad_job "watchdog below 1 s" "bad.yaml:8: watchdog_s must be >= 1, got '0.3'" 's/^watchdog_s: 60/watchdog_s: 0.3/'
# Beyond 1e6 rate x burstiness could overflow to zero gaps: every arrival at 0.
bad_job "huge burstiness" "bad.yaml:6: workload.burstiness must be in \(0, 1e6\], got '1e308'" \
  's/request_rate: 50,/request_rate: 50, burstiness: 1e308,/'
bad_job "duplicate key" "bad.yaml:9: duplicate key 'watchdog_s'" 's/^watchdog_s: 60/watchdog_s: 60\nwatchdog_s: 8/'
bad_job "duplicate key in a section" "bad.yaml:3: duplicate key 'routing.tau'" 's/tau: 0.1,/tau: 0.1, tau: 0.2,/'
bad_job "bad choice" "bad.yaml:2: model.gate must be replay or computed, got 'replya' \(did you mean 'replay'\?\)" \
  's/gate: replay/gate: replya/'
bad_job "bool" "bad.yaml:7: output.tokens must be true or false, got 'yes please'" \
  's/^output: {dir: run}/output: {dir: run, tokens: yes please}/'
bad_job "bad compute choice" "bad.yaml:9: compute must be cpu, cuda or auto, got 'gpu'" \
  's/^watchdog_s: 60/watchdog_s: 60\ncompute: gpu/'
bad_job "compute as a mapping" "bad.yaml:9: compute must be" 's/^watchdog_s: 60/watchdog_s: 60\ncompute: {backend: cuda}/'
bad_job "duplicate compute" "bad.yaml:10: duplicate key 'compute'" 's/^watchdog_s: 60/watchdog_s: 60\ncompute: cpu\ncompute: cuda/'
for v in cpu cuda auto; do
  sed "s/^watchdog_s: 60/watchdog_s: 60\ncompute: $v/" job.yaml > compute-$v.yaml
  run_ok "job: compute: $v loads" "$ELDR" serve --print-ranks -c compute-$v.yaml
done
bad_job "missing required key" "bad.yaml: workload.trace is required" 's/trace: trace.h5, //'
sed 's/request_rate: 50/request_rate: inf/' job.yaml > inf.yaml
run_ok "job: request_rate inf is valid" "$ELDR" simulate -c inf.yaml --no-output --quiet
sed 's/, tau: 0.1//' job.yaml > notau.yaml
"$ELDR" simulate -c notau.yaml --no-output --json > notau.json 2>/dev/null
$PY -c "import json; assert abs(json.load(open('notau.json'))['tau'] - json.load(open('/dev/stdin'))['tau']) < 1e-12" \
  < <("$ELDR" inspect cal2.h5 --json) && ok "job: tau unset takes the calibration's" || bad "job: tau unset"
mkdir adir
expect_error "-c DIR" "adir: is a directory, expected a job config file" - "$ELDR" serve --print-ranks -c adir
expect_error "-c DIR (simulate)" "adir: is a directory, expected a job config file" - "$ELDR" simulate -c adir --no-output

# ---- cost models: required sections ----
printf 'prefill: {a: 1.0e-3, b: 1.0e-5}\ncontrol_latency_s: 5.0e-5\n' > nodecode.yaml
expect_error "cost model without decode:" "nodecode.yaml: decode is required" run/metrics.json \
  "$ELDR" simulate -c job.yaml --cost-model nodecode.yaml --quiet
printf 'decdoe: {a: 1, b: 1, c: 1, d: 1}\nprefill: {a: 1.0e-3, b: 1.0e-5}\n' > typo.yaml
expect_error "cost model with decode: misspelt" "typo.yaml:1: unknown key 'decdoe' \(did you mean 'decode'\?\)" \
  run/metrics.json "$ELDR" simulate -c job.yaml --cost-model typo.yaml --quiet
printf 'decode: {a: 1, b: 1, c: 1}\nprefill: {a: 1.0e-3, b: 1.0e-5}\n' > nod.yaml
expect_error "cost model without decode.d" "nod.yaml: decode.d is required" - \
  "$ELDR" simulate -c job.yaml --cost-model nod.yaml --no-output
# Times are at most an hour (runtime/cost/cost_model.h kCostSeconds): 1e304 s per step simulated to ttft inf and null
# metrics with exit 0; the writers refuse what the reader refuses (--bandwidth 1e-320 wrote decode.a: inf).
printf 'decode: {a: 7.8e304, b: 1, c: 1, d: 1}\nprefill: {a: 1.0e-3, b: 1.0e-5}\n' > huge.yaml
expect_error "cost model: a step of 7.8e304 s" "huge.yaml:1: decode.a must be in \[0, 3600\], got '7.8e304'" run/metrics.json \
  "$ELDR" simulate -c job.yaml --cost-model huge.yaml --quiet
# (--bandwidth 1e-320 now stops at the option's plausible range, below.)
expect_error "derive: --bandwidth 1e-320 (an infinite model)" "--bandwidth: must be in \[1e9, 1e14\], got '1e-320'" \
  derived-inf.yaml "$ELDR" simulate --derive h200 --model "$SRC/configs/models/tiny.yaml" --bandwidth 1e-320 -o derived-inf.yaml
# A step's time is a cost model time: 1e300 s overflowed the fit's residuals and, where distinct experts, batch and
# context vary apart (a collinear design is refused, tests/cli/simulate_test.sh), fitted a model that costs nothing.
for i in 1 2 3 4 5 6 7 8 9 10; do
  echo "{\"kind\":\"decode\",\"worker\":0,\"time\":$i,\"seconds\":1e300,\"batch\":$((1 + i % 3)),\"distinct_experts\":$((i * i % 11)),\"context_tokens\":$((5 * i))}"
done > huge-steps.jsonl
expect_error "fit: steps of 1e300 s" "huge-steps.jsonl:1: not a step record: seconds must be in \[0, 3600\]$" fit-huge.yaml \
  "$ELDR" simulate --fit huge-steps.jsonl --model "$SRC/configs/models/tiny.yaml" -o fit-huge.yaml
# ---- cost models: plausible hardware figures (runtime/cost/cost_model.h kLinkBandwidth, kMemoryBandwidth, kCores) ----
# Finite but absurd figures were accepted: a KV link of 1e30 or 1e-9 B/s, 1e30 shared cores, a negative zero, a
# bandwidth that underflows to 0 (read as "no transfer cost"), --derive --bandwidth 1e30. Each is refused in one line
# naming the key (and its line), the accepted range and why; the shipped models and the figures' 0s still load.
cost_with() {  # cost_with FILE BANDWIDTH CORES
  printf 'decode: {a: 1.0e-3, b: 1.0e-5, c: 1.0e-5, d: 1.0e-8}\nprefill: {a: 1.0e-3, b: 1.0e-5}\n' > "$1"
  printf 'kv_transfer: {latency_s: 1.0e-4, bandwidth_Bps: %s}\ncores: %s\n' "$2" "$3" >> "$1"
}
link_why="\(bytes/s: 1 MB/s to 10 TB/s holds every network link, from slow Ethernet to beyond NVLink; 0: a transfer costs latency_s only\)"
for bw in 1e30 1e-9 5e5 2e13; do
  cost_with bw.yaml "$bw" 0
  expect_error "cost model: kv_transfer.bandwidth_Bps $bw" \
    "error: bw.yaml:3: kv_transfer.bandwidth_Bps must be 0 or in \[1e6, 1e13\], got '$bw' $link_why$" run/metrics.json \
    "$ELDR" simulate -c job.yaml --cost-model bw.yaml --quiet
done
cost_with bw.yaml -0 0
expect_error "cost model: kv_transfer.bandwidth_Bps -0" \
  "error: bw.yaml:3: kv_transfer.bandwidth_Bps must be 0 or in \[1e6, 1e13\], got '-0' \(a negative zero: write 0\)$" \
  run/metrics.json "$ELDR" simulate -c job.yaml --cost-model bw.yaml --quiet
cost_with bw.yaml 1e-400 0
expect_error "cost model: kv_transfer.bandwidth_Bps 1e-400 (underflows to 0)" \
  "error: bw.yaml:3: kv_transfer.bandwidth_Bps must be 0 or in \[1e6, 1e13\], got '1e-400'" run/metrics.json \
  "$ELDR" simulate -c job.yaml --cost-model bw.yaml --quiet
cost_with bw.yaml 5e9 -0.0
expect_error "cost model: cores -0.0" \
  "error: bw.yaml:4: cores must be 0 or in \[0.1, 65536\], got '-0.0' \(a negative zero: write 0\)$" run/metrics.json \
  "$ELDR" simulate -c job.yaml --cost-model bw.yaml --quiet
for cores in 1e30 1e-9; do
  cost_with cores.yaml 5e9 "$cores"
  expect_error "cost model: cores $cores" \
    "error: cores.yaml:4: cores must be 0 or in \[0.1, 65536\], got '$cores' \(CPU cores the workers share: from a 0.1-core container quota to 65536; 0: a device per worker\)$" \
    run/metrics.json "$ELDR" simulate -c job.yaml --cost-model cores.yaml --quiet
done
printf 'decode: {a: -0, b: 1.0e-5, c: 1.0e-5, d: 1.0e-8}\nprefill: {a: 1.0e-3, b: 1.0e-5}\n' > negzero.yaml
expect_error "cost model: decode.a -0" "error: negzero.yaml:1: decode.a must be in \[0, 3600\], got '-0' \(a negative zero: write 0\)$" \
  run/metrics.json "$ELDR" simulate -c job.yaml --cost-model negzero.yaml --quiet
sed 's/bandwidth_Bps: 1.0e9/bandwidth_Bps: 1.0e30/' job.yaml > simbw.yaml
expect_error "job simulate: section: bandwidth 1e30" \
  "error: simbw.yaml:12: simulate.kv_transfer.bandwidth_Bps must be 0 or in \[1e6, 1e13\], got '1.0e30' $link_why$" \
  run/metrics.json "$ELDR" simulate -c simbw.yaml --quiet
mem_why="\(bytes/s: 1 GB/s to 100 TB/s holds every memory, from one DDR channel to 20x an H200's HBM3e\)"
for bw in 1e30 1e-9; do
  expect_error "derive: --bandwidth $bw" "error: --bandwidth: must be in \[1e9, 1e14\], got '$bw' $mem_why \(see --help\)$" derived-bw.yaml \
    "$ELDR" simulate --derive h200 --model "$SRC/configs/models/tiny.yaml" --bandwidth "$bw" -o derived-bw.yaml
done
expect_error "fit: --cores 1e30" "error: --cores: must be 0 or in \[0.1, 65536\], got '1e30'" fit-cores.yaml \
  "$ELDR" simulate --fit huge-steps.jsonl --model "$SRC/configs/models/tiny.yaml" --cores 1e30 -o fit-cores.yaml
# A measured read bandwidth (moe_layer_bench's BM_Read) sets d: one of 1e-12 GB/s made d = 3.8e5 s per token.
$PY - <<'PY'
import json
for name, gbps in (("readbw", 1e-12), ("readneg", -10.0), ("readok", 10.0)):
    b = [{"name": "BM_Read", "run_type": "iteration", "real_time": 1.0, "time_unit": "ms", "GBps": gbps}]
    for n in (16, 32, 64):
        for B in (16, 64):
            b.append({"name": f"BM_MoeLayer/{n}/{B}/real_time", "run_type": "iteration", "time_unit": "ms",
                      "real_time": 1.0 + 0.02 * n + 0.005 * B})
    json.dump({"context": {}, "benchmarks": b}, open(name + ".json", "w"))
PY
for f in readbw readneg; do
  expect_error "fit: BM_Read of an implausible bandwidth ($f)" \
    "error: $f.json: benchmarks\[0\] \(BM_Read\): a read bandwidth of .* GB/s; a memory bandwidth must be in \[1e9, 1e14\] $mem_why$" \
    fit-read.yaml "$ELDR" simulate --fit "$f.json" --model "$SRC/configs/models/tiny.yaml" -o fit-read.yaml
done
# A decode step that costs nothing (all four terms 0) is refused wherever a cost model is read: route's eldr price
# (was: accepted, the tie rule decided every request), simulate, and the inline simulate: keys of a job config.
printf 'decode: {a: 0, b: 0, c: 0, d: 0}\nprefill: {a: 1.0e-3, b: 1.0e-5}\n' > zero.yaml
zero_why="decode.a \\+ b \\+ c = 0 s, so a decode step of one sequence over one expert would take under a nanosecond"
expect_error "cost model: all decode terms 0 (route)" "error: zero.yaml: $zero_why" - \
  "$ELDR" route --calib cal2.h5 --trace trace.h5 --policy eldr --cost-model zero.yaml
expect_error "cost model: all decode terms 0 (simulate)" "error: zero.yaml: $zero_why" run/metrics.json \
  "$ELDR" simulate -c job.yaml --cost-model zero.yaml --quiet
# A job whose simulate: section completes a zero file with its own decode keys is checked once, after them.
cat > zero_job.yaml <<YAML
$(sed '/^simulate:/,$d' job.yaml)
simulate:
  cost_model: zero.yaml
  decode: {a: 2.0e-3, b: 1.0e-4, c: 1.0e-5, d: 1.0e-7}
YAML
run_ok "inline decode keys complete a zero cost model file" "$ELDR" simulate -c zero_job.yaml --no-output --quiet
sed 's/  decode: {a: 2.0e-3, b: 1.0e-4, c: 1.0e-5, d: 1.0e-7}/  control_latency_s: 1.0e-4/' zero_job.yaml > zero_job2.yaml
expect_error "inline keys that leave the decode step at 0" "error: zero_job2.yaml \(simulate:\): decode.a \\+ b \\+ c = 0 s" - \
  "$ELDR" simulate -c zero_job2.yaml --no-output --quiet
printf 'decode: {a: 0, b: 1.0e-320, c: 0, d: 0}\nprefill: {a: 1.0e-3, b: 1.0e-5}\n' > tiny_b.yaml
expect_error "cost model: a decode step under a nanosecond (b = 1e-320)" "error: tiny_b.yaml: decode.a \\+ b \\+ c = .* under a nanosecond" - \
  "$ELDR" route --calib cal2.h5 --trace trace.h5 --policy eldr --cost-model tiny_b.yaml
printf 'decode: {a: 0, b: 1.0e-5, c: 0, d: 0}\nprefill: {a: 1.0e-3, b: 1.0e-5}\n' > b_only.yaml
run_ok "cost model: one decode term alone" "$ELDR" route --calib cal2.h5 --trace trace.h5 --policy eldr \
  --cost-model b_only.yaml
# Valid figures still load: every shipped cost model, 0 for "none" (no transfer cost, a device per worker), the
# bounds themselves, fractional cores, a derived model at 1 TB/s, a bench fit at 10 GB/s.
for f in "$SRC"/configs/costs/*.yaml; do
  run_ok "shipped cost model $(basename "$f")" "$ELDR" simulate -c job.yaml --cost-model "$f" --no-output --quiet
done
for pair in "0 0" "1e6 0.1" "1e13 65536" "5e9 2.5"; do
  cost_with ok.yaml $pair
  run_ok "cost model: bandwidth_Bps and cores $pair" "$ELDR" simulate -c job.yaml --cost-model ok.yaml --no-output --quiet
done
run_ok "derive: --bandwidth 1e12" "$ELDR" simulate --derive h200 --model "$SRC/configs/models/tiny.yaml" --bandwidth 1e12 \
  -o derived-ok.yaml
run_ok "fit: BM_Read at 10 GB/s" "$ELDR" simulate --fit readok.json --model "$SRC/configs/models/tiny.yaml" -o fit-read.yaml
sed 's/^  decode:/  decdoe:/' job.yaml > simtypo.yaml
expect_error "inline cost model misspelt" "simtypo.yaml:10: unknown key 'simulate.decdoe' \(did you mean 'decode'\?\)" \
  - "$ELDR" simulate -c simtypo.yaml --no-output
# serve runs no cost model, yet it checks the simulate: keys too (without reading the cost_model file).
expect_error "serve: simulate section misspelt" \
  "simtypo.yaml:10: unknown key 'simulate.decdoe' \(did you mean 'decode'\?\)" - "$ELDR" serve --print-ranks -c simtypo.yaml
sed 's/^  control_latency_s:/  control_latncy_s:/' job.yaml > simtypo2.yaml
expect_error "serve: simulate key misspelt" "simtypo2.yaml:[0-9]+: unknown key 'simulate.control_latncy_s'" - \
  "$ELDR" serve --print-ranks -c simtypo2.yaml
sed 's|^simulate:|simulate:\n  cost_model: nowhere.yaml|' job.yaml > simnofile.yaml
run_ok "serve: the simulate section's cost_model file is not read" "$ELDR" serve --print-ranks -c simnofile.yaml

# ---- trace synth integer options: ranges checked before conversion, one line naming the option ----
expect_error "synth --layers 0" "--layers: must be an integer in \[1, 4096\], got '0'" s0.h5 \
  "$ELDR" trace synth --layers 0 --out s0.h5
expect_error "synth --experts 70000" "--experts: must be an integer in \[1, 65535\], got '70000'" s0.h5 \
  "$ELDR" trace synth --experts 70000 --out s0.h5
expect_error "synth --top-k 1.5" "--top-k: must be an integer in \[1, 65535\], got '1.5'" s0.h5 \
  "$ELDR" trace synth --top-k 1.5 --out s0.h5
expect_error "synth --domains -1" "--domains: must be an integer in \[1, 65535\], got '-1'" s0.h5 \
  "$ELDR" trace synth --domains -1 --out s0.h5
expect_error "synth --requests 0" "--requests: must be an integer in \[1, [0-9]+\], got '0'" s0.h5 \
  "$ELDR" trace synth --requests 0 --out s0.h5
expect_error "synth --requests abc" "--requests: must be an integer in \[1, [0-9]+\], got 'abc'" s0.h5 \
  "$ELDR" trace synth --requests abc --out s0.h5
# A seed CLI11 would wrap: -1 and 10^20 were both taken as 2^64 - 1.
for s in -1 99999999999999999999; do
  expect_error "synth --seed $s" "--seed: must be an integer in \[0, 18446744073709551615\], got '$s'" s0.h5 \
    "$ELDR" trace synth --seed "$s" --out s0.h5
done
expect_error "simulate --seed -1" "--seed: must be an integer in \[0, 18446744073709551615\], got '-1'" - \
  "$ELDR" simulate -c job.yaml --seed -1 --no-output
expect_error "synth --domain-affinity 1.5" "--domain-affinity: must be in \[0, 1\], got '1.5'" s0.h5 \
  "$ELDR" trace synth --domain-affinity 1.5 --out s0.h5
expect_error "synth --like --separation 1e300 (was: 301 digits)" "--separation: must be in \[0, 100\], got '1e300'" s0.h5 \
  "$ELDR" trace synth --like trace.h5 --separation 1e300 --out s0.h5
# Options of the other mode were ignored silently (--like takes the shape from its trace).
expect_error "synth --like with --layers" "--layers does not apply with --like" s0.h5 \
  "$ELDR" trace synth --like trace.h5 --layers 3 --out s0.h5
expect_error "synth --like with --mix" "--mix does not apply with --like" s0.h5 \
  "$ELDR" trace synth --like trace.h5 --mix wildchat --out s0.h5
expect_error "synth --separation without --like" "--separation applies only with --like" s0.h5 \
  "$ELDR" trace synth --separation 2 --out s0.h5

# ---- the run directory (output.dir): refused when it holds files, replaced whole with output.replace ----
sed 's|^output: {dir: run}|output: {dir: rd}|' job.yaml > rd.yaml
run_ok "simulate writes a new run directory" "$ELDR" simulate -c rd.yaml --quiet
cp rd/metrics.json rd-first.json
echo stale >rd/steps.jsonl  # as a serve run leaves it: simulate writes no steps.jsonl
expect_error "a second run into the same output.dir" "output.dir rd already holds files \(an earlier run\?\); set output.replace: true" \
  - "$ELDR" simulate -c rd.yaml --quiet
cmp -s rd/metrics.json rd-first.json && ok "the refused run directory is left as it was" || bad "the refused run directory is left as it was"
sed 's|^output: {dir: rd}|output: {dir: rd, replace: true}|' rd.yaml > rdr.yaml
run_ok "output.replace: true replaces the earlier run" "$ELDR" simulate -c rdr.yaml --quiet
[ "$(ls -A rd | tr '\n' ' ')" = "metrics.json requests.jsonl " ] && ! ls -A . | grep -q '^\.rd\.tmp' \
  && ok "replaced whole: the earlier run's steps.jsonl is gone, no temporary left" \
  || bad "replaced whole" "$(ls -A rd . | tr '\n' ' ')"
echo mine >rd/notes.txt
expect_error "output.replace never removes other data" "output.dir rd holds notes.txt, which is not a run's file" - \
  "$ELDR" simulate -c rdr.yaml --quiet
[ "$(cat rd/notes.txt)" = mine ] && ok "other data left in place" || bad "other data left in place"
mkdir mine && echo precious >mine/metrics.json && echo mine >mine/requests.jsonl
expect_error "output.replace never takes a user's metrics.json for a run's" \
  "output.dir mine holds a metrics.json that no eldr run wrote" - "$ELDR" simulate -c rdr.yaml --output-dir mine --quiet
[ "$(cat mine/metrics.json mine/requests.jsonl | tr '\n' ' ')" = "precious mine " ] \
  && ok "the user's files named like a run's are left in place" || bad "the user's files named like a run's"
# An output.dir that another job is writing (it holds the flock on .NAME.eldr-lock beside it) is refused before the
# run, naming the holder; nothing is written and the holder's lock file is left alone.
rm -f busy.ready
( flock 9 && echo "pid 4242 on othernode" >&9 && touch busy.ready && sleep 60 ) 9>.busy.eldr-lock &
holder=$!
for i in $(seq 100); do [ -e busy.ready ] && break; sleep 0.05; done
expect_error "an output.dir another job is writing" \
  "output.dir busy is in use by another eldr job \(pid 4242 on othernode\); wait for it to end or choose another" busy \
  "$ELDR" simulate -c rd.yaml --output-dir busy --quiet
[ "$(cat .busy.eldr-lock)" = "pid 4242 on othernode" ] && ok "the holder's lock file is left alone" ||
  bad "the holder's lock file is left alone"
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
rm -f .busy.eldr-lock
run_ok "the same output.dir once the other job has ended" "$ELDR" simulate -c rd.yaml --output-dir busy --quiet
[ "$(ls -A . | grep -c 'eldr-lock')" = 0 ] && ok "no lock file left after a run" || bad "no lock file left after a run"
sed 's|replace: true|replace: maybe|' rdr.yaml > rdbad.yaml
expect_error "output.replace: not a bool" "rdbad.yaml:[0-9]+: output.replace" - "$ELDR" serve --print-ranks -c rdbad.yaml
sed 's|^simulate:|simulate:\n  cost_model: '"$SRC"'/configs/costs/h200-qwen3-30b-a3b.yaml|; /^  decode:/d; /^  prefill:/d' job.yaml \
  > simfile.yaml
run_ok "cost_model file with inline overrides" "$ELDR" simulate -c simfile.yaml --no-output --quiet

# ---- model configs ----
sed 's/^hidden_size:/hiden_size:/' "$SRC/configs/models/tiny.yaml" > badmodel.yaml
expect_error "model: misspelt key" "badmodel.yaml:[0-9]+: unknown key 'hiden_size' \(did you mean 'hidden_size'\?\)" \
  - "$ELDR" simulate --derive h200 --model badmodel.yaml
sed 's/^num_experts_per_tok: .*/num_experts_per_tok: 1.5/' "$SRC/configs/models/tiny.yaml" > fracmodel.yaml
expect_error "model: fractional integer" "num_experts_per_tok must be an integer in \[1, " - \
  "$ELDR" simulate --derive h200 --model fracmodel.yaml

# ---- overrides checked like the keys ----
expect_error "serve --tau nan" "--tau: must be >= 0, got 'nan' \(not a number\)" - "$ELDR" serve -c job.yaml --tau nan --print-ranks
expect_error "simulate --load-bound 1e309 (infinite)" \
  "--load-bound: must be >= 0, got '1e309' \(infinite: give a finite number\)" run/metrics.json \
  "$ELDR" simulate -c job.yaml --load-bound 1e309 --quiet
expect_error "simulate --rate 1e-14 (arrivals past the clock's resolution)" \
  "job.yaml: workload.request_rate \(--rate\) 1e-14 spreads 40 arrivals over .* raise the rate" run/metrics.json \
  "$ELDR" simulate -c job.yaml --rate 1e-14 --quiet
expect_error "simulate --policy '' (not the config's policy)" "--policy: the value is empty" run/metrics.json \
  "$ELDR" simulate -c job.yaml --policy "" --quiet
expect_error "serve --policy ''" "--policy: the value is empty" - "$ELDR" serve -c job.yaml --policy "" --print-ranks
# An override that the policy run would ignore is refused, naming the option and the policies that read it; a config
# file may hold every policy's keys (job.yaml's routing.tau and calibration, with --policy jsq, run).
expect_error "simulate --policy jsq --tau 0.2 (jsq has no band)" \
  "^eldr: error: --tau does not apply to policy jsq, which would ignore it \(the band width is read by eldr_paper, eldr_tail\)" \
  run/metrics.json "$ELDR" simulate -c job.yaml --policy jsq --tau 0.2 --quiet
expect_error "simulate --tau with the config's eldr (a marginal-cost router: no band)" \
  "--tau does not apply to policy eldr," run/metrics.json "$ELDR" simulate -c job.yaml --tau 0.2 --quiet
expect_error "simulate --policy jsq --calib" \
  "--calib does not apply to policy jsq, .*read by locality_top1, eldr, eldr_paper, eldr_tail\)" run/metrics.json \
  "$ELDR" simulate -c job.yaml --policy jsq --calib cal2.h5 --quiet
expect_error "simulate --policy eldr_paper --harm-weight (λ is eldr's)" \
  "--harm-weight does not apply to policy eldr_paper, .*read by eldr\)" run/metrics.json \
  "$ELDR" simulate -c job.yaml --policy eldr_paper --harm-weight 0.5 --quiet
expect_error "serve --policy round_robin --load-bound 0.1" "--load-bound does not apply to policy round_robin" - \
  "$ELDR" serve -c job.yaml --policy round_robin --load-bound 0.1 --print-ranks
expect_error "simulate --policy jsq --route-on decode" "--route-on does not apply to policy jsq" run/metrics.json \
  "$ELDR" simulate -c job.yaml --policy jsq --route-on decode --quiet
run_ok "simulate --policy jsq --route-on prefill (the default, what every policy does)" \
  "$ELDR" simulate -c job.yaml --policy jsq --route-on prefill --no-output --quiet
run_ok "simulate --policy jsq, the config holding eldr's tau and calibration" \
  "$ELDR" simulate -c job.yaml --policy jsq --no-output --quiet
run_ok "simulate --policy eldr_paper --tau 0.2 --load-bound 0.1" \
  "$ELDR" simulate -c job.yaml --policy eldr_paper --tau 0.2 --load-bound 0.1 --no-output --quiet
# eldr_tail's bound is never off: load_bound 0 routes as 0.25, and metrics.json records the ε routed with.
run_ok "eldr_tail with load_bound 0" "$ELDR" simulate -c job.yaml --policy eldr_tail --load-bound 0 --output-dir lb0 \
  --quiet
run_ok "eldr_tail with load_bound 0.25" "$ELDR" simulate -c job.yaml --policy eldr_tail --load-bound 0.25 \
  --output-dir lb25 --quiet
run_ok "eldr_tail: load_bound 0 is recorded and routed as 0.25" $PY - <<'PYEOF'
import json
a, b = (json.load(open(d + "/metrics.json")) for d in ("lb0", "lb25"))
assert a["load_bound"] == 0.25 and a["config"]["routing"]["load_bound"] == 0.25, (a["load_bound"], a["config"]["routing"])
assert [json.loads(l)["decoder"] for l in open("lb0/requests.jsonl")] == \
       [json.loads(l)["decoder"] for l in open("lb25/requests.jsonl")]
PYEOF
expect_error "serve --load-bound -1" "--load-bound: must be >= 0, got '-1'" - \
  "$ELDR" serve -c job.yaml --load-bound -1 --print-ranks
for h in 1.5 -0.1 nan; do
  expect_error "simulate --harm-weight $h" "--harm-weight: must be in \\[0, 1\\], got '$h'" - \
    "$ELDR" simulate -c job.yaml --harm-weight "$h" --no-output
done
"$ELDR" simulate -c job.yaml --harm-weight 0.25 --no-output --json --quiet > hw.json 2>/dev/null
$PY -c 'import json,sys; sys.exit(json.load(open("hw.json"))["config"]["routing"]["harm_weight"] != 0.25)' \
  && ok "simulate --harm-weight 0.25 reaches the job (config.routing.harm_weight)" \
  || bad "simulate --harm-weight 0.25 reaches the job (config.routing.harm_weight)"
for r in 0 -1 nan; do
  expect_error "simulate --rate $r" "--rate: must be > 0 or inf, got '$r'" - "$ELDR" simulate -c job.yaml --rate "$r" --no-output
done
run_ok "simulate --rate inf (all at once)" "$ELDR" simulate -c job.yaml --rate inf --no-output --quiet
# Nesting past yaml-cpp's depth guard is named as such (its own message is "bad file"); a read error names the file.
$PY -c "print('topology: ' + '[' * 10000)" > deep.yaml
expect_error "YAML nested too deep" "deep.yaml:[0-9]+: invalid YAML: nested deeper than the parser's limit" - \
  "$ELDR" simulate -c deep.yaml --no-output
expect_error "a config that cannot be read" "^eldr: error: /proc/self/mem: cannot read: " - \
  "$ELDR" simulate -c /proc/self/mem --no-output
# A second YAML document would be dropped unread; an empty one after a trailing "---" is nothing dropped.
{ cat job.yaml; printf -- '---\ntopology: {prefill_ranks: 7}\n'; } > two-docs.yaml
expect_error "a second YAML document" "two-docs.yaml:[0-9]+: a second YAML document; a job config is one document" - \
  "$ELDR" simulate -c two-docs.yaml --no-output
{ cat job.yaml; printf -- '---\n'; } > trailing-marker.yaml
run_ok "a trailing '---' alone" "$ELDR" simulate -c trailing-marker.yaml --no-output -n 2
expect_error "simulate --burstiness 0" "--burstiness: must be in \\(0, 1e6\\], got '0'" - \
  "$ELDR" simulate -c job.yaml --burstiness 0 --no-output
expect_error "simulate -n -5" "--num-requests: must be an integer in \[0, [0-9]+\], got '-5'" - \
  "$ELDR" simulate -c job.yaml -n -5 --no-output
expect_error "simulate --max-batch 0" "--max-batch: must be an integer in \[1, [0-9]+\], got '0'" - \
  "$ELDR" simulate -c job.yaml --max-batch 0 --no-output
expect_error "simulate --max-batch 2.5" "--max-batch: must be an integer in \[1, [0-9]+\], got '2.5'" - \
  "$ELDR" simulate -c job.yaml --max-batch 2.5 --no-output
expect_error "simulate -K 0" "--decoders: must be an integer in \[1, 65536\], got '0'" - \
  "$ELDR" simulate -c job.yaml -K 0 --no-output
expect_error "simulate --admission-cap -1" "--admission-cap: must be an integer in \[0, [0-9]+\], got '-1'" - \
  "$ELDR" simulate -c job.yaml --admission-cap -1 --no-output
expect_error "route --tau -1" "--tau: must be >= 0, got '-1'" - "$ELDR" route --calib cal2.h5 --trace trace.h5 --tau -1
expect_error "route --rate -1" "--rate: must be >= 0 or inf, got '-1'" - \
  "$ELDR" route --calib cal2.h5 --trace trace.h5 --rate -1
run_ok "route --rate inf (all at once)" "$ELDR" route --calib cal2.h5 --trace trace.h5 --rate inf
expect_error "calibrate --max-pairs -5" "--max-pairs: must be an integer in \[0, [0-9]+\], got '-5'" out.h5 \
  "$ELDR" calibrate --trace trace.h5 -K 2 --max-pairs -5 --out out.h5
expect_error "place --expert-bytes -5" "--expert-bytes: must be an integer in \[0, [0-9]+\], got '-5'" - \
  "$ELDR" place profile --load x.json -P 8 -R 2 --expert-bytes -5
expect_error "refit --signature" "--signature is a fit option: --refit re-clusters" out.h5 \
  "$ELDR" calibrate --refit cal2.h5 -K 2 --signature count --out out.h5
expect_error "refit --layers" "--layers is a fit option" out.h5 "$ELDR" calibrate --refit cal2.h5 -K 2 --layers 1 --out out.h5
# --refit computes no rho: --holdout and --max-pairs were ignored silently.
expect_error "refit --holdout" "--holdout is a fit option" out.h5 "$ELDR" calibrate --refit cal2.h5 -K 2 --holdout 0.5 --out out.h5
expect_error "refit --max-pairs" "--max-pairs is a fit option" out.h5 "$ELDR" calibrate --refit cal2.h5 -K 2 --max-pairs 5 --out out.h5
expect_error "CLI11 error: one line" "^eldr: error: The following argument was not expected: --bogus" - \
  "$ELDR" simulate -c job.yaml --bogus
expect_error "CLI11 missing option: one line" "^eldr: error: --out is required" - "$ELDR" calibrate --trace trace.h5 -K 2

# ---- bounds before allocation ----
expect_error "route --repeat 100000000" "--repeat 100000000 x 40 requests: needs [0-9.]+ [GMT]?B, this machine has" - \
  "$ELDR" route --calib cal2.h5 --trace trace.h5 --repeat 100000000
expect_error "route --repeat over a small budget" "--repeat 1000 x 40 requests: needs 2.6 MB, this machine has 1.0 MB" - \
  env ELDR_MEMORY_BUDGET=1000000 "$ELDR" route --calib cal2.h5 --trace trace.h5 --repeat 1000
expect_error "simulate -n 10^13 (was: 'out of memory')" "job.yaml: workload.num_requests \(--num-requests\) 10000000000000: needs .*, this machine has" \
  - "$ELDR" simulate -c job.yaml -n 10000000000000 --no-output
expect_error "synth over the memory budget" "synthetic trace of [0-9]+ routing entries: needs" big.h5 \
  env ELDR_MEMORY_BUDGET=1000000 "$ELDR" trace synth --requests 10000 --layers 4 --experts 8 --top-k 2 --out big.h5
$PY - <<'PY'
import json
row = lambda t: [[0, 1], [2, 3]]
line = {"id": "r0", "num_layers": 2, "num_experts": 8, "top_k": 2, "num_tokens": 3, "prompt_len": 1,
        "topk_ids": [row(t) for t in range(3)]}
open("ok.jsonl", "w").write(json.dumps(line) + "\n")
w = dict(line, topk_weights=[[[0.5, 0.5], [0.5, 1e39]]] * 3)
open("w39.jsonl", "w").write(json.dumps(w) + "\n")
open("prof-gap.json", "w").write(json.dumps({"token_scores": {"0": {"0": 1, "1": 2}, "1": {"0": 1, "1": 2},
                                                               "5": {"0": 1, "1": 2}}}))
open("prof-huge.json", "w").write(json.dumps({"token_scores": {"0": {"0": 1e308, "1": 1e308}}}))
open("prof.json", "w").write(json.dumps({"token_scores": {"1": {"0": 1, "1": 2, "2": 3, "3": 4}}}))
open("prev.json", "w").write(json.dumps({"num_layers": 1, "num_experts": 4, "num_ranks": 2, "phy2log": [0, 0, 0, 0]}))
PY
expect_error "JSONL num_tokens over the memory budget" "ok.jsonl:1: num_tokens 3 x 2 layers x top-2: needs" imp.h5 \
  env ELDR_MEMORY_BUDGET=10 "$ELDR" trace import --in ok.jsonl --out imp.h5

# ---- writers refuse what readers reject ----
# (the command line's range is the trace format's; the writer's own check is ValidateTraceShape, unit-tested)
expect_error "synth --layers 5000" "--layers: must be an integer in \[1, 4096\], got '5000'" s5000.h5 \
  "$ELDR" trace synth --requests 2 --layers 5000 --experts 8 --top-k 2 --prompt-len 2 --output-len 2 --out s5000.h5
expect_error "JSONL topk_weights 1e39" "w39.jsonl:1: topk_weights\[0\]\[1\] has a negative or non-finite value" w39.h5 \
  "$ELDR" trace import --in w39.jsonl --out w39.h5
expect_error "place: loads of 1e308" "prof-huge.json: the loads sum to .*above 1e300" - \
  "$ELDR" place profile --load prof-huge.json -P 2 -R 2
echo '{"token_scores": {"1": {"0": 1, "1": 2, "2": 3, "3": 4}}, "token_scores": {"1": {"0": 9, "1": 2, "2": 3, "3": 4}}}' \
  > prof-dup.json
expect_error "place: token_scores twice" "prof-dup.json: duplicate key \"token_scores\" in a JSON object" - \
  "$ELDR" place profile --load prof-dup.json -P 4 -R 2
echo '{"token_scores": {"1": {"0": 1, "1": 2, "1": 3, "3": 4}}}' > prof-dup2.json
expect_error "place: an expert twice in a layer" "prof-dup2.json: duplicate key \"1\" in a JSON object" - \
  "$ELDR" place profile --load prof-dup2.json -P 4 -R 2
echo '{"kind":"decode","kind":"prefill","worker":0,"time":0,"seconds":0.004,"batch":1,"distinct_experts":2,"context_tokens":5}' \
  > steps-dup.jsonl
expect_error "simulate --fit: a step record with kind twice" "steps-dup.jsonl:1: not a step record: duplicate key \"kind\"" - \
  "$ELDR" simulate --fit steps-dup.jsonl --model "$SRC/configs/models/tiny.yaml"
mkdir -p stepsdir
expect_error "simulate --fit DIR" "stepsdir: is a directory, expected a steps.jsonl" - \
  "$ELDR" simulate --fit stepsdir --model "$SRC/configs/models/tiny.yaml"
expect_error "place: layer keys 0, 1, 5" "prof-gap.json: token_scores layer keys must be consecutive; layer \"2\" is missing" - \
  "$ELDR" place profile --load prof-gap.json -P 2 -R 2
run_ok "place: layer keys starting at 1" "$ELDR" place profile --load prof.json -P 4 -R 2

# ---- messages (item 10) ----
expect_error "calibrate --holdout 0.99" "--holdout 0.990 leaves [0-9]+ of 40 usable requests to calibrate on, fewer than K = 2" \
  out.h5 "$ELDR" calibrate --trace trace.h5 -K 2 --holdout 0.99 --out out.h5
expect_error "place --previous names its file" "prev.json: " - \
  "$ELDR" place profile --load prof.json -P 4 -R 2 --previous prev.json
"$ELDR" trace import --in ok.jsonl --out ok.h5 >/dev/null 2>&1 && ok "small JSONL imports" || bad "small JSONL imports"
$PY -c "
import gzip, json
line = json.loads(open('ok.jsonl').read())
data = ''.join(json.dumps(dict(line, id='r%d' % i)) + '\n' for i in range(200)).encode()
z = gzip.compress(data)
open('cut.jsonl.gz', 'wb').write(z[:len(z) * 2 // 3])
"
expect_error "truncated gzip" "cut.jsonl.gz:[0-9]+: .*(truncated|ends early)" cut.h5 "$ELDR" trace import --in cut.jsonl.gz --out cut.h5

finish
