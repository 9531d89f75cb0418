#!/usr/bin/env bash
# The serving job under a real one-node Slurm started here (ctest label slurm): the same job through srun
# (--mpi=pmix) and through sbatch (launch/eldr-launch inside the batch script), every request completed.
# Usage: slurm_test.sh /path/to/eldr /path/to/source
set -u
ELDR="$1"
SRC="$2"
PY=/usr/bin/python3
if [ "$(id -u)" != 0 ] || ! command -v slurmctld >/dev/null; then
  echo "slurm test needs root and slurm-wlm (launch/setup installs it); skipped"
  echo "0 passed, 0 failed, 1 skipped"
  exit 0
fi
WORK="$(mktemp -d)"
STATE="$WORK/slurm"
cleanup() { "$SRC/tests/slurm/local_slurm.sh" stop "$STATE"; rm -rf "$WORK"; }
trap cleanup EXIT
eval "$("$SRC/tests/slurm/local_slurm.sh" start "$STATE")" || { echo "FAILED could not start Slurm"; exit 1; }
cd "$WORK"
export ELDR_NUM_THREADS=1
source "$SRC/tests/lib.sh"

"$ELDR" trace synth --domains 3 --requests 30 --layers 2 --experts 8 --top-k 2 --prompt-len 8:24 --output-len 1:12 \
  --seed 5 --out trace.h5 >/dev/null
"$ELDR" calibrate --trace trace.h5 -K 2 --out calib.h5 --quiet
for name in srun sbatch; do
  cat > "$name.yaml" <<YAML
topology: {prefill_ranks: 1, decode_ranks: 2}
model: {config: $SRC/configs/models/tiny.yaml, weights: synthetic, seed: 0, gate: replay}
routing: {policy: eldr, calibration: $WORK/calib.h5, tau: 0.1, seed: 1}
kv_cache: {block_size: 4, prefill_blocks: 64, decode_blocks: 24}
decode: {max_batch: 4}
workload: {trace: $WORK/trace.h5, request_rate: 200, seed: 3}
output: {dir: $WORK/out-$name}
watchdog_s: 60
YAML
done
complete() {
  $PY -c "
import json
m = json.load(open('$WORK/out-$1/metrics.json'))
assert m['completed'] == 30 and m['failed'] == 0, m
assert len(open('$WORK/out-$1/requests.jsonl').readlines()) == 30
"
}
if timeout 120 srun --overcommit -n 4 --mpi=pmix "$ELDR" serve -c srun.yaml --quiet >srun.log 2>&1 && complete srun; then
  ok "srun --mpi=pmix -n 4 eldr serve"
else bad "srun" "$(tail -3 srun.log)"; fi
cat > job.sbatch <<SB
#!/usr/bin/env bash
#SBATCH --ntasks=4
#SBATCH --overcommit
#SBATCH --output=$WORK/sbatch.log
export ELDR=$ELDR ELDR_NUM_THREADS=1
$SRC/launch/eldr-launch $WORK/sbatch.yaml --launcher srun --run -- --overcommit
SB
if timeout 180 sbatch --wait job.sbatch >submit.log 2>&1 && complete sbatch && grep -q "rank 0: router" sbatch.log; then
  ok "sbatch → launch/eldr-launch → srun"
else bad "sbatch" "$(tail -3 submit.log; tail -3 sbatch.log 2>/dev/null)"; fi

