#!/usr/bin/python3
"""`needle init` writes an upstream-format checkpoint with upstream's initialisers.

Runs  $NEEDLE init OUT.pkl --preset tiny --seed 1   (and --seed 1 again,
--seed 2, and --preset tiny --layers 3 --d-model 96 --seed 1) and checks:
  * the pickle loads with Python; format_version == 2; config has the tiny
    values (overridden ones where given); fields that are present and not
    overridden have upstream's defaults;
  * the parameter tree has exactly the names/shapes of upstream model.init
    (docs/formats.md §1.4 plus mtp_*; no contrastive/confidence heads), float32 ndarrays;
  * initialisers: embedding, q/k/v/gate kernels, mhc_phi_*, engram tables,
    key_proj, mtp_combine ~ N(0, 0.02); out_proj and engram value_proj
    ~ N(0, 0.02/sqrt(2L)) (std within 10%, mean ~0); norm scales,
    attn_gate, b_pre, b_post == 0; taps[0] == 1, taps[1:] == 0;
    b_res == 4 I; a_* == 0.01; d1 == d2 == 1; d3 == 0.02;
    per-layer slices and different tensors are not copies of each other;
  * same seed -> identical bytes; different seed -> different params;
  * `needle eval` on the fresh checkpoint matches the numpy reference.
"""
import math
import os
import pickle
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "ref"))
import make_ckpt  # noqa: E402
import san_ref as R  # noqa: E402
from harness import Checker, find_needle, run, write_tokens, split_logits, check_eval_json  # noqa: E402

TOL = 1e-4


def init_class(path, L):
    """-> ('normal', std) | ('const', value) | ('taps',) | ('b_res',)"""
    leaf = path.rsplit("/", 1)[-1]
    if path.endswith("out_proj/kernel") or path.endswith("value_proj/kernel"):
        return ("normal", 0.02 / math.sqrt(2 * L))
    if leaf in ("kernel", "embedding") or path.startswith("stack/mhc_phi"):
        return ("normal", 0.02)
    if leaf in ("scale", "attn_gate", "mhc_b_pre", "mhc_b_post"):
        return ("const", 0.0)
    if leaf.startswith("mhc_a_"):
        return ("const", np.float32(0.01))
    if leaf in ("d1", "d2"):
        return ("const", 1.0)
    if leaf == "d3":
        return ("const", np.float32(0.02))
    if leaf == "taps":
        return ("taps",)
    if leaf == "mhc_b_res":
        return ("b_res",)
    raise KeyError(path)


def check_checkpoint(check, path, tag, want_cfg):
    try:
        with open(path, "rb") as f:
            ck = pickle.load(f)
    except Exception as e:  # noqa: BLE001
        check(tag + " pickle loads", False, repr(e))
        return None
    ok = isinstance(ck, dict) and ck.get("format_version") == 2 and \
        isinstance(ck.get("config"), dict) and isinstance(ck.get("params"), dict)
    if not check(tag + " format_version 2, config and params dicts", ok,
                 "" if ok else repr(type(ck)) + repr(list(ck)[:5] if isinstance(ck, dict) else "")):
        return None
    cfg = ck["config"]
    bad = []
    for k, v in want_cfg.items():
        got = cfg.get(k, "<missing>")
        if isinstance(v, tuple):
            got = tuple(got) if isinstance(got, (list, tuple)) else got
        if got != v:
            bad.append("%s=%r (want %r)" % (k, got, v))
    for k, v in make_ckpt.CONFIG_DEFAULTS.items():
        if k in want_cfg or k not in cfg or k in ("dtype", "flash", "remat", "scan_unroll",
                                                  "attn_dim"):
            continue
        got = tuple(cfg[k]) if isinstance(v, tuple) and isinstance(cfg[k], (list, tuple)) else cfg[k]
        if got != v:
            bad.append("%s=%r (default %r)" % (k, got, v))
    if "attn_dim" in cfg and cfg["attn_dim"] not in (0, want_cfg["d_model"]):
        bad.append("attn_dim=%r" % cfg["attn_dim"])
    check(tag + " config values", not bad, "; ".join(bad))

    flat = make_ckpt.flatten(ck["params"])
    full = make_ckpt.full_config(cfg)
    want = make_ckpt.param_shapes(full)
    missing = sorted(set(want) - set(flat))
    extra = sorted(set(flat) - set(want))
    check(tag + " param names == upstream model.init (%d tensors)" % len(want),
          not missing and not extra, "missing %s extra %s" % (missing[:6], extra[:6]))
    badshape = [k for k in want if k in flat and
                (not isinstance(flat[k], np.ndarray) or flat[k].shape != want[k])]
    check(tag + " param shapes and ndarray type", not badshape,
          ", ".join("%s %s" % (k, getattr(flat[k], "shape", type(flat[k]))) for k in badshape[:6]))
    baddt = [k for k in flat if getattr(flat[k], "dtype", None) != np.float32]
    check(tag + " all params float32", not baddt, ", ".join(baddt[:6]))

    L = full["num_layers"]
    stat_bad, const_bad = [], []
    for k in want:
        if k not in flat or k in badshape:
            continue
        a = np.asarray(flat[k], dtype=np.float64)
        c = init_class(k, L)
        if c[0] == "normal":
            std = float(a.std())
            mean = float(a.mean())
            lim = 5 * c[1] / math.sqrt(a.size)
            print("    %-44s n=%7d std %.5f (want %.5f) mean %+.1e" % (k, a.size, std, c[1], mean))
            if abs(std / c[1] - 1) > 0.10 or abs(mean) > lim:
                stat_bad.append("%s std %.5f mean %.1e" % (k, std, mean))
        elif c[0] == "const":
            if not np.all(a == np.float64(np.float32(c[1]))):
                const_bad.append("%s (want %r, got e.g. %r)" % (k, float(c[1]), a.reshape(-1)[:3]))
        elif c[0] == "taps":
            exp = np.zeros(a.shape)
            exp[0] = 1.0
            if not np.array_equal(a, exp):
                const_bad.append(k)
        elif c[0] == "b_res":
            n = a.shape[-1]
            if not np.array_equal(a, np.broadcast_to(4 * np.eye(n), a.shape)):
                const_bad.append(k)
    check(tag + " normal initialisers (std within 10%, mean ~0)", not stat_bad,
          "; ".join(stat_bad[:4]))
    check(tag + " constant initialisers (zeros/ones/0.01/0.02/taps/4I)", not const_bad,
          "; ".join(const_bad[:4]))

    # independence: no two random tensors / layer slices share values
    seen, dup = {}, []
    for k in want:
        if k in flat and k not in badshape and init_class(k, L)[0] == "normal":
            a = np.asarray(flat[k])
            slices = [a[i] for i in range(a.shape[0])] if k.startswith("stack/layers") or \
                k.startswith("stack/mhc_phi") else [a]
            for i, s in enumerate(slices):
                key = s.reshape(-1)[:8].tobytes()
                if key in seen:
                    dup.append("%s[%d] == %s" % (k, i, seen[key]))
                seen[key] = "%s[%d]" % (k, i)
    check(tag + " random tensors and layer slices are distinct", not dup, "; ".join(dup[:4]))
    return ck


