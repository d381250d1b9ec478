#!/usr/bin/python3
"""Needle 3's probe heads (src/model/probe3.c) against numpy.

tests/test_probe3.c's `dump` mode writes a random head, random cells
[T, L+1, d] with some pad tokens, and what the C module computes from them
(cells handed over in chunks of 3 tokens, row by row). This test computes
the same in float64 from upstream 3.x architecture.py's probe_pool and the
heads around it, written here from the math: a masked softmax over tokens
per (row, probe), rms_unit and the gain, query attention with row_bias and a
softmax over every (row, probe), the projection, and for the embedding head
the unit-length output.

Run: NEEDLE_BUILD=build /usr/bin/python3 tests/test_probe3_numpy.py
"""
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
BUILD = os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build")
BIN = os.path.join(BUILD, "test_probe3")
FAILED = []


def softmax(x, axis):
    x = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)


def probe_head(cells, keep, probes, gain, query, row_bias, proj, bias, norm):
    T, L1, d = cells.shape
    k, q = probes.shape[1], query.shape[0]
    scores = np.einsum("tld,lkd->lkt", cells, probes) / np.sqrt(d)
    scores = np.where(keep[None, None, :] > 0, scores, -np.inf)
    r = np.einsum("lkt,tld->lkd", softmax(scores, -1), cells)
    r = r / np.sqrt(np.mean(r * r, axis=-1, keepdims=True) + 1e-6) * gain[:, :, None]
    u = np.einsum("lkd,qd->qlk", r, query) / np.sqrt(d) + row_bias
    w = softmax(u.reshape(q, L1 * k), -1)
    pooled = (w @ r.reshape(L1 * k, d)).reshape(q * d)
    out = pooled @ proj
    if bias is not None:
        out = out + bias
    if norm:
        out = out / np.sqrt(np.sum(out * out) + 1e-12)
    return out


def case(seed, rows, k, q, d, out, T, norm, bias):
    args = [BIN, "dump"] + [str(v) for v in (seed, rows, k, q, d, out, T, norm, bias)]
    text = subprocess.run(args, check=True, stdout=subprocess.PIPE, text=True,
                          timeout=120).stdout
    f = {}
    for line in text.splitlines():
        name, *vals = line.split()
        f[name] = np.array([float(v) for v in vals], dtype=np.float64)
    ref = probe_head(f["cells"].reshape(T, rows, d), f["keep"],
                     f["probes"].reshape(rows, k, d), f["gain"].reshape(rows, k),
                     f["query"].reshape(q, d), f["row_bias"].reshape(q, rows, k),
                     f["proj"].reshape(q * d, out), f.get("bias"), norm)
    err = np.max(np.abs(f["out"] - ref)) / max(np.max(np.abs(ref)), 1e-6)
    name = "seed %d rows %d k %d q %d d %d out %d T %d norm %d bias %d" % (
        seed, rows, k, q, d, out, T, norm, bias)
    ok = err <= 1e-5
    print("%-70s %s rel err %.2e" % (name, "ok  " if ok else "FAIL", err))
    if not ok:
        FAILED.append(name)


def main():
    # the embedding head (normalised, no bias), confidence (1 output) and
    # router (3 outputs) shapes, and the needle3 preset's 21 rows, 4 probes,
    # 4 queries at a smaller d
    case(1, 3, 2, 2, 8, 12, 7, 1, 0)
    case(2, 5, 4, 4, 16, 1, 40, 0, 1)
    case(3, 5, 4, 4, 16, 3, 40, 0, 1)
    case(4, 21, 4, 4, 32, 128, 25, 1, 0)
    case(5, 2, 1, 1, 4, 2, 1, 0, 1)
    if FAILED:
        print("test_probe3_numpy: %d failures" % len(FAILED))
        return 1
    print("test_probe3_numpy: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
