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
finish
