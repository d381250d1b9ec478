#!/usr/bin/env bash
# The demo's held-out tool set (examples/heldout/, used by examples/demo.sh):
# pets, a domain tools/pretrain_nano.sh never trains on. 200 training
# examples (seed 11) and 100 test examples (seed 12) whose queries are all
# different from every training query and from each other. Deterministic:
# tests/test_demo_data.sh regenerates them and compares the bytes.
#   tools/gen_demo_heldout.sh [OUTDIR]   (default examples/heldout)
set -euo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-examples/heldout}
PY=${PYTHON:-python3}
DOMAIN=pets
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" tools/gen_toolcall_corpus.py --split heldout --domains $DOMAIN --num 200 --seed 11 \
  --output "$tmp/train.jsonl" >/dev/null
"$PY" tools/gen_toolcall_corpus.py --split heldout --domains $DOMAIN --num 160 --seed 12 \
  --output "$tmp/pool.jsonl" >/dev/null
# test: the first 100 pool examples whose query is new
"$PY" - "$tmp/train.jsonl" "$tmp/pool.jsonl" "$tmp/test.jsonl" <<'PYEOF'
import json, sys
seen = {json.loads(l)["query"] for l in open(sys.argv[1], encoding="utf-8")}
out = []
for line in open(sys.argv[2], encoding="utf-8"):
    q = json.loads(line)["query"]
    if q not in seen and len(out) < 100:
        seen.add(q)
        out.append(line)
if len(out) < 100:
    sys.exit("only %d new test queries" % len(out))
open(sys.argv[3], "w", encoding="utf-8").writelines(out)
PYEOF
mkdir -p "$OUTDIR"
mv "$tmp/train.jsonl" "$OUTDIR/${DOMAIN}_train.jsonl"
mv "$tmp/test.jsonl" "$OUTDIR/${DOMAIN}_test.jsonl"
echo "$OUTDIR/${DOMAIN}_train.jsonl: $(wc -l < "$OUTDIR/${DOMAIN}_train.jsonl") examples"
echo "$OUTDIR/${DOMAIN}_test.jsonl: $(wc -l < "$OUTDIR/${DOMAIN}_test.jsonl") examples"
