#!/usr/bin/env bash
# The whole pipeline, small: init -> LoRA finetune (one short epoch) ->
# eval with the adapter -> build (merge + CQ + tokenizer) -> inspect -> run
# (engine, schema-constrained call). Checks every step exits 0 and that
# the engine's answer is a successful envelope whose calls name declared tools. Cheap enough to run
# under qemu-aarch64 (make arm64-check), where it is the fine-tune and the
# build + engine round trip of the emulated subset.
set -euo pipefail
NEEDLE=${NEEDLE:-build/needle}
PY=${PYTHON:-python3}
TOK=models/tokenizer.model
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
head -n 8 examples/data.jsonl > "$T/data.jsonl"
"$NEEDLE" init "$T/base.pkl" --preset tiny --max-seq-len 256 --seed 3 >/dev/null
"$NEEDLE" finetune "$T/data.jsonl" --checkpoint "$T/base.pkl" --tokenizer "$TOK" \
  --batch-size 4 --max-len 256 --epochs 1 --lr 1e-2 --out "$T/adapter.pkl" > "$T/ft.log"
test -s "$T/adapter.pkl"
"$NEEDLE" eval "$T/data.jsonl" --checkpoint "$T/base.pkl" --tokenizer "$TOK" --max-len 256 \
  --lora "$T/adapter.pkl" --json > "$T/eval.json"
"$PY" - "$T/eval.json" <<'PYEOF'
import json, math, sys
r = json.load(open(sys.argv[1]))
assert math.isfinite(r["mean_loss"]) and 0 < r["mean_loss"] < 20, r["mean_loss"]
PYEOF
"$NEEDLE" build "$T/base.pkl" --lora "$T/adapter.pkl" --tokenizer "$TOK" --out "$T/m.cact" >/dev/null
"$NEEDLE" inspect "$T/m.cact" >/dev/null
"$NEEDLE" run --weights "$T/m.cact" --tools examples/tools.json --max-new-tokens 32 \
  "What's the weather in Paris?" > "$T/run.out"
"$PY" - "$T/run.out" examples/tools.json <<'PYEOF'
import json, sys
out = open(sys.argv[1]).read()
tools = {t["name"] for t in json.load(open(sys.argv[2]))}
start = out.index("{")
env = json.loads(out[start:out.rindex("}") + 1])
assert env["success"] is True and env["error"] is None, out
# a tiny model trained for seconds may answer in text; any call it makes
# must name a declared tool
for c in env["function_calls"]:
    assert c["name"] in tools, (c, tools)
PYEOF
echo "pipeline smoke: ok"
