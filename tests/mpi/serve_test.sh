#!/usr/bin/env bash
# eldr serve under mpirun (ctest label mpi): every accepted request completes exactly once with the right number
# of tokens, the decoded tokens equal a single-process run (serve_reference), routing is reproducible for a seed
# (the rule in runtime/serve/serve.h), every policy runs, 2 to 6 ranks, the KV transport choice (mpi, auto,
# nccl) is honoured and recorded, and bad configurations fail with one clear line instead of hanging.
# Usage: serve_test.sh /path/to/eldr /path/to/source /path/to/serve_reference
set -u
ELDR="$1"
SRC="$2"
REFERENCE="$3"  # tests/mpi/serve_reference.cc: the single-process oracle of the decoded tokens
PY=/usr/bin/python3
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
export ELDR_NUM_THREADS=1
MPIRUN=(timeout -k 5 300 mpirun --oversubscribe -x ELDR_NUM_THREADS)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
source "$SRC/tests/lib.sh"

"$ELDR" trace synth --domains 3 --requests 30 --layers 2 --experts 8 --top-k 2 --prompt-len 8:24 --output-len 1:12 \
  --seed 5 --out trace.h5 >/dev/null
"$ELDR" calibrate --trace trace.h5 -K 2 --out calib2.h5 --quiet
"$ELDR" calibrate --trace trace.h5 -K 4 --out calib4.h5 --quiet

job() {  # job NAME PREFILL DECODE POLICY CALIB [extra workload fields]
  cat > "$1.yaml" <<YAML
topology: {prefill_ranks: $2, decode_ranks: $3}
model: {config: $SRC/configs/models/tiny.yaml, weights: synthetic, seed: 0, gate: replay}
routing: {policy: $4, calibration: $5, tau: 0.1, seed: 1}
kv_cache: {block_size: 4, prefill_blocks: 64, decode_blocks: 24}
decode: {max_batch: 4}
workload: {trace: $WORK/trace.h5, request_rate: ${6:-200}, max_concurrency: ${7:-0}, seed: 3}
output: {dir: $WORK/out-$1}
watchdog_s: 60
YAML
}

# Every request exactly once, with its trace's output length (decode tokens; at least prefill's one).
check_complete() {
  $PY - "$WORK/out-$1" "$WORK/trace.h5" <<'PYEOF'
import json, sys, h5py
out, trace = sys.argv[1], sys.argv[2]
t = h5py.File(trace, "r")
ids = [x.decode() for x in t["/requests/id"][:]]
want = {i: max(1, int(n - p)) for i, n, p in zip(ids, t["/requests/num_tokens"][:], t["/requests/prompt_len"][:])}
recs = [json.loads(l) for l in open(out + "/requests.jsonl")]
got = {}
for r in recs:
    assert r["id"] not in got, "request twice: " + r["id"]
    got[r["id"]] = r
assert set(got) == set(want), "missing or extra requests"
for i, r in got.items():
    assert r["success"], (i, r.get("error"))
    assert r["output_len"] == want[i], (i, r["output_len"], want[i])
m = json.load(open(out + "/metrics.json"))
assert m["completed"] == len(want) and m["failed"] == 0
assert sum(d["requests"] for d in m["decoders"]) == len(want)
PYEOF
}

for np in 3 4 6; do
  dec=$((np - 2))
  calib=calib2.h5; [ "$dec" = 4 ] && calib=calib4.h5
  [ "$dec" = 1 ] && { "$ELDR" calibrate --trace trace.h5 -K 1 --out calib1.h5 --quiet; calib=calib1.h5; }
  job "np$np" 1 "$dec" eldr "$WORK/$calib"
  if "${MPIRUN[@]}" -np "$np" "$ELDR" serve -c "np$np.yaml" --quiet >"np$np.log" 2>&1 && check_complete "np$np"; then
    ok "eldr, $np ranks (1 router, 1 prefill, $dec decoders): every request once, right token counts"
  else bad "eldr, $np ranks" "$(tail -5 "np$np.log")"; fi
done
job "p2" 2 2 jsq "" 500 6
if "${MPIRUN[@]}" -np 5 "$ELDR" serve -c p2.yaml --quiet >p2.log 2>&1 && check_complete p2; then
  ok "2 prefill ranks, max_concurrency 6, jsq"
else bad "2 prefill ranks" "$(tail -5 p2.log)"; fi
for policy in random round_robin p2c domain locality_top1; do
  job "pol-$policy" 1 2 "$policy" "$WORK/calib2.h5"
  if "${MPIRUN[@]}" -np 4 "$ELDR" serve -c "pol-$policy.yaml" --quiet >"pol.log" 2>&1 && check_complete "pol-$policy"; then
    ok "policy $policy"
  else bad "policy $policy" "$(tail -5 pol.log)"; fi
done
# The launcher script: the command line from the config, run through gpu-bind (no GPU here: CPU ranks).
job launch 1 2 jsq ""
if ELDR="$ELDR" timeout -k 5 120 "$SRC/launch/eldr-launch" launch.yaml --run -- --oversubscribe -x ELDR_NUM_THREADS \
     >launch.log 2>&1 && grep -q "^# rank 3: decode 1" launch.log && check_complete launch; then
  ok "launch/eldr-launch --run (mpirun, rank map, gpu-bind)"
else bad "launch/eldr-launch" "$(tail -3 launch.log)"; fi

