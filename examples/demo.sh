#!/usr/bin/env bash
# The main job (`make demo`), issue 15's story in a few minutes on a CPU:
#   1. the nano base (models/needle-nano.pkl) on a tool set it never saw in
#      pre-training (pets, examples/heldout/), zero-shot, as a 4-bit archive;
#   2. a LoRA fine-tune on 200 pets examples (loss curve as SVG);
#   3. 4-bit and 2-bit archives of it, scored with the float model on 100
#      held-out pets queries (no query of the test file is in the train file);
#   4. a second fine-tune with --qat --bits 2 (trained through 2-bit CQ) and
#      its archives;
#   5. one summary table ($OUT/summary.md), and one `needle run`.
# Knobs (tests/test_demo.sh runs a short version): OUT, DEMO_EPOCHS,
# DEMO_LIMIT (use only the first N train and N test examples),
# FT_SETTINGS (the fine-tune's settings, both runs; by default only the user's
# --epochs 10: lr, rank, alpha and batch come from the checkpoint's
# recommended settings, which finetune prints).
set -euo pipefail
NEEDLE=${1:-build/needle}
OUT=${OUT:-out/demo}
FT_SETTINGS=${FT_SETTINGS:-"--epochs ${DEMO_EPOCHS:-10}"}
BASE=models/needle-nano.pkl
TOK=models/tokenizer.model
TRAIN=examples/heldout/pets_train.jsonl
TEST=examples/heldout/pets_test.jsonl
mkdir -p "$OUT"
if [ -n "${DEMO_LIMIT:-}" ]; then
  head -n "$DEMO_LIMIT" "$TRAIN" > "$OUT/train.jsonl"
  head -n "$DEMO_LIMIT" "$TEST" > "$OUT/test.jsonl"
  TRAIN=$OUT/train.jsonl
  TEST=$OUT/test.jsonl
fi

T0=$SECONDS
STEP_T=$SECONDS
STEP_NAME=
step() { # close the previous step (its time), open the next
  if [ -n "$STEP_NAME" ]; then echo "   ($STEP_NAME: $((SECONDS - STEP_T)) s)"; fi
  STEP_NAME=$1
  STEP_T=$SECONDS
  echo
  echo "== $1"
}
show() { # print a command (quoted as a shell would need it), then run it
  printf '$'
  printf ' %q' "$@"
  echo
  "$@"
}

# eval-calls --json -> "tool% args% refusals valid%" (counts over all examples)
ROWS=()
score() { # score LABEL MODEL-ARGS...
  local label=$1
  shift
  local json
  printf '$ %q eval-calls' "$NEEDLE"
  printf ' %q' "$@" --json "$TEST"
  echo
  json=$("$NEEDLE" eval-calls "$@" --json "$TEST")
  local n tool args valid refused no_call
  n=$(metric "$json" all examples)
  tool=$(metric "$json" all tool_name)
  args=$(metric "$json" all exact_args)
  valid=$(metric "$json" all valid_json)
  refused=$(metric "$json" no_call refusal)
  no_call=$(metric "$json" no_call examples)
  local row
  row=$(awk -v l="$label" -v n="$n" -v t="$tool" -v a="$args" -v v="$valid" -v r="$refused" \
    -v nc="$no_call" 'BEGIN { printf "| %s | %.1f%% | %.1f%% | %d/%d | %.1f%% |", l,
      100*t/n, 100*a/n, r, nc, 100*v/n }')
  echo "   $row"
  ROWS+=("$row")
}
# metric JSON GROUP KEY: the count of KEY in GROUP ("examples": the group's size)
metric() {
  local rest
  rest=$(printf '%s' "$1" | sed -E "s/.*\"$2\": \{//")
  if [ "$3" = examples ]; then
    printf '%s' "$rest" | sed -E 's/^"examples": ([0-9]+).*/\1/'
  else
    printf '%s' "$rest" | grep -oE "\"$3\": \{\"count\": [0-9]+" | head -n 1 | grep -oE '[0-9]+$'
  fi
}

echo "needle demo: the nano base on a tool set it never saw (pets: $(wc -l < "$TRAIN") train,"
echo "$(wc -l < "$TEST") test examples), fine-tuned with LoRA ($FT_SETTINGS), exported"
echo "at 4 and 2 bits; outputs in $OUT/"

