#!/usr/bin/env bash
# examples/heldout/ (the demo's data, committed so the demo needs no Python)
# must be what tools/gen_demo_heldout.sh makes, byte for byte.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bash tools/gen_demo_heldout.sh "$tmp" >/dev/null
for f in pets_train.jsonl pets_test.jsonl; do
  if ! cmp "examples/heldout/$f" "$tmp/$f"; then
    echo "examples/heldout/$f is stale: regenerate with tools/gen_demo_heldout.sh" >&2
    exit 1
  fi
done
echo "examples/heldout/ matches tools/gen_demo_heldout.sh"
