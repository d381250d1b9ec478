#!/usr/bin/env bash
# The CUDA plugin's kernels, run on the CPU (build.sh), against the CPU
# backend: test_backend_ops (every op), then the same fine-tunes on both (shared-prefix, packed and padded
# batches; full and LoRA; a tiny and a wider model with 4 lanes, head dim
# 64 and two engram sites), per-step losses within 1e-4 (relative) and the
# trained weights within 1% of how far training moved them; and (with
# mpirun) 2 ranks whose gradients go through the NCCL path (a stand-in
# libnccl) against one process. Minutes, not seconds: every GPU thread is a
# coroutine here. Device memory (cudaMalloc) is closed to host code outside
# the emulated stream work, so a host dereference of it aborts the run.
#
# The runs are independent processes, so they go as background jobs,
# CHECK_JOBS at a time (default: the core count), each writing its own log
# and exit status; the emulated plugin is single-threaded, so each fine-tune
# gets one thread. The verdicts come after every run has finished, in a fixed
# order, and any failed run or comparison fails the script.
set -euo pipefail
cd "$(dirname "$0")/../.."
NEEDLE=${NEEDLE:-build/needle}
EMU=${EMU:-build-cuda-emu}
JOBS=${CHECK_JOBS:-$(nproc 2>/dev/null || echo 2)}
OUT=$(mktemp -d /tmp/needle-cuda-emu.XXXXXX)
cleanup() {
  local p
  for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$OUT"
}
trap cleanup EXIT
PY=${PYTHON:-/usr/bin/python3}
TOK=models/tokenizer.model
T0=$SECONDS

# ---- the job pool ----
# spawn NAME CMD...: run CMD in the background once fewer than JOBS jobs
# run; its output goes to $OUT/NAME.log, its exit status to $OUT/NAME.rc
# (a missing .rc: it was killed before it finished).
spawn() {
  local name=$1
  shift
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do
    wait -n || true
  done
  (
    s=$SECONDS
    rc=0
    "$@" >"$OUT/$name.log" 2>&1 || rc=$?
    echo "$name: $((SECONDS - s)) s" >"$OUT/$name.time"
    echo "$rc" >"$OUT/$name.rc"
  ) &
}
# ok NAME: whether job NAME finished with status 0
ok() { [ "$(cat "$OUT/$1.rc" 2>/dev/null)" = 0 ]; }

# ---- the runs ----
finetune() { # NAME DEV BASE DATA EXTRA...
  local name=$1 dev=$2 base=$3 data=$4
  shift 4
  "$NEEDLE" finetune "$OUT/$data" --checkpoint "$OUT/$base" --tokenizer "$TOK" --batch-size 4 \
    --max-len 256 --epochs 1 --lr 1e-2 --seed 0 --val-split 0 --device "$dev" --threads 1 "$@" \
    --out "$OUT/$name.$dev.pkl"
}
# the guard on device memory: copies and kernels may touch it, host code may not
poison() {
  ${CXX:-g++} -std=c++17 -O1 -U_FORTIFY_SOURCE -D_FORTIFY_SOURCE=0 -w -Itools/cuda_emu/include \
    -o "$OUT/poison_check" tools/cuda_emu/poison_check.cpp tools/cuda_emu/emu.cpp || return 1
  if ! "$OUT/poison_check" >"$OUT/poison.run" 2>&1; then
    echo "poison_check: allowed accesses failed"
    cat "$OUT/poison.run"
    return 1
  elif ("$OUT/poison_check" touch >"$OUT/poison.run" 2>&1; exit $?) 2>/dev/null ||
    ! grep -q 'host code touched device memory' "$OUT/poison.run"; then
    echo "poison_check: a host read of device memory was not caught"
    cat "$OUT/poison.run"
    return 1
  fi
  echo "poison_check: a host read of device memory aborts: ok"
}
# every op against the CPU (test_backend_ops, when built)
OPS=${OPS:-$(dirname "$NEEDLE")/test_backend_ops}
ops() {
  if NEEDLE_TEST_REQUIRE_BACKEND=1 "$OPS" cuda >"$OUT/ops.run" 2>&1; then
    echo "test_backend_ops: $(tail -n 1 "$OUT/ops.run")"
  else
    grep -v ' ok ' "$OUT/ops.run" | tail -n 20
    echo "test_backend_ops: FAILED"
    return 1
  fi
}
# an op declined on CUDA cannot run on the CPU over its memory: refused at
# start (exit 2, named), not a crash mid-run
decline() {
  local rc=0
  NEEDLE_BACKEND_DECLINE=matmul "$OPS" cuda >"$OUT/decline.run" 2>&1 || rc=$?
  if [ "$rc" = 2 ] && grep -q "cannot run on the CPU: its memory is device memory" "$OUT/decline.run"; then
    echo "decline: a declined op on device memory is refused at start: ok"
  else
    echo "decline: want exit 2 naming device memory, got exit $rc:"
    cat "$OUT/decline.run"
    return 1
  fi
}
# the GEMM precision reaches the plugin in its open call's options (the
# plugin reads no environment): --precision bf16, NEEDLE_CUDA_PRECISION=tf32
# through core/tuning, and neither (float32); the backend line says which
precision() {
  echo "1 2 3 4 5 6 7 8" >"$OUT/prec.tok"
  local how want got
  for how in "--precision bf16:float32 (bf16 matmuls)" "env:float32 (TF32 matmuls)" \
    "none:float32"; do
    want=${how#*:}
    case ${how%%:*} in
    env) got=$(NEEDLE_CUDA_PRECISION=tf32 "$NEEDLE" eval --checkpoint "$OUT/tiny.pkl" \
      --tokens "$OUT/prec.tok" --device cuda --threads 1 2>&1) ;;
    none) got=$("$NEEDLE" eval --checkpoint "$OUT/tiny.pkl" --tokens "$OUT/prec.tok" \
      --device cuda --threads 1 2>&1) ;;
    # shellcheck disable=SC2086 # "--precision bf16": two words
    *) got=$("$NEEDLE" eval --checkpoint "$OUT/tiny.pkl" --tokens "$OUT/prec.tok" \
      --device cuda --threads 1 ${how%%:*} 2>&1) ;;
    esac
    if ! grep -q "backend   cuda .*, ${want}\$" <<<"$got"; then
      echo "precision: ${how%%:*}: want the backend line to end '$want', got:"
      echo "$got" | tail -n 5
      return 1
    fi
  done
  echo "precision: --precision and NEEDLE_CUDA_PRECISION reach the plugin: ok"
}
# 2 ranks (mpirun, loopback) on the emulated plugin, the gradients through
# the NCCL path of src/dist with a stand-in libnccl (fake_nccl.c: the id
# exchange and the all-reduce calls are checked, NCCL itself is not): the
# adapter must equal the one-process run's (<= 1e-5 relative)
MPI_ARGS=(finetune "$OUT/d4.jsonl" --checkpoint "$OUT/tiny.pkl" --tokenizer "$TOK" --batch-size 2
  --max-len 256 --epochs 1 --lr 1e-2 --seed 0 --val-split 0 --device cuda --threads 1)
