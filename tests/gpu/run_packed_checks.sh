#!/usr/bin/env bash
# run_gpu_checks.sh in a pack of tests/gpu/pack_for_device.sh (see there): the gpu tests, compute-sanitizer
# memcheck on them, the MoE layer benchmark; every step under a timeout, about 5 minutes in all; one tarball of
# logs and JSON in $ELDR_GPU_OUT (default $OUT, else ./gpu-check-out). Fails fast without a GPU.
set -uo pipefail
PACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT_DIR="${ELDR_GPU_OUT:-${OUT:-$PWD/gpu-check-out}}"
LOGS="$(mktemp -d)/gpu-check"
mkdir -p "$OUT_DIR" "$LOGS"
T0=$(date +%s)
step() { printf '\n== %s [%ds]\n' "$*" $(($(date +%s) - T0)) | tee -a "$LOGS/summary.txt"; }
note() { echo "$*" | tee -a "$LOGS/summary.txt"; }
pack_up() {
  cp "$PACK/PACK_INFO" "$LOGS/" 2>/dev/null
  tar -czf "$OUT_DIR/gpu-check.tar.gz" -C "$(dirname "$LOGS")" gpu-check && note "results: $OUT_DIR/gpu-check.tar.gz"
}
rc=0

step "device"
cat "$PACK/PACK_INFO" | tee -a "$LOGS/summary.txt"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! timeout 20 nvidia-smi -L >"$LOGS/nvidia-smi.txt" 2>&1 ||
   ! grep -q '^GPU' "$LOGS/nvidia-smi.txt"; then
  note "run_gpu_checks: no GPU here (nvidia-smi missing or lists no GPU): nothing to check"
  pack_up
  exit 2
fi
cat "$LOGS/nvidia-smi.txt" | tee -a "$LOGS/summary.txt"

# The CUDA runtime and cuBLAS of this machine (the pack has none): the toolkit's, else PyTorch's wheels.
step "CUDA libraries"
libdirs="$PACK/lib"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && libdirs="$libdirs:$d"; done
for sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
  for f in $(find "$sp/nvidia" "$sp/torch/lib" -maxdepth 4 \( -name 'libcudart.so*' -o -name 'libcublas*.so*' \) 2>/dev/null); do
    libdirs="$libdirs:$(dirname "$f")"
  done
done
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
missing=$(for b in "$PACK"/bin/*; do ldd "$b" | grep 'not found'; done | sort -u)
if [ -n "$missing" ]; then
  note "run_gpu_checks: libraries not found: $missing"
  pack_up
  exit 3
fi
note "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

step "gpu tests"
for t in cuda_ops_test backend_gpu_test; do
  timeout 150 "$PACK/bin/$t" --gtest_output="json:$LOGS/$t.json" >"$LOGS/$t.log" 2>&1
  r=$?
  note "$t: exit $r ($(grep -E '^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$LOGS/$t.log" | tr '\n' ' '))"
  if grep -q '^\[  SKIPPED \]' "$LOGS/$t.log"; then note "$t: tests skipped: CUDA sees no device"; r=1; fi
  [ "$r" -ne 0 ] && rc=1
done

step "compute-sanitizer memcheck (backend_gpu_test)"
if command -v compute-sanitizer >/dev/null 2>&1; then
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 99 "$PACK/bin/backend_gpu_test" \
    >"$LOGS/memcheck.log" 2>&1
  r=$?
  case "$r" in
    0) note "memcheck: clean" ;;
    99) note "memcheck: errors (see memcheck.log)"; rc=1 ;;
    124) note "memcheck: timed out (120 s): reported, not failed" ;;
    *) note "memcheck: refused or failed to start here (exit $r): reported, not failed: $(tail -2 "$LOGS/memcheck.log")" ;;
  esac
else
  note "memcheck: compute-sanitizer not found: skipped"
fi

step "MoE layer benchmark"
timeout 180 "$PACK/bin/moe_layer_gpu_bench" --benchmark_out="$LOGS/moe_layer_gpu.json" --benchmark_out_format=json \
  >"$LOGS/moe_layer_gpu.log" 2>&1 || { note "moe_layer_gpu_bench: exit $?"; rc=1; }

step "done: rc=$rc"
pack_up
exit "$rc"