# A fault under srun (README "When a rank fails"), 2 s into a job whose requests decode 600 tokens each: SIGSTOP of a
# busy decoder (rank 3), and SIGTERM to it alone (its heartbeat answers carry the signal: rank 0 must stop the job
# and write the metrics before that task's exit has slurmstepd SIGKILL every task). The job must end within
# watchdog_s + 3 s (+ 2 s for a loaded machine), exit non-zero, name decode 1 (rank 3) in one eldr line, and rank 0
# must write metrics.json with every request accounted for.
# (kill -9 is not a case here: when a task dies, slurmstepd's mpi/pmix plugin cancels the step and SIGKILLs every
# task at once, rank 0 included, with no SIGTERM first, so no rank can write anything; srun names the task.)
TAG="slurm-fault-$$"
rank_pid() {  # RANK: the PID of this test's eldr rank RANK under srun
  local p
  for p in $(pgrep -x eldr 2>/dev/null); do
    { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qx "ELDR_FAULT_TAG=$TAG" || continue
    { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qx "SLURM_PROCID=$1" && echo "$p"
  done
}
srun_fault() {  # SIGNAL NAME_PATTERN
  local sig="$1" pattern="$2" out="$WORK/out-fault-$1" log="fault-$1.log" pid="" i rc took label
  cat > "fault-$sig.yaml" <<YAML
topology: {prefill_ranks: 1, decode_ranks: 2}
model: {config: $SRC/configs/models/tiny.yaml, weights: synthetic, seed: 0, gate: replay}
routing: {policy: round_robin, seed: 1}
kv_cache: {block_size: 8, prefill_blocks: 64, decode_blocks: 1024}
decode: {max_batch: 4}
workload: {trace: $WORK/trace.h5, request_rate: 5, seed: 3, num_requests: 60, output_len: 600}
output: {dir: $out}
watchdog_s: 4
YAML
  ELDR_FAULT_TAG="$TAG" timeout -k 5 60 srun --overcommit -n 4 --mpi=pmix "$ELDR" serve -c "fault-$sig.yaml" --quiet \
    >"$log" 2>&1 &
  local job_pid=$!
  for i in $(seq 150); do pid=$(rank_pid 3); [ -n "$pid" ] && [ -n "$(rank_pid 0)" ] && break; sleep 0.1; done
  sleep 2
  local t0
  t0=$(date +%s.%N)
  [ -n "$pid" ] && kill "-$sig" "$pid"
  wait "$job_pid"
  rc=$?
  took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  label="srun: SIG$sig of a busy decoder (rank 3), ended $took s after (bound 4 + 3 s)"
  if [ -z "$pid" ]; then bad "$label" "rank 3 not found"
  elif [ "$rc" = 0 ] || [ "$rc" = 124 ]; then bad "$label" "exit $rc"
  elif ! awk -v t="$took" 'BEGIN { exit !(t <= 9) }'; then bad "$label" "longer than 9 s"
  elif [ "$(grep -c 'eldr: error' "$log")" != 1 ] || ! grep -qE "$pattern" "$log"; then
    bad "$label" "$(grep -E 'eldr|srun' "$log" | head -3)"
  elif ! $PY -c "
import json
m = json.load(open('$out/metrics.json'))
assert m['completed'] + m['failed'] == 60 and m['incomplete'] is True and 'rank 3' in m['reason'], m
assert len(open('$out/requests.jsonl').readlines()) == 60
open('$out/steps.jsonl')
" 2>>"$log"; then bad "$label" "metrics: $(tail -1 "$log")"
  else ok "$label"; fi
  local p
  for p in $(rank_pid 0) $(rank_pid 1) $(rank_pid 2) $(rank_pid 3); do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
}
srun_fault STOP "(watchdog|silent longest): decode 1 \(rank 3\)"
srun_fault TERM "router \(rank 0\): decode 1 \(rank 3\) received SIGTERM"

# A signal to launch/eldr-launch --launcher srun --run's process group, as timeout(1) or a terminal's Ctrl-C sends
# it: srun itself would SIGKILL every task ("forcing job termination"), so eldr-launch keeps srun out of its group
# and passes the signal on to the tasks (scancel --signal): rank 0 names it and writes the metrics. A SIGKILL (as
# timeout -k sends it) ends eldr-launch at once: its guard, in a session of its own, passes SIGTERM on instead, and
# the step must still end (within 30 s) with rank 0's line and the metrics, leaving no task, step or guard behind.
# A SIGINT then a SIGKILL (timeout -s INT -k): the guard passes nothing more on, and the job's reason stays SIGINT.
launch_signal() {  # SIGNAL [SIGNAL2: sent 0.5 s after the first]
  local sig="$1" then="${2:-}" name="$1${2:+-$2}" pid="" i rc expect="$1"
  local out="$WORK/out-launch-$name" log="launch-$name.log"
  [ "$sig" = KILL ] && expect=TERM
  sed "s|dir: .*}|dir: $out}|" fault-TERM.yaml >"launch-$name.yaml"
  ELDR="$ELDR" ELDR_FAULT_TAG="$TAG" timeout -k 5 60 setsid "$SRC/launch/eldr-launch" "launch-$name.yaml" --launcher srun \
    --run -- --overcommit >"$log" 2>&1 &
  local job_pid=$!
  for i in $(seq 150); do pid=$(rank_pid 3); [ -n "$pid" ] && [ -n "$(rank_pid 0)" ] && break; sleep 0.1; done
  sleep 2
  local pgid
  pgid=$(ps -o pgid= -p "$(pgrep -f -n "launch/eldr-launch launch-$name.yaml" || echo 0)" 2>/dev/null | tr -d ' ')
  if [ -n "$pgid" ]; then
    kill "-$sig" -- "-$pgid"
    [ -n "$then" ] && sleep 0.5 && kill "-$then" -- "-$pgid"
  fi
  wait "$job_pid"
  rc=$?
  # eldr-launch may be gone (SIGKILL): the step must end by itself, and the guard with it
  for i in $(seq 300); do
    [ -z "$(rank_pid 0)$(squeue --noheader --steps --format %j | grep '^eldr-launch-')$(pgrep -f 'srun_runs')" ] && break
    sleep 0.1
  done
  local left guards
  left="$(rank_pid 0)$(squeue --noheader --steps --format %j | grep '^eldr-launch-')$(pgrep -f 'srun_runs')"
  left="$left$(ls "${TMPDIR:-/tmp}"/eldr-launch.?????? 2>/dev/null)"  # eldr-launch's state file
  guards=$(grep -c "its guard passes" "$log")
  local label="eldr-launch --launcher srun: SIG$sig${then:+ then SIG$then} to its process group"
  if [ -z "$pid" ] || [ -z "$pgid" ]; then bad "$label" "job not found (rank 3 '$pid', group '$pgid')"
  elif [ "$rc" = 0 ] || [ "$rc" = 124 ]; then bad "$label" "exit $rc"
  elif [ -n "$left" ]; then bad "$label" "still running 30 s later: $left"
  elif [ "$sig" = KILL ] && ! grep -q "its guard passes SIGTERM on to step" "$log"; then
    bad "$label" "no guard line: $(grep -E 'eldr|srun' "$log" | head -4)"
  elif [ "$sig" != KILL ] && [ "$guards" != 0 ]; then bad "$label" "the guard passed a signal on too: $(grep guard "$log")"
  elif [ "$(grep -c 'eldr: error' "$log")" != 1 ] || ! grep -q "rank 0 received SIG$expect" "$log"; then
    bad "$label" "$(grep -E 'eldr|srun' "$log" | head -4)"
  elif ! $PY -c "
import json
m = json.load(open('$out/metrics.json'))
assert m['completed'] + m['failed'] == 60 and m['incomplete'] is True and 'SIG$expect' in m['reason'], m
assert len(open('$out/requests.jsonl').readlines()) == 60
" 2>>"$log"; then bad "$label" "metrics: $(tail -1 "$log")"
  else ok "$label: rank 0's line, every request accounted for, nothing left, exit $rc"; fi
  local p
  for p in $(rank_pid 0) $(rank_pid 1) $(rank_pid 2) $(rank_pid 3); do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
}
launch_signal TERM
launch_signal INT
launch_signal KILL
launch_signal INT KILL

# A SIGTERM while srun still waits for its allocation (--begin=now+60 keeps the job pending): eldr-launch stops srun,
# which withdraws the request; nothing is left queued.
ELDR="$ELDR" timeout -k 5 60 setsid "$SRC/launch/eldr-launch" "launch-TERM.yaml" --launcher srun --run -- \
  --overcommit --begin=now+60 >pending.log 2>&1 &
job_pid=$!
for i in $(seq 100); do squeue --noheader --states PENDING --format %j | grep -q '^eldr-launch-' && break; sleep 0.1; done
kill -TERM -- "-$job_pid"
wait "$job_pid"
rc=$?
sleep 0.5
if [ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -q "while srun waits for its allocation: stopping srun" pending.log &&
  [ -z "$(squeue --noheader --format %j | grep '^eldr-launch-')" ]; then
  ok "eldr-launch --launcher srun: SIGTERM while pending: request withdrawn, exit $rc"
else bad "eldr-launch --launcher srun: SIGTERM while pending" "rc=$rc $(tail -3 pending.log) $(squeue --noheader)"; fi

# scancel JOB of a batch job running eldr-launch: Slurm signals the step's tasks (rank 0 writes the metrics) and the
# batch script and srun, which forces the step's termination; eldr-launch passes the SIGTERM on once more at most
# (harmless: rank 0 has it already) and never SIGKILLs anything itself.
cat > cancel.sbatch <<SB
#!/usr/bin/env bash
#SBATCH --ntasks=4
#SBATCH --overcommit
#SBATCH --output=$WORK/cancel.log
export ELDR=$ELDR ELDR_NUM_THREADS=1 ELDR_FAULT_TAG=$TAG
$SRC/launch/eldr-launch $WORK/cancel.yaml --launcher srun --run -- --overcommit
SB
sed "s|dir: .*}|dir: $WORK/out-cancel}|" fault-TERM.yaml >cancel.yaml
jid=$(sbatch --parsable cancel.sbatch)
for i in $(seq 150); do [ -n "$(rank_pid 3)" ] && [ -n "$(rank_pid 0)" ] && break; sleep 0.1; done
sleep 2
scancel "$jid"
for i in $(seq 300); do [ -z "$(squeue --noheader --jobs "$jid" 2>/dev/null)" ] && break; sleep 0.1; done
if [ "$(grep -c 'eldr: error' cancel.log)" = 1 ] && grep -q "rank 0 received SIGTERM" cancel.log && $PY -c "
import json
m = json.load(open('$WORK/out-cancel/metrics.json'))
assert m['completed'] + m['failed'] == 60 and m['incomplete'] is True, m
assert len(open('$WORK/out-cancel/requests.jsonl').readlines()) == 60
" 2>>cancel.log; then ok "scancel JOB of sbatch → eldr-launch → srun: rank 0's line, every request accounted for"
else bad "scancel JOB" "$(grep -E 'eldr|srun' cancel.log | head -5)"; fi
finish
