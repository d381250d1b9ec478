#!/usr/bin/env bash
# Data-parallel training on GPUs, for a machine with NVIDIA GPUs, Open MPI
# (or MPICH) and NCCL (libnccl.so.2 on the loader's path): one process per
# GPU, the gradients summed by NCCL on device memory (src/dist/nccl.c).
#   1. build with -DNEEDLE_CUDA=ON (skip: BUILD_DONE=1)
#   2. a LoRA finetune on one GPU, one process            -> lora1.pkl
#   3. the same with mpirun -np $NP (NCCL)                -> lora2.pkl
#      must say "summed on the GPUs by NCCL", equal (2) to TOL (relative)
#   4. (3) again: bit-identical (NCCL's order is fixed for one machine,
#      NCCL version and rank count)
#   5. (3) with NEEDLE_NCCL=0 (MPI through host memory): equal (3) to TOL
#   6. --full on one process and on $NP ranks: equal to TOL
# With fewer than 2 GPUs NCCL cannot run 2 ranks (one GPU per rank): the
# NCCL steps are skipped and said so. Exit status 1 if anything failed.
# Environment: BUILD (build-cuda-mpi), NP (GPUs, at most 8), TOL (1e-4:
# cuBLAS may pick other kernels for a rank's smaller share of rows, so
# less than the CPU's 1e-5), CUDA_ARCHS (native), STEPS data lines (64),
# BASE (models/needle-nano.pkl, else a fresh tiny model), NEEDLE (the
# program: $BUILD/needle), NGPU (the GPU count: nvidia-smi's), MPIRUN_ARGS
# (more mpirun options, e.g. "--mca btl self,tcp"). A dry run without GPUs,
# on the emulated plugin and the stand-in NCCL (tools/cuda_emu):
#   BUILD_DONE=1 NEEDLE=build/needle NEEDLE_PLUGIN_DIR=$PWD/build-cuda-emu \
#   NGPU=2 NEEDLE_NCCL=/path/to/fake/libnccl.so.2 BASE=tiny.pkl STEPS=16 ...
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build-cuda-mpi}
TOL=${TOL:-1e-4}
PY=${PYTHON:-python3}
OUT=$(mktemp -d /tmp/needle-gpu-mpi.XXXXXX)
NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
NP=${NP:-$((NGPU < 8 ? NGPU : 8))}
echo "gpu_mpi_check: $NGPU GPUs, $NP ranks, logs in $OUT"
fail=0
note() { echo "gpu_mpi_check: $*"; }
bad() {
  echo "gpu_mpi_check: FAILED: $*"
  fail=1
}

if [ "${BUILD_DONE:-0}" != 1 ]; then
  if ! { cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DNEEDLE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-native}" >"$OUT/cmake.log" 2>&1 &&
    cmake --build "$BUILD" -j "$(nproc)" --target needle needle_cuda >"$OUT/build.log" 2>&1; }; then
    tail -n 30 "$OUT/cmake.log" "$OUT/build.log"
    bad "build"
    exit 1
  fi
fi
NEEDLE=${NEEDLE:-$BUILD/needle}
command -v mpirun >/dev/null || { bad "no mpirun (apt-get install openmpi-bin)"; exit 1; }
[ "$NGPU" -ge 1 ] || { bad "no GPU (nvidia-smi -L)"; exit 1; }
"$PY" -c 'import numpy' 2>/dev/null || PY=/usr/bin/python3

head -n "${STEPS:-64}" examples/data.jsonl >"$OUT/data.jsonl"
BASE=${BASE:-models/needle-nano.pkl}
[ -f "$BASE" ] || { "$NEEDLE" init "$OUT/base.pkl" --preset tiny --seed 0 >/dev/null; BASE=$OUT/base.pkl; }
ARGS=(finetune "$OUT/data.jsonl" --checkpoint "$BASE" --tokenizer models/tokenizer.model
  --batch-size 16 --max-len 256 --epochs 1 --lr 1e-3 --seed 0 --val-split 0 --device cuda --threads 2)
# shellcheck disable=SC2206 # MPIRUN_ARGS: words on purpose
MPI=(mpirun --allow-run-as-root --oversubscribe ${MPIRUN_ARGS:-} -np "$NP" -x NEEDLE_NCCL
  -x LD_LIBRARY_PATH)

# run NAME [mpi] EXTRA...: one finetune, log in $OUT/NAME.log, output $OUT/NAME.pkl
run() {
  local name=$1 how=$2
  shift 2
  local cmd=("$NEEDLE" "${ARGS[@]}" "$@" --out "$OUT/$name.pkl")
  [ "$how" = mpi ] && cmd=("${MPI[@]}" "${cmd[@]}")
  echo "== $name: ${cmd[*]}"
  if timeout 900 "${cmd[@]}" >"$OUT/$name.log" 2>&1; then
    grep -E 'distributed|backend' "$OUT/$name.log"
  else
    tail -n 15 "$OUT/$name.log"
    bad "$name run"
  fi
}
# same A B MAXREL: every float tensor of two outputs, max |a-b| / max |a|
# (tools/same_pkl.py, shared with tools/cuda_emu/check.sh)
same() {
  "$PY" tools/same_pkl.py "$OUT/$1.pkl" "$OUT/$2.pkl" "$3" "$1 vs $2" || bad "$1 vs $2"
}

run lora1 one
if [ "$NP" -ge 2 ]; then
  export NEEDLE_NCCL=${NEEDLE_NCCL:-}
  run lora2 mpi
  grep -q "summed on the GPUs by NCCL" "$OUT/lora2.log" || bad "lora2 did not use NCCL"
  same lora1 lora2 "$TOL"
  run lora2b mpi
  same lora2 lora2b 0
  NEEDLE_NCCL=0 run lora2m mpi
  grep -q "summed in rank order" "$OUT/lora2m.log" || bad "lora2m did not sum over MPI"
  same lora2 lora2m "$TOL"
  run full1 one --full
  run full2 mpi --full
  same full1 full2 "$TOL"
  grep -h 'distributed .* ms a step' "$OUT/lora2.log" "$OUT/full2.log"
else
  note "one GPU: NCCL needs one GPU per rank; 2 ranks on it over MPI (NEEDLE_NCCL=0)"
  NP=2
  # shellcheck disable=SC2206
  MPI=(mpirun --allow-run-as-root --oversubscribe ${MPIRUN_ARGS:-} -np 2 -x NEEDLE_NCCL
    -x LD_LIBRARY_PATH)
  NEEDLE_NCCL=0 run lora2m mpi
  same lora1 lora2m "$TOL"
fi
if [ "$fail" = 0 ]; then note ok; else note FAILED; fi
exit "$fail"
