#!/usr/bin/python3
"""Stand-in for the C `needle` program implementing the eval/init contract with
the numpy reference (computes in float32-rounded output).  Only for
self-testing the Python tests:  NEEDLE=tests/ref/fake_needle.py python3 tests/test_forward_ref.py

  eval --checkpoint CKPT --tokens FILE [--json] [--logits OUT.bin]
  init OUT.pkl [--preset tiny] [--seed S] [--layers L] [--d-model D]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_ckpt  # noqa: E402
import san_ref as R  # noqa: E402


def main(argv):
    if not argv:
        return 2
    if argv[0] == "eval":
        ap = argparse.ArgumentParser()
        ap.add_argument("--checkpoint", required=True)
        ap.add_argument("--tokens", required=True)
        ap.add_argument("--json", action="store_true")
        ap.add_argument("--logits")
        a = ap.parse_args(argv[1:])
        try:
            m = R.load(a.checkpoint)
        except OSError as e:
            sys.stderr.write("error: %s\n" % e)
            return 1
        seqs = R.read_tokens(a.tokens)
        logits, summ = R.evaluate(m, seqs)
        for ex in summ["examples"]:
            if ex["loss"] is None:
                ex["loss"] = 0.0
        if a.logits:
            with open(a.logits, "wb") as f:
                for lg in logits:
                    f.write(lg.astype("<f4").tobytes())
        if a.json:
            print(json.dumps(summ))
        else:
            for i, ex in enumerate(summ["examples"]):
                print("example %d  loss %.6f  tokens %d" % (i, ex["loss"], ex["tokens"]))
            print("mean loss %.6f" % summ["mean_loss"])
        return 0
    if argv[0] == "init":
        ap = argparse.ArgumentParser()
        ap.add_argument("out")
        ap.add_argument("--preset", default="tiny")
        ap.add_argument("--seed", type=int, default=0)
        ap.add_argument("--layers", type=int)
        ap.add_argument("--d-model", type=int)
        a = ap.parse_args(argv[1:])
        kw = dict(make_ckpt.TINY)
        if a.layers:
            kw["num_layers"] = a.layers
        if a.d_model:
            kw["d_model"] = a.d_model
        make_ckpt.make_checkpoint(a.out, seed=a.seed, dtype="float32", **kw)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
