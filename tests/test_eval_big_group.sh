#!/usr/bin/env bash
# needle eval on examples that share one long prefix in large numbers (one
# tool set, as the held-out corpus has): a prefix group can exceed the
# default micro-batch (2048 rows), so eval must size its activations from
# its own batches (it failed with "a prefix group of N rows ... exceeds").
# Shared and packed batching must give the same loss.
set -euo pipefail
cd "$(dirname "$0")/.."
NEEDLE=${NEEDLE:-build/needle}
PY=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" tools/gen_toolcall_corpus.py --split heldout --domains pets --num 120 --seed 7 \
    --output "$tmp/d.jsonl" 2>/dev/null
"$NEEDLE" init "$tmp/t.pkl" --preset tiny --max-seq-len 1024 --seed 1 >/dev/null
run() {
    "$NEEDLE" eval --checkpoint "$tmp/t.pkl" "$tmp/d.jsonl" --tokenizer models/tokenizer.model \
        --batch-size 120 --threads 1 --batching "$1" | tail -n 1
}
shared=$(run shared)
packed=$(run packed)
echo "shared: $shared"
echo "packed: $packed"
[[ "$shared" == mean\ loss* && "$shared" == "$packed" ]] || { echo "FAIL: shared and packed differ"; exit 1; }
echo "ok"
