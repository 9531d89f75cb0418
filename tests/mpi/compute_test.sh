#!/usr/bin/env bash
# compute: cpu | cuda | auto of eldr serve under mpirun (label mpi): the startup line and metrics.json say where
# the job computed and why; compute: cuda where it cannot run fails at start with one line naming the key, file
# and the reason ("built without CUDA", or the first worker rank and host without a device), a non-zero exit and
# no output directory; the router needs no GPU (the check names worker ranks only).
# Usage: compute_test.sh /path/to/eldr /path/to/source HAVE_CUDA(ON|OFF|1|0)
set -u
ELDR="$1"
SRC="$2"
HAVE_CUDA="$3"
PY=/usr/bin/python3
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
export ELDR_NUM_THREADS=1
MPIRUN=(timeout -k 5 120 mpirun --oversubscribe -x ELDR_NUM_THREADS)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
source "$SRC/tests/lib.sh"
# expect_job_error NAME PATTERN OUTPUT CMD...: non-zero exit, exactly one "eldr: error:" line (mpirun adds its own
# banner after it), matching PATTERN, and OUTPUT not created.
expect_job_error() {
  local name="$1" pattern="$2" output="$3"; shift 3
  "$@" >"$WORK/out.txt" 2>"$WORK/err.txt"
  local rc=$? lines
  lines=$(grep -c '^eldr: error:' "$WORK/err.txt")
  if [ "$rc" -eq 0 ]; then bad "$name" "exit code 0"; return; fi
  if [ "$lines" -ne 1 ]; then bad "$name" "$lines eldr: error lines: $(head -3 "$WORK/err.txt")"; return; fi
  if ! grep -qE -- "$pattern" "$WORK/err.txt"; then bad "$name" "stderr '$(head -2 "$WORK/err.txt")' lacks /$pattern/"; return; fi
  if [ -e "$output" ]; then bad "$name" "output $output left behind"; return; fi
  ok "$name"
}
case "$HAVE_CUDA" in ON|on|1|TRUE|true) HAVE_CUDA=1 ;; *) HAVE_CUDA=0 ;; esac
GPUS=0
command -v nvidia-smi >/dev/null 2>&1 && GPUS=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)

"$ELDR" trace synth --domains 2 --requests 6 --layers 2 --experts 8 --top-k 2 --prompt-len 8:12 --output-len 2:4 \
  --seed 1 --out trace.h5 >/dev/null
job() {  # NAME COMPUTE-LINE
  cat > "$1.yaml" <<YAML
topology: {prefill_ranks: 1, decode_ranks: 2}
model: {config: $SRC/configs/models/tiny.yaml, weights: synthetic, gate: replay}
routing: {policy: jsq}
kv_cache: {block_size: 4, prefill_blocks: 64, decode_blocks: 64, transport: mpi}
workload: {trace: $WORK/trace.h5}
output: {dir: $WORK/out-$1}
watchdog_s: 30
$2
YAML
}

# cpu: the startup line says so, metrics.json records it.
job cpu "compute: cpu"
if "${MPIRUN[@]}" -np 4 "$ELDR" serve -c cpu.yaml --quiet >cpu.log 2>&1 &&
   grep -q "^eldr serve: 4 ranks (router, 1 prefill, 2 decode x 1), compute cpu (compute: cpu), kv transport mpi" cpu.log &&
   $PY -c "import json,sys; m=json.load(open(sys.argv[1])); assert m['compute']=='cpu', m['compute']" out-cpu/metrics.json; then
  ok "compute: cpu: startup line and metrics.json"
else bad "compute: cpu" "$(head -3 cpu.log)"; fi

# auto (the default, key absent): cpu on this host, with the reason on the startup line.
job auto ""
if "${MPIRUN[@]}" -np 4 "$ELDR" serve -c auto.yaml --quiet >auto.log 2>&1 &&
   $PY -c "import json,sys; m=json.load(open(sys.argv[1])); assert m['compute'] in ('cpu','cuda')" out-auto/metrics.json; then
  line="$(grep '^eldr serve: ' auto.log)"
  if [ "$HAVE_CUDA" = 0 ]; then want='compute cpu \(auto: eldr was built without CUDA\)'
  elif [ "$GPUS" = 0 ]; then want='compute cpu \(auto: rank 1 \(host [^)]*\): no CUDA device\)'
  else want='compute (cpu|cuda) \(auto: '; fi
  echo "$line" | grep -qE "$want" && ok "compute: auto (default): ${line#*compute }" || bad "compute: auto line" "$line"
else bad "compute: auto" "$(head -3 auto.log)"; fi

# cuda where it cannot run: one line, non-zero exit, no output.
job cuda "compute: cuda"
if [ "$HAVE_CUDA" = 0 ]; then
  expect_job_error "compute: cuda on a build without CUDA" \
    "^eldr: error: router \(rank 0\): .*cuda.yaml: compute: cuda but eldr was built without CUDA" out-cuda \
    "${MPIRUN[@]}" -np 4 "$ELDR" serve -c cuda.yaml --quiet
elif [ "$GPUS" = 0 ]; then
  expect_job_error "compute: cuda without a GPU: the first worker rank and its host" \
    "^eldr: error: router \(rank 0\): .*cuda.yaml: compute: cuda: rank 1 \(host [^)]+\): no CUDA device$" out-cuda \
    "${MPIRUN[@]}" -np 4 "$ELDR" serve -c cuda.yaml --quiet
else
  # A GPU host: three ranks of one node on one GPU share it, or (own GPUs) the executor refuses: either one line.
  expect_job_error "compute: cuda on a GPU host (shared GPU or host-only executor)" \
    "^eldr: error: router \(rank 0\): .*cuda.yaml: compute: cuda: " out-cuda \
    "${MPIRUN[@]}" -np 4 "$ELDR" serve -c cuda.yaml --quiet
fi
finish
