#!/usr/bin/env bash
# First run of the CUDA backend on a GPU machine (written for one H200).
# Stages, each with a time limit; a failure is recorded and the next stage
# runs anyway; one summary table at the end (exit status 1 if any failed):
#   build        Release build with -DNEEDLE_CUDA=ON (needle, the plugin,
#                test_backend_ops when present)
#   device       nvidia-smi -L and what `needle` reports for --device cuda
#   conformance  build/test_backend_ops cuda: every op against the CPU
#   device-ft    tests/device_finetune.sh cuda: 32 LoRA steps vs the CPU
#   bench        needle bench train --preset needle2 --device cuda (16 x 128)
#   bench-64x1k  the same at batch 64 x seq 1024
#   bench-64x1k-tf32  the same with --precision tf32 (tensor-core GEMMs)
#   ft-full      finetune --full of a tiny fresh base on CPU and on CUDA, same
#                seed: per-step losses must agree (relative FT_TOL)
#   ft-lora      the same for a LoRA adapter
#   ft-repeat    the CUDA LoRA run again: losses must be bit-identical (no
#                atomics anywhere, so the GPU is deterministic run to run)
# Total well under 8 minutes on an H200 (most of it the build).
# Environment: BUILD (default build), CUDA_ARCHS (default 90: only the
# H200's SASS, to save build time; the full fat binary is `make cuda-build`),
# FT_TOL (default 2e-3), JOBS (default nproc), SKIP (stage names to leave
# out, e.g. SKIP="build bench-64x1k").
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
CUDA_ARCHS=${CUDA_ARCHS:-90}
FT_TOL=${FT_TOL:-2e-3}
JOBS=${JOBS:-$(nproc)}
SKIP=${SKIP:-}
OUT=${OUT:-$(mktemp -d /tmp/needle-cuda.XXXXXX)}
NEEDLE="$BUILD/needle"
TOK=models/tokenizer.model
mkdir -p "$OUT"
export BUILD CUDA_ARCHS FT_TOL JOBS OUT NEEDLE TOK
echo "cuda.sh: logs in $OUT"

names=()
codes=()
secs=()
notes=()