# Reproducible routing: the same seed and config give the same decoder for every request. Load-aware policies
# see the decoders' in-flight counts, which in a live job depend on when completions arrive; one request at a
# time (max_concurrency 1) makes every load snapshot the same, so the decisions must be identical. random
# draws from the seeded stream.
job rep1 1 2 eldr "$WORK/calib2.h5" inf 1
job rep2 1 2 eldr "$WORK/calib2.h5" inf 1
job rep3 1 2 random "" inf 1
job rep4 1 2 random "" inf 1
for r in rep1 rep2 rep3 rep4; do "${MPIRUN[@]}" -np 4 "$ELDR" serve -c $r.yaml --quiet >/dev/null 2>&1; done
for pair in "rep1 rep2" "rep3 rep4"; do
  set -- $pair
  if $PY -c "
import json
a = {json.loads(l)['id']: json.loads(l)['decoder'] for l in open('$WORK/out-$1/requests.jsonl')}
b = {json.loads(l)['id']: json.loads(l)['decoder'] for l in open('$WORK/out-$2/requests.jsonl')}
assert a == b and len(a) == 30, (len(a), len(b))
assert len(set(a.values())) == 2, 'both decoders used'
"; then ok "routing decisions reproducible ($1, $2)"; else bad "routing decisions reproducible ($1, $2)"; fi
done

# Beyond max_concurrency 1 (the rule is in runtime/serve/serve.h): with 1 prefill rank rank 0 routes in request
# order, so the policies that do not look at load give the same decoders at request_rate inf and unlimited
# concurrency, where completions interleave with routing differently in every run: round_robin and random
# (the decision sequence, in request order), locality_top1 (the nearest centroid) and domain (its group, one
# decoder each here: 3 domains, 2 decoders). The latter two are functions of the request alone, so they stay
# reproducible with 2 prefill ranks, whose results reach rank 0 in a timing-dependent order. Load-aware
# policies (jsq, p2c, eldr) are reproducible one request at a time (eldr: rep1, rep2 above); jsq and p2c then see
# every decoder idle at each decision and take the lower index, decoder 0, every time.
same_decoders() {  # RUN_A RUN_B [python check of the decoder list d, in request order; default: both used]
  $PY -c "
import json
def load(run):
    recs = [json.loads(l) for l in open('$WORK/out-%s/requests.jsonl' % run)]
    assert len(recs) == 30 and all(r['success'] for r in recs), run
    return recs
a, b = load('$1'), load('$2')
d = [r['decoder'] for r in a]
assert [r['id'] for r in a] == [r['id'] for r in b]
assert d == [r['decoder'] for r in b], [r['id'] for r, s in zip(a, b) if r['decoder'] != s['decoder']]
${3:-assert len(set(d)) == 2, 'both decoders used'}
"
}
for spec in "round_robin 1 0" "random 1 0" "locality_top1 1 0" "domain 1 0" "locality_top1 2 0" "domain 2 0" \
            "jsq 1 1" "p2c 1 1"; do
  set -- $spec
  for run in a b; do
    job "rr-$1-$2-$3-$run" "$2" 2 "$1" "$WORK/calib2.h5" inf "$3"
    "${MPIRUN[@]}" -np $((3 + $2)) "$ELDR" serve -c "rr-$1-$2-$3-$run.yaml" --quiet >/dev/null 2>&1
  done
done
# round_robin in request order is 0, 1, 0, 1, ...; domain sends the i-th of the sorted labels to decoder i mod 2.
check_rr="assert d == [i % 2 for i in range(30)], d"
check_domain="labels = sorted({r['domain'] for r in a}); assert d == [labels.index(r['domain']) % 2 for r in a], d"
for spec in "round_robin 1 0" "random 1 0" "locality_top1 1 0" "domain 1 0" "locality_top1 2 0" "domain 2 0" \
            "jsq 1 1" "p2c 1 1"; do
  set -- $spec
  extra=""
  [ "$1" = round_robin ] && extra="$check_rr"
  [ "$1" = domain ] && extra="$check_domain"
  [ "$1" = jsq ] || [ "$1" = p2c ] && extra="assert d == [0] * 30, d"
  what="$1, $2 prefill rank(s), $([ "$3" = 0 ] && echo 'rate inf, unlimited concurrency' || echo 'max_concurrency 1')"
  if same_decoders "rr-$1-$2-$3-a" "rr-$1-$2-$3-b" "$extra"; then ok "routing reproducible: $what"
  else bad "routing reproducible: $what"; fi
done

# The decoded tokens do not depend on the topology: 1 decoder vs 4 decoders, 1 vs 2 prefill ranks (max_batch 1,
# so every decode step has the same arithmetic as a single sequence run alone).
for t in "tok1 1 1" "tok4 1 4" "tok22 2 2"; do
  set -- $t
  job "$1" "$2" "$3" jsq ""
  sed -i 's/max_batch: 4/max_batch: 1/; s|output: {dir: \(.*\)}|output: {dir: \1, tokens: true}|' "$1.yaml"
  "${MPIRUN[@]}" -np $((1 + $2 + $3)) "$ELDR" serve -c "$1.yaml" --quiet >/dev/null 2>&1
done
if $PY -c "
import json
runs = [{json.loads(l)['id']: json.loads(l)['tokens'] for l in open('$WORK/out-%s/requests.jsonl' % n)} for n in ('tok1', 'tok4', 'tok22')]
assert len(runs[0]) == 30 and all(len(v) >= 1 for v in runs[0].values())
assert runs[0] == runs[1] == runs[2]
"; then ok "decoded tokens identical across topologies (KV shipped intact)"; else bad "decoded tokens identical across topologies"; fi

