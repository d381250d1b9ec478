#!/usr/bin/env bash
# needle eval-calls --checkpoint [--lora] [--tokenizer]: the float model of a
# checkpoint scored through the engine (tests/test_engine_checkpoint.c checks
# its weights and answers exactly); here the command line: a report over the
# asked examples, and clear errors for bad input.
set -euo pipefail
cd "$(dirname "$0")/.."
NEEDLE=${NEEDLE:-build/needle}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
DATA=examples/heldout/pets_test.jsonl
TOK=models/tokenizer.model

# a tiny random base and an adapter for it (another model than the nano base)
"$NEEDLE" init "$tmp/tiny.pkl" --preset tiny --max-seq-len 512 --seed 0 >/dev/null
head -n 4 examples/heldout/pets_train.jsonl > "$tmp/four.jsonl"
"$NEEDLE" finetune "$tmp/four.jsonl" --checkpoint "$tmp/tiny.pkl" --tokenizer "$TOK" \
  --epochs 1 --batch-size 4 --val-split 0 --max-len 512 --threads 2 \
  --out "$tmp/tiny_adapter.pkl" >/dev/null

# the tiny base and its adapter: a report over exactly the asked examples
json=$("$NEEDLE" eval-calls --checkpoint "$tmp/tiny.pkl" --lora "$tmp/tiny_adapter.pkl" \
  --tokenizer "$TOK" --limit 3 --json --threads 2 --max-new-tokens 32 \
  --predictions "$tmp/pred.jsonl" "$DATA")
echo "$json" | grep -q '"all": {"examples": 3,' || fail "no 3-example report: $json"
[ "$(wc -l < "$tmp/pred.jsonl")" = 3 ] || fail "predictions: $(wc -l < "$tmp/pred.jsonl") lines"
# the tokenizer beside the checkpoint is the default
cp "$TOK" "$tmp/tokenizer.model"
"$NEEDLE" eval-calls --checkpoint "$tmp/tiny.pkl" --limit 1 --json --threads 2 \
  --max-new-tokens 16 "$DATA" | grep -q '"examples": 1,' || fail "tokenizer beside the checkpoint"

expect_error() { # expect_error CODE PATTERN ARGS...: exit CODE, stderr matching PATTERN
  local code=$1 pat=$2 rc=0
  shift 2
  "$NEEDLE" eval-calls "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
  [ "$rc" = "$code" ] || fail "eval-calls $*: exit $rc, expected $code ($(cat "$tmp/err"))"
  grep -q -- "$pat" "$tmp/err" || fail "eval-calls $*: stderr lacks '$pat': $(cat "$tmp/err")"
}
expect_error 1 "$tmp/missing.pkl" --checkpoint "$tmp/missing.pkl" "$DATA"
expect_error 1 "tiny_adapter.pkl" --checkpoint models/needle-nano.pkl --lora "$tmp/tiny_adapter.pkl" \
  --tokenizer "$TOK" "$DATA"
expect_error 1 "$tmp/none.model" --checkpoint "$tmp/tiny.pkl" --tokenizer "$tmp/none.model" "$DATA"
expect_error 2 "not both" --checkpoint "$tmp/tiny.pkl" --weights x.cact "$DATA"
expect_error 2 "goes with --checkpoint" --weights x.cact --lora "$tmp/tiny_adapter.pkl" "$DATA"
expect_error 2 "is required" "$DATA"
"$NEEDLE" eval-calls --help | grep -q -- "--checkpoint PATH" || fail "--help lacks --checkpoint"
echo "eval-calls --checkpoint: report and errors ok"
