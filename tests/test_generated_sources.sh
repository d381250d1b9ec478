#!/usr/bin/env bash
# Generated sources must match their generators (edit the generator, then
# rerun it as shown): tests/backend_ops_break.c from backend.h's op table.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
"$PY" tools/gen_backend_ops_break.py | clang-format --assume-filename=tests/backend_ops_break.c > "$tmp"
if ! diff -u tests/backend_ops_break.c "$tmp"; then
  echo "tests/backend_ops_break.c is stale: regenerate with" >&2
  echo "  python3 tools/gen_backend_ops_break.py | clang-format --assume-filename=x.c > tests/backend_ops_break.c" >&2
  exit 1
fi
echo "generated sources up to date"
