#!/usr/bin/python3
"""C forward (`needle eval`) vs the float64 numpy reference (tests/ref/san_ref.py).

For each configuration a random checkpoint is written (tests/ref/make_ckpt.py),
a token file with sequences of lengths 1, 2, 17, 33, 60 (repeated n-grams,
token 0 and V-1 included) is evaluated by
    $NEEDLE eval --checkpoint CKPT --tokens FILE --json --logits OUT.bin
and by the reference; asserted:
  * exit status 0, stdout exactly one JSON object of the contract's shape,
    tokens == len-1 per sequence;
  * logits file size == sum(len) * V float32, and per sequence
    max|c - ref| / max|ref| <= 1e-4;
  * per-sequence losses and mean_loss agree with the reference to 1e-4 relative;
  * plain (non --json) mode exits 0 and prints the mean loss;
  * a missing checkpoint makes eval exit non-zero.
Missing $NEEDLE or any failure of the program fails the test (no skipping).

Configurations:
  tiny-default   upstream conftest shape, upstream init, minimal config dict
                 (only the keys conftest's vars(config) has)
  tiny-perturb   same shape, every parameter randomised
  mid-perturb    V 512, d 96 (hadamard N 128), attn_dim 128, H 4, G 2, L 5,
                 engrams at (1,3), orders (2,3), slots 97, 4 lanes (layer 4
                 wraps to lane 0), config dtype "bfloat16"
  tiny-f16       float16-stored arrays, engram_heads 2, rope_theta 10000
  mha-probe      G == H == 3, d 48, L 3, 3 lanes, engrams at (0,2), orders
                 (2,4) (dilation 4), plus contrastive/confidence heads present
  no-engram      no engram sites, 1 lane, d 32
"""
import math
import os
import re
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "ref"))
import make_ckpt  # noqa: E402
import san_ref as R  # noqa: E402
from harness import Checker, find_needle, run, write_tokens, split_logits, check_eval_json  # noqa: E402

TOL = 1e-4

CONFIGS = [
    ("tiny-default", dict(seed=0, perturb=False, minimal=True, **make_ckpt.TINY)),
    ("tiny-perturb", dict(seed=1, perturb=True, dtype="float32", **make_ckpt.TINY)),
    ("mid-perturb", dict(seed=2, perturb=True, vocab_size=512, d_model=96, attn_dim=128,
                         num_heads=4, num_kv_heads=2, num_layers=5, max_seq_len=128,
                         engram_layers=(1, 3), engram_orders=(2, 3), engram_slots=97,
                         mhc_lanes=4, dtype="bfloat16")),
    ("tiny-f16", dict(seed=3, perturb=True, store_dtype="float16", engram_heads=2,
                      rope_theta=10000.0, dtype="float32", **make_ckpt.TINY)),
    ("mha-probe", dict(seed=4, perturb=True, probe_heads=True, vocab_size=300, d_model=48,
                       num_heads=3, num_kv_heads=3, num_layers=3, max_seq_len=64,
                       engram_layers=(0, 2), engram_orders=(2, 4), engram_slots=31,
                       mhc_lanes=3, dtype="float32")),
    ("no-engram", dict(seed=5, perturb=True, vocab_size=100, d_model=32, num_heads=2,
                       num_kv_heads=1, num_layers=2, max_seq_len=64, engram_layers=(),
                       mhc_lanes=1, dtype="float32")),
]


def make_seqs(V, seed):
    rng = np.random.default_rng(100 + seed)
    base = [int(t) for t in rng.integers(0, V, 8)]
    s17 = (base[:5] * 4)[:17]                       # heavy repetition
    s33 = [int(t) for t in rng.integers(0, V, 33)]
    s33[20:26] = s33[3:9]
    s60 = [int(t) for t in rng.integers(0, min(V, 12), 60)]  # tiny alphabet
    s60[0], s60[59] = 0, V - 1
    return [[int(rng.integers(0, V))], [0, 0], s17, s33, s60]


def relerr(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def main():
    check = Checker()
    needle = find_needle()
    if not check("needle program found ($NEEDLE)", needle is not None,
                 str(os.environ.get("NEEDLE"))):
        return check.finish()
    with tempfile.TemporaryDirectory() as td:
        for name, kw in CONFIGS:
            kw = dict(kw)
            seed = kw["seed"]
            ck = os.path.join(td, name + ".pkl")
            cfg, _ = make_ckpt.make_checkpoint(ck, **kw)
            m = R.load(ck)
            seqs = make_seqs(m.V, seed)
            tf = os.path.join(td, name + ".txt")
            write_tokens(tf, seqs)
            ob = os.path.join(td, name + ".bin")
            r = run([needle, "eval", "--checkpoint", ck, "--tokens", tf, "--json",
                     "--logits", ob])
            if not check("[%s] eval exits 0" % name, r.returncode == 0,
                         "rc=%d %s" % (r.returncode, r.stderr[-400:])):
                continue
            js = check_eval_json(check, r.stdout, seqs, "[%s]" % name)
            try:
                got = split_logits(ob, seqs, m.V)
            except (ValueError, OSError) as e:
                check("[%s] logits file size" % name, False, str(e))
                continue
            worst, ok = 0.0, True
            ref_losses, tot, cnt = [], 0.0, 0
            for s, g in zip(seqs, got):
                ref = R.forward(m, s)
                e = relerr(g, ref)
                worst = max(worst, e)
                ok &= bool(np.isfinite(g).all()) and e <= TOL
                ce = R.losses(ref, s)
                ref_losses.append(float(ce.mean()) if len(ce) else None)
                tot += float(ce.sum())
                cnt += len(ce)
                print("    len %2d  logits max|c-ref|/max|ref| = %.2e" % (len(s), e))
            check("[%s] logits vs reference <= %g" % (name, TOL), ok, "worst %.2e" % worst)
            if js is not None:
                lw, lok = 0.0, True
                for ex, rl in zip(js["examples"], ref_losses):
                    if rl is None:
                        continue
                    le = abs(ex["loss"] - rl) / abs(rl)
                    lw = max(lw, le)
                    lok &= le <= TOL
                me = abs(js["mean_loss"] - tot / cnt) / abs(tot / cnt)
                print("    losses c=%s ref=%s" % ([ex["loss"] for ex in js["examples"]],
                                                   ref_losses))
                check("[%s] per-sequence losses vs reference <= %g" % (name, TOL), lok,
                      "worst %.2e" % lw)
                check("[%s] mean_loss vs reference <= %g" % (name, TOL), me <= TOL,
                      "c %.6f ref %.6f (%.2e)" % (js["mean_loss"], tot / cnt, me))
            if name == "tiny-perturb":
                r2 = run([needle, "eval", "--checkpoint", ck, "--tokens", tf])
                nums = [float(x) for x in re.findall(r"[-+]?\d+\.\d+(?:[eE][-+]?\d+)?",
                                                       r2.stdout)]
                mean = tot / cnt
                check("[%s] plain mode exits 0 and prints the mean loss" % name,
                      r2.returncode == 0 and any(abs(x - mean) <= 1e-3 * mean for x in nums),
                      "rc=%d out=%r" % (r2.returncode, r2.stdout[-200:]))
                r3 = run([needle, "eval", "--checkpoint", os.path.join(td, "nope.pkl"),
                          "--tokens", tf, "--json"])
                check("[%s] missing checkpoint -> non-zero exit" % name, r3.returncode != 0)
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
