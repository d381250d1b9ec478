#!/usr/bin/env bash
# A GPU backend against the CPU on the same short fine-tune: 32 LoRA steps
# of the tiny model (shared-prefix batching, the default) with the same seed
# on both; every step's loss must agree within 1e-3 relative and the two
# adapters within 1e-3 (max abs, numpy). Usage: device_finetune.sh DEVICE
# (e.g. vulkan:0, cuda). Exit 77 (CTest: skipped) when the device is absent.
set -uo pipefail
DEV=${1:?device}
NEEDLE=${NEEDLE:-build/needle}
PY=${PYTHON:-python3}
TOK=models/tokenizer.model
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
if ! "$NEEDLE" bench forward --preset tiny --batch 1 --seq 8 --iters 1 --device "$DEV" \
  >"$T/probe" 2>&1; then
  echo "skipped: $(grep -m1 needle: "$T/probe" || tail -n1 "$T/probe")"
  exit 77
fi
set -e
head -n 8 examples/data.jsonl > "$T/data.jsonl"
"$NEEDLE" init "$T/base.pkl" --preset tiny --max-seq-len 256 --seed 3 >/dev/null
for d in cpu "$DEV"; do
  "$NEEDLE" finetune "$T/data.jsonl" --checkpoint "$T/base.pkl" --tokenizer "$TOK" \
    --batch-size 2 --max-len 256 --epochs 8 --lr 1e-2 --val-split 0 --seed 5 --device "$d" \
    --out "$T/adapter-${d%%:*}.pkl" > "$T/ft-${d%%:*}.log"
done
grep backend "$T/ft-${DEV%%:*}.log"
"$PY" - "$T/ft-cpu.log" "$T/ft-${DEV%%:*}.log" "$T/adapter-cpu.pkl" "$T/adapter-${DEV%%:*}.pkl" <<'PYEOF'
import pickle, re, sys
import numpy as np
def losses(path):
    return [float(m.group(1)) for m in re.finditer(r"^  step +\d+/\d+ +loss ([-\d.]+)", open(path).read(), re.M)]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == len(b) == 32, (len(a), len(b))
worst = max(abs(x - y) / max(abs(x), 1e-6) for x, y in zip(a, b))
print(f"steps {len(a)}  first loss cpu {a[0]:.4f} device {b[0]:.4f}  last cpu {a[-1]:.4f} device {b[-1]:.4f}  worst rel diff {worst:.2e}")
assert worst < 1e-3, worst
pa, pb = pickle.load(open(sys.argv[3], "rb")), pickle.load(open(sys.argv[4], "rb"))
diff = 0.0
for k, ab in pa["lora"].items():
    for n in ("A", "B"):
        diff = max(diff, float(np.max(np.abs(np.asarray(ab[n]) - np.asarray(pb["lora"][k][n])))))
print(f"adapter max abs diff {diff:.2e}")
assert diff < 1e-3, diff
PYEOF
echo "device finetune ($DEV vs cpu): ok"