# The decoded tokens equal a single-process run of the same requests: serve_reference runs each request alone
# (a cold prefill, greedy decode at batch 1; no prefix cache, batching, KV shipping or MPI). The jobs make the
# paths the reference lacks happen: every trace request three times at once (the repeats hit the prefix cache:
# whole prompts), 32 output tokens, max_batch 8 (steps wider than any kernel tile); 1 prefill + 4 decoders
# (round_robin) and 2 prefill + 2 decoders (eldr). Exact equality holds because every kernel is batch-invariant
# (kernels/ops.h); tests/unit/batch_invariance_test.cc checks that bit for bit.
ref_job() {  # NAME PREFILL DECODE POLICY CALIB
  job "$1" "$2" "$3" "$4" "$5" inf
  sed -i 's/max_batch: 4/max_batch: 8/; s/prefill_blocks: 64, decode_blocks: 24/prefill_blocks: 512, decode_blocks: 256/
          s/seed: 3}/seed: 3, num_requests: 90, output_len: 32}/; s|output: {dir: \(.*\)}|output: {dir: \1, tokens: true}|' "$1.yaml"
}
ref_job ref14 1 4 round_robin ""
ref_job ref22 2 2 eldr "$WORK/calib2.h5"
for r in "ref14 6" "ref22 5"; do
  set -- $r
  if "${MPIRUN[@]}" -np "$2" "$ELDR" serve -c "$1.yaml" --quiet >"$1.log" 2>&1 &&
     "$REFERENCE" "$1.yaml" "$1.ref.jsonl" 2>>"$1.log" && $PY - "$WORK/out-$1" "$1.ref.jsonl" >>"$1.log" 2>&1 <<'PYEOF'
import json, sys
out, ref = sys.argv[1], sys.argv[2]
got = {}
for l in open(out + "/requests.jsonl"):
    r = json.loads(l)
    assert r["success"] and r["id"] not in got, r
    got[r["id"]] = r["tokens"]
want = {json.loads(l)["id"]: json.loads(l)["tokens"] for l in open(ref)}
assert len(want) == 90 and all(len(t) == 32 for t in want.values()), "reference: 90 requests of 32 tokens"
diff = [i for i in want if got.get(i) != want[i]]
assert set(got) == set(want) and not diff, "tokens differ from the single-process run: %s" % diff[:5]
# The job really batched and really hit the prefix cache (prompts are 8-24 tokens: fewer than 4 computed = a hit).
steps = [json.loads(l) for l in open(out + "/steps.jsonl")]
assert max(s["batch"] for s in steps if s["kind"] == "decode") >= 2, "no batched decode step"
assert sum(1 for s in steps if s["kind"] == "prefill" and s["prompt_tokens"] < 4) >= 20, "too few prefix hits"
print("max batch", max(s["batch"] for s in steps if s["kind"] == "decode"))
PYEOF
  then ok "$1: every request's tokens equal the single-process reference ($(tail -1 "$1.log"), prefix hits)"
  else bad "$1: tokens equal the single-process reference" "$(tail -3 "$1.log")"; fi
done

# The KV handoff with a decoder that is full when requests are routed to it (runtime/serve/protocol.h): 14 KV blocks
# hold one request of the longest prompt (24 + 31 positions = 14 blocks of 4), so most offers wait at the decoder
# as metadata until a finished request frees the blocks, while their KV stays in the prefill rank's blocks; every
# request still completes with the single-process reference's tokens.
ref_job reffull 1 1 round_robin ""
sed -i 's/decode_blocks: 256/decode_blocks: 14/' reffull.yaml
if "${MPIRUN[@]}" -np 3 "$ELDR" serve -c reffull.yaml --quiet >reffull.log 2>&1 &&
   "$REFERENCE" reffull.yaml reffull.ref.jsonl 2>>reffull.log && $PY - "$WORK/out-reffull" reffull.ref.jsonl >>reffull.log 2>&1 <<'PYEOF'
import json, sys
out, ref = sys.argv[1], sys.argv[2]
got = {json.loads(l)["id"]: json.loads(l) for l in open(out + "/requests.jsonl")}
want = {json.loads(l)["id"]: json.loads(l)["tokens"] for l in open(ref)}
assert len(want) == 90 and set(got) == set(want)
assert all(r["success"] for r in got.values()), [r for r in got.values() if not r["success"]][:2]
diff = [i for i in want if got[i]["tokens"] != want[i]]
assert not diff, "tokens differ from the single-process run: %s" % diff[:5]
# Full all along: never two sequences at once (any two need >= 20 blocks), with all 90 requests sent at once.
steps = [json.loads(l) for l in open(out + "/steps.jsonl")]
assert max(s["batch"] for s in steps if s["kind"] == "decode") == 1, "the decoder was not full"
PYEOF
then ok "reffull: a decoder full when KV is routed to it: every request completes with the reference's tokens"
else bad "reffull: full decoder" "$(tail -3 reffull.log)"; fi

# A burst job: NAME PREFILL DECODE REQUESTS [watchdog_s]: rate inf, 2 output tokens each, room for 8 sequences.
burst_job() {
  job "$1" "$2" "$3" jsq "" inf
  sed -i "s/max_batch: 4/max_batch: 8/; s/prefill_blocks: 64, decode_blocks: 24/prefill_blocks: 512, decode_blocks: 256/
          s/seed: 3}/seed: 3, num_requests: $4, output_len: 2}/; s/watchdog_s: 60/watchdog_s: ${5:-60}/" "$1.yaml"
}

