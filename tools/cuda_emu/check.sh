#!/usr/bin/env bash
# The CUDA plugin's kernels, run on the CPU (build.sh), against the CPU
# backend: test_backend_ops (every op), then the same fine-tunes on both (shared-prefix, packed and padded
# batches; full and LoRA; a tiny and a wider model with 4 lanes, head dim
# 64 and two engram sites), per-step losses within 1e-4 (relative) and the
# trained weights within 1% of how far training moved them. Minutes, not
# seconds: every GPU thread is a coroutine here.
set -euo pipefail
cd "$(dirname "$0")/../.."
NEEDLE=${NEEDLE:-build/needle}
EMU=${EMU:-build-cuda-emu}
OUT=$(mktemp -d /tmp/needle-cuda-emu.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
# a 64 KB staging ring: outgrown and recycled many times a run
EMU_CFLAGS="-DRING_MIN_BYTES=65536" bash tools/cuda_emu/build.sh "$EMU" >/dev/null
export NEEDLE_PLUGIN_DIR=$PWD/$EMU
PY=${PYTHON:-/usr/bin/python3}
TOK=models/tokenizer.model
head -n 16 examples/data.jsonl >"$OUT/d16.jsonl"
head -n 8 examples/data.jsonl >"$OUT/d8.jsonl"
"$NEEDLE" init "$OUT/tiny.pkl" --preset tiny --max-seq-len 512 --seed 0 >/dev/null
"$NEEDLE" init "$OUT/wide.pkl" --preset tiny --d-model 256 --heads 4 --kv-heads 2 --lanes 4 \
  --layers 2 --engram-layers 0,1 --max-seq-len 512 --seed 1 >/dev/null

losses() { grep -o 'step *[0-9]*/[0-9]*  loss [0-9.naif-]*' "$1" | awk '{print $NF}'; }

fail=0
pair() { # NAME BASE DATA EXTRA...
  local name=$1 base=$2 data=$3
  shift 3
  for dev in cpu cuda; do
    "$NEEDLE" finetune "$OUT/$data" --checkpoint "$OUT/$base" --tokenizer "$TOK" --batch-size 4 \
      --max-len 256 --epochs 1 --lr 1e-2 --seed 0 --val-split 0 --device "$dev" "$@" \
      --out "$OUT/$name.$dev.pkl" >"$OUT/$name.$dev.log" 2>&1 || {
      echo "$name: $dev run failed"
      tail -n 5 "$OUT/$name.$dev.log"
      fail=1
      return
    }
  done
  grep -q 'backend   cuda' "$OUT/$name.cuda.log" || { echo "$name: not the cuda backend"; fail=1; }
  local verdict
  verdict=$(paste <(losses "$OUT/$name.cpu.log") <(losses "$OUT/$name.cuda.log") | awk '
    { n++; d = $1 - $2; if (d < 0) d = -d; if (d / ($1 < 0 ? -$1 : $1) > 1e-4 || $2 == "") bad++ }
    END { printf "%d steps, %d differ", n, bad; exit !(n > 0 && bad == 0) }') || fail=1
  echo "$name: losses $verdict"
  if "$PY" -c 'import numpy' 2>/dev/null; then
    "$PY" tools/cuda_emu/compare_weights.py "$OUT/$name.cpu.pkl" "$OUT/$name.cuda.pkl" \
      "$OUT/$base" || fail=1
  fi
}
# every op against the CPU first (test_backend_ops, when built)
OPS=${OPS:-$(dirname "$NEEDLE")/test_backend_ops}
if [ -x "$OPS" ]; then
  if NEEDLE_TEST_REQUIRE_BACKEND=1 "$OPS" cuda >"$OUT/ops.log" 2>&1; then
    echo "test_backend_ops: $(tail -n 1 "$OUT/ops.log")"
  else
    grep -v ' ok ' "$OUT/ops.log" | tail -n 20
    echo "test_backend_ops: FAILED"
    fail=1
  fi
fi
pair tiny-full-shared tiny.pkl d16.jsonl --full
pair wide-full-padded wide.pkl d8.jsonl --full --batching padded
pair wide-lora-shared wide.pkl d8.jsonl
pair wide-lora-packed wide.pkl d8.jsonl --batching packed
[ "$fail" = 0 ] && echo "cuda-emu-check: ok" || echo "cuda-emu-check: FAILED"
exit "$fail"
