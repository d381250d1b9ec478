#!/usr/bin/env bash
# A larger built-in base on one GPU in one run of at most 10 minutes
# (issue 34): the needle-nano recipe's data and trainer (tools/pretrain_nano.sh,
# docs/nano-base.md) at a larger shape on the CUDA backend, sized to the time:
#   corpus   shards made in parallel on the CPU: half tools/gen_toolcall_corpus.py
#            (the synthetic domains, half renamed, 30% multi-call: stages 2-4),
#            half tools/gen_reading_corpus.py (real API tools, made-up values:
#            stages 5-6); the held-out sets the same way, --split heldout
#   probe    `needle finetune --full --stop-after PROBE_STEPS` on the device:
#            seconds a step, so the real run's one epoch (and its cosine
#            schedule) ends inside TRAIN_S
#   train    `needle init` (D_MODEL x LAYERS) and one epoch of
#            `needle finetune --full --group-by-tools` on that many examples;
#            a run still going at TRAIN_S + 60 s is stopped (SIGINT: it saves)
#   score    float16 checkpoint, 4-bit archive, then tools/eval_base.py's
#            zero-shot parts (held-out synthetic domains, held-out real API
#            sets, first-tool choice alone and among other APIs' tools) on the
#            archive, on the CPU
# Outputs in OUT: base.pkl, base.cact, loss.jsonl, loss.svg, scores/, logs.
# Environment (defaults in brackets): BUILD [build] (a build with
# -DNEEDLE_CUDA=ON: tests/device/cuda.sh builds one), DEVICE [cuda],
# TRAIN_S [330], D_MODEL [512], LAYERS [12], HEADS [8], KV_HEADS [4],
# BATCH [64], LR [1e-3], SHARDS [nproc], PER_SHARD [6000] (examples a
# shard; the run uses what fits TRAIN_S), SETS [the committed OpenAPI
# sample; the whole package's: tools/openapi_tools.py sample], PROBE_STEPS
# [20], EVAL_NUM [100], OUT [a new /tmp/needle-gpu-base.XXXXXX].
# A CPU trial (a minute or two): DEVICE=cpu D_MODEL=64 LAYERS=5 HEADS=1
# KV_HEADS=1 BATCH=8 TRAIN_S=30 SHARDS=2 PER_SHARD=300 EVAL_NUM=20.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
NEEDLE=$BUILD/needle
DEVICE=${DEVICE:-cuda}
TRAIN_S=${TRAIN_S:-330}
D_MODEL=${D_MODEL:-512}
LAYERS=${LAYERS:-12}
HEADS=${HEADS:-8}
KV_HEADS=${KV_HEADS:-4}
BATCH=${BATCH:-64}
LR=${LR:-1e-3}
SHARDS=${SHARDS:-$(nproc)}
PER_SHARD=${PER_SHARD:-6000}
SETS=${SETS:-tests/data/openapi_sample/sets.jsonl}
PROBE_STEPS=${PROBE_STEPS:-20}
EVAL_NUM=${EVAL_NUM:-100}
OUT=${OUT:-$(mktemp -d /tmp/needle-gpu-base.XXXXXX)}
TOK=models/tokenizer.model
mkdir -p "$OUT"
[[ -x "$NEEDLE" ]] || { echo "pretrain_gpu.sh: $NEEDLE not found (build first)" >&2; exit 1; }
step() { echo "== $(date -u +%H:%M:%S) $*"; }
t_start=$SECONDS

step "corpus: $SHARDS shards of $PER_SHARD examples (out: $OUT)"
gen_shard() { # gen_shard I: shard I, synthetic for even I, reading for odd I
    local i=$1
    if ((i % 2 == 0)); then
        python3 tools/gen_toolcall_corpus.py --split pretrain --num "$PER_SHARD" --seed $((100 + i)) \
            --alias-rate 0.5 --multi-rate 0.3 --output "$OUT/shard$i.jsonl"
    else
        python3 tools/gen_reading_corpus.py --split train --sets "$SETS" --num "$PER_SHARD" \
            --seed $((100 + i)) --multi-rate 0.3 --novel-rate 0.5 --output "$OUT/shard$i.jsonl"
    fi
}
export -f gen_shard
export OUT PER_SHARD SETS
seq 0 $((SHARDS - 1)) | xargs -P "$SHARDS" -I{} bash -c 'gen_shard {}' 2>"$OUT/corpus.log"
# interleave the shards line by line: any prefix of the corpus mixes both kinds
paste -d '\n' "$OUT"/shard*.jsonl | grep -v '^$' >"$OUT/corpus.jsonl"
rm -f "$OUT"/shard*.jsonl
echo "corpus: $(wc -l <"$OUT/corpus.jsonl") examples in $((SECONDS - t_start)) s"

