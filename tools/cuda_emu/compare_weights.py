#!/usr/bin/env python3
# compare_weights.py A.pkl B.pkl BASE.pkl: every tensor of A and B (trained
# from BASE, or LoRA adapters) within 1% of how far training moved it.
import pickle
import sys

import numpy as np


def tensors(x, pre=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from tensors(v, pre + "/" + str(k))
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from tensors(v, pre + "/" + str(i))
    elif isinstance(x, np.ndarray):
        yield pre, x


def load(p):
    with open(p, "rb") as f:
        return dict(tensors(pickle.load(f)))


a, b, base = (load(p) for p in sys.argv[1:4])
worst, name, bad = 0.0, "", []
for k, x in a.items():
    if not x.size or not np.issubdtype(x.dtype, np.floating):
        continue
    x = x.astype(np.float64)
    y = b[k].astype(np.float64)
    moved = np.abs(x - base[k]).max() if k in base else np.abs(x).max()
    r = np.abs(x - y).max() / max(moved, 1e-12)
    if r > worst:
        worst, name = r, k
    if r > 1e-2 or not np.isfinite(y).all():
        bad.append(k)
print("  weights: worst %.1e of the training move (%s)%s"
      % (worst, name, "; differ: " + ", ".join(bad) if bad else ""))
sys.exit(1 if bad else 0)
