#!/usr/bin/env bash
# `make demo` end to end, shortened (1 epoch of batch 4, 8 train and 8 test
# examples) so the script cannot silently rot: every step runs, the summary
# has all its rows with numbers, both loss curves are SVG pictures.
set -euo pipefail
cd "$(dirname "$0")/.."
NEEDLE=${NEEDLE:-build/needle}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
OUT=$tmp/demo DEMO_LIMIT=8 FT_SETTINGS="--epochs 1 --lr 1e-3 --batch-size 4" bash examples/demo.sh "$NEEDLE" > "$tmp/log" 2>&1 ||
  { tail -n 40 "$tmp/log"; fail "examples/demo.sh exited non-zero"; }
S=$tmp/demo/summary.md
[ -s "$S" ] || fail "no summary.md"
num='[0-9]+\.[0-9]%'
for row in "base zero-shot (4-bit)" "fine-tuned, float" "fine-tuned, 4-bit" "fine-tuned, 2-bit" \
  "fine-tuned --qat, 2-bit" "fine-tuned --qat, 4-bit"; do
  pat=$(printf '%s' "$row" | sed 's/[()]/\\&/g')
  grep -qE "^\| $pat \| $num \| $num \| [0-9]+/[0-9]+ \| $num \|$" "$S" ||
    { cat "$S"; fail "summary.md lacks the row '$row'"; }
done
grep -q "^| model | tool name | exact args | refusals | valid JSON |$" "$S" || fail "table header"
grep -q ", 8 test$" "$S" || fail "summary does not say the test size"
for svg in lora-loss.svg qat-loss.svg; do
  head -c 400 "$tmp/demo/$svg" | grep -q "<svg" || fail "$svg is not an SVG"
done
grep -q '"function_calls"' "$tmp/log" || fail "the final needle run printed no envelope"
grep -q "demo done in" "$tmp/log" || fail "no closing line"
cat "$S"
echo "demo (short) ok"
