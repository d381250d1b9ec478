#!/usr/bin/env bash
# The main job, end to end on the embedded tiny model and the shipped data:
#   1. init     a fresh random tiny base checkpoint (upstream's format),
#   2. pretrain it briefly (finetune --full) on half of examples/data.jsonl:
#               a random base cannot be LoRA-tuned usefully (its frozen output
#               embeddings cap every logit), so the demo makes a small base first,
#   3. finetune a LoRA adapter on the other half (the user's step 1),
#   4. eval     the base with and without the adapter,
#   5. build    merge the adapter and quantise to a .cact archive (step 2),
#   6. inspect  the archive,
#   7. run      the tuned archive with schema-constrained tool calls (step 3).
# The tiny model is initialised with max_seq_len 512 so the engine accepts the
# three-tool prompt (training itself is capped only by --max-len, as upstream).
set -euo pipefail
NEEDLE=${1:-build/needle}
OUT=${OUT:-out/demo}
TOK=models/tokenizer.model
mkdir -p "$OUT"
head -n 96 examples/data.jsonl | awk 'NR % 2 == 1' > "$OUT/base_data.jsonl"
head -n 96 examples/data.jsonl | awk 'NR % 2 == 0' > "$OUT/tune_data.jsonl"

echo "== 1. needle init (tiny preset)"
"$NEEDLE" init "$OUT/tiny.pkl" --preset tiny --max-seq-len 512 --seed 0
echo "== 2. needle finetune --full (pre-train a small base, 4 epochs)"
"$NEEDLE" finetune "$OUT/base_data.jsonl" --full --checkpoint "$OUT/tiny.pkl" --tokenizer "$TOK" \
  --batch-size 8 --max-len 256 --epochs 4 --lr 1e-2 --out "$OUT/base.pkl"
echo "== 3. needle finetune (LoRA rank 16, 8 epochs)"
"$NEEDLE" finetune "$OUT/tune_data.jsonl" --checkpoint "$OUT/base.pkl" --tokenizer "$TOK" \
  --batch-size 8 --max-len 256 --epochs 8 --lr 1e-2 --out "$OUT/adapter.pkl"
echo "== 4. needle eval: base vs base + adapter on the tuning data"
"$NEEDLE" eval "$OUT/tune_data.jsonl" --checkpoint "$OUT/base.pkl" --tokenizer "$TOK" \
  --max-len 256 | tail -n 1
"$NEEDLE" eval "$OUT/tune_data.jsonl" --checkpoint "$OUT/base.pkl" --tokenizer "$TOK" \
  --max-len 256 --lora "$OUT/adapter.pkl" | tail -n 1
echo "== 5. needle build (merge + 4-bit CQ + tokenizer)"
"$NEEDLE" build "$OUT/base.pkl" --lora "$OUT/adapter.pkl" --tokenizer "$TOK" --out "$OUT/tuned.cact"
echo "== 6. needle inspect"
"$NEEDLE" inspect "$OUT/tuned.cact" | sed -n "1,20p"
echo "== 7. needle run (engine: grammar-constrained call from the declared schemas)"
"$NEEDLE" run --weights "$OUT/tuned.cact" --tools examples/tools.json --max-new-tokens 64 \
  "What's the weather in Paris?"
echo
echo "(a tiny model trained for seconds: the call is valid JSON for the declared"
echo " schemas by construction; whether it is the right call is up to the model)"
