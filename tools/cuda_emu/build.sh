#!/usr/bin/env bash
# Build the CUDA plugin's sources as a host library that runs every kernel
# on the CPU (tools/cuda_emu: a stand-in CUDA runtime and cuBLAS; each
# block's threads are coroutines, __syncthreads and the warp shuffles are
# rendezvous points; stream work runs at a sync, as on a GPU). It is the
# real kernel code, so loss and weights of a run through it check the
# plugin's index math, barriers, staging of host inputs and ring recycling
# on a machine without a GPU; it says nothing of speed or of GPU
# memory-model races. Output: $1/libneedle_cuda.so (default
# build-cuda-emu). EMU_CFLAGS: extra flags, e.g. -DRING_MIN_BYTES=65536.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-build-cuda-emu}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
mkdir -p "$OUT/gen"
rm -f "$OUT"/gen/*.cpp "$OUT"/gen/*.o
for f in src/backend/cuda/*.cu; do
  python3 tools/cuda_emu/convert.py "$f" "$OUT/gen/$(basename "$f" .cu).cpp"
done
cp src/backend/cuda/*.cuh "$OUT/gen/"
cp tools/cuda_emu/emu.cpp "$OUT/gen/emu.cpp"
# -U_FORTIFY_SOURCE: longjmp between coroutine stacks trips glibc's check.
# One object a file, JOBS at a time (JOBS: default the core count).
# shellcheck disable=SC2086
printf '%s\n' "$OUT"/gen/*.cpp | xargs -P "$JOBS" -I{} \
  ${CXX:-g++} -std=c++17 -O2 -fPIC -U_FORTIFY_SOURCE -D_FORTIFY_SOURCE=0 -w ${EMU_CFLAGS:-} \
  -Itools/cuda_emu/include -Isrc -fvisibility=hidden -c -o {}.o {}
${CXX:-g++} -shared -o "$OUT/libneedle_cuda.so" "$OUT"/gen/*.cpp.o
echo "built $OUT/libneedle_cuda.so (CPU emulation of the CUDA plugin)"