step "init: d $D_MODEL x $LAYERS layers, heads $HEADS / $KV_HEADS"
"$NEEDLE" init "$OUT/init.pkl" --preset needle2 --d-model "$D_MODEL" --layers "$LAYERS" \
    --heads "$HEADS" --kv-heads "$KV_HEADS" --engram-layers 1,4 --engram-slots 4096 \
    --max-seq-len 1024 --seed 0 >"$OUT/init.log"

# the recipe's full fine-tune, one epoch: "${TRAIN[@]}" CORPUS --out RUN ...
TRAIN=("$NEEDLE" finetune --checkpoint "$OUT/init.pkl" --tokenizer "$TOK" --full --epochs 1
       --batch-size "$BATCH" --lr "$LR" --val-split 0.01 --seed 0 --group-by-tools
       --device "$DEVICE")

step "probe: $PROBE_STEPS steps on $DEVICE"
t0=$SECONDS
set +e
"${TRAIN[@]}" "$OUT/corpus.jsonl" --out "$OUT/probe.pkl" --stop-after "$PROBE_STEPS" \
    >"$OUT/probe.log" 2>&1
set -e
probe_s=$((SECONDS - t0))
grep -m1 -i "backend\|device" "$OUT/probe.log" || true
# steps that fit TRAIN_S at the probe's pace (its start-up counted as steps:
# conservative), as examples for one epoch; at least two batches
steps=$((TRAIN_S * PROBE_STEPS / (probe_s > 0 ? probe_s : 1)))
examples=$((steps * BATCH))
total=$(wc -l <"$OUT/corpus.jsonl")
((examples > total)) && examples=$total
((examples < 2 * BATCH)) && examples=$((2 * BATCH))
echo "probe: $PROBE_STEPS steps in $probe_s s -> $examples examples (~$steps steps) for ${TRAIN_S} s"
head -n "$examples" "$OUT/corpus.jsonl" >"$OUT/train.jsonl"

step "train: one epoch of $examples examples, batch $BATCH, lr $LR, $DEVICE"
t0=$SECONDS
set +e
timeout -s INT -k 30 $((TRAIN_S + 60)) "${TRAIN[@]}" "$OUT/train.jsonl" --out "$OUT/run.pkl" \
    --loss-log "$OUT/loss.jsonl" --save-every 500 >"$OUT/train.log" 2>&1
rc=$?
set -e
tail -n 3 "$OUT/train.log"
echo "train: exit $rc in $((SECONDS - t0)) s (1: stopped at the time limit, the run saved)"
[[ -f "$OUT/run.pkl" ]] || { echo "pretrain_gpu.sh: no run written" >&2; exit 1; }
"$NEEDLE" plot-loss "$OUT/loss.jsonl" --out "$OUT/loss.svg" \
    --title "needle base d $D_MODEL x $LAYERS on $DEVICE" >/dev/null || true

step "score: float16 checkpoint, 4-bit archive, zero-shot parts"
"$NEEDLE" convert "$OUT/run.pkl" "$OUT/base.pkl" --dtype float16 \
    --recommend lr=3e-3,lora_rank=64,lora_alpha=128,batch_size=8 >/dev/null
"$NEEDLE" build "$OUT/base.pkl" --tokenizer "$TOK" --out "$OUT/base.cact" >/dev/null
python3 tools/eval_base.py --needle "$NEEDLE" --weights "$OUT/base.cact" \
    --parts synthetic,real,first-tool,first-tool-mixed --num "$EVAL_NUM" --sets "$SETS" --threads "$(nproc)" \
    --out "$OUT/scores" | tee "$OUT/scores.txt"
step "done in $((SECONDS - t_start)) s: $OUT/base.pkl, $OUT/base.cact, $OUT/loss.svg, $OUT/scores.txt"