# A burst larger than rank 0 sends in one pass of its loop (at most 256 requests: a million in one call kept it
# from its heartbeats until the workers' watch gave up): 600 requests at request_rate inf all complete once, and
# each keeps its due time, 0, as its arrival (a request sent in a later pass does not lose its wait at rank 0
# from its TTFT; before, each was stamped when it was sent).
burst_job burst 1 2 600
if "${MPIRUN[@]}" -np 4 "$ELDR" serve -c burst.yaml --quiet >burst.log 2>&1 && $PY - "$WORK/out-burst" >>burst.log 2>&1 <<'PYEOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/requests.jsonl")]
assert len(recs) == 600 and len({r["id"] for r in recs}) == 600, "not every request once"
assert all(r["success"] and r["output_len"] == 2 for r in recs), [r for r in recs if not r["success"]][:2]
late = [r["id"] for r in recs if r["arrival_s"] != 0.0]
assert not late, "arrival stamped at the send, not when due: %s" % late[:3]
m = json.load(open(sys.argv[1] + "/metrics.json"))
assert m["completed"] == 600 and m["failed"] == 0
PYEOF
then ok "burst of 600 at rate inf (rank 0 sends at most 256 a pass): every request once, each arrival when due"
else bad "burst of 600 at rate inf" "$(tail -3 burst.log)"; fi

# SIGTERM to mpirun in the middle of a 300 000-request burst: mpirun passes it on odls_base_sigkill_timeout (here
# 5 s) later and SIGKILLs as long after that; rank 0 has to account for every request and write its outputs in
# that time. It could not: the prompts queued at the prefill rank slowed the job a thousandfold and each of the
# 300 000 records carried the whole stop report (it wrote after ~12 s). The signal goes to mpirun itself (the
# timeout wrapper does not pass it on).
burst_job sigburst 1 2 300000
"${MPIRUN[@]}" --mca odls_base_sigkill_timeout 5 -np 4 "$ELDR" serve -c sigburst.yaml --quiet >sigburst.out 2>sigburst.log &
wrapper=$!
sleep 4
kill -TERM "$(pgrep -P "$wrapper" -x mpirun)" 2>/dev/null
wait "$wrapper"
rc=$?
if [ "$rc" -ne 0 ] && [ "$(grep -c 'eldr: error' sigburst.log)" = 1 ] &&
   grep -q "rank 0 received SIGTERM" sigburst.log && $PY - "$WORK/out-sigburst" >>sigburst.log 2>&1 <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1] + "/metrics.json"))
assert m["incomplete"] is True and m["completed"] > 0 and m["completed"] + m["failed"] == 300000, m
recs = [json.loads(l) for l in open(sys.argv[1] + "/requests.jsonl")]
assert len(recs) == 300000 and sum(r["success"] for r in recs) == m["completed"]
assert all(r["error"].startswith(("never sent (rank 0 received SIGTERM", "unfinished (rank 0 received SIGTERM"))
           for r in recs if not r["success"]), [r for r in recs if not r["success"]][:1]
PYEOF
then ok "SIGTERM mid-burst (300 000 requests): one line, every request accounted for in the metrics"
else bad "SIGTERM mid-burst" "rc=$rc $(grep -m2 -E 'eldr|Error' sigburst.log | cut -c1-300)"; fi

# A decoder stopped (SIGSTOP) in the middle of a 300 000-request burst, 2 prefill ranks and 3 decoders: rank 0's
# watchdog names it in one line and the metrics count every request. The line used to come after the workers
# were told to exit, and under this load mpirun SIGKILLed rank 0 first (no line in 5 of 7 runs, 66 ms after its
# summary); it is printed before now.
burst_job stopburst 2 3 300000 2
"${MPIRUN[@]}" -np 6 "$ELDR" serve -c stopburst.yaml --quiet >stopburst.out 2>stopburst.log &
wrapper=$!
sleep 3
stopped=""
for p in $(pgrep -P "$(pgrep -P "$wrapper" -x mpirun)"); do
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=4 && stopped=$p
done
[ -n "$stopped" ] && kill -STOP "$stopped"
wait "$wrapper"
rc=$?
[ -n "$stopped" ] && { kill -CONT "$stopped"; kill -9 "$stopped"; } 2>/dev/null
if [ -n "$stopped" ] && [ "$rc" -ne 0 ] && [ "$(grep -c 'eldr: error' stopburst.log)" = 1 ] &&
   grep -q "watchdog: decode 1 (rank 4) silent" stopburst.log && $PY -c "
import json
m = json.load(open('$WORK/out-stopburst/metrics.json'))
assert m['incomplete'] is True and m['completed'] + m['failed'] == 300000, m
"; then ok "decoder stopped mid-burst (2 prefill, 3 decoders): rank 0's one line names it, every request counted"
else bad "decoder stopped mid-burst" "rc=$rc pid=$stopped $(grep -m2 -E 'eldr|Error' stopburst.log | cut -c1-300)"; fi

