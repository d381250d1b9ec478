#!/usr/bin/python3
"""Needle 3's Hadamard MLP (src/model/hada3.c) against numpy.

- numpy's legacy RandomState(seed).permutation(n), which upstream uses for
  the MLP's permutations, against ours (core/np_random.c) for many seeds and
  sizes, and the split form of upstream's _hada_perms;
- the forward of the C module (run by tests/test_hada3.c's `dump` mode on
  random weights) against the same math written here in numpy float64 from
  upstream's HadamardMLP: _hada_blocks, _hada_perms, the einsum patterns of
  _apply_factors, cond = 1 + softmax(x @ cond_v) @ cond_u.

Run: NEEDLE_BUILD=build /usr/bin/python3 tests/test_hada3_numpy.py
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
BUILD = os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build")
BIN = os.path.join(BUILD, "test_hada3")
FAILED = []


def check(name, ok, detail=""):
    print("%-60s %s %s" % (name, "ok  " if ok else "FAIL", detail))
    if not ok:
        FAILED.append(name)


def run(*args):
    return subprocess.run([BIN] + [str(a) for a in args], check=True,
                          stdout=subprocess.PIPE, text=True, timeout=300).stdout


def ints(line):
    return np.array([int(v) for v in line.split()], dtype=np.int64)


# ---- numpy's side, from upstream's definitions ----

def hada_blocks(n):
    b = 1 << ((n - 1).bit_length() // 2)
    return b, n // b


def hada_perms(n, split):
    seeds = (11, 13)
    if split:
        h = n // 2
        return tuple(np.concatenate([np.random.RandomState(s).permutation(h),
                                     h + np.random.RandomState(s + 977).permutation(h)])
                     for s in seeds)
    return tuple(np.random.RandomState(s).permutation(n) for s in seeds)


def hadamard_mlp(x, P, d, untied, split):
    n = 1 << (d - 1).bit_length()
    ba, bb = hada_blocks(n)
    p1, p2 = hada_perms(n, split)
    logits = x @ P["cond_v"]
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    cond = 1 + (e / e.sum(axis=-1, keepdims=True)) @ P["cond_u"]
    z = np.pad(x, ((0, 0), (0, n - d)))

    def apply(w, wa, wb):
        lead = w.shape[:-1]
        w = w.reshape(*lead, ba, bb)
        if untied:
            w = np.einsum("...ij,jik,kjl->...kl", w, wa, wb)
        else:
            w = np.einsum("...ij,ik,jl->...kl", w, wa, wb)
        return w.reshape(*lead, ba * bb)

    def silu(v):
        return v / (1 + np.exp(-v))

    z = apply(P["d1"] * z, P["w1a"], P["w1b"])[..., p1]
    z = apply(silu(P["d2"] * cond * z + P["b2"]), P["w2a"], P["w2b"])[..., p2]
    z = apply(P["d3"] * z, P["w3a"], P["w3b"])
    return (P["d4"] * z)[..., :d]


def load_dump(path):
    raw = open(path, "rb").read()
    hdr = np.frombuffer(raw[:28], dtype="<i4")
    d, n, ba, bb, untied, split, N = (int(v) for v in hdr)
    f = np.frombuffer(raw[28:], dtype="<f4").astype(np.float64)
    R = 8
    wa = (bb, ba, ba) if untied else (ba, ba)
    wb = (ba, bb, bb) if untied else (bb, bb)
    shapes = [("x", (N, d)), ("w1a", wa), ("w1b", wb), ("w2a", wa), ("w2b", wb),
              ("w3a", wa), ("w3b", wb), ("d1", (n,)), ("d2", (n,)), ("b2", (n,)),
              ("d3", (n,)), ("d4", (n,)), ("cond_v", (d, R)), ("cond_u", (R, n)),
              ("y", (N, d))]
    P, off = {}, 0
    for name, shp in shapes:
        size = int(np.prod(shp))
        P[name] = f[off:off + size].reshape(shp)
        off += size
    assert off == f.size, "dump size"
    return (d, n, ba, bb, untied, split, N), P


def main():
    if not os.path.exists(BIN):
        print("test_hada3_numpy: %s not built" % BIN)
        return 1
    # 1. permutations, bit for bit
    for seed in (11, 13, 988, 990, 0, 1, 12345, 4294967295):
        for n in (0, 1, 2, 3, 5, 16, 100, 257, 512, 1000, 1024, 4096):
            want = np.random.RandomState(seed).permutation(n)
            got = ints(run("perm", seed, n))
            check("RandomState(%d).permutation(%d)" % (seed, n),
                  got.shape == want.shape and np.array_equal(got, want))
    # 2. the module's geometry and permutations as upstream makes them
    for d in (2, 3, 24, 100, 768, 1000):
        for split in (0, 1):
            lines = run("geom", d, split).splitlines()
            n, ba, bb = (int(v) for v in lines[0].split())
            wn = 1 << (d - 1).bit_length()
            p1, p2 = hada_perms(wn, split)
            ok = (n, ba, bb) == (wn,) + hada_blocks(wn)
            ok = ok and np.array_equal(ints(lines[1]), p1) and np.array_equal(ints(lines[2]), p2)
            check("geometry and _hada_perms d %d split %d" % (d, split), ok,
                  "n %d ba %d bb %d" % (n, ba, bb))
    # 3. the forward against numpy float64
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "dump.bin")
        for d, untied, split, N in ((12, 0, 0, 9), (12, 1, 1, 9), (24, 0, 1, 6),
                                    (24, 1, 0, 6), (32, 1, 1, 5), (64, 0, 0, 4),
                                    (100, 1, 0, 3), (100, 0, 1, 3), (768, 0, 0, 3),
                                    (768, 1, 1, 3)):
            run("dump", path, d, untied, split, N, 31 + d + untied)
            (dd, n, ba, bb, ut, sp, NN), P = load_dump(path)
            ok = (dd, ut, sp, NN) == (d, untied, split, N)
            want = hadamard_mlp(P["x"], P, d, untied, split)
            err = float(np.max(np.abs(P["y"] - want)) / np.max(np.abs(want)))
            check("forward d %d %s%s N %d vs numpy" % (d, "block_untied" if untied else "shared",
                                                      " split" if split else "", N),
                  ok and err < 3e-5, "rel err %.2e" % err)
    if FAILED:
        print("%d FAILED" % len(FAILED))
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