# run NAME LIMIT_S CMD...: runs CMD under a time limit, log in $OUT/NAME.log
run() {
  local name=$1 limit=$2
  shift 2
  if [[ " $SKIP " == *" $name "* ]]; then
    names+=("$name")
    codes+=(0)
    secs+=(0)
    notes+=("skipped (SKIP)")
    return 0
  fi
  echo "== $name: $*"
  local t0=$SECONDS rc
  # through bash -c so that CMD may be one of the functions exported below
  timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  tail -n 25 "$OUT/$name.log"
  names+=("$name")
  codes+=("$rc")
  secs+=($((SECONDS - t0)))
  notes+=("")
  [ "$rc" = 124 ] && notes[${#notes[@]} - 1]="timed out after ${limit}s"
  return "$rc"
}

note() { [ -z "$*" ] || notes[${#notes[@]} - 1]="$*"; }

# ---- build ----
build() {
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DNEEDLE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" || return 1
  local targets="needle needle_cuda"
  [ -f tests/test_backend_ops.c ] && targets="$targets test_backend_ops"
  # shellcheck disable=SC2086
  cmake --build "$BUILD" -j "$JOBS" --target $targets
}
export -f build
run build 420 build

# ---- device ----
device() {
  nvidia-smi -L || true
  # the backend line names the device (a too-short run: one tiny step)
  "$NEEDLE" bench forward --preset tiny --device cuda --batch 1 --seq 8 --iters 1
}
export -f device
run device 60 device
note "$(grep -m1 -o 'backend .*' "$OUT/device.log" 2>/dev/null | cut -c1-60)"

# ---- conformance ----
if [ -x "$BUILD/test_backend_ops" ]; then
  run conformance 180 env NEEDLE_TEST_REQUIRE_BACKEND=1 "$BUILD/test_backend_ops" cuda
else
  names+=(conformance)
  codes+=(1)
  secs+=(0)
  notes+=("test_backend_ops not built (not merged yet?)")
fi

# ---- the suite's device fine-tune (32 LoRA steps vs the CPU) ----
run device-ft 240 env NEEDLE="$NEEDLE" bash tests/device_finetune.sh cuda
note "$(grep -m1 -o 'worst rel diff.*' "$OUT/device-ft.log" 2>/dev/null)"

# ---- benchmarks ----
run bench 150 "$NEEDLE" bench train --preset needle2 --device cuda
note "$(grep -m1 -o 'median [0-9.]* s  [0-9]* tokens/s' "$OUT/bench.log" 2>/dev/null)"
run bench-64x1k 240 "$NEEDLE" bench train --preset needle2 --device cuda --batch 64 --seq 1024 \
  --iters 3
note "$(grep -m1 -o 'median [0-9.]* s  [0-9]* tokens/s' "$OUT/bench-64x1k.log" 2>/dev/null)"
run bench-64x1k-tf32 240 "$NEEDLE" bench train --preset needle2 --device cuda --batch 64 \
  --seq 1024 --iters 3 --precision tf32
note "$(grep -m1 -o 'median [0-9.]* s  [0-9]* tokens/s' "$OUT/bench-64x1k-tf32.log" 2>/dev/null)"

# ---- fine-tunes: CPU vs CUDA ----
head -n 64 examples/data.jsonl >"$OUT/data.jsonl"

# step losses of a finetune log, one per line
losses() { grep -o 'step *[0-9]*/[0-9]*  loss [0-9.naif-]*' "$1" | awk '{print $NF}'; }

# compare A B TOL: same number of steps, every |a-b| <= TOL*max(1,|a|)
compare() {
  local a b
  a=$(losses "$1")
  b=$(losses "$2")
  [ -n "$a" ] || { echo "no losses in $1"; return 1; }
  paste <(echo "$a") <(echo "$b") | awk -v tol="$3" '
    { n++; d = $1 - $2; if (d < 0) d = -d; s = $1 < 0 ? -$1 : $1; if (s < 1) s = 1;
      r = d / s; if (r > worst) worst = r; if ($2 == "" || r > tol || $1 != $1) bad++ }
    END { printf "steps %d  max rel diff %.2e  (tol %s)\n", n, worst, tol; exit bad > 0 }'
}

finetune() { # DEVICE LOG EXTRA...
  local dev=$1 log=$2
  shift 2
  "$NEEDLE" finetune "$OUT/data.jsonl" --checkpoint "$OUT/tiny.pkl" --tokenizer "$TOK" \
    --batch-size 8 --max-len 256 --epochs 2 --lr 1e-2 --seed 7 --device "$dev" "$@" >"$log" 2>&1
}

ft_pair() { # NAME EXTRA...: CPU then CUDA, compared
  local name=$1
  shift
  [ -f "$OUT/tiny.pkl" ] ||
    "$NEEDLE" init "$OUT/tiny.pkl" --preset tiny --max-seq-len 512 --seed 0 || return 1
  finetune cpu "$OUT/$name.cpu.log" "$@" --out "$OUT/$name.cpu.pkl" || { echo "CPU run failed"; return 1; }
  finetune cuda "$OUT/$name.cuda.log" "$@" --out "$OUT/$name.cuda.pkl" || {
    tail -n 5 "$OUT/$name.cuda.log"
    echo "CUDA run failed"
    return 1
  }
  paste <(losses "$OUT/$name.cpu.log") <(losses "$OUT/$name.cuda.log") | sed 's/^/  cpu cuda: /'
  compare "$OUT/$name.cpu.log" "$OUT/$name.cuda.log" "$FT_TOL"
}
export -f losses compare finetune ft_pair
run ft-full 150 ft_pair ft-full --full
note "$(grep -m1 -o 'steps.*' "$OUT/ft-full.log" 2>/dev/null)"
run ft-lora 150 ft_pair ft-lora
note "$(grep -m1 -o 'steps.*' "$OUT/ft-lora.log" 2>/dev/null)"

ft_repeat() {
  [ -f "$OUT/ft-lora.cuda.log" ] || { echo "no first CUDA LoRA run"; return 1; }
  finetune cuda "$OUT/ft-repeat.cuda.log" --out "$OUT/ft-repeat.pkl" || return 1
  compare "$OUT/ft-lora.cuda.log" "$OUT/ft-repeat.cuda.log" 0
}
export -f ft_repeat
run ft-repeat 90 ft_repeat
note "$(grep -m1 -o 'steps.*' "$OUT/ft-repeat.log" 2>/dev/null)"

# ---- summary ----
echo
printf '%-12s %-6s %6s  %s\n' stage status secs note
failed=0
for i in "${!names[@]}"; do
  st=ok
  [ "${codes[$i]}" = 0 ] || { st="rc=${codes[$i]}"; failed=1; }
  printf '%-12s %-6s %6s  %s\n' "${names[$i]}" "$st" "${secs[$i]}" "${notes[$i]}"
done
echo "logs: $OUT"
exit "$failed"
