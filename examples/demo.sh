#!/usr/bin/env bash
# The main job, end to end on the embedded default model shape:
#   1. write a fresh random tiny base checkpoint (upstream format),
#   2. score shipped token sequences with it (forward pass + loss).
# A random model's loss sits near ln(vocab) = ln(8192) = 9.01: this shows
# the pipeline runs and the numbers are sane, not that the model is good
# (fine-tuning lands with the finetune issue).
set -euo pipefail
NEEDLE=${1:-build/needle}
OUT=${OUT:-out/demo}
mkdir -p "$OUT"
echo "== needle init (tiny preset, seed 0)"
"$NEEDLE" init "$OUT/tiny.pkl" --preset tiny --seed 0
echo "== needle eval on examples/tokens.txt"
"$NEEDLE" eval --checkpoint "$OUT/tiny.pkl" --tokens examples/tokens.txt
echo "== needle eval --json (first 200 bytes)"
"$NEEDLE" eval --checkpoint "$OUT/tiny.pkl" --tokens examples/tokens.txt --json | head -c 200; echo
echo "(expected: every loss near ln(8192) = 9.01 for an untrained model)"
