#!/usr/bin/env bash
# Usage: bench/calibrate_compare.sh OLD_ELDR NEW_ELDR TRACE [RUNS]: `eldr calibrate --decoders 16` with two binaries,
# alternating old/new RUNS times (default 3) in $WORKDIR (default .); one line per run: wall (date) and the
# report's read / fit (seconds.total) / write, with the load average. Compare the outputs with
# bench/same_calibration.py c_old.h5 c_new.h5.
set -euo pipefail
old=$1; new=$2; trace=$3; runs=${4:-3}
cd "${WORKDIR:-.}"
printf "%-4s %-4s %8s %8s %8s %8s %6s\n" run bin wall read fit write load
for i in $(seq 1 "$runs"); do
  for which in old new; do
    bin=$old; [ $which = new ] && bin=$new
    rm -f c_$which.h5 r_$which.json
    s=$(date +%s.%N)
    $bin calibrate --trace "$trace" --decoders 16 --out c_$which.h5 --report r_$which.json --quiet >/dev/null
    e=$(date +%s.%N)
    load=$(cut -d' ' -f1 /proc/loadavg)
    python3 -c "
import json,sys
j=json.load(open('r_$which.json'))['seconds']
print('%-4s %-4s %8.3f %8.3f %8.3f %8.3f %6s' % ($i,'$which',$e-$s,j['read'],j['total'],j['write'],'$load'))"
  done
done
