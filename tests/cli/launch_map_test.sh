#!/usr/bin/env bash
# The rank → GPU map of launch/eldr-launch and the binding of launch/gpu-bind (label cli, no GPU needed:
# ELDR_GPUS_PER_NODE fakes the node's GPU count): one GPU per worker rank, its local rank among the node's worker
# ranks modulo the GPUs, the router (rank 0) none; 1, 2 and 8 GPUs per node, one node and two; Slurm's
# --gpus-per-task kept; gpu-bind under a real mpirun gives each rank what the printed map says.
# Usage: launch_map_test.sh /path/to/eldr /path/to/source
set -u
ELDR="$1"
SRC="$2"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
source "$SRC/tests/lib.sh"
unset SLURM_GPUS_PER_TASK SLURM_NTASKS_PER_NODE

"$ELDR" trace synth --domains 2 --requests 8 --layers 2 --experts 8 --top-k 2 --prompt-len 8:16 --output-len 4:8 \
  --seed 1 --out trace.h5 >/dev/null
cat > job.yaml <<YAML
topology: {prefill_ranks: 1, decode_ranks: 4}
model: {config: $SRC/configs/models/tiny.yaml}
routing: {policy: jsq}
workload: {trace: trace.h5}
YAML
# The map lines "rank R: ROLE[ (…)]" of eldr-launch, '# ' stripped.
map() { ELDR="$ELDR" "$SRC/launch/eldr-launch" job.yaml "$@" | sed -n 's/^# \(rank .*\)/\1/p'; }
# expect_map NAME "EXPECTED LINES" [eldr-launch args]: the whole map, line by line.
expect_map() {
  local name="$1" want="$2"; shift 2
  local got; got="$(map "$@")"
  if [ "$got" = "$want" ]; then ok "$name"; else bad "$name" "got: $(echo "$got" | tr '\n' '|')"; fi
}

# Hand-computed: ranks 1..5 are workers 0..4 of the one node; GPU = worker index mod GPUs.
ELDR_GPUS_PER_NODE=8 expect_map "8 GPUs, one node: workers on GPUs 0-4, router none" "rank 0: router (no gpu)
rank 1: prefill 0 (gpu 0, node 0)
rank 2: decode 0 (gpu 1, node 0)
rank 3: decode 1 (gpu 2, node 0)
rank 4: decode 2 (gpu 3, node 0)
rank 5: decode 3 (gpu 4, node 0)"
ELDR_GPUS_PER_NODE=2 expect_map "2 GPUs, one node: workers alternate" "rank 0: router (no gpu)
rank 1: prefill 0 (gpu 0, node 0)
rank 2: decode 0 (gpu 1, node 0)
rank 3: decode 1 (gpu 0, node 0)
rank 4: decode 2 (gpu 1, node 0)
rank 5: decode 3 (gpu 0, node 0)"
ELDR_GPUS_PER_NODE=1 expect_map "1 GPU, one node: every worker on GPU 0" "rank 0: router (no gpu)
rank 1: prefill 0 (gpu 0, node 0)
rank 2: decode 0 (gpu 0, node 0)
rank 3: decode 1 (gpu 0, node 0)
rank 4: decode 2 (gpu 0, node 0)
rank 5: decode 3 (gpu 0, node 0)"
# Two nodes of 3 ranks: node 0 holds the router, so its workers start at local rank 1; node 1's at local rank 0.
ELDR_GPUS_PER_NODE=2 expect_map "2 GPUs, two nodes of 3 ranks" "rank 0: router (no gpu)
rank 1: prefill 0 (gpu 0, node 0)
rank 2: decode 0 (gpu 1, node 0)
rank 3: decode 1 (gpu 0, node 1)
rank 4: decode 2 (gpu 1, node 1)
rank 5: decode 3 (gpu 0, node 1)" --ranks-per-node 3
ELDR_GPUS_PER_NODE=8 expect_map "8 GPUs, two nodes of 3 ranks" "rank 0: router (no gpu)
rank 1: prefill 0 (gpu 0, node 0)
rank 2: decode 0 (gpu 1, node 0)
rank 3: decode 1 (gpu 0, node 1)
rank 4: decode 2 (gpu 1, node 1)
rank 5: decode 3 (gpu 2, node 1)" --ranks-per-node 3
ELDR_GPUS_PER_NODE=0 expect_map "no GPU: the plain role map" "rank 0: router
rank 1: prefill 0
rank 2: decode 0
rank 3: decode 1
rank 4: decode 2
rank 5: decode 3"
SLURM_GPUS_PER_TASK=1 expect_map "Slurm --gpus-per-task: each worker its task's GPU" "rank 0: router (no gpu)
rank 1: prefill 0 (gpu of its task: --gpus-per-task)
rank 2: decode 0 (gpu of its task: --gpus-per-task)
rank 3: decode 1 (gpu of its task: --gpus-per-task)
rank 4: decode 2 (gpu of its task: --gpus-per-task)
rank 5: decode 3 (gpu of its task: --gpus-per-task)"
# --ranks-per-node reaches the launcher (it only changed the printed map); --kill-delay is mpirun's (srun refuses it).
ELDR="$ELDR" "$SRC/launch/eldr-launch" job.yaml --ranks-per-node 3 | tail -1 | grep -q -- "--map-by ppr:3:node " &&
  ok "--ranks-per-node 3: mpirun --map-by ppr:3:node" || bad "--ranks-per-node 3 for mpirun"
