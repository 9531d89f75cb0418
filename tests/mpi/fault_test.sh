#!/usr/bin/env bash
# eldr serve when a rank fails (ctest label mpi; README "When a rank fails"): SIGSTOP and kill -9 of the router,
# the prefill rank, a busy decoder, an idle decoder and an EP group member (decode.ep_size 2), under plain mpirun
# and under launch/eldr-launch --run. Each case must end within watchdog_s + grace of the fault (asserted on the
# wall clock; a hard outer timeout turns a hang into a failure), exit non-zero, name the failed rank (rank 0's
# line, a worker's line about rank 0, or mpirun's own "process rank R ... exited on signal 9"), print at most one
# "eldr: error" line (one per job, not per rank), never blame another rank first, and, where rank 0 lives, write
# metrics.json accounting for every request (completed + failed = requests, "incomplete": true) together with
# requests.jsonl and steps.jsonl. A worker killed under plain mpirun (which SIGTERMs the survivors 1 s later) must
# be named in rank 0's own line too, not only in mpirun's.
# Usage: fault_test.sh /path/to/eldr /path/to/source
set -u
ELDR="$(realpath "$1")"
SRC="$(realpath "$2")"
PY=/usr/bin/python3
WORK="$(mktemp -d)"
TAG="fault-$$"  # every rank of these jobs carries ELDR_FAULT_TAG=$TAG in its environment: how PIDs are found
tagged_pids() {  # [RANK]: the PIDs of this script's eldr ranks (of world rank RANK)
  local p
  for p in $(pgrep -x eldr 2>/dev/null); do
    { tr "\0" "\n" <"/proc/$p/environ"; } 2>/dev/null | grep -qx "ELDR_FAULT_TAG=$TAG" || continue
    [ -z "${1:-}" ] || tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" || continue
    echo "$p"
  done
}
cleanup() {
  local p
  for p in $(tagged_pids); do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
cd "$WORK"
export ELDR_NUM_THREADS=1 ELDR_FAULT_TAG="$TAG" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
source "$SRC/tests/lib.sh"
W=4       # watchdog_s of these jobs
GRACE=3   # README: every fault ends the job within watchdog_s + 3 s
SLACK=2   # for a CI machine whose 2 cores run other tests beside this one
N=60      # requests

"$ELDR" trace synth --domains 2 --requests 20 --layers 2 --experts 8 --top-k 2 --prompt-len 8:24 --output-len 1:12 \
  --seed 5 --out trace.h5 >/dev/null

# 1 prefill rank (rank 1) and 2 decoders (ranks 2, 3). Every request decodes 600 tokens and they arrive at 5/s,
# so the job is mid-run, its decoders busy, when the fault comes 2 s in. idle: jsq with one request at a time
# sends every request to decoder 0, so decoder 1 (rank 3) never has work.
# ep: one decoder that is an EP group of 2 ranks (leader rank 2, member rank 3), so the member is busy too.
# fast: 20 000 requests at 2000/s of 8 tokens each, so that rank 0 has a stream of messages for the prefill rank when
# it stops: rank 0 must not block on its sends to the stopped rank (it used to, and then blamed itself).
job() {  # NAME POLICY MAX_CONCURRENCY [ep|fast]
  local decoders=2 decode="{max_batch: 4}" rate=5 output=600
  JOB_N=$N
  [ "${4:-}" = ep ] && decoders=1 decode="{max_batch: 4, ep_size: 2, placement: contiguous}"
  [ "${4:-}" = fast ] && rate=2000 output=8 JOB_N=20000
  cat >"$1.yaml" <<YAML
topology: {prefill_ranks: 1, decode_ranks: $decoders}
model: {config: $SRC/configs/models/tiny.yaml, weights: synthetic, seed: 0, gate: replay}
routing: {policy: $2, seed: 1}
kv_cache: {block_size: 8, prefill_blocks: 64, decode_blocks: 1024}
decode: $decode
workload: {trace: $WORK/trace.h5, request_rate: $rate, max_concurrency: $3, seed: 3, num_requests: $JOB_N, output_len: $output}
output: {dir: $WORK/out-$1}
watchdog_s: $W
YAML
}

open_or_bad() {  # ID LABEL WHY (every case is asserted: none is known to be open)
  bad "$2" "$3"
}

# run_case LAUNCHER RANK SIGNAL POLICY MAXCONC WHAT NAME_PATTERN [ep] (the rank's name as rank 0 or a worker says it)
run_case() {
  local launcher="$1" rank="$2" sig="$3" policy="$4" mc="$5" what="$6" name="$7" ep="${8:-}"
  local id="$launcher-$rank-$sig-$policy${ep:+-$ep}"
  job "$id" "$policy" "$mc" "$ep"
  if [ "$launcher" = mpirun ]; then
    timeout -k 5 60 mpirun --oversubscribe -np 4 -x ELDR_NUM_THREADS -x ELDR_FAULT_TAG \
      "$ELDR" serve -c "$id.yaml" --quiet >"$id.log" 2>&1 &
  else
    ELDR="$ELDR" timeout -k 5 60 "$SRC/launch/eldr-launch" "$id.yaml" --run -- --oversubscribe -x ELDR_NUM_THREADS \
      -x ELDR_FAULT_TAG >"$id.log" 2>&1 &
  fi
  local job_pid=$! pid="" i
  for i in $(seq 100); do
    pid=$(tagged_pids "$rank")
    [ -n "$pid" ] && [ "$(tagged_pids | wc -l)" = 4 ] && break
    sleep 0.1
  done
  sleep 2
  local t0 t1 rc
  t0=$(date +%s.%N)
  [ -n "$pid" ] && kill "-$sig" "$pid"
  wait "$job_pid"
  rc=$?
  t1=$(date +%s.%N)
  local p
  for p in $(tagged_pids); do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
  local took bound
  took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  bound=$((W + GRACE + SLACK))
  local label="$launcher: SIG$sig of $what (rank $rank), ended ${took} s after (bound $W + $GRACE s)"
  if [ -z "$pid" ]; then open_or_bad "$id" "$label" "rank $rank not found"; return; fi
  if [ "$rc" = 0 ]; then open_or_bad "$id" "$label" "exit 0"; return; fi
  if [ "$rc" = 124 ] || awk -v t="$took" 'BEGIN { exit !(t >= 55) }'; then open_or_bad "$id" "$label" "hung (outer timeout)"; return; fi
  if ! awk -v t="$took" -v b="$bound" 'BEGIN { exit !(t <= b) }'; then open_or_bad "$id" "$label" "longer than $bound s"; return; fi
  # Named: by rank 0 or a worker (eldr's lines), or by mpirun (a rank killed by a signal) where rank 0 is the one
  # killed; a killed worker is named by rank 0 itself.
  local named="$name"
  [ "$rank" = 0 ] && named="$name|process rank $rank with PID [0-9]+ on node .* exited on signal 9"
  if ! grep -qE "$named" "$id.log"; then
    open_or_bad "$id" "$label" "no line names rank $rank: $(grep -m3 -E 'eldr: error|exited on signal' "$id.log")"; return
  fi
  # Never another rank blamed first: what rank 0 names as silent is the failed rank.
  local blamed
  blamed=$(grep -oE "(watchdog|silent longest): [a-z]+ [0-9]+ \(rank [0-9]+\)" "$id.log" | grep -oE "rank [0-9]+" | sort -u)
  if [ -n "$blamed" ] && [ "$blamed" != "rank $rank" ]; then open_or_bad "$id" "$label" "blames $blamed"; return; fi
  # A stopped rank is the only silent one: a rank blocked on it (a prefill rank's KV send to a stopped decoder, an
  # EP leader's collective with a stopped member) answers rank 0's heartbeats from inside the wait.
  if [ "$sig" = STOP ] && grep -q "also silent" "$id.log"; then
    open_or_bad "$id" "$label" "a rank waiting on the stopped one is blamed too: $(grep -o 'also silent[^;]*' "$id.log" | head -1)"; return
  fi
  if [ "$(grep -c 'eldr: error' "$id.log")" -gt 1 ]; then
    open_or_bad "$id" "$label" "more than one error line: $(grep 'eldr: error' "$id.log" | head -3)"; return
  fi
  # Rank 0 lives unless killed: a stopped rank 0 is continued by the launcher once rank 1 has given up on it.
  if [ -f "out-$id/metrics.json" ] || [ "$rank" != 0 ] || [ "$sig" = STOP ]; then
    if ! $PY - "out-$id" "$JOB_N" <<'PYEOF' 2>>"$id.log"
import json, sys
out, n = sys.argv[1], int(sys.argv[2])
m = json.load(open(out + "/metrics.json"))
assert m["completed"] + m["failed"] == n, (m["completed"], m["failed"])
assert m["incomplete"] is True and m["reason"], m.get("reason")
recs = [json.loads(l) for l in open(out + "/requests.jsonl")]
assert len(recs) == n and sum(not r["success"] for r in recs) == m["failed"]
steps = open(out + "/steps.jsonl").read()  # the three files are committed together
PYEOF
    then open_or_bad "$id" "$label" "metrics: $(tail -1 "$id.log")"; return; fi
  fi
  ok "$label"
}

for launcher in mpirun launch; do
  for sig in STOP KILL; do
    run_case "$launcher" 0 "$sig" round_robin 0 "the router" "heard nothing from the router \(rank 0\)|the router \(rank 0\) itself was stopped"
    run_case "$launcher" 1 "$sig" round_robin 0 "the prefill rank" "(watchdog|silent longest): prefill 0 \(rank 1\)"
    run_case "$launcher" 3 "$sig" round_robin 0 "a busy decoder" "(watchdog|silent longest): decode 1 \(rank 3\)"
    run_case "$launcher" 3 "$sig" jsq 1 "an idle decoder" "(watchdog|silent longest): decode 1 \(rank 3\)"
    run_case "$launcher" 3 "$sig" round_robin 0 "an EP group member" "(watchdog|silent longest): decode 0 ep 1 \(rank 3\)" ep
  done
done
# A busy decoder stopped between the header and the payload of a message to rank 0 (ELDR_FAULT_STOP_MID_SEND_RANK=3,
# its 50th): rank 0 receives a payload while its heartbeats and watchdog go on, so its watchdog names rank 3 and it
# writes the metrics. (It used to block in that receive until rank 1's watch on rank 0 gave up: no line named rank 3;
# a SIGSTOP that landed there made two CI runs fail.)
job midsend round_robin 0
ELDR_FAULT_STOP_MID_SEND_RANK=3 timeout -k 5 60 mpirun --oversubscribe -np 4 -x ELDR_NUM_THREADS -x ELDR_FAULT_TAG \
  -x ELDR_FAULT_STOP_MID_SEND_RANK "$ELDR" serve -c midsend.yaml --quiet >midsend.log 2>&1
rc=$?
for p in $(tagged_pids); do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(grep -c 'eldr: error' midsend.log)" = 1 ] &&
   grep -qE "router \(rank 0\): watchdog: decode 1 \(rank 3\) silent" midsend.log &&
   $PY -c "
import json
m = json.load(open('out-midsend/metrics.json'))
assert m['completed'] + m['failed'] == $N and m['incomplete'] is True, m
" 2>>midsend.log
then ok "a decoder stopped in the middle of a message to rank 0: rank 0's watchdog names it, metrics written"
else bad "a decoder stopped in the middle of a message to rank 0" "rc=$rc $(grep -m3 -E 'eldr|exited' midsend.log)"; fi

# SIGTERM to one worker alone (not to the launcher): its heartbeat answers carry the signal, and rank 0 names it,
# accounts for every request and writes the metrics within the worker's 2 s grace, then tells the others to exit.
# (Before, rank 0 learnt nothing until the worker's exit had the launcher SIGTERM every rank.)
for launcher in mpirun launch; do
  run_case "$launcher" 3 TERM round_robin 0 "a busy decoder" "router \(rank 0\): decode 1 \(rank 3\) received SIGTERM"
done
run_case mpirun 1 TERM round_robin 0 "the prefill rank" "router \(rank 0\): prefill 0 \(rank 1\) received SIGTERM"
run_case mpirun 3 TERM round_robin 0 "an EP group member" "router \(rank 0\): decode 0 ep 1 \(rank 3\) received SIGTERM" ep
run_case mpirun 1 STOP round_robin 0 "the prefill rank under 2000 req/s" "(watchdog|silent longest): prefill 0 \(rank 1\)" fast

# SIGTERM to rank 0 while the job sets up (ELDR_FAULT_SLOW_SETUP_RANK=0 holds rank 0 there for up to 3 s): one line
# from rank 0 saying so, non-zero exit, no run directory (it used to die at the signal's default action, exit 143 and
# no line, when the signal came in the ~0.7 s before the handlers were installed). The signal is sent once rank 0's
# /proc status shows SIGTERM caught (SigCgt bit 14), so the case does not depend on timing.
setup_term_case() {  # NAME RANK LINE LABEL: SIGTERM to RANK, held in setup, once it shows SIGTERM caught
  local name="$1" rank="$2" line="$3" label="$4" pid="" caught="" mask rc i
  job "$name" round_robin 0
  ELDR_FAULT_SLOW_SETUP_RANK="$rank" timeout -k 5 60 mpirun --oversubscribe -np 4 -x ELDR_NUM_THREADS -x ELDR_FAULT_TAG \
    -x ELDR_FAULT_SLOW_SETUP_RANK "$ELDR" serve -c "$name.yaml" --quiet >"$name.log" 2>&1 &
  local job_pid=$!
  for i in $(seq 300); do
    pid=$(tagged_pids "$rank")
    mask=$(awk '/^SigCgt:/ { print $2 }' "/proc/$pid/status" 2>/dev/null)
    [ -n "$pid" ] && [ -n "$mask" ] && (( (0x$mask >> 14) & 1 )) && caught=1 && break
    sleep 0.01
  done
  [ -n "$caught" ] && kill -TERM "$pid"
  wait "$job_pid"
  rc=$?
  if [ -n "$caught" ] && [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(grep -c 'eldr: error' "$name.log")" = 1 ] &&
     grep -q "$line" "$name.log" && [ ! -e "out-$name" ]
  then ok "$label: one line, exit $rc, no run directory"
  else bad "$label" "caught=$caught rc=$rc $(grep -m3 -E 'eldr|exited' "$name.log")"; fi
}
setup_term_case setup-term 0 "eldr: error: router (rank 0): received SIGTERM while the job was setting up" \
  "SIGTERM to rank 0 during setup"
# The same SIGTERM to one worker (rank 2) during setup: that rank's line is the job's only one (rank 0 used to add
# "another rank could not load …"), non-zero exit, no run directory.
setup_term_case setup-term2 2 "eldr: error: decode 0 (rank 2): received SIGTERM while the job was setting up" \
  "SIGTERM to a worker during setup"

# A SIGTERM to every rank before main (ELDR_PENDING_SIGNAL=15: each process sends it to itself in its
# .preinit_array, while the shared libraries are still to initialise, ~0.1 s): before, each rank died at the signal's
# default action with no line; now it is recorded and the job ends at its setup as for any signal then.
job early-term round_robin 0
ELDR_PENDING_SIGNAL=15 timeout -k 5 60 mpirun --oversubscribe -np 4 -x ELDR_NUM_THREADS -x ELDR_FAULT_TAG \
  -x ELDR_PENDING_SIGNAL "$ELDR" serve -c early-term.yaml --quiet >early-term.log 2>&1
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(grep -c 'eldr: error' early-term.log)" = 1 ] &&
   grep -q "eldr: error: router (rank 0): received SIGTERM while the job was setting up" early-term.log &&
   [ ! -e out-early-term ]
then ok "SIGTERM to every rank before main: rank 0's line, exit $rc, no run directory"
else bad "SIGTERM to every rank before main" "rc=$rc $(grep -m3 -E 'eldr|exited' early-term.log)"; fi

# A SIGTERM to a worker rank while launch/gpu-bind still runs for it (a slow nvidia-smi: a stub that sleeps 3 s and
# lists no GPU): gpu-bind keeps the signal and passes it on to eldr (ELDR_PENDING_SIGNAL). Before, the rank died in
# bash at the signal, with no eldr line, and mpirun ended the job.
mkdir -p slow-smi && printf '#!/bin/sh\nsleep 3\n' >slow-smi/nvidia-smi && chmod +x slow-smi/nvidia-smi
job gpu-bind-term round_robin 0
PATH="$WORK/slow-smi:$PATH" timeout -k 5 60 mpirun --oversubscribe -np 4 -x PATH -x ELDR_NUM_THREADS -x ELDR_FAULT_TAG \
  "$SRC/launch/gpu-bind" "$ELDR" serve -c gpu-bind-term.yaml --quiet >gpu-bind-term.log 2>&1 &
job_pid=$!
bind_pid=""
of_rank2() { tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=2"; }
for i in $(seq 300); do  # once rank 2's stub runs; then its gpu-bind: the bash whose parent is the launcher
  for p in $(pgrep -f "$WORK/slow-smi/nvidia-smi"); do of_rank2 "$p" && break 2; done
  sleep 0.01
done
for p in $(pgrep -f "launch/gpu-bind $ELDR serve -c gpu-bind-term.yaml"); do
  of_rank2 "$p" && [ "$(ps -o comm= -p "$(ps -o ppid= -p "$p" | tr -d ' ')")" != bash ] && bind_pid=$p
done
[ -n "$bind_pid" ] && kill -TERM "$bind_pid"
wait "$job_pid"
rc=$?
if [ -n "$bind_pid" ] && [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(grep -c 'eldr: error' gpu-bind-term.log)" = 1 ] &&
   grep -q "eldr: error: decode 0 (rank 2): received SIGTERM while the job was setting up" gpu-bind-term.log &&
   [ ! -e out-gpu-bind-term ]
then ok "SIGTERM to a worker inside launch/gpu-bind: that rank's line, exit $rc, no run directory"
else bad "SIGTERM to a worker inside launch/gpu-bind" "gpu-bind '$bind_pid' rc=$rc $(grep -m3 -E 'eldr|exited' gpu-bind-term.log)"; fi

# SIGTERM to mpirun while rank 2 is stuck in setup where a signal cannot reach it (ELDR_FAULT_STUCK_SETUP_RANK=2,
# 30 s, as a read on a dead file system) and rank 0 waits for it in the ranks' agreement: mpirun passes the SIGTERM
# on and SIGKILLs a second later. Rank 0's setup watch must print its line within that second (it was killed with
# no line). Sent once every rank shows SIGTERM caught.
job setup-stuck round_robin 0
ELDR_FAULT_STUCK_SETUP_RANK=2 timeout -k 5 60 mpirun --oversubscribe -np 4 -x ELDR_NUM_THREADS -x ELDR_FAULT_TAG \
  -x ELDR_FAULT_STUCK_SETUP_RANK "$ELDR" serve -c setup-stuck.yaml --quiet >setup-stuck.log 2>&1 &
job_pid=$!
caught=""
for i in $(seq 300); do
  n=0
  for p in $(tagged_pids); do
    mask=$(awk '/^SigCgt:/ { print $2 }' "/proc/$p/status" 2>/dev/null)
    [ -n "$mask" ] && (( (0x$mask >> 14) & 1 )) && n=$((n + 1))
  done
  [ "$n" = 4 ] && caught=1 && break
  sleep 0.01
done
t0=$(date +%s.%N)
[ -n "$caught" ] && kill -TERM "$(pgrep -P "$job_pid" -x mpirun)"
wait "$job_pid"
rc=$?
took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
if [ -n "$caught" ] && [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(grep -c 'eldr: error' setup-stuck.log)" = 1 ] &&
   grep -q "eldr: error: rank 0: received SIGTERM while the job was setting up, and setup did not end" setup-stuck.log &&
   [ ! -e out-setup-stuck ] && awk -v t="$took" -v b="$((W + GRACE + SLACK))" 'BEGIN { exit !(t <= b) }'
then ok "SIGTERM to mpirun while a rank is stuck in setup: rank 0's line, exit $rc, ${took} s"
else bad "SIGTERM to mpirun while a rank is stuck in setup" "caught=$caught rc=$rc took=$took $(grep -m2 -E 'eldr|exited' setup-stuck.log)"; fi

# No signal, and a rank that never gets through setup: every wait of setup on the other ranks (MPI start-up, the
# ranks' agreements) ends after watchdog_s with one line from rank 0 naming where it waited; the launcher then ends
# the rest. Before, such a job waited forever (a rank stopped in MPI_Init held every other rank there). Rank 2 stuck
# before the inputs' agreement (ELDR_FAULT_STUCK_SETUP_RANK=2, 30 s), and a 4th rank that starts MPI 30 s late (an
# MPMD launch whose last rank sleeps first, as a rank stopped in MPI start-up would).
setup_wait_case() {  # NAME WHERE_PATTERN MPIRUN_ARGS... (rank 0's line; SETUP_WAIT_LINE: another pattern)
  local name="$1" where="$2" t0 rc took; shift 2
  local line="${SETUP_WAIT_LINE:-eldr: error: rank 0: waited [0-9.]+ s \(watchdog_s\) for the other ranks in $where}"
  job "$name" round_robin 0
  t0=$(date +%s.%N)
  timeout -k 5 60 mpirun --oversubscribe -x ELDR_NUM_THREADS -x ELDR_FAULT_TAG "$@" >"$name.log" 2>&1
  rc=$?
  took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(grep -c 'eldr: error' "$name.log")" = 1 ] &&
     grep -qE "$line" "$name.log" &&
     [ ! -e "out-$name" ] && awk -v t="$took" -v b="$((W + GRACE + SLACK + 2))" 'BEGIN { exit !(t <= b) }'
  then ok "a rank that never gets through $where: one eldr line after watchdog_s, exit $rc, ${took} s"
  else bad "a rank that never gets through $where" "rc=$rc took=$took $(grep -m2 -E 'eldr|exited' "$name.log")"; fi
}
ELDR_FAULT_STUCK_SETUP_RANK=2 setup_wait_case setup-wait-inputs "the ranks' agreement on the job's inputs" \
  -x ELDR_FAULT_STUCK_SETUP_RANK -np 4 "$ELDR" serve -c setup-wait-inputs.yaml --quiet
setup_wait_case setup-wait-mpi "MPI start-up" -np 3 "$ELDR" serve -c setup-wait-mpi.yaml --quiet : \
  -np 1 bash -c "sleep 30; exec '$ELDR' serve -c setup-wait-mpi.yaml --quiet"
# Rank 0 itself stuck (no line could come from it): rank 1 says so, 2 s after rank 0 would have.
SETUP_WAIT_LINE="eldr: error: rank 1: waited [0-9.]+ s \(watchdog_s \+ 2 s\) for the other ranks in the ranks' agreement on the job's inputs.*, and rank 0 did not end the job" \
  ELDR_FAULT_STUCK_SETUP_RANK=0 setup_wait_case setup-wait-rank0 "the ranks' agreement on the job's inputs (rank 0 stuck)" \
  -x ELDR_FAULT_STUCK_SETUP_RANK -np 4 "$ELDR" serve -c setup-wait-rank0.yaml --quiet
# Rank 0 stopped before it even started (SIGSTOP before its exec): rank 1's line only; rank 0, continued by mpirun
# once rank 1 has exited, sees its own stop (from its start time) and adds no line blaming the others.
SETUP_WAIT_LINE="eldr: error: rank 1: waited [0-9.]+ s \(watchdog_s \+ 2 s\) for the other ranks in MPI start-up, and rank 0 did not end the job" \
  setup_wait_case setup-wait-stop0 "MPI start-up (rank 0 stopped before its start)" \
  -np 1 bash -c "kill -STOP \$\$; exec '$ELDR' serve -c setup-wait-stop0.yaml --quiet" : \
  -np 3 "$ELDR" serve -c setup-wait-stop0.yaml --quiet

finish
