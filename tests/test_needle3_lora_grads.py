#!/usr/bin/python3
"""Needle 3 LoRA gradients, entry by entry, against the independent float64
numpy reference (tools/ref_needle3.py --grads: central finite differences
of upstream 3.x's fine-tune loss in every adapter entry).

Our side: tests/lora_grad_dump.c (build/lora_grad_dump), one training step
of the trainer (merge, forward, masked loss, backward) on the same fixture,
adapter and batch, every adapter gradient entry written as JSON.

Fixtures (tools/make_needle3_fixture.py, random weights away from their
initialisers, a random adapter with A and B non-zero):
  * tiny3b, rank 1: EVERY entry of every A and B is compared (headwise
    gate, block_untied factors, out_vocab, a CLA pair, a global layer).
  * tiny3, rank 2: the reference's random 12 entries of each tensor
    (sliding window 2 with a global layer, masked conv tap, engram banks and
    seed heads, CLA, split permutations); its finite differences are too
    slow for every entry of every tensor in the timed suite.
The batch holds two sequences of different lengths (so one is padded, and
both are longer than the windows), with a loss mask that has zeros.

Error per tensor: max|ours - ref| / max(max|ref| of the tensor, 1e-3 * max|ref|
over all tensors) <= 1e-5 (what ref_needle3.py --check-grads computes; the
issue's target is 1e-4). The loss must equal the reference's to 1e-6.

Negative control: the same dump with one gradient entry moved by 1e-3 of
its tensor's largest entry (lora_grad_dump --perturb) must fail the check.

Quantised numerics (--quant: 3.x's quant=True forward, straight-through
backward): the reference refuses finite differences across rounding, so
there is no per-entry reference for those gradients. Checked instead: the
loss equals ref_needle3.py --quant --loss (1e-4, as tests/test_needle3_qat.py),
the gradients are finite and differ from the float ones (on these random
fixtures by 0.4 to 0.7 in relative L2: 4-bit weights of tiny random kernels
move a lot).
"""
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "ref"))
from harness import Checker, run  # noqa: E402

import numpy as np  # noqa: E402

PY = os.environ.get("PYTHON", sys.executable)
FIXTURE = os.path.join(SRC, "tools", "make_needle3_fixture.py")
REF = os.path.join(SRC, "tools", "ref_needle3.py")
TOL = 1e-5

SEQS = [[5, 9, 3, 17, 2, 30, 11, 7, 1, 19], [1, 2, 3, 4, 5, 6]]
MASKS = [[0, 0, 1, 1, 1, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 1]]
# preset, adapter rank, reference entries per tensor ("all" or a count)
CASES = [("tiny3b", 1, "all"), ("tiny3", 2, "12")]


def find_dump():
    cands = []
    if os.environ.get("NEEDLE_BUILD"):
        cands.append(os.path.join(os.environ["NEEDLE_BUILD"], "lora_grad_dump"))
    cands.append(os.path.join(SRC, "build", "lora_grad_dump"))
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def tensor_errors(ours, ref):
    """{name: error} as ref_needle3.compare_grads, at the reference's entries."""
    scale_all = max(max((abs(g) for g in t["grad"]), default=0.0)
                    for t in ref["tensors"].values())
    errs = {}
    for name, t in ref["tensors"].items():
        o = ours["tensors"].get(name)
        if o is None or list(o["shape"]) != list(t["shape"]):
            errs[name] = float("inf")
            continue
        c = np.asarray(o["grad"], np.float64)[np.asarray(t["index"], np.int64)]
        r = np.asarray(t["grad"], np.float64)
        den = max(float(np.max(np.abs(r))), 1e-3 * scale_all, 1e-300)
        errs[name] = float(np.max(np.abs(c - r)) / den) if np.all(np.isfinite(c)) else float("inf")
    return errs


