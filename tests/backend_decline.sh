#!/usr/bin/env bash
# A backend that declines ops: nd_backend_get runs them on the CPU, the
# conformance test (test_backend_ops) names them as DECLINED instead of
# comparing the CPU with itself, and fails unless told to accept them; the
# rest of the run (chains, the whole model's gradients) goes through the
# mix of the backend's ops and the CPU's. NEEDLE_BACKEND_DECLINE=op,...
# declines ops on any backend, so this runs without a device.
# Usage: backend_decline.sh [target]   (cpu, vulkan:0, cuda; default cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${NEEDLE_BUILD:?set NEEDLE_BUILD to the build directory}
TARGET=${1:-cpu}
T=$B/test_backend_ops
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail() {
  echo "FAIL ($TARGET): $*" >&2
  cat "$out" >&2
  exit 1
}
run() { # run ENV... ; sets rc
  set +e
  env NEEDLE_PLUGIN_DIR="$B" "$@" "$T" "$TARGET" >"$out" 2>&1
  rc=$?
  set -e
}
DECLINE=matmul,attention_backward,scatter_add_rows

# 1. declined ops are named and fail the run by default
run NEEDLE_BACKEND_DECLINE=$DECLINE
if [ $rc = 77 ]; then
  echo "skipped: $TARGET not available"
  exit 77
fi
[ $rc = 1 ] || fail "declined ops must fail the conformance run (exit $rc, want 1)"
for op in ${DECLINE//,/ }; do
  grep -Eq "^$op +[0-9]+ +[^ ]+ +[^ ]+ +[^ ]+ +DECLINED" "$out" || fail "no DECLINED row for $op"
done
grep -q "^3 ops declined: FAIL" "$out" || fail "no summary of the declined ops"

# 2. accepted: exactly those rows read DECLINED, every other row passes,
# including the chains and the model, which run the declined ops on the CPU
run NEEDLE_BACKEND_DECLINE=$DECLINE NEEDLE_TEST_ALLOW_DECLINED=1
[ $rc = 0 ] || fail "with NEEDLE_TEST_ALLOW_DECLINED=1 the run must pass (exit $rc)"
[ "$(grep -Ec ' DECLINED ' "$out")" = 3 ] || fail "want exactly 3 DECLINED rows"
grep -Eq "^model: packed, shared prefixes +[0-9]+ .* ok" "$out" || fail "the model row did not run"
grep -Eq "^chain: " "$out" || fail "no chain rows"
grep -Eq "^attention +[0-9]+ .* ok" "$out" || fail "attention (not declined) was not compared"

# 3. a name that is not an op is an error, not a skip
run NEEDLE_BACKEND_DECLINE=matmul,no_such_op
[ $rc = 2 ] || fail "an unknown op in NEEDLE_BACKEND_DECLINE must be an error (exit $rc, want 2)"
grep -q "no_such_op" "$out" || fail "the error does not name the unknown op"

# 4. the progress line names the ops that run on the CPU
if [ "$TARGET" = cpu ]; then
  set +e
  NEEDLE_BACKEND_DECLINE=attention "$B/needle" bench forward --preset tiny --batch 2 --seq 16 \
    --iters 1 --device cpu >"$out" 2>&1
  rc=$?
  set -e
  [ $rc = 0 ] || fail "needle bench with a declined op failed (exit $rc)"
  grep -Eq "backend .*; on the CPU: attention$" "$out" || fail "the backend line does not name the declined op"
fi
echo "backend_decline $TARGET: ok"
