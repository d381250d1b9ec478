#!/usr/bin/python3
"""A tiny Needle 3 model fine-tunes: `needle finetune --full` and LoRA on a
tiny3 checkpoint (sliding-window and global layers, q/k/v conv taps, CLA,
engram banks with seed heads, the Kronecker-factored Hadamard MLP).

  * init --preset tiny3; --full fine-tune on examples/data.jsonl: the
    training-set loss falls by a third, the written checkpoint is still
    Needle 3 (3.x config, probe heads carried, no mtp_*);
  * LoRA fine-tune of that base: validation loss falls epoch over epoch
    (first to last), and `needle eval --lora` gives a lower loss than the
    base.
"""
import json
import os
import pickle
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

    tmp = tempfile.mkdtemp(prefix="needle3_ft_")
    ck = os.path.join(tmp, "tiny3.pkl")
    r = run("init", ck, "--preset", "tiny3", "--seed", "1")
    if not check("init tiny3", r.returncode == 0, r.stderr[-300:]):
        return check.finish()
    tok = ["--tokenizer", TOK, "--batch-size", "8", "--max-len", "256", "--threads", "2"]

    def eval_loss(ckpt, *extra):
        r = run("eval", DATA, "--checkpoint", ckpt, "--tokenizer", TOK, "--max-len", "256",
                "--json", *extra)
        return json.loads(r.stdout)["mean_loss"] if r.returncode == 0 else float("nan")

    pre = os.path.join(tmp, "pre.pkl")
    r = run("finetune", DATA, "--full", "--checkpoint", ck, *tok, "--epochs", "2", "--lr", "1e-2",
            "--out", pre)
    check("finetune --full on a Needle 3 base", r.returncode == 0 and os.path.exists(pre),
          r.stderr[-300:])
    l0, l1 = eval_loss(ck), eval_loss(pre)
    check("full fine-tune: loss falls by a third", l1 <= l0 * 2 / 3, "%.4f -> %.4f" % (l0, l1))
    with open(pre, "rb") as f:
        pc = pickle.load(f)
    check("the --full checkpoint stays Needle 3 with its heads",
          "qk_head_dim" in pc["config"] and "router_head" in pc["params"]
          and "engram_banks_0" in pc["params"] and "mtp_block" not in pc["params"])

    ad = os.path.join(tmp, "adapter.pkl")
    r = run("finetune", DATA, "--checkpoint", pre, *tok, "--epochs", "3", "--lr", "1e-2",
            "--out", ad, "--seed", "3")
    print(r.stdout)
    check("LoRA finetune exits 0", r.returncode == 0, r.stderr[-300:])
    vals = [float(l.split("val")[1]) for l in r.stdout.splitlines()
            if l.strip().startswith("epoch")]
    check("validation loss falls", len(vals) == 3 and vals[-1] < vals[0], repr(vals))
    base, tuned = eval_loss(pre), eval_loss(pre, "--lora", ad)
    check("eval --lora below the base", tuned < base, "%.4f -> %.4f" % (base, tuned))
    for name in os.listdir(tmp):
        os.unlink(os.path.join(tmp, name))
    os.rmdir(tmp)
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
