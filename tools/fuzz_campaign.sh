#!/usr/bin/env bash
# Fuzzing campaign: each libFuzzer target (built by `make fuzz` into
# build-fuzz/, ASan + UBSan) runs in turn for RUNS executions, starting from
# its committed corpus tests/fuzz/corpus_T in a scratch copy.
#
#   tools/fuzz_campaign.sh [RUNS] [TARGET...]     (default 10000000, all)
#
# Environment: MAX_TIME=S stops a target after S seconds even short of RUNS
# (0 = no limit); MERGE=1 afterwards copies into tests/fuzz/corpus_T only
# the inputs that add coverage (libFuzzer -merge=1); NICE (default 10).
# One target at a time, single-threaded (OMP_NUM_THREADS=1). Crashing
# inputs land in build-fuzz/campaign/crash_T/; the script exits 1 if any.
set -u
cd "$(dirname "$0")/.."
RUNS=${1:-10000000}
[ $# -gt 0 ] && shift
TARGETS=${*:-pickle checkpoint lora cact spm_model pyjson jsonl grammar copy_prior choice_prior}
MAX_TIME=${MAX_TIME:-0}
C=build-fuzz/campaign
bad=0
for t in $TARGETS; do
  bin=build-fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "$bin missing: run make fuzz" >&2; exit 2; }
  mkdir -p "$C/work_$t" "$C/crash_$t"
  cp -n tests/fuzz/corpus_$t/* "$C/work_$t/" 2>/dev/null
  OMP_NUM_THREADS=1 nice -n "${NICE:-10}" "$bin" -runs="$RUNS" -max_total_time="$MAX_TIME" \
    -timeout=10 -print_final_stats=1 -artifact_prefix="$C/crash_$t/" "$C/work_$t" \
    >"$C/log_$t.txt" 2>&1
  rc=$?
  ex=$(sed -n 's/^stat::number_of_executed_units: *//p' "$C/log_$t.txt")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$C/log_$t.txt")
  crashes=$(ls "$C/crash_$t" | wc -l)
  echo "$t: rc=$rc executions=${ex:-?} exec/s=${rate:-?} crash files=$crashes (log $C/log_$t.txt)"
  [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ] && bad=1
  if [ "${MERGE:-0}" = 1 ]; then
    OMP_NUM_THREADS=1 "$bin" -merge=1 "tests/fuzz/corpus_$t" "$C/work_$t" >"$C/merge_$t.log" 2>&1
    echo "  corpus_$t: $(ls tests/fuzz/corpus_$t | wc -l) files, $(du -sb tests/fuzz/corpus_$t | cut -f1) bytes"
  fi
done
exit $bad
