#!/usr/bin/env bash
# The GPU checks (DESIGN.md §7 "gpu"). Two ways to run:
#  - packed (the bare GPU machine): tests/gpu/pack_for_device.sh built the binaries here and put this script
#    beside them with PACK_INFO; run PACK/run_gpu_checks.sh there. No configure, no build: the gpu tests, the
#    same under compute-sanitizer memcheck (reported, not failed, where the host refuses it) and the MoE layer
#    benchmark, each with a timeout (about 5 minutes in all), then one tarball of logs and JSON in
#    $ELDR_GPU_OUT (default $OUT, else ./gpu-check-out). Without a GPU it fails within seconds, saying so.
#  - in the repository (a GPU machine with the packages of launch/setup): configures a Release build with CUDA
#    in build-gpu/, builds the CUDA kernel tests and the GPU benchmark only, runs the gpu-labelled tests and the
#    benchmark, and prints a summary.
#
# Usage: tests/gpu/run_gpu_checks.sh        (or PACK/run_gpu_checks.sh)
#   OUT                     where logs and moe_layer_gpu.json go (default: the build directory)
#   ELDR_GPU_OUT            packed: the folder for the tarball (default $OUT, else ./gpu-check-out)
#   ELDR_GPU_BUILD_DIR      build directory (default: build-gpu/ in the repository)
#   ELDR_CUDA_ARCHITECTURES CUDA architectures (default 90: H100/H200)
#   ELDR_JOBS               build parallelism (default: all cores)
# Exit status: non-zero when configuring or building fails, a gpu test fails or is skipped (no device visible),
# or the benchmark fails.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ -f "$HERE/PACK_INFO" ]; then
  exec bash "$HERE/run_packed_checks.sh" "$@"
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${ELDR_GPU_BUILD_DIR:-$ROOT/build-gpu}"
OUT="${OUT:-$BUILD}"
JOBS="${ELDR_JOBS:-$(nproc)}"
ARCH="${ELDR_CUDA_ARCHITECTURES:-90}"
mkdir -p "$BUILD" "$OUT"
T0=$(date +%s)
step() { printf '\n== %s [%ds]\n' "$*" $(($(date +%s) - T0)); }

step "device"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
else
  echo "nvidia-smi not found"
fi
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"

step "configure $BUILD (Release, CUDA on, architectures $ARCH)"
if ! cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DELDR_WITH_CUDA=ON \
     -DELDR_CUDA_ARCHITECTURES="$ARCH" >"$BUILD/configure.log" 2>&1; then
  cat "$BUILD/configure.log"
  echo "run_gpu_checks: configure failed (missing packages: see launch/setup; no nvcc: install the CUDA toolkit)" >&2
  exit 1
fi
grep "eldr " "$BUILD/configure.log" | sed 's/^-- //'

step "build cuda_ops_test backend_gpu_test moe_layer_gpu_bench"
cmake --build "$BUILD" -j "$JOBS" --target cuda_ops_test backend_gpu_test moe_layer_gpu_bench

step "gpu tests (ctest -L gpu)"
test_rc=0
(cd "$BUILD" && ctest -L gpu --output-on-failure --timeout 300) 2>&1 | tee "$OUT/gpu_tests.log" || test_rc=$?
if grep -q "(Skipped)" "$OUT/gpu_tests.log"; then
  echo "run_gpu_checks: gpu tests were skipped: CUDA sees no device" >&2
  test_rc=1
fi

step "benchmark"
bench_rc=0
rm -f "$OUT/moe_layer_gpu.json"  # never summarise an earlier run
"$BUILD/tests/gpu/moe_layer_gpu_bench" --benchmark_out="$OUT/moe_layer_gpu.json" --benchmark_out_format=json \
  2>&1 | tee "$OUT/moe_layer_gpu.log" || bench_rc=$?

step "summary"
if [ -s "$OUT/moe_layer_gpu.json" ]; then
  python3 - "$OUT/moe_layer_gpu.json" <<'PY' || bench_rc=1
import json, re, sys
data = json.load(open(sys.argv[1]))
ctx = data.get("context", {})
print(f"device {ctx.get('device')}, CUDA runtime {ctx.get('cuda_runtime')}, cuBLAS {ctx.get('cublas')}")
cases, copy, errors = {}, None, []
for b in data["benchmarks"]:
    if b.get("run_type") == "aggregate":
        continue
    if b.get("error_occurred"):
        errors.append(f"{b['name']}: {b.get('error_message')}")
        continue
    if b["name"].startswith("BM_DeviceCopy"):
        copy = b["copy_TBps"]
        continue
    m = re.match(r"(BM_\w+)/experts:(\d+)/batch:(\d+)", b["name"])
    if m:
        cases[(m.group(1), int(m.group(2)), int(m.group(3)))] = b
if copy:
    print(f"device-to-device copy (1 GiB, read + write): {copy:.2f} TB/s = {copy / 4.8:.0%} of 4.8 TB/s")
print(f"{'variant':<32} {'experts':>7} {'batch':>5} {'latency_us':>10} {'weight_TB/s':>11} {'of 4.8TB/s':>10} "
      f"{'of copy':>8} {'grouped':>7}")
for key in sorted(cases):
    b = cases[key]
    of_copy = f"{b['weight_TBps'] / copy:.0%}" if copy else "-"
    print(f"{key[0]:<32} {key[1]:>7} {key[2]:>5} {b['latency_us']:>10.1f} {b['weight_TBps']:>11.2f} "
          f"{b['frac_of_4.8TBps']:>10.0%} {of_copy:>8} {int(b.get('grouped_gemm', 0)):>7}")
for variant in sorted({k[0] for k in cases}):
    for batch in (16, 64):
        lo, hi = cases.get((variant, 16, batch)), cases.get((variant, 128, batch))
        if lo and hi:
            print(f"{variant} batch {batch}: latency 128/16 experts = {hi['latency_us'] / lo['latency_us']:.2f}x "
                  f"(published: 4.7x)")
    for experts in (16, 32, 64, 128):
        a, b = cases.get((variant, experts, 16)), cases.get((variant, experts, 64))
        if a and b:
            print(f"{variant} experts {experts}: latency batch 64/16 = {b['latency_us'] / a['latency_us']:.2f}x")
for e in errors:
    print("error:", e)
sys.exit(1 if errors else 0)
PY
else
  echo "run_gpu_checks: no benchmark JSON written" >&2
  bench_rc=1
fi

step "done: tests rc=$test_rc, benchmark rc=$bench_rc (outputs in $OUT)"
[ "$test_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