# Expert-parallel decoders (decode.ep_size): a decoder that is an EP group of 2 ranks (its MoE layers dispatched
# to the ranks holding the experts and combined in the single-rank order) decodes exactly the tokens one rank
# does, with the contiguous placement and with a per-cluster placement that replicates hot experts, and the
# metrics carry each decoder's per-rank loads. max_batch 4: every product of a step has at most 4 rows, so a
# sequence's arithmetic does not depend on which requests share its steps.
"$ELDR" place calib --calib calib2.h5 --out calib2-ep2.h5 --algorithm eldr --slots 10 --ranks 2 >/dev/null
"$ELDR" place calib --calib calib2.h5 --out calib2-ep4.h5 --algorithm eldr --slots 8 --ranks 4 >/dev/null
ep_job() {  # NAME EP_SIZE PLACEMENT
  job "$1" 1 2 jsq ""
  sed -i "s|decode: {max_batch: 4}|decode: {max_batch: 4, ep_size: $2, placement: $3}|; s|output: {dir: \(.*\)}|output: {dir: \1, tokens: true}|" "$1.yaml"
}
ep_job ep1 1 contiguous
ep_job ep2 2 contiguous
ep_job ep2p 2 "$WORK/calib2-ep2.h5"
ep_rc=0
for r in "ep1 4" "ep2 6" "ep2p 6"; do
  set -- $r
  "${MPIRUN[@]}" -np "$2" "$ELDR" serve -c "$1.yaml" --quiet >"$1.log" 2>&1 && check_complete "$1" || { ep_rc=1; tail -3 "$1.log"; }
done
if [ "$ep_rc" = 0 ] && $PY -c "
import json
runs = [{json.loads(l)['id']: json.loads(l)['tokens'] for l in open('$WORK/out-%s/requests.jsonl' % n)} for n in ('ep1', 'ep2', 'ep2p')]
assert len(runs[0]) == 30 and sum(len(v) for v in runs[0].values()) > 60
assert runs[0] == runs[1], [i for i in runs[0] if runs[0][i] != runs[1][i]]
assert runs[0] == runs[2], [i for i in runs[0] if runs[0][i] != runs[2][i]]
"; then ok "EP decoders (ep_size 2, contiguous and per-cluster placement) decode the tokens of 1-rank decoders"
else bad "EP decoders decode the tokens of 1-rank decoders"; fi
if $PY -c "
import json
m1 = json.load(open('$WORK/out-ep1/metrics.json'))
assert m1['topology']['ep_size'] == 1
for d in m1['decoders']:
    assert d['ep_size'] == 1 and 'mean_rank_load' not in d, d
for run in ('ep2', 'ep2p'):
    m = json.load(open('$WORK/out-%s/metrics.json' % run))
    assert m['topology']['ep_size'] == 2
    assert [d['leader_rank'] for d in m['decoders']] == [2, 4], m['decoders']  # the leaders: 1 + P + k·G
    assert [d['decoder'] for d in m['decoders']] == [0, 1], m['decoders']
    for d in m['decoders']:
        assert d['ep_size'] == 2 and len(d['mean_rank_load']) == 2, d
        assert all(x > 0 for x in d['mean_rank_load']), d
        # every step computes batch x 2 MoE layers x top-2 activations, spread over the 2 ranks
        assert abs(sum(d['mean_rank_load']) - 4 * d['mean_batch']) < 1e-9, d
        assert 0 < d['p1_balancedness'] <= d['mean_balancedness'] <= 1, d
"; then ok "metrics.json: per-decoder ep_size, mean_rank_load [2], mean and p1 balancedness"
else bad "metrics.json EP rank loads" "$(grep -o '"decoders".*' "$WORK/out-ep2/metrics.json" | head -c 400)"; fi
if "$ELDR" serve -c ep2.yaml --print-ranks >ranks.out && grep -qx "ranks 6" ranks.out && grep -qx "rank 2: decode 0" ranks.out &&
   grep -qx "rank 3: decode 0 ep 1" ranks.out && grep -qx "rank 5: decode 1 ep 1" ranks.out &&
   ELDR="$ELDR" "$SRC/launch/eldr-launch" ep2.yaml | grep -q "^# rank 4: decode 1$"; then
  ok "serve --print-ranks and eldr-launch: EP groups of 2 ranks (leader, then members)"
else bad "EP rank map" "$(cat ranks.out)"; fi

# Faults and bad input: one clear line from rank 0, non-zero exit, no hang.
expect_fail() {  # NAME PATTERN NP CONFIG
  "${MPIRUN[@]}" -np "$3" "$ELDR" serve -c "$4" --quiet >f.out 2>f.err
  local rc=$?
  if [ "$rc" -eq 0 ]; then bad "$1" "exit 0"; return; fi
  if [ "$rc" -eq 124 ]; then bad "$1" "hung (timeout)"; return; fi
  if ! grep -qE -- "$2" f.err; then bad "$1" "stderr lacks /$2/: $(grep eldr f.err | head -2)"; return; fi
  ok "$1"
}
# EP config errors: one line (rank 0 only), non-zero exit.
expect_fail_once() {  # as expect_fail, and the error is printed exactly once
  expect_fail "$@"
  [ "$(grep -c 'eldr: error' f.err)" = 1 ] || bad "$1: printed once" "$(grep -c 'eldr: error' f.err) error lines"
}
ep_job ep0 0 contiguous
expect_fail_once "decode.ep_size 0" "decode.ep_size must be an integer in \[1, 1024\], got '0'" 4 ep0.yaml
expect_fail_once "EP world size differs" "needs 6 ranks \(1 router \+ 1 prefill \+ 2 decode x 2 EP ranks\) but the job has 4" 4 ep2.yaml
ep_job ep2wrong 2 "$WORK/calib2-ep4.h5"
expect_fail_once "placement file for another EP rank count" "calib2-ep4.h5: /placement is for 4 EP ranks but decode.ep_size is 2" 6 ep2wrong.yaml
ep_job ep3 3 contiguous
expect_fail_once "contiguous placement with E % ep_size != 0" "E = 8 experts and decode.ep_size is 3" 8 ep3.yaml
ep_job epmissing 2 "$WORK/nope-calib.h5"
expect_fail_once "missing placement file" "decode.placement .*nope-calib.h5: no such file" 6 epmissing.yaml
job ws 1 2 jsq ""
expect_fail "world size differs from the topology" "needs 4 ranks .* has 3; run with mpirun -np 4" 3 ws.yaml
job nocal 1 2 eldr ""
expect_fail "eldr policy without calibration" "needs routing.calibration" 4 nocal.yaml
# Sizes past memory: one line, agreed on by every rank before any allocates (was: a bad_alloc on the prefill rank).
sed 's/prefill_blocks: [0-9]*/prefill_blocks: 1073741824/' ws.yaml > bigkv.yaml
"${MPIRUN[@]}" -x ELDR_MEMORY_BUDGET=1G -np 4 "$ELDR" serve -c bigkv.yaml --quiet >f.out 2>f.err
if [ $? -ne 0 ] && [ "$(grep -c 'eldr: error' f.err)" = 1 ] && \
   grep -qE "the 4 ranks on this node: .*kv_cache.prefill_blocks = 1073741824 \\(.*needs [0-9.]+ GB, this machine has 1.1 GB available" f.err; then
  ok "KV cache past the memory budget: one line naming kv_cache.prefill_blocks"
