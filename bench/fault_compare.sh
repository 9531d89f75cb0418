#!/usr/bin/env bash
# Seconds from a fault to the end of the serving job, two source trees side by side (alternating, REPEATS times):
# one case of tests/mpi/fault_test.sh each (watchdog_s 4, 1 prefill + 2 decoders, 60 requests of 600 tokens at 5/s,
# the fault 2 s in). Prints "repeat|launcher rank signal|tree|seconds|metrics.json written (0/1)".
# Usage: bench/fault_compare.sh OLD_TREE NEW_TREE [REPEATS]   (each tree built: TREE/build/bin/eldr)
set -u
OLD="$(realpath "$1")"; NEW="$(realpath "$2")"; REPEATS="${3:-3}"
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT; cd "$WORK"
export ELDR_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ELDR_FAULT_TAG="fcmp-$$"
"$NEW/build/bin/eldr" trace synth --domains 2 --requests 20 --layers 2 --experts 8 --top-k 2 --prompt-len 8:24 \
  --output-len 1:12 --seed 5 --out trace.h5 >/dev/null
rank_pid() {  # RANK: the PID of this script's eldr rank RANK
  local p
  for p in $(pgrep -x eldr); do
    { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qx "ELDR_FAULT_TAG=$ELDR_FAULT_TAG" || continue
    { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && echo "$p"
  done
}
one() {  # TREE LAUNCHER RANK SIGNAL
  local tree="$1" l="$2" r="$3" s="$4" pid="" i jp t0 p
  rm -rf out; cat >job.yaml <<YAML
topology: {prefill_ranks: 1, decode_ranks: 2}
model: {config: $tree/configs/models/tiny.yaml, weights: synthetic, seed: 0, gate: replay}
routing: {policy: round_robin, seed: 1}
kv_cache: {block_size: 8, prefill_blocks: 64, decode_blocks: 1024}
decode: {max_batch: 4}
workload: {trace: $WORK/trace.h5, request_rate: 5, seed: 3, num_requests: 60, output_len: 600}
output: {dir: $WORK/out}
watchdog_s: 4
YAML
  if [ "$l" = mpirun ]; then
    timeout -k 5 60 mpirun --oversubscribe -np 4 -x ELDR_NUM_THREADS -x ELDR_FAULT_TAG "$tree/build/bin/eldr" serve \
      -c job.yaml --quiet >log 2>&1 &
  else
    ELDR="$tree/build/bin/eldr" timeout -k 5 60 "$tree/launch/eldr-launch" job.yaml --run -- --oversubscribe \
      -x ELDR_NUM_THREADS -x ELDR_FAULT_TAG >log 2>&1 &
  fi
  jp=$!
  for i in $(seq 100); do pid=$(rank_pid "$r"); [ -n "$pid" ] && break; sleep 0.1; done
  sleep 2; t0=$(date +%s.%N); kill "-$s" "$pid"; wait "$jp"
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'
  for p in $(rank_pid 0) $(rank_pid 1) $(rank_pid 2) $(rank_pid 3); do kill -CONT "$p"; kill -9 "$p"; done 2>/dev/null
}
for rep in $(seq "$REPEATS"); do
  for c in "mpirun 1 KILL" "launch 1 KILL" "launch 3 STOP" "launch 0 STOP"; do
    for tree in "$OLD" "$NEW"; do
      # shellcheck disable=SC2086
      t=$(one "$tree" $c); echo "$rep|$c|$(basename "$tree")|$t|$([ -f out/metrics.json ] && echo 1 || echo 0)"
    done
  done
done
