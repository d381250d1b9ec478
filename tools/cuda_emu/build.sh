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
mkdir -p "$OUT/gen"
rm -f "$OUT"/gen/*.cpp
for f in src/backend/cuda/*.cu; do
  python3 tools/cuda_emu/convert.py "$f" "$OUT/gen/$(basename "$f" .cu).cpp"
done
cp src/backend/cuda/*.cuh "$OUT/gen/"
# -U_FORTIFY_SOURCE: longjmp between coroutine stacks trips glibc's check
# shellcheck disable=SC2086
${CXX:-g++} -std=c++17 -O2 -fPIC -shared -U_FORTIFY_SOURCE -D_FORTIFY_SOURCE=0 -w ${EMU_CFLAGS:-} \
  -Itools/cuda_emu/include -Isrc -fvisibility=hidden -o "$OUT/libneedle_cuda.so" \
  "$OUT"/gen/*.cpp tools/cuda_emu/emu.cpp
echo "built $OUT/libneedle_cuda.so (CPU emulation of the CUDA plugin)"
