#!/usr/bin/env bash
# Builds the GPU checks here and packs them for a bare GPU machine (issue 13, "The GPU check"): that machine has
# nvcc, CMake, the NVIDIA driver and PyTorch's CUDA runtime / cuBLAS / NCCL libraries, but none of the Debian
# libraries eldr links (HDF5, yaml-cpp, ...), cannot fetch anything and cannot configure. So this script
#   1. configures a Release build in build-device/ with CUDA (sm_90 by default) and -march=native OFF (the GPU
#      host's CPU is unknown: a binary built for this CPU could die there of SIGILL),
#   2. builds only the GPU test binaries and the GPU benchmark (cuda_ops_test, backend_gpu_test,
#      moe_layer_gpu_bench),
#   3. copies them, with the non-CUDA shared libraries they need (ldd; never libcuda, the CUDA runtime, cuBLAS or
#      NCCL: the machine's own are found at run time) and tests/gpu/run_gpu_checks.sh, into one folder
#      (build-device/pack/, ignored by git), and refuses a pack over 64 MiB.
# Usage: tests/gpu/pack_for_device.sh [PACK_DIR]
#   ELDR_CUDA_ARCHITECTURES (default 90), ELDR_JOBS (default: all cores).
# Then copy PACK_DIR to the GPU machine and run PACK_DIR/run_gpu_checks.sh there (it knows it runs packed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build-device"
PACK="${1:-$BUILD/pack}"
ARCH="${ELDR_CUDA_ARCHITECTURES:-90}"
JOBS="${ELDR_JOBS:-$(nproc)}"
LIMIT_MB=64
TARGETS=(cuda_ops_test backend_gpu_test moe_layer_gpu_bench)
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"

mkdir -p "$BUILD"
echo "pack_for_device: configure $BUILD (Release, CUDA architectures $ARCH, native OFF)"
if ! cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DELDR_WITH_CUDA=ON -DELDR_NATIVE_ARCH=OFF \
     -DELDR_CUDA_ARCHITECTURES="$ARCH" ${CMAKE_CXX_COMPILER_LAUNCHER:+-DCMAKE_CXX_COMPILER_LAUNCHER=$CMAKE_CXX_COMPILER_LAUNCHER} \
     ${CMAKE_CUDA_COMPILER_LAUNCHER:+-DCMAKE_CUDA_COMPILER_LAUNCHER=$CMAKE_CUDA_COMPILER_LAUNCHER} \
     >"$BUILD/configure.log" 2>&1; then
  tail -20 "$BUILD/configure.log"
  echo "pack_for_device: configure failed (no nvcc: install the CUDA toolkit; missing packages: launch/setup)" >&2
  exit 1
fi
grep "eldr " "$BUILD/configure.log" | sed 's/^-- //'
echo "pack_for_device: build ${TARGETS[*]}"
cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}"

rm -rf "$PACK"
mkdir -p "$PACK/bin" "$PACK/lib"
for t in "${TARGETS[@]}"; do
  f="$(find "$BUILD/tests" -type f -name "$t" -perm -u+x | head -1)"
  [ -n "$f" ] || { echo "pack_for_device: $t was not built" >&2; exit 1; }
  cp "$f" "$PACK/bin/"
done
cp "$ROOT/tests/gpu/run_gpu_checks.sh" "$ROOT/tests/gpu/run_packed_checks.sh" "$PACK/"
# The libraries the GPU machine lacks: everything ldd resolves except the C runtime itself (glibc is there) and
# the CUDA/NVIDIA libraries (the machine's own, matching its driver).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libcuda\.so|libcudart|libcublas|libnccl|libnvidia|libnvrtc|libnvJitLink)'
for b in "$PACK"/bin/*; do
  ldd "$b" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    if echo "$name" | grep -qE "$skip"; then continue; fi
    [ -e "$PACK/lib/$name" ] || cp -L "$path" "$PACK/lib/$name"
  done
done
{
  echo "# eldr GPU check pack"
  echo "git_sha $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo -dirty)"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), CUDA architectures $ARCH, native OFF"
  echo "needs at run time: libcudart.so.13, libcublas.so.13, libcublasLt.so.13 (the machine's, e.g. PyTorch's)"
} >"$PACK/PACK_INFO"
size_kb=$(du -sk "$PACK" | cut -f1)
echo "pack_for_device: $PACK: $((size_kb / 1024)) MiB ($(ls "$PACK/lib" | wc -l) libraries): $(ls "$PACK/lib" | tr '\n' ' ')"
if [ "$size_kb" -gt $((LIMIT_MB * 1024)) ]; then
  echo "pack_for_device: the pack is $((size_kb / 1024)) MiB, over the $LIMIT_MB MiB limit" >&2
  exit 1
fi
