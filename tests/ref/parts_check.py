#!/usr/bin/python3
"""Compare a dump of C intermediate values against the numpy reference.

Usage:  parts_check.py [--tol 1e-4] [--checkpoint CKPT.pkl] DUMP.txt
Exit 0 when every tensor in the dump matches; 1 on any mismatch, unknown
name, shape mismatch, or an empty dump.

DUMP FORMAT ("needle-dump 1", text, whitespace-separated, '#' starts a comment
line):
    needle-dump 1
    checkpoint /path/to/ckpt.pkl         (optional if --checkpoint is given)
    tokens 5 6 7 5 6 7                   (the sequence; one line)
    tensor <name> <ndim> <dim0> ... <dimN-1>
    <prod(dims) numbers, row-major, any line breaks, %.9g or similar>
    tensor <name> ...
Any subset of the names below may be present, in any order.  T = sequence
length, K = engram tables, d = d_model, n = lanes, H/G heads, hd = head dim,
s = engram site number (index into engram_layers), l = layer.

  engram.indices   [T, K]     int table rows (exact match), k = oi*heads + h
  site<s>.e        [T, K*sub] concatenated engram rows (zeroed when t < order-1)
  site<s>.k        [T, d]     e @ key_proj
  site<s>.vp       [T, d]     e @ value_proj (before the taps)
  site<s>.v        [T, d]     after the 4 dilated taps
  x0               [T, d]     embedding * sqrt(d)
  layer<l>.hpre    [T, n]     sigmoid(... + 8*lane - 4)
  layer<l>.hpost   [T, n]     2*sigmoid(... - 4*(1-lane))
  layer<l>.hres    [T, n, n]  Sinkhorn output M (M[i,j] mixes lane j into lane i)
  layer<l>.u       [T, d]     sum_i hpre_i X_i
  layer<l>.alpha<s>[T]        engram gate of site s (only at its layer)
  layer<l>.bx      [T, d]     block input (u + sum alpha*v)
  layer<l>.a       [T, d]     zcrms(bx, norm_in)
  layer<l>.q       [T, H, hd] after q_norm and RoPE
  layer<l>.k       [T, G, hd] after k_norm and RoPE
  layer<l>.v       [T, G, hd] value projection
  layer<l>.attn    [T, H*hd]  softmax attention output, before the sigmoid gate
  layer<l>.attn_out[T, d]     after gate and out_proj (before post_attn_norm)
  layer<l>.mid     [T, d]     bx + sigmoid(attn_gate)*zcrms(attn_out, post)
  layer<l>.mlp     [T, d]     HadamardMLP(zcrms(mid, pre_hada))
  layer<l>.block   [T, d]     mid + mlp
  layer<l>.y       [T, d]     block - u
  layer<l>.X       [T, n, d]  lanes after the update
  final.h          [T, d]     zcrms(mean over lanes, final_norm)
  logits           [T, V]

Error metric per tensor: max|c - ref| / max|ref| (exact equality for indices).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import san_ref as R  # noqa: E402


def parse_dump(path):
    with open(path) as f:
        lines = [ln for ln in f.read().splitlines() if not ln.lstrip().startswith("#")]
    words = " ".join(lines).split()
    if words[:2] != ["needle-dump", "1"]:
        raise ValueError("%s: missing 'needle-dump 1' header" % path)
    i = 2
    ckpt, tokens, tensors = None, None, []
    # tokens run until the next keyword, so parse line-wise for that one
    for ln in lines:
        p = ln.split()
        if p and p[0] == "tokens":
            tokens = [int(x) for x in p[1:]]
        if p and p[0] == "checkpoint":
            ckpt = ln.split(None, 1)[1].strip()
    while i < len(words):
        w = words[i]
        if w == "checkpoint":
            i += 2
        elif w == "tokens":
            i += 1 + len(tokens)
        elif w == "tensor":
            name, nd = words[i + 1], int(words[i + 2])
            dims = tuple(int(x) for x in words[i + 3:i + 3 + nd])
            cnt = int(np.prod(dims)) if nd else 1
            start = i + 3 + nd
            vals = np.array([float(x) for x in words[start:start + cnt]])
            if vals.size != cnt:
                raise ValueError("tensor %s: %d values, expected %d" % (name, vals.size, cnt))
            tensors.append((name, vals.reshape(dims)))
            i = start + cnt
        else:
            raise ValueError("unexpected word %r" % w)
    if tokens is None:
        raise ValueError("dump has no 'tokens' line")
    return ckpt, tokens, tensors


def compare(m, tokens, tensors, tol):
    trace = {}
    R.forward(m, tokens, trace)
    fails = 0
    for name, got in tensors:
        if name not in trace:
            print("%-20s FAIL unknown name (reference has no such tensor)" % name)
            fails += 1
            continue
        ref = np.asarray(trace[name], dtype=np.float64)
        if got.shape != ref.shape:
            print("%-20s FAIL shape %s, reference %s" % (name, got.shape, ref.shape))
            fails += 1
            continue
        if name == "engram.indices":
            bad = int(np.sum(got != ref))
            print("%-20s %s %d mismatching indices" % (name, "ok  " if bad == 0 else "FAIL", bad))
            fails += bad != 0
            continue
        e = float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30)) if ref.size else 0.0
        ok = e <= tol and bool(np.isfinite(got).all())
        print("%-20s %s max|c-ref|/max|ref| = %.2e" % (name, "ok  " if ok else "FAIL", e))
        fails += not ok
    return fails


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dump")
    ap.add_argument("--checkpoint")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args(argv)
    ckpt, tokens, tensors = parse_dump(a.dump)
    ckpt = a.checkpoint or ckpt
    if not ckpt:
        print("no checkpoint given")
        return 1
    if not tensors:
        print("dump has no tensors")
        return 1
    fails = compare(R.load(ckpt), tokens, tensors, a.tol)
    print("%d tensor(s) compared, %d failure(s)" % (len(tensors), fails))
    return 1 if fails else 0


def write_dump(path, ckpt, tokens, trace, names=None):
    """Write a dump from a reference trace (used to self-test this checker)."""
    with open(path, "w") as f:
        f.write("needle-dump 1\ncheckpoint %s\ntokens %s\n" % (ckpt, " ".join(map(str, tokens))))
        for k in names or sorted(trace):
            v = np.asarray(trace[k])
            f.write("tensor %s %d %s\n" % (k, v.ndim, " ".join(map(str, v.shape))))
            f.write(" ".join("%.9g" % x for x in v.reshape(-1)) + "\n")


if __name__ == "__main__":
    sys.exit(main())
