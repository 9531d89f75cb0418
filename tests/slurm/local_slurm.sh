#!/usr/bin/env bash
# Starts (or stops) a real one-node Slurm cluster on this machine for the tests: munged, slurmctld and slurmd
# with a generated slurm.conf under a state directory. Needs root and Debian's slurm-wlm and munge packages.
# Usage: local_slurm.sh start STATE_DIR   (prints "export SLURM_CONF=..." for the caller to eval)
#        local_slurm.sh stop STATE_DIR
set -euo pipefail
cmd="$1"
STATE="$2"
CONF="$STATE/slurm.conf"
if [ "$cmd" = stop ]; then
  for p in slurmd slurmctld munged; do
    [ -f "$STATE/$p.pid" ] && kill "$(cat "$STATE/$p.pid")" 2>/dev/null || true
  done
  sleep 1
  exit 0
fi
mkdir -p "$STATE"/{spool,state,munge,log}
HOST="$(hostname -s)"
CPUS="$(nproc)"
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
# munge: a key of our own, a socket in the state directory.
if [ ! -f "$STATE/munge/munge.key" ]; then
  dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$STATE/munge/munge.key"
fi
chmod 700 "$STATE/munge"
munged --force --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/munge.socket" \
  --pid-file="$STATE/munged.pid" --log-file="$STATE/log/munged.log" --seed-file="$STATE/munge/seed"
cat > "$CONF" <<CONF
ClusterName=eldr-test
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$STATE/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldPort=16817
SlurmdPort=16818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=pmix
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=test Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
export SLURM_CONF="$CONF"
slurmctld -f "$CONF"
slurmd -f "$CONF"
for i in $(seq 1 60); do
  if sinfo -h -o %T 2>/dev/null | grep -qE "^(idle|mixed)"; then
    echo "export SLURM_CONF=$CONF"
    exit 0
  fi
  sleep 1
done
echo "local_slurm: the node did not come up; see $STATE/log" >&2
exit 1