mpi1() { "$NEEDLE" "${MPI_ARGS[@]}" --out "$OUT/mpi1.pkl"; }
mpi2() {
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NEEDLE_NCCL="$OUT/libnccl.so.2" \
    FAKE_NCCL_LOG="$OUT/nccl.log" timeout 300 mpirun --oversubscribe --mca btl self,tcp \
    --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -np 2 \
    "$NEEDLE" "${MPI_ARGS[@]}" --out "$OUT/mpi2.pkl"
}

# ---- setup: fixtures and the plugin (build.sh compiles JOBS files at a time) ----
head -n 16 examples/data.jsonl >"$OUT/d16.jsonl"
head -n 8 examples/data.jsonl >"$OUT/d8.jsonl"
head -n 4 examples/data.jsonl >"$OUT/d4.jsonl" # 2 steps of 2 rows: one row a rank
"$NEEDLE" init "$OUT/tiny.pkl" --preset tiny --max-seq-len 512 --seed 0 >/dev/null
"$NEEDLE" init "$OUT/wide.pkl" --preset tiny --d-model 256 --heads 4 --kv-heads 2 --lanes 4 \
  --layers 2 --engram-layers 0,1 --max-seq-len 512 --seed 1 >/dev/null
# a 64 KB staging ring: outgrown and recycled many times a run
EMU_CFLAGS="-DRING_MIN_BYTES=65536" JOBS=$JOBS bash tools/cuda_emu/build.sh "$EMU" >/dev/null
export NEEDLE_PLUGIN_DIR=$PWD/$EMU
HAVE_MPI=0
if command -v mpirun >/dev/null; then
  HAVE_MPI=1
  ${CC:-gcc} -std=c11 -O1 -shared -fPIC -o "$OUT/libnccl.so.2" tools/cuda_emu/fake_nccl.c -ldl
  # the stand-in is as strict as NCCL: host memory is refused, not summed
  ${CC:-gcc} -std=c11 -O1 -o "$OUT/nccl_strict" tools/cuda_emu/nccl_strict.c -ldl
  if "$OUT/nccl_strict" "$OUT/libnccl.so.2" >"$OUT/nccl_strict.run" 2>&1 &&
    grep -q 'not device memory' "$OUT/nccl_strict.run"; then
    echo "mpi-nccl: fake NCCL refuses host memory: ok" >"$OUT/nccl_strict.verdict"
  else
    { echo "mpi-nccl: fake NCCL summed host memory:"; cat "$OUT/nccl_strict.run"; } >"$OUT/nccl_strict.verdict"
    NCCL_STRICT_FAILED=1
  fi
