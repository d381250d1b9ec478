#!/usr/bin/python3
"""Needle 3 forward parity: our float32 logits against the independent
float64 numpy reference of upstream 3.x (tools/ref_needle3.py) on random
tiny Needle 3 fixtures (tools/make_needle3_fixture.py), relative error
<= 1e-5 per sequence.

Fixtures: presets tiny3 (sliding window with a global layer, conv taps with
a tap masked on local layers, engram banks + seed heads, a CLA pair, split
Hadamard permutations, elementwise gate, shared factors) and tiny3b
(headwise gate, block_untied factors, out_vocab), every parameter away from
its initialiser. The fixture (safetensors) is handed to `needle eval
--tokens --logits` as a pickle of the same tree (format_version 2, config
dict, params); when this build reads safetensors (`needle inspect` accepts
the file) the .safetensors itself is checked too.
"""
import json
import os
import pickle
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "ref"))
sys.path.insert(0, os.path.join(SRC, "tools"))
from harness import Checker, find_needle, run  # noqa: E402

import numpy as np  # noqa: E402

PY = os.environ.get("PYTHON", sys.executable)
FIXTURE = os.path.join(SRC, "tools", "make_needle3_fixture.py")
REF = os.path.join(SRC, "tools", "ref_needle3.py")

# sequences longer than the windows, shorter than the fixtures' max_seq_len
SEQS = [[5, 9, 3, 17, 2, 30, 11, 7, 1, 19, 23, 4, 8, 13],
        [1, 2, 3, 4, 5, 6, 7],
        [37, 3]]


def unflatten(flat):
    tree = {}
    for name, value in flat.items():
        node = tree
        parts = name.split("/")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return tree


def to_pickle(st_path, pkl_path):
    import ref_needle3
    tensors, meta, dtypes = ref_needle3.read_safetensors(st_path)
    params = unflatten({k: np.asarray(v, np.float32) for k, v in tensors.items()})
    ck = {"format_version": int(meta["format_version"]), "config": json.loads(meta["config"]),
          "params": params, "step": int(meta.get("step") or 0)}
    with open(pkl_path, "wb") as f:
        pickle.dump(ck, f, protocol=2)


def main():
    check = Checker()
    needle = find_needle()
    if not check("needle binary found", needle is not None):
        return check.finish()
    if not check("tools/make_needle3_fixture.py and tools/ref_needle3.py present",
                 os.path.isfile(FIXTURE) and os.path.isfile(REF)):
        return check.finish()
    tmp = tempfile.mkdtemp(prefix="needle3_parity_")
    toks = os.path.join(tmp, "tokens.txt")
    with open(toks, "w") as f:
        for s in SEQS:
            f.write(" ".join(map(str, s)) + "\n")
    ref_tokens = []
    for s in SEQS:
        ref_tokens += ["--tokens", ",".join(map(str, s))]
    for preset in ("tiny3", "tiny3b"):
        for seed in (1, 2):
            tag = "%s seed %d" % (preset, seed)
            st = os.path.join(tmp, "%s_%d.safetensors" % (preset, seed))
            r = run([PY, FIXTURE, st, "--preset", preset, "--seed", str(seed)])
            if not check(tag + ": fixture written", r.returncode == 0, r.stderr[-300:]):
                continue
            pkl = st[:-len(".safetensors")] + ".pkl"
            to_pickle(st, pkl)
            inputs = [pkl]
            r = run([needle, "inspect", st])
            if r.returncode == 0:
                inputs.append(st)
            for ck in inputs:
                kind = "safetensors" if ck.endswith(".safetensors") else "pickle"
                out = os.path.join(tmp, "logits.bin")
                r = run([needle, "eval", "--checkpoint", ck, "--tokens", toks, "--logits", out,
                         "--threads", "2", "--device", "cpu"])
                if not check("%s: needle eval (%s)" % (tag, kind), r.returncode == 0,
                             r.stderr[-300:]):
                    continue
                r = run([PY, REF, st, *ref_tokens, "--check-logits", out, "--tol", "1e-5"])
                check("%s: logits vs reference (%s)" % (tag, kind), r.returncode == 0,
                      (r.stdout.strip() + " " + r.stderr.strip())[-300:])
    for name in os.listdir(tmp):
        os.unlink(os.path.join(tmp, name))
    os.rmdir(tmp)
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