else bad "KV cache past the memory budget" "$(grep eldr f.err | head -3)"; fi
# A bad command line or environment is the same on every rank: printed once (was: once per rank).
"${MPIRUN[@]}" -np 4 "$ELDR" serve -c ws.yaml --quiet --bogus >f.out 2>f.err
if [ $? -ne 0 ] && [ "$(grep -c 'eldr: error' f.err)" = 1 ] &&
   grep -q "eldr: error: rank 0: The following argument was not expected: --bogus" f.err
then ok "serve: an unknown option under mpirun -np 4 is one line"
else bad "serve: an unknown option under mpirun -np 4 is one line" "$(grep eldr f.err | head -5)"; fi
# An MPMD launch where only rank 3's command line is bad: that rank's own error is printed, not hidden.
"${MPIRUN[@]}" -np 3 "$ELDR" serve -c ws.yaml --quiet : -np 1 "$ELDR" serve -c ws.yaml --nope >f.out 2>f.err
if [ $? -ne 0 ] && grep -q "eldr: error: rank 3: The following argument was not expected: --nope" f.err
then ok "serve: one MPMD rank's bad option is named by that rank"
else bad "serve: one MPMD rank's bad option is named by that rank" "$(grep eldr f.err | head -5)"; fi
ELDR_NUM_THREADS=abc "${MPIRUN[@]}" -np 4 "$ELDR" serve -c ws.yaml --quiet >f.out 2>f.err
if [ $? -ne 0 ] && [ "$(grep -c 'eldr: error' f.err)" = 1 ] && grep -q "ELDR_NUM_THREADS='abc' must be" f.err
then ok "serve: a bad ELDR_NUM_THREADS under mpirun -np 4 is one line"
else bad "serve: a bad ELDR_NUM_THREADS under mpirun -np 4 is one line" "$(grep eldr f.err | head -5)"; fi
# The run directory: one that holds an earlier run is refused before the job starts (output.replace: false), once,
# naming output.dir, and left as it was.
job again 1 2 jsq ""
mkdir -p "$WORK/out-again" && echo '{"earlier": true}' >"$WORK/out-again/metrics.json"
expect_fail_once "output.dir holding an earlier run" "output.dir .*out-again already holds files .*output.replace: true" 4 again.yaml
[ "$(cat "$WORK/out-again/metrics.json")" = '{"earlier": true}' ] && [ "$(ls "$WORK/out-again")" = metrics.json ] \
  && ok "the refused run directory is left as it was" || bad "the refused run directory is left as it was"
# An output.dir another job is writing (it holds the flock on .NAME.eldr-lock beside it, as a running eldr job does)
# is refused before this job runs, naming the holder; the holder's lock file is left alone.
job inuse 1 2 jsq ""
rm -f inuse.ready
( flock 9 && echo "pid 4242 on othernode" >&9 && touch inuse.ready && sleep 60 ) 9>"$WORK/.out-inuse.eldr-lock" &
holder=$!
for i in $(seq 100); do [ -e inuse.ready ] && break; sleep 0.05; done
expect_fail_once "output.dir in use by another job" \
  "output.dir .*out-inuse is in use by another eldr job \(pid 4242 on othernode\); wait for it" 4 inuse.yaml
