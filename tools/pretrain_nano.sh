#!/bin/bash
# needle-nano: pre-train a small tool-calling base from scratch, reproducibly,
# on the synthetic corpus (tools/gen_toolcall_corpus.py, pretrain split):
# corpus -> `needle init` -> `needle finetune --full` -> zero-shot loss on the
# held-out domains -> `needle build` (.cact). Sized for about two hours on the
# 2-core reference machine (see README "needle-nano").
#
#   tools/pretrain_nano.sh                                  # the real run
#   NANO_EXAMPLES=800 NANO_EPOCHS=1 NANO_THREADS=1 NANO_OUT=/tmp/nano tools/pretrain_nano.sh
#                                                           # a short trial
#
# Environment (defaults in brackets):
#   NANO_EXAMPLES  pretrain corpus size [16000]     NANO_EPOCHS   passes [2]
#   NANO_THREADS   worker threads [2]               NANO_LR       peak lr [1e-3]
#   NANO_BATCH     examples per step [16]           NANO_HELDOUT  held-out eval set [400]
#   NANO_OUT       output folder [models]           NANO_WORK     scratch [build/nano]
#   NEEDLE         the needle binary [build/needle] PYTHON        [/usr/bin/python3]
# Outputs: $NANO_OUT/needle-nano.pkl (float32 checkpoint), $NANO_OUT/needle-nano.cact,
# $NANO_WORK/{corpus,heldout}.jsonl, $NANO_WORK/train.log.
# Interrupted (Ctrl-C) or killed: the checkpoint so far is in
# $NANO_OUT/needle-nano.pkl (written on SIGINT and every 200 steps); `finetune
# --resume` does not cover --full, so rerun, or continue from it as a new run
# (its own schedule, so no longer this exact recipe).
set -euo pipefail

if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
fi
if [[ $# -gt 0 ]]; then
    echo "pretrain_nano.sh: no arguments expected (got '$1'); configure with NANO_* variables, see --help" >&2
    exit 2
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
NEEDLE=${NEEDLE:-$ROOT/build/needle}
PYTHON=${PYTHON:-/usr/bin/python3}
TOKENIZER=$ROOT/models/tokenizer.model
EXAMPLES=${NANO_EXAMPLES:-16000}
EPOCHS=${NANO_EPOCHS:-2}
THREADS=${NANO_THREADS:-2}
LR=${NANO_LR:-1e-3}
BATCH=${NANO_BATCH:-16}
HELDOUT=${NANO_HELDOUT:-400}
OUT=${NANO_OUT:-$ROOT/models}
WORK=${NANO_WORK:-$ROOT/build/nano}

# The chosen shape (calibrated in README "needle-nano"): d 256 x 6 layers,
# head dim 64 as needle2 (4 query heads, 2 kv heads), two engram sites like
# needle2's (early and mid stack) with half its slots, needle2's 4 lanes.
SHAPE=(--preset needle2 --d-model 256 --layers 6 --heads 4 --kv-heads 2
       --engram-layers 1,4 --engram-slots 4096 --max-seq-len 1024)
CORPUS_SEED=1
HELDOUT_SEED=2
INIT_SEED=0
TRAIN_SEED=0

[[ -x "$NEEDLE" ]] || { echo "pretrain_nano.sh: $NEEDLE not found; build first (make)" >&2; exit 1; }
mkdir -p "$OUT" "$WORK"
step() { echo "== $(date -u +%H:%M:%S) $*"; }

step "corpus: $EXAMPLES pretrain examples (seed $CORPUS_SEED), $HELDOUT held-out (seed $HELDOUT_SEED)"
"$PYTHON" "$ROOT/tools/gen_toolcall_corpus.py" --split pretrain --num "$EXAMPLES" \
    --seed "$CORPUS_SEED" --output "$WORK/corpus.jsonl"
"$PYTHON" "$ROOT/tools/gen_toolcall_corpus.py" --split heldout --num "$HELDOUT" \
    --seed "$HELDOUT_SEED" --output "$WORK/heldout.jsonl"

step "init: ${SHAPE[*]} --seed $INIT_SEED"
"$NEEDLE" init "$WORK/nano_init.pkl" "${SHAPE[@]}" --seed "$INIT_SEED"

step "zero-shot held-out loss of the random init"
"$NEEDLE" eval --checkpoint "$WORK/nano_init.pkl" "$WORK/heldout.jsonl" \
    --tokenizer "$TOKENIZER" --threads "$THREADS" | tail -n 1

step "finetune --full: epochs $EPOCHS, batch $BATCH, lr $LR, threads $THREADS"
# --group-by-tools: examples of one tool list share their prefix in a batch
# (shared batching runs it once), the main speed-up on this corpus.
"$NEEDLE" finetune "$WORK/corpus.jsonl" --checkpoint "$WORK/nano_init.pkl" \
    --tokenizer "$TOKENIZER" --full --epochs "$EPOCHS" --batch-size "$BATCH" --lr "$LR" \
    --val-split 0.02 --seed "$TRAIN_SEED" --threads "$THREADS" --group-by-tools \
    --save-every 200 --out "$OUT/needle-nano.pkl" 2>&1 | tee "$WORK/train.log"

step "zero-shot held-out loss of needle-nano (domains never seen in training)"
"$NEEDLE" eval --checkpoint "$OUT/needle-nano.pkl" "$WORK/heldout.jsonl" \
    --tokenizer "$TOKENIZER" --threads "$THREADS" | tail -n 1

# No float16 conversion: our tools write float32 checkpoints only (the .cact
# is quantised either way; `needle finetune` and `needle build` read both).
step "build: $OUT/needle-nano.cact"
"$NEEDLE" build "$OUT/needle-nano.pkl" --tokenizer "$TOKENIZER" --out "$OUT/needle-nano.cact"
step "done: $OUT/needle-nano.pkl, $OUT/needle-nano.cact"
