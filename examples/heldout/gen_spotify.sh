#!/usr/bin/env bash
# A held-out real API tool set for the fine-tune target of issue 34:
# Spotify's Web API (the APIs.guru entry spotify.com/sonallux.json, whose
# specification declares no licence: APIs.guru's CC0 contribution), a
# provider that tools/gen_reading_corpus.py holds out (its sha256 rule), so
# no base trained on --split train has read these tools. Real names and
# descriptions (the reading view: no renaming, no re-describing, no
# distractors of other APIs, no synthetic domains); queries in the reading
# corpus's mixed styles (imperative, questions, indirect, lower case, typos,
# preambles; multi-call 25%, no-call 12%, system facts).
# 200 training examples (seed 11) and 100 test examples (seed 12), every
# query distinct and no test query in train. Deterministic.
#   examples/heldout/gen_spotify.sh SETS.jsonl [OUTDIR]
# SETS.jsonl: tools/openapi_tools.py sample's output over the whole package
# (docs/nano-base.md: `sample /tmp/oa/package /tmp/oa/all --sets 3000
# --max-tools 30 --max-set-bytes 80000`); OUTDIR default examples/heldout.
set -euo pipefail
cd "$(dirname "$0")/../.."
SETS=${1:?usage: gen_spotify.sh SETS.jsonl [OUTDIR]}
OUTDIR=${2:-examples/heldout}
PY=${PYTHON:-python3}
API=spotify.com/sonallux.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" - "$SETS" "$API" "$tmp/sets.jsonl" <<'PYEOF'
import json, sys
src, api, dst = sys.argv[1:]
lines = [l for l in open(src, encoding="utf-8") if json.loads(l).get("api") == api]
if len(lines) != 1:
    sys.exit("%s: %d lines of %s (want 1)" % (src, len(lines), api))
open(dst, "w", encoding="utf-8").writelines(lines)
PYEOF
gen() {
  "$PY" tools/gen_reading_corpus.py --sets "$tmp/sets.jsonl" --split heldout --synthetic-rate 0 \
    --rename-rate 0 --redescribe-rate 0 --distractor-rate 0 "$@" >/dev/null
}
gen --num 260 --seed 11 --output "$tmp/train_pool.jsonl"
gen --num 160 --seed 12 --output "$tmp/test_pool.jsonl"
# the first 200 distinct queries of the train pool, then the first 100 of the
# test pool that are new
"$PY" - "$tmp" <<'PYEOF'
import json, os, sys
tmp = sys.argv[1]
seen = set()
def take(pool, n, out):
    rows = []
    for line in open(os.path.join(tmp, pool), encoding="utf-8"):
        q = json.loads(line)["query"]
        if q not in seen and len(rows) < n:
            seen.add(q)
            rows.append(line)
    if len(rows) < n:
        sys.exit("%s: only %d distinct new queries (want %d)" % (pool, len(rows), n))
    open(os.path.join(tmp, out), "w", encoding="utf-8").writelines(rows)
take("train_pool.jsonl", 200, "train.jsonl")
take("test_pool.jsonl", 100, "test.jsonl")
PYEOF
mkdir -p "$OUTDIR"
mv "$tmp/train.jsonl" "$OUTDIR/spotify_train.jsonl"
mv "$tmp/test.jsonl" "$OUTDIR/spotify_test.jsonl"
echo "$OUTDIR/spotify_train.jsonl: $(wc -l < "$OUTDIR/spotify_train.jsonl") examples"
echo "$OUTDIR/spotify_test.jsonl: $(wc -l < "$OUTDIR/spotify_test.jsonl") examples"
