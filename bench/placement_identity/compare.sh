#!/usr/bin/env bash
# Builds bench/placement_identity/driver.cc against placement/ of two revisions (default: main and the work
# tree) and compares every placement of `driver dump` byte for byte, then times both side by side.
# Usage: bench/placement_identity/compare.sh [OLD_REV] [random cases] [timing rounds]. Needs a configured
# build/ (launch/build) for runtime/common; writes into a temporary directory. One placer thread unless
# ELDR_NUM_THREADS says otherwise (the placement must not depend on it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OLD_REV="${1:-main}"; NRAND="${2:-3000}"; ROUNDS="${3:-7}"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/old" && git -C "$ROOT" archive "$OLD_REV" placement | tar -x -C "$TMP/old"
build() {  # build SRC_DIR OUT
  g++ -O3 -DNDEBUG -march=native -fno-tree-slp-vectorize -std=c++20 -I"$1" -I"$ROOT" -I"$ROOT/build/runtime/generated" \
    -I/usr/include/hdf5/serial "$ROOT/bench/placement_identity/driver.cc" "$1"/placement/{placement,eplb,eldr_placement,load_io}.cc \
    -o "$2" "$ROOT/build/runtime/libeldr_common.a" /usr/lib/x86_64-linux-gnu/hdf5/serial/libhdf5.so -lyaml-cpp -ldeflate -lz -lpthread
}
build "$TMP/old" "$TMP/driver_old"; build "$ROOT" "$TMP/driver_new"
export ELDR_PROFILES="$ROOT/bench/data/expert-load-profiles" ELDR_NUM_THREADS="${ELDR_NUM_THREADS:-1}"
"$TMP/driver_old" dump "$TMP/old.bin" "$NRAND"; "$TMP/driver_new" dump "$TMP/new.bin" "$NRAND"
cmp "$TMP/old.bin" "$TMP/new.bin" && echo "identical placements (old $OLD_REV vs work tree)"
for i in $(seq "$ROUNDS"); do
  echo "$("$TMP/driver_old" time 60 | awk '{print $2}') $("$TMP/driver_new" time 60 | awk '{print $2}')"
done | python3 -c "
import statistics as st, sys
r = [tuple(map(float, l.split())) for l in sys.stdin]
for i, (o, n) in enumerate(r): print('round %d: old %.3f ms, new %.3f ms' % (i + 1, o, n))
print('median old %.3f ms, new %.3f ms, median per-round ratio %.3f' % (st.median(o for o, _ in r),
      st.median(n for _, n in r), st.median(n / o for o, n in r)))"
