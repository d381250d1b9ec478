#!/usr/bin/python3
"""`needle bench finetune` runs finetune's steps (train/run.h): on a Needle 3
base it trains through 3.x's deployed numerics as `needle finetune` does
(before, it trained a Needle 3 model in float: it never switched them on).

  * tiny3 base; finetune for one step (--stop-after 1, --loss-log) and
    bench finetune for one step on the same data, batch and seed: the same
    first-step loss (to bench's 4 decimals);
  * bench finetune --no-qat (float, as finetune --no-qat) gives another
    loss, equal to finetune --no-qat's: the comparison can tell them apart.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "ref"))
from harness import Checker, find_needle  # noqa: E402

DATA = os.path.join(SRC, "examples", "data.jsonl")
TOK = os.path.join(SRC, "models", "tokenizer.model")


def main():
    check = Checker()
    needle = find_needle()
    if not check("needle binary found", needle is not None):
        return check.finish()

    def run(*args):
        print("  $ needle " + " ".join(args), flush=True)
        return subprocess.run([needle, *args], capture_output=True, text=True, timeout=900)

    tmp = tempfile.mkdtemp(prefix="needle3_bench_ft_")
    ck = os.path.join(tmp, "tiny3.pkl")
    r = run("init", ck, "--preset", "tiny3", "--seed", "1")
    if not check("init tiny3", r.returncode == 0, r.stderr[-300:]):
        return check.finish()
    common = ["--checkpoint", ck, "--tokenizer", TOK, "--batch-size", "8", "--max-len", "256",
              "--threads", "2", "--seed", "3"]

    def finetune_loss(*extra):
        log = os.path.join(tmp, "loss%d.jsonl" % len(extra))
        r = run("finetune", DATA, *common, "--epochs", "1", "--val-split", "0", "--stop-after",
                "1", "--loss-log", log, "--out", os.path.join(tmp, "a.pkl"), *extra)
        if r.returncode != 1 or not os.path.exists(log):
            print(r.stdout[-500:], r.stderr[-500:])
            return None
        with open(log) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return rows[0]["loss"] if rows and rows[0].get("step") == 1 else None

    def bench(*extra):
        r = run("bench", "finetune", DATA, *common, "--steps", "1", *extra)
        m = re.search(r"step\s+1/1 .* loss (\d+\.\d+)", r.stdout)
        if r.returncode or not m:
            print(r.stdout[-800:], r.stderr[-500:])
            return None, r.stdout
        return float(m.group(1)), r.stdout

    fq, ff = finetune_loss(), finetune_loss("--no-qat")
    bq, out_q = bench()
    bf, out_f = bench("--no-qat")
    check("four losses", None not in (fq, ff, bq, bf), "%s %s %s %s" % (fq, ff, bq, bf))
    if None in (fq, ff, bq, bf):
        return check.finish()
    check("the numerics differ enough to tell apart", round(fq, 4) != round(ff, 4),
          "%.6f vs %.6f" % (fq, ff))
    check("bench finetune on Needle 3 = finetune's first step (3.x numerics)",
          abs(bq - round(fq, 4)) < 1.5e-4, "bench %.4f finetune %.6f" % (bq, fq))
    check("bench finetune --no-qat = finetune --no-qat", abs(bf - round(ff, 4)) < 1.5e-4,
          "bench %.4f finetune %.6f" % (bf, ff))
    check("bench says which numerics", "numerics  Needle 3" in out_q and "float (--no-qat)" in out_f,
          out_q[-400:])
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
