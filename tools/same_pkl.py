#!/usr/bin/env python3
"""same_pkl.py A.pkl B.pkl MAXREL [LABEL]: two training outputs (adapters or
checkpoints) hold the same numbers: every float array, in key order,
flattened into one vector each; max |a - b| / max |a| must be <= MAXREL
(0: bit-identical). Prints "LABEL: max relative difference R (limit
MAXREL)"; exit 0 when within, 1 when not (or the shapes differ), 2 on bad
arguments. Shared by tools/cuda_emu/check.sh and tools/gpu_mpi_check.sh;
needs numpy (/usr/bin/python3 on Debian)."""
import pickle
import sys

import numpy as np


def flat(t, out):
    if isinstance(t, dict):
        for k in sorted(t, key=str):
            flat(t[k], out)
    elif isinstance(t, (list, tuple)):
        for v in t:
            flat(v, out)
    elif isinstance(t, np.ndarray) and t.dtype.kind == "f":
        out.append(t.astype(np.float64).ravel())
    return out


def load(path):
    with open(path, "rb") as f:
        parts = flat(pickle.load(f), [])
    return np.concatenate(parts) if parts else np.zeros(0)


def main(argv):
    if len(argv) not in (4, 5):
        sys.stderr.write(__doc__)
        return 2
    limit = float(argv[3])
    label = argv[4] if len(argv) == 5 else "%s vs %s" % (argv[1], argv[2])
    a, b = load(argv[1]), load(argv[2])
    if a.shape != b.shape or not a.size:
        print("%s: different shapes (%d vs %d numbers)" % (label, a.size, b.size))
        return 1
    d = np.abs(a - b).max()
    rel = d / max(np.abs(a).max(), 1e-30)
    if not np.isfinite(b).all():
        rel = float("inf")
    print("%s: max relative difference %.3g (limit %s)" % (label, rel, argv[3]))
    return 0 if rel <= limit else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