[ ! -e "$WORK/out-inuse" ] && [ "$(cat "$WORK/.out-inuse.eldr-lock")" = "pid 4242 on othernode" ] &&
  ok "the refused job wrote nothing and left the holder's lock file" || bad "the refused job left the lock alone"
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
# An output.dir where nothing can be created is refused before the job runs (it was found after the whole job).
sed "s|dir: .*}|dir: /sys/eldr-run}|" again.yaml > sysdir.yaml
expect_fail_once "output.dir where nothing can be created" "output.dir /sys/eldr-run: nothing can be created in /sys" 4 sysdir.yaml
job wrongk 1 2 eldr "$WORK/calib4.h5"
expect_fail "calibration for another decoder count" "K = 4 centroids but the job has 2 decoders" 4 wrongk.yaml
"$ELDR" trace synth --domains 2 --requests 10 --layers 3 --experts 8 --top-k 2 --out other.h5 >/dev/null
"$ELDR" calibrate --trace other.h5 -K 2 --out other-cal.h5 --quiet
job wrongshape 1 2 eldr "$WORK/other-cal.h5"
expect_fail "calibration of another model shape" "model shape|calibration is for model shape" 4 wrongshape.yaml
printf 'topology: {prefill_ranks: 1, decode_ranks: 2\nmodel: [' > broken.yaml
expect_fail "malformed config" "broken.yaml:.*invalid YAML" 4 broken.yaml
job badtrace 1 2 jsq ""
sed -i "s|trace: $WORK/trace.h5|trace: $WORK/nope.h5|" badtrace.yaml
expect_fail "missing workload trace" "nope.h5: no such file" 4 badtrace.yaml
head -c 3000 trace.h5 > cut.h5
job cuttrace 1 2 jsq ""
sed -i "s|trace: $WORK/trace.h5|trace: $WORK/cut.h5|" cuttrace.yaml
expect_fail "truncated workload trace" "cut.h5" 4 cuttrace.yaml
# model.weights: a safetensors file is opened by every rank before the job starts, so an error in it is one line from
# rank 0 naming the key (it used to be one line per worker, or none: a worker's "missing tensor" was never printed).
$PY - st.safetensors <<'PYEOF'
# A valid safetensors file for configs/models/tiny.yaml (weights.cc Specs), small random F32 values.
import json, struct, sys
import numpy as np
H, D, I, F, V, E, S = 32, 8, 16, 48, 64, 8, 16
shapes = {"model.embed_tokens.weight": (V, H)}
for l in range(3):
    p = f"model.layers.{l}."
    shapes.update({p + "input_layernorm.weight": (H,), p + "self_attn.q_proj.weight": (4 * D, H),
                   p + "self_attn.k_proj.weight": (2 * D, H), p + "self_attn.v_proj.weight": (2 * D, H),
                   p + "self_attn.o_proj.weight": (H, 4 * D), p + "post_attention_layernorm.weight": (H,)})
    if l == 0:
        shapes.update({p + "mlp.gate_proj.weight": (F, H), p + "mlp.up_proj.weight": (F, H), p + "mlp.down_proj.weight": (H, F)})
    else:
        shapes[p + "mlp.gate.weight"] = (E, H)
        for e in range(E):
            q = p + f"mlp.experts.{e}."
            shapes.update({q + "gate_proj.weight": (I, H), q + "up_proj.weight": (I, H), q + "down_proj.weight": (H, I)})
        shapes.update({p + "mlp.shared_experts.gate_proj.weight": (S, H), p + "mlp.shared_experts.up_proj.weight": (S, H),
                       p + "mlp.shared_experts.down_proj.weight": (H, S)})
shapes.update({"model.norm.weight": (H,), "lm_head.weight": (V, H)})
rng = np.random.default_rng(0)
header, blobs, off = {}, [], 0
for name, shape in shapes.items():
    a = (np.ones(shape) if len(shape) == 1 else rng.normal(0, 0.1, shape)).astype("<f4").tobytes()
    header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(a)]}
    blobs.append(a); off += len(a)
h = json.dumps(header).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PYEOF
weights_job() {  # NAME WEIGHTS
  job "$1" 1 2 jsq ""
  sed -i "s|weights: synthetic|weights: $2|" "$1.yaml"
}
weights_job stok "$WORK/st.safetensors"
if "${MPIRUN[@]}" -np 4 "$ELDR" serve -c stok.yaml --quiet >f.out 2>f.err && grep -q "Successful requests: *30" f.out; then
  ok "model.weights: a safetensors file serves"
else bad "model.weights: a safetensors file serves" "$(grep eldr f.err | head -2)"; fi
weights_job stmissing "$WORK/nope.safetensors"
expect_fail_once "model.weights: missing file" "router \(rank 0\): model.weights: .*nope.safetensors: no such file" 4 stmissing.yaml
printf '\x02\0\0\0\0\0\0\0{}' > empty.safetensors
weights_job stempty "$WORK/empty.safetensors"
expect_fail_once "model.weights: a tensor is missing" "model.weights: .*empty.safetensors: missing tensor model.embed_tokens.weight" \
  4 stempty.yaml
printf '\x20\0\0\0\0\0\0\0{"model.embed_tokens.weight": 5}' > num.safetensors
weights_job stnum "$WORK/num.safetensors"
expect_fail_once "model.weights: a header entry of the wrong type" "num.safetensors: model.embed_tokens.weight: its header entry is not a JSON object" \
  4 stnum.yaml
weights_job stdir "$WORK"
expect_fail_once "model.weights: a directory" "model.weights: .*: is a directory, expected a .safetensors file" 4 stdir.yaml