step "1. the nano base as a 4-bit archive, zero-shot on the pets test set"
show "$NEEDLE" build "$BASE" --tokenizer "$TOK" --bits 4 --out "$OUT/base-w4.cact"
score "base zero-shot (4-bit)" --weights "$OUT/base-w4.cact"

step "2. LoRA fine-tune on the pets train set"
# shellcheck disable=SC2086 # FT_SETTINGS is a list of options
show "$NEEDLE" finetune "$TRAIN" --checkpoint "$BASE" --tokenizer "$TOK" $FT_SETTINGS \
  --loss-log "$OUT/lora-loss.jsonl" --out "$OUT/lora.pkl"
show "$NEEDLE" plot-loss "$OUT/lora-loss.jsonl" --out "$OUT/lora-loss.svg" \
  --title "LoRA fine-tune on pets"

step "3. build 4-bit and 2-bit archives, score float / 4-bit / 2-bit"
show "$NEEDLE" build "$BASE" --lora "$OUT/lora.pkl" --tokenizer "$TOK" --bits 4 \
  --out "$OUT/tuned-w4.cact"
show "$NEEDLE" build "$BASE" --lora "$OUT/lora.pkl" --tokenizer "$TOK" --bits 2 \
  --out "$OUT/tuned-w2.cact"
score "fine-tuned, float" --checkpoint "$BASE" --lora "$OUT/lora.pkl" --tokenizer "$TOK"
score "fine-tuned, 4-bit" --weights "$OUT/tuned-w4.cact"
score "fine-tuned, 2-bit" --weights "$OUT/tuned-w2.cact"

step "4. fine-tune again through 2-bit quantisation (--qat --bits 2)"
# shellcheck disable=SC2086
show "$NEEDLE" finetune "$TRAIN" --checkpoint "$BASE" --tokenizer "$TOK" $FT_SETTINGS \
  --qat --bits 2 --loss-log "$OUT/qat-loss.jsonl" --out "$OUT/lora-qat2.pkl"
show "$NEEDLE" plot-loss "$OUT/qat-loss.jsonl" --out "$OUT/qat-loss.svg" \
  --title "LoRA fine-tune on pets, --qat --bits 2"
show "$NEEDLE" build "$BASE" --lora "$OUT/lora-qat2.pkl" --tokenizer "$TOK" --bits 2 \
  --out "$OUT/tuned-qat-w2.cact"
show "$NEEDLE" build "$BASE" --lora "$OUT/lora-qat2.pkl" --tokenizer "$TOK" --bits 4 \
  --out "$OUT/tuned-qat-w4.cact" 2>/dev/null # (the note that it trained at 2 bits)
score "fine-tuned --qat, 2-bit" --weights "$OUT/tuned-qat-w2.cact"
score "fine-tuned --qat, 4-bit" --weights "$OUT/tuned-qat-w4.cact"

step "5. summary"
{
  echo "Pets (a tool set held out from the nano base's pre-training), $(wc -l < "$TEST") test"
  echo "examples; fine-tunes on $(wc -l < "$TRAIN") train examples with $FT_SETTINGS."
  echo "Rates over all test examples; refusals: no-call examples answered with no call."
  echo
  echo "| model | tool name | exact args | refusals | valid JSON |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
} > "$OUT/summary.md.tmp"
mv "$OUT/summary.md.tmp" "$OUT/summary.md"
cat "$OUT/summary.md"
echo
echo "loss curves: $OUT/lora-loss.svg, $OUT/qat-loss.svg"

step "6. needle run: the tuned 4-bit archive on a test query"
# the first test example's query and tools (the JSONL key order is query, tools, answers)
line=$(head -n 1 "$TEST")
query=$(printf '%s' "$line" | sed -E 's/^\{"query": "(([^"\\]|\\.)*)".*/\1/')
printf '%s' "$line" | sed -E 's/.*"tools": (\[.*\]), "answers".*/\1/' > "$OUT/tools.json"
show "$NEEDLE" run --weights "$OUT/tuned-w4.cact" --tools "$OUT/tools.json" --max-new-tokens 128 \
  "$query"
echo "expected: $(printf '%s' "$line" | sed -E 's/.*"answers": (\[.*\]), "reasoning".*/\1/')"
echo "   ($STEP_NAME: $((SECONDS - STEP_T)) s)"
echo
echo "demo done in $((SECONDS - T0)) s"