fi
echo "cuda-emu-check: setup $((SECONDS - T0)) s; the runs, $JOBS at a time"

# ---- the runs, the longest first ----
PAIRS=("tiny-full-shared tiny.pkl d16.jsonl --full"
  "wide-full-padded wide.pkl d8.jsonl --full --batching padded"
  "wide-lora-shared wide.pkl d8.jsonl"
  "wide-lora-packed wide.pkl d8.jsonl --batching packed")
for dev in cuda cpu; do
  for p in "${PAIRS[@]}"; do
    read -r -a a <<<"$p"
    spawn "${a[0]}.$dev" finetune "${a[0]}" "$dev" "${a[@]:1}"
  done
  if [ "$dev" = cuda ]; then
    [ -x "$OPS" ] && spawn ops ops && spawn decline decline
    spawn precision precision
    if [ "$HAVE_MPI" = 1 ]; then
      spawn mpi2 mpi2
      spawn mpi1 mpi1
    fi
  fi
done
spawn poison poison
wait

# ---- the verdicts, in a fixed order ----
fail=0
losses() { grep -o 'step *[0-9]*/[0-9]*  loss [0-9.naif-]*' "$1" | awk '{print $NF}'; }
failed() { # NAME WHAT LINES: a run that failed, and the end of its log
  echo "$2 failed (exit $(cat "$OUT/$1.rc" 2>/dev/null || echo '?'))"
  tail -n "$3" "$OUT/$1.log"
  fail=1
}
ok poison || fail=1
cat "$OUT/poison.log"
if [ -x "$OPS" ]; then
  ok ops || fail=1
  cat "$OUT/ops.log"
  ok decline || fail=1
  cat "$OUT/decline.log"
fi
ok precision || fail=1
cat "$OUT/precision.log"
if [ "$HAVE_MPI" = 1 ]; then
  cat "$OUT/nccl_strict.verdict"
  [ "${NCCL_STRICT_FAILED:-0}" = 0 ] || fail=1
fi
if [ "$HAVE_MPI" = 0 ]; then
  echo "mpi-nccl: skipped (no mpirun)"
elif ! ok mpi1; then
  failed mpi1 "mpi-nccl: 1-process run" 5
elif ! ok mpi2; then
  failed mpi2 "mpi-nccl: 2-rank run" 8
else
  steps=$(losses "$OUT/mpi1.log" | wc -l)
  grep -q 'distributed  mpi  2 ranks.*summed on the GPUs by NCCL' "$OUT/mpi2.log" ||
    { echo "mpi-nccl: not the NCCL path"; grep distributed "$OUT/mpi2.log" || true; fail=1; }
  # one all-reduce a step on each rank, of the whole adapter's gradients
  [ "$(grep -c "size 2 calls $steps floats [1-9]" "$OUT/nccl.log")" = 2 ] ||
    { echo "mpi-nccl: expected 2 ranks x $steps all-reduces:"; cat "$OUT/nccl.log" || true; fail=1; }
  # the adapter of 2 ranks equals one process's (tools/same_pkl.py, shared
  # with tools/gpu_mpi_check.sh)
  "$PY" tools/same_pkl.py "$OUT/mpi1.pkl" "$OUT/mpi2.pkl" 1e-5 \
    "mpi-nccl: 2 ranks (NCCL path) vs 1 process" || fail=1
fi
for p in "${PAIRS[@]}"; do
  read -r -a a <<<"$p"
  name=${a[0]} base=${a[1]}
  if ! ok "$name.cpu"; then
    failed "$name.cpu" "$name: cpu run" 5
    continue
  elif ! ok "$name.cuda"; then
    failed "$name.cuda" "$name: cuda run" 5
    continue
  fi
  grep -q 'backend   cuda' "$OUT/$name.cuda.log" || { echo "$name: not the cuda backend"; fail=1; }
  verdict=$(paste <(losses "$OUT/$name.cpu.log") <(losses "$OUT/$name.cuda.log") | awk '
    { n++; d = $1 - $2; if (d < 0) d = -d; if (d / ($1 < 0 ? -$1 : $1) > 1e-4 || $2 == "") bad++ }
    END { printf "%d steps, %d differ", n, bad; exit !(n > 0 && bad == 0) }') || fail=1
  echo "$name: losses $verdict"
  if "$PY" -c 'import numpy' 2>/dev/null; then
    "$PY" tools/cuda_emu/compare_weights.py "$OUT/$name.cpu.pkl" "$OUT/$name.cuda.pkl" \
      "$OUT/$base" || fail=1
  fi
done
echo "cuda-emu-check: $((SECONDS - T0)) s; the runs took: $(cat "$OUT"/*.time | sort -t: -k2 -rn |
  tr '\n' ',' | sed 's/,$//; s/,/, /g')"
[ "$fail" = 0 ] && echo "cuda-emu-check: ok" || echo "cuda-emu-check: FAILED"
exit "$fail"