# KV transport (kv_cache.transport; runtime/comm/kv_transport.h). mpi: the KV inside the control message, as in
# every job above; auto: nccl only where every rank has a GPU of its own, else mpi; metrics.json records the one
# used. nccl where it cannot work (a build without NCCL, or ranks without a device of their own, as on a CPU
# machine) fails at start on every rank: one line, a non-zero exit, no rank left in a collective.
kv_job() {  # NAME TRANSPORT
  job "$1" 1 2 jsq ""
  sed -i "s/decode_blocks: 24}/decode_blocks: 24, transport: $2}/; s|output: {dir: \(.*\)}|output: {dir: \1, tokens: true}|" "$1.yaml"
}
kv_metric() { $PY -c "import json; print(json.load(open('$WORK/out-$1/metrics.json')).get('kv_transport'))"; }
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
kv_job kvmpi mpi
kv_job kvauto auto
for r in kvmpi kvauto; do "${MPIRUN[@]}" -np 4 "$ELDR" serve -c $r.yaml --quiet >$r.log 2>&1; done
if check_complete kvmpi && [ "$(kv_metric kvmpi)" = mpi ]; then ok "kv_cache.transport mpi: completes, metrics kv_transport = mpi"
else bad "kv_cache.transport mpi" "$(tail -2 kvmpi.log) kv_transport=$(kv_metric kvmpi)"; fi
auto_want=mpi
[ "${gpus:-0}" -ge 3 ] && auto_want="$(kv_metric kvauto)"  # a GPU per worker rank: nccl when built with NCCL
if check_complete kvauto && [ "$(kv_metric kvauto)" = "$auto_want" ]; then
  ok "kv_cache.transport auto: completes over $(kv_metric kvauto) ($gpus GPUs for 4 ranks)"
else bad "kv_cache.transport auto" "$(tail -2 kvauto.log) kv_transport=$(kv_metric kvauto), want $auto_want"; fi
kv_job kvnccl nccl
if "${MPIRUN[@]}" -np 4 "$ELDR" serve -c kvnccl.yaml --quiet >f.out 2>f.err; then
  # Only where every rank has a GPU: the KV went over NCCL and the decoders decoded what they do over MPI.
  if [ "${gpus:-0}" -ge 3 ] && check_complete kvnccl && [ "$(kv_metric kvnccl)" = nccl ] && $PY -c "
import json
runs = [{json.loads(l)['id']: json.loads(l)['tokens'] for l in open('$WORK/out-%s/requests.jsonl' % n)} for n in ('kvmpi', 'kvnccl')]
assert runs[0] == runs[1]
"; then ok "kv_cache.transport nccl: KV over NCCL, the same tokens as over MPI"
  else bad "kv_cache.transport nccl" "exit 0 with $gpus GPUs: $(tail -2 f.err)"; fi
else
  rc=$?
  if [ "$rc" -eq 124 ]; then bad "kv_cache.transport nccl without a GPU per rank" "hung (timeout)"
  elif [ "$(grep -c 'eldr: error' f.err)" != 1 ]; then bad "kv_cache.transport nccl: one error line" "$(grep eldr f.err | head -4)"
  elif ! grep -qE "kvnccl.yaml: kv_cache.transport: KV transport nccl: (built without NCCL|no usable CUDA device on ranks 1, 2, 3 |ranks [0-9]+ and [0-9]+ share CUDA device)" f.err
  then bad "kv_cache.transport nccl: the reason" "$(grep eldr f.err)"
  else ok "kv_cache.transport nccl without a GPU per rank: one line ($(grep -oE 'built without NCCL|no usable CUDA device|share CUDA device' f.err)), exit $rc, no hang"; fi
fi
kv_job kvbad tcp
expect_fail "kv_cache.transport tcp" "kv_cache.transport must be auto, mpi or nccl, got 'tcp'" 4 kvbad.yaml

# A decode rank that hangs: rank 0's watchdog ends the job, names the rank and its role, and still writes the
# metrics it has, with the unfinished requests counted as failed.
job hang 1 2 jsq ""
sed -i 's/watchdog_s: 60/watchdog_s: 3/' hang.yaml
# (Open MPI 4.1's mpirun sometimes lingers after it has ended every rank of a failed job; the hard timeout
# below reaps it. What is checked is that every eldr rank ended, the error line and the metrics.)
ELDR_FAULT_HANG_RANK=3 timeout -k 5 60 "${MPIRUN[@]:4}" -x ELDR_FAULT_HANG_RANK -np 4 "$ELDR" serve -c hang.yaml --quiet >f.out 2>f.err
rc=$?
sleep 1
if [ "$rc" -ne 0 ] && ! pgrep -f "serve -c hang.yaml" >/dev/null && grep -q "watchdog: decode 1 (rank 3) silent for .* s (watchdog_s 3): stopped, hung or dead" f.err && $PY -c "
import json
m = json.load(open('$WORK/out-hang/metrics.json'))
assert m['failed'] > 0 and m['completed'] + m['failed'] == 30, m
assert 'rank 3' in m['watchdog'] and m['incomplete'] is True
"; then ok "hung decode rank: watchdog names it, metrics written with failed counted"
else bad "hung decode rank" "rc=$rc $(grep -m2 eldr f.err)"; fi

# A decode rank that dies: with the survivors given time before the launcher kills them (what
# launch/eldr-launch asks mpirun for), rank 0 names the rank and writes the metrics with failed counted.
rm -rf "$WORK/out-hang"
ELDR_FAULT_DIE_RANK=3 timeout -k 5 60 "${MPIRUN[@]:4}" --mca odls_base_sigkill_timeout 30 -x ELDR_FAULT_DIE_RANK -np 4 \
  "$ELDR" serve -c hang.yaml --quiet >f.out 2>f.err
rc=$?
if [ "$rc" -ne 0 ] && grep -q "decode 1 (rank 3) holds" f.err && $PY -c "
import json
m = json.load(open('$WORK/out-hang/metrics.json'))
assert m['failed'] > 0 and m['completed'] + m['failed'] == 30, m
"; then ok "dead decode rank: named, metrics written with failed counted"
else bad "dead decode rank" "rc=$rc $(grep -m2 eldr f.err)"; fi

finish
