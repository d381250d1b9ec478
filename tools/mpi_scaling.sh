#!/usr/bin/env bash
# The MPI scaling table of docs/training.md: per-step time of LoRA (and
# --full) fine-tuning on this machine, 1 process x 2 threads against
# mpirun -np 2 x 1 thread. A step's time is the difference of two runs'
# wall times (EPOCHS_A and EPOCHS_B epochs of the same data) over the
# extra steps, so start-up (loading, tokenising, MPI) cancels. The two
# configurations alternate, ROUNDS times, so a noisy shared machine hits
# both alike; min and median are printed, with the load average before and
# after, and the 2-rank runs' own account of the exchange (the `distributed
# ... ms a step summing gradients` line).
# Environment: NEEDLE (build/needle), BASE (models/needle-nano.pkl), ROUNDS
# (3), LINES data lines (32), BATCH (8), MODE ("lora full"), BATCHING
# (finetune's --batching; default its own: shared prefixes computed once,
# which leaves the nano base's steps too short to time on a noisy machine:
# padded gives steps of steady work).
set -u
cd "$(dirname "$0")/.." || exit 1
NEEDLE=${NEEDLE:-build/needle}
BASE=${BASE:-models/needle-nano.pkl}
ROUNDS=${ROUNDS:-3}
LINES=${LINES:-32}
BATCH=${BATCH:-8}
EPOCHS_A=1
EPOCHS_B=2
OUT=$(mktemp -d /tmp/needle-mpi-scaling.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
head -n "$LINES" examples/data.jsonl >"$OUT/data.jsonl"
STEPS=$(((LINES + BATCH - 1) / BATCH))
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl "self,tcp"
  --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -np 2)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)  ($(nproc) cores)"

# secs CONFIG EPOCHS MODE: wall seconds of one run (log in $OUT)
secs() {
  local cfg=$1 ep=$2 mode=$3 extra=()
  [ "$mode" = full ] && extra=(--full)
  local args=(finetune "$OUT/data.jsonl" --checkpoint "$BASE" --tokenizer models/tokenizer.model
    --batch-size "$BATCH" --max-len 256 --epochs "$ep" --lr 1e-3 --seed 0 --val-split 0
    ${BATCHING:+--batching "$BATCHING"}
    "${extra[@]}" --out "$OUT/$cfg.$mode.pkl")
  local t0 t1
  t0=$(date +%s.%N)
  if [ "$cfg" = 1p2t ]; then
    "$NEEDLE" "${args[@]}" --threads 2 >"$OUT/$cfg.$mode.$ep.log" 2>&1
  else
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      "${MPI[@]}" "$NEEDLE" "${args[@]}" --threads 1 >"$OUT/$cfg.$mode.$ep.log" 2>&1
  fi || { echo "run failed: $cfg $mode $ep"; tail -n 5 "$OUT/$cfg.$mode.$ep.log"; exit 1; }
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}

stats() { sort -g | awk '{ v[NR] = $1 } END { printf "min %7.1f  median %7.1f", v[1], (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

for mode in ${MODE:-lora full}; do
  : >"$OUT/1p2t.$mode.ms"
  : >"$OUT/2r1t.$mode.ms"
  for r in $(seq "$ROUNDS"); do
    for cfg in 1p2t 2r1t; do
      a=$(secs "$cfg" "$EPOCHS_A" "$mode")
      b=$(secs "$cfg" "$EPOCHS_B" "$mode")
      ms=$(echo "($b - $a) * 1000 / ($STEPS * ($EPOCHS_B - $EPOCHS_A))" | bc -l)
      printf '%.1f\n' "$ms" >>"$OUT/$cfg.$mode.ms"
      printf 'round %d  %-5s %-4s %7.1f ms a step\n' "$r" "$mode" "$cfg" "$ms"
    done
    grep -h 'distributed .* ms a step' "$OUT/2r1t.$mode.$EPOCHS_B.log"
  done
  echo "$mode  1 process x 2 threads: $(stats <"$OUT/1p2t.$mode.ms")  ms a step"
  echo "$mode  2 ranks x 1 thread:    $(stats <"$OUT/2r1t.$mode.ms")  ms a step"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