ELDR="$ELDR" "$SRC/launch/eldr-launch" job.yaml --launcher srun --ranks-per-node 3 | tail -1 |
  grep -q -- "srun --mpi=pmix -n 6 --ntasks-per-node 3 " && ok "--ranks-per-node 3: srun --ntasks-per-node 3" ||
  bad "--ranks-per-node 3 for srun"
if ELDR="$ELDR" "$SRC/launch/eldr-launch" job.yaml --launcher srun --kill-delay 5 >/dev/null 2>err.txt; then
  bad "srun --kill-delay refused" "exit 0"
else grep -q "kill-delay sets mpirun's delay; under srun it is Slurm's KillWait" err.txt &&
  ok "srun --kill-delay refused (was: dropped)" || bad "srun --kill-delay refused" "$(cat err.txt)"; fi
if ELDR="$ELDR" "$SRC/launch/eldr-launch" job.yaml --ranks-per-node 0 >/dev/null 2>err.txt; then
  bad "--ranks-per-node 0 refused"
else grep -q "ranks-per-node must be a positive integer" err.txt && ok "--ranks-per-node 0 refused" || bad "--ranks-per-node 0" "$(cat err.txt)"; fi

# gpu-bind's environment, from the launchers' variables (Open MPI, Slurm).
bound() { env "$@" "$SRC/launch/gpu-bind" sh -c 'echo "${CUDA_VISIBLE_DEVICES-unset}"'; }
check_bound() {  # NAME WANT ENV...
  local name="$1" want="$2"; shift 2
  local got; got="$(bound "$@")"
  [ "$got" = "$want" ] && ok "$name" || bad "$name" "CUDA_VISIBLE_DEVICES '$got', want '$want'"
}
check_bound "gpu-bind: router hidden from every GPU" "" ELDR_GPUS_PER_NODE=8 OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_LOCAL_RANK=0
check_bound "gpu-bind: rank 3 of node 0, 2 GPUs -> GPU 0" 0 ELDR_GPUS_PER_NODE=2 OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_LOCAL_RANK=3
check_bound "gpu-bind: rank 5, local 1 of node 1, 8 GPUs -> GPU 1" 1 ELDR_GPUS_PER_NODE=8 OMPI_COMM_WORLD_RANK=5 OMPI_COMM_WORLD_LOCAL_RANK=1
check_bound "gpu-bind: Slurm ranks (SLURM_PROCID/LOCALID)" 1 ELDR_GPUS_PER_NODE=2 SLURM_PROCID=2 SLURM_LOCALID=2
check_bound "gpu-bind: --gpus-per-task binding kept" 3 SLURM_GPUS_PER_TASK=1 CUDA_VISIBLE_DEVICES=3 SLURM_PROCID=4 SLURM_LOCALID=4
check_bound "gpu-bind: no GPUs, worker untouched" unset ELDR_GPUS_PER_NODE=0 OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_LOCAL_RANK=2

# Under a real mpirun: what each rank is bound to equals the printed map.
MPIRUN=(timeout -k 5 60 mpirun --oversubscribe -np 6)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
got="$(ELDR_GPUS_PER_NODE=2 "${MPIRUN[@]}" -x ELDR_GPUS_PER_NODE "$SRC/launch/gpu-bind" \
  sh -c 'echo "$OMPI_COMM_WORLD_RANK ${CUDA_VISIBLE_DEVICES-unset}"' 2>&1 | sort -n | tr '\n' '|')"
[ "$got" = "0 |1 0|2 1|3 0|4 1|5 0|" ] && ok "gpu-bind under mpirun -np 6, 2 GPUs: as the map says" \
  || bad "gpu-bind under mpirun" "$got"
finish