def eval_matches(check, needle, ckpt_path, td, tag):
    m = R.load(ckpt_path)
    rng = np.random.default_rng(7)
    seqs = [[5], [int(t) for t in rng.integers(0, m.V, 19)],
            ([3, 9, 3, 9, 27] * 8)[:37]]
    tf = os.path.join(td, tag + ".txt")
    write_tokens(tf, seqs)
    ob = os.path.join(td, tag + ".bin")
    r = run([needle, "eval", "--checkpoint", ckpt_path, "--tokens", tf, "--json", "--logits", ob])
    if not check("[%s] eval on init checkpoint exits 0" % tag, r.returncode == 0,
                 r.stderr[-300:]):
        return
    js = check_eval_json(check, r.stdout, seqs, "[%s]" % tag)
    try:
        got = split_logits(ob, seqs, m.V)
    except (ValueError, OSError) as e:
        check("[%s] logits file" % tag, False, str(e))
        return
    errs = []
    for s, g in zip(seqs, got):
        ref = R.forward(m, s)
        errs.append(float(np.max(np.abs(g - ref)) / np.max(np.abs(ref))))
    check("[%s] eval logits vs reference <= %g" % (tag, TOL), max(errs) <= TOL,
          " ".join("%.1e" % e for e in errs))
    if js is not None:
        _, summ = R.evaluate(m, seqs)
        e = abs(js["mean_loss"] - summ["mean_loss"]) / summ["mean_loss"]
        check("[%s] mean_loss vs reference" % tag, e <= TOL,
              "c %.6f ref %.6f" % (js["mean_loss"], summ["mean_loss"]))


def main():
    check = Checker()
    needle = find_needle()
    if not check("needle program found ($NEEDLE)", needle is not None,
                 str(os.environ.get("NEEDLE"))):
        return check.finish()
    tiny = dict(make_ckpt.TINY)
    with tempfile.TemporaryDirectory() as td:
        p1 = os.path.join(td, "s1.pkl")
        p1b = os.path.join(td, "s1b.pkl")
        p2 = os.path.join(td, "s2.pkl")
        p3 = os.path.join(td, "l3.pkl")
        runs = [(p1, ["--preset", "tiny", "--seed", "1"]),
                (p1b, ["--preset", "tiny", "--seed", "1"]),
                (p2, ["--preset", "tiny", "--seed", "2"]),
                (p3, ["--preset", "tiny", "--layers", "3", "--d-model", "96", "--seed", "1"])]
        for path, args in runs:
            r = run([needle, "init", path] + args)
            check("init %s exits 0 and writes the file" % " ".join(args),
                  r.returncode == 0 and os.path.isfile(path),
                  "rc=%d %s" % (r.returncode, r.stderr[-300:]))
        if not os.path.isfile(p1):
            return check.finish()
        ck1 = check_checkpoint(check, p1, "[tiny seed1]", tiny)
        if os.path.isfile(p1b):
            with open(p1, "rb") as f1, open(p1b, "rb") as f2:
                check("same seed -> identical bytes", f1.read() == f2.read())
        if os.path.isfile(p2) and ck1 is not None:
            with open(p2, "rb") as f:
                ck2 = pickle.load(f)
            a = make_ckpt.flatten(ck1["params"])
            b = make_ckpt.flatten(ck2["params"])
            diff = [k for k in ("embedding/embedding", "stack/layers/block/self_attn/q_proj/kernel",
                                "engrams_0/embedding", "stack/mhc_phi_res")
                    if k in a and k in b and not np.array_equal(a[k], b[k])]
            check("different seed -> different random params", len(diff) == 4, str(diff))
        if os.path.isfile(p3):
            want = dict(tiny, num_layers=3, d_model=96)
            check_checkpoint(check, p3, "[tiny L3 d96]", want)
        if ck1 is not None:
            eval_matches(check, needle, p1, td, "init-tiny")
        if os.path.isfile(p3):
            eval_matches(check, needle, p3, td, "init-L3-d96")
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