def main():
    check = Checker()
    dump = find_dump()
    if not check("lora_grad_dump built", dump is not None):
        return check.finish()
    tmp = tempfile.mkdtemp(prefix="needle3_lora_grads_")
    toks, masks = os.path.join(tmp, "tokens.txt"), os.path.join(tmp, "mask.txt")
    with open(toks, "w") as f:
        f.writelines(" ".join(map(str, s)) + "\n" for s in SEQS)
    with open(masks, "w") as f:
        f.writelines(",".join(map(str, s)) + "\n" for s in MASKS)
    ref_seq = []
    for s, mk in zip(SEQS, MASKS):
        ref_seq += ["--tokens", ",".join(map(str, s)), "--mask", ",".join(map(str, mk))]
    for preset, rank, entries in CASES:
        tag = "%s rank %d" % (preset, rank)
        ck = os.path.join(tmp, preset + ".safetensors")
        ad = os.path.join(tmp, preset + "_lora.safetensors")
        r = run([PY, FIXTURE, ck, "--preset", preset, "--seed", "5", "--adapter", ad,
                 "--lora-rank", str(rank)])
        if not check(tag + ": fixture and adapter written", r.returncode == 0, r.stderr[-300:]):
            continue
        ours_path = os.path.join(tmp, preset + "_ours.json")
        r = run([dump, ck, ad, toks, ours_path, "--mask-file", masks, "--threads", "2"])
        if not check(tag + ": lora_grad_dump (float)", r.returncode == 0, r.stderr[-300:]):
            continue
        ref_path = os.path.join(tmp, preset + "_ref.json")
        r = run([PY, REF, ck, "--adapter", ad, *ref_seq, "--grads", ref_path,
                 "--grad-entries", entries, "--grad-seed", "3"], timeout=1500)
        if not check(tag + ": reference --grads", r.returncode == 0, r.stderr[-300:]):
            continue
        with open(ours_path) as f:
            ours = json.load(f)
        with open(ref_path) as f:
            ref = json.load(f)
        n_cmp = sum(len(t["index"]) for t in ref["tensors"].values())
        n_all = sum(int(np.prod(t["shape"])) for t in ref["tensors"].values())
        check(tag + ": the dump holds every tensor the reference has",
              set(ref["tensors"]) <= set(ours["tensors"]),
              sorted(set(ref["tensors"]) - set(ours["tensors"])))
        if entries == "all":
            check(tag + ": every adapter entry compared", n_cmp == n_all,
                  "%d of %d" % (n_cmp, n_all))
        lerr = abs(ours["loss"] - ref["loss"]) / abs(ref["loss"])
        check(tag + ": loss vs reference (1e-6)", lerr <= 1e-6,
              "%r vs %r (%.3g)" % (ours["loss"], ref["loss"], lerr))
        errs = tensor_errors(ours, ref)
        worst = max(errs.values())
        print("  %s: %d of %d entries compared, worst tensor error %.3g (%s)"
              % (tag, n_cmp, n_all, worst, max(errs, key=errs.get)))
        for name, e in sorted(errs.items()):
            check("%s: %s within %g" % (tag, name.split("/")[-3] + "/" + name.split("/")[-1], TOL),
                  e <= TOL, "%.3g" % e)
        # a gradient off by 1e-3 of its tensor's scale in one compared entry
        name = "lora/stack/layers/block/self_attn/q_proj/kernel/A"
        t = ref["tensors"][name]
        idx = t["index"][len(t["index"]) // 2]
        delta = 1e-3 * max(abs(g) for g in t["grad"])
        bad_path = os.path.join(tmp, preset + "_bad.json")
        r = run([dump, ck, ad, toks, bad_path, "--mask-file", masks, "--threads", "2",
                 "--perturb", "q_proj/A:%d:%.9g" % (idx, delta)])
        if check(tag + ": lora_grad_dump --perturb", r.returncode == 0, r.stderr[-300:]):
            with open(bad_path) as f:
                bad = json.load(f)
            e = tensor_errors(bad, ref)[name]
            check(tag + ": a perturbed gradient entry fails the check", e > TOL, "%.3g" % e)
        # quantised numerics: the loss against the reference, gradients sane
        q_path = os.path.join(tmp, preset + "_quant.json")
        r = run([dump, ck, ad, toks, q_path, "--mask-file", masks, "--threads", "2", "--quant"])
        if not check(tag + ": lora_grad_dump --quant", r.returncode == 0, r.stderr[-300:]):
            continue
        with open(q_path) as f:
            qd = json.load(f)
        r = run([PY, REF, ck, "--adapter", ad, *ref_seq, "--quant", "--loss"])
        if check(tag + ": reference --quant --loss", r.returncode == 0, r.stderr[-300:]):
            ql = json.loads(r.stdout.strip().splitlines()[-1])["loss"]
            qerr = abs(qd["loss"] - ql) / abs(ql)
            check(tag + ": quantised loss vs reference (1e-4)", qerr <= 1e-4,
                  "%r vs %r (%.3g)" % (qd["loss"], ql, qerr))
        names = sorted(ours["tensors"])
        gq = np.concatenate([np.asarray(qd["tensors"][k]["grad"]) for k in names])
        gf = np.concatenate([np.asarray(ours["tensors"][k]["grad"]) for k in names])
        rel = float(np.linalg.norm(gq - gf) / np.linalg.norm(gf))
        print("  %s: quantised vs float gradients rel L2 %.3g" % (tag, rel))
        check(tag + ": quantised gradients finite", bool(np.all(np.isfinite(gq))))
        check(tag + ": quantised gradients differ from the float ones", rel > 1e-4, "%.3g" % rel)
    for name in os.listdir(tmp):
        os.unlink(os.path.join(tmp, name))
    os.rmdir(tmp)
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
