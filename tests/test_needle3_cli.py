#!/usr/bin/python3
"""`needle init --preset tiny3|tiny3b` writes a Needle 3 (cactus-needle 3.x)
checkpoint and `needle inspect` reads it back as Needle 3.

Checks, written from upstream 3.x architecture.py (not from our C code):
  * the pickle loads with Python; format_version == 2; the config carries
    3.x's TransformerConfig fields (no attn_dim);
  * the parameter tree has exactly 3.x's flax paths and shapes for the
    config: separate qk/v head dims, q/k/v conv taps, headwise or
    elementwise gate_proj, shared or block_untied Kronecker factors
    (n = next power of two >= d, ba = 1 << (bit_length(n-1) // 2)),
    b2/d4/cond_v/cond_u, engram banks + readers or per-site engrams, and the
    three probe heads; float32 arrays;
  * initialisers: Walsh factors (Sylvester, / sqrt(size)), identity taps per
    layer, d1 = d2 = d3 = 1, b2 = 0, d4 = 0.02, cond_u = 0, heads' gain 1,
    row_bias 0, log_temp log 10, bias -10;
  * `needle inspect` prints "Needle 3" and the 3.x fields for them, and
    "Needle 2" for a tiny Needle 2 checkpoint; a non-adjacent CLA pair is
    refused naming cla_pairs; `needle build` writes a Needle 3 archive, and
    without a tokenizer (offline) names Needle 3's repository for it, not
    Needle 2's.
"""
import math
import os
import pickle
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "ref"))
from harness import Checker, find_needle, run  # noqa: E402


def flatten(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        name = prefix + "/" + k if prefix else k
        if isinstance(v, dict):
            out.update(flatten(v, name))
        else:
            out[name] = v
    return out


def expected_shapes(c):
    """3.x's parameter tree for config dict c (architecture.py)."""
    V, d, H, G, L = c["vocab_size"], c["d_model"], c["num_heads"], c["num_kv_heads"], c["num_layers"]
    qk = c["qk_head_dim"] or d // H
    v = c["v_head_dim"] or d // H
    n = 1 << (d - 1).bit_length()
    ba = 1 << ((n - 1).bit_length() // 2)
    bb = n // ba
    lanes = c["mhc_lanes"]
    orders = c["engram_orders"]
    heads = c["engram_heads"] or max(1, d // (len(orders) * 128))
    sub = d // (len(orders) * heads)
    K = len(orders) * heads
    b = "stack/layers/block/"
    s = {"embedding/embedding": (V, d),
         b + "ZCRMSNorm_0/scale": (L, d),
         b + "self_attn/q_proj/kernel": (L, d, H * qk),
         b + "self_attn/k_proj/kernel": (L, d, G * qk),
         b + "self_attn/v_proj/kernel": (L, d, G * v),
         b + "self_attn/q_norm/scale": (L, qk),
         b + "self_attn/k_norm/scale": (L, qk),
         b + "self_attn/gate_proj/kernel": (L, d, H if c["attention_gate"] == "headwise" else H * v),
         b + "self_attn/out_proj/kernel": (L, H * v, d),
         b + "post_attn_norm/scale": (L, d),
         b + "pre_hada_norm/scale": (L, d),
         b + "attn_gate": (L,),
         "stack/final_norm/scale": (d,),
         "stack/mhc_phi_pre": (L, lanes * d, lanes), "stack/mhc_phi_post": (L, lanes * d, lanes),
         "stack/mhc_phi_res": (L, lanes * d, lanes * lanes),
         "stack/mhc_b_pre": (L, lanes), "stack/mhc_b_post": (L, lanes),
         "stack/mhc_b_res": (L, lanes, lanes),
         "stack/mhc_a_pre": (L,), "stack/mhc_a_post": (L,), "stack/mhc_a_res": (L,)}
    T = c["qkv_conv_taps"]
    if T:
        s[b + "self_attn/q_taps"] = (L, T, H * qk)
        s[b + "self_attn/k_taps"] = (L, T, G * qk)
        s[b + "self_attn/v_taps"] = (L, T, G * v)
    for k in (1, 2, 3):
        if c["hada_factor_mode"] == "block_untied":
            s[b + "hadamard_mlp/w%da" % k] = (L, bb, ba, ba)
            s[b + "hadamard_mlp/w%db" % k] = (L, ba, bb, bb)
        else:
            s[b + "hadamard_mlp/w%da" % k] = (L, ba, ba)
            s[b + "hadamard_mlp/w%db" % k] = (L, bb, bb)
    for name in ("d1", "d2", "b2", "d3", "d4"):
        s[b + "hadamard_mlp/" + name] = (L, n)
    s[b + "hadamard_mlp/cond_v"] = (L, d, 8)
    s[b + "hadamard_mlp/cond_u"] = (L, 8, n)
    sites = len(c["engram_layers"])
    banks = c["engram_bank_ids"]
    for i in range(sites):
        pre = "engram_readers_%d/" % i if banks else "engrams_%d/" % i
        if not banks:
            s[pre + "embedding"] = (K, c["engram_slots"], sub)
        s[pre + "key_proj/kernel"] = (K * sub, d)
        s[pre + "value_proj/kernel"] = (K * sub, d)
        s[pre + "taps"] = (4, d)
    if banks:
        for i in range(max(banks) + 1):
            s["engram_banks_%d/embedding" % i] = (K, c["engram_slots"], sub)
    for head, out in (("embedding_head", c["embedding_dim"]), ("confidence_head", 1),
                      ("router_head", 3)):
        key = head.split("_")[0]
        k, q = c[key + "_probes"], c[key + "_queries"]
        s[head + "/probes"] = (L + 1, k, d)
        s[head + "/gain"] = (L + 1, k)
        s[head + "/query"] = (q, d)
        s[head + "/row_bias"] = (q, L + 1, k)
        s[head + "/proj/kernel"] = (q * d, out)
        if head == "embedding_head":
            s[head + "/log_temp"] = ()
            s[head + "/bias"] = ()
        else:
            s[head + "/proj/bias"] = (out,)
    return s, (ba, bb, n)


def walsh(k):
    h = np.array([[1.0]])
    while h.shape[0] < k:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(k)).astype(np.float32)


def main():
    check = Checker()
    needle = find_needle()
    if not check("needle binary found", needle is not None):
        return check.finish()
    tmp = tempfile.mkdtemp(prefix="needle3_cli_")
    for preset, expect in (("tiny3", {"attention_gate": "elementwise", "qkv_conv_taps": 3,
                                      "engram_bank_ids": (0, 0), "cla_pairs": ((1, 2),)}),
                           ("tiny3b", {"attention_gate": "headwise", "out_vocab": 8000,
                                       "hada_factor_mode": "block_untied"})):
        path = os.path.join(tmp, preset + ".pkl")
        r = run([needle, "init", path, "--preset", preset, "--seed", "5"])
        if not check(preset + ": init", r.returncode == 0, r.stderr[-300:]):
            continue
        with open(path, "rb") as f:
            ck = pickle.load(f)
        c = ck["config"]
        check(preset + ": format_version 2", ck.get("format_version") == 2)
        check(preset + ": 3.x config (no attn_dim)", "attn_dim" not in c and "qk_head_dim" in c)
        for k, v in expect.items():
            check(preset + ": config " + k, c.get(k) == v, repr(c.get(k)))
        flat = flatten(ck["params"])
        shapes, (ba, bb, n) = expected_shapes(c)
        got = {k: tuple(np.asarray(v).shape) for k, v in flat.items()}
        missing = sorted(set(shapes) - set(got))
        extra = sorted(set(got) - set(shapes))
        check(preset + ": parameter names", not missing and not extra,
              "missing %s extra %s" % (missing[:4], extra[:4]))
        bad = [k for k in shapes if k in got and got[k] != shapes[k]]
        check(preset + ": parameter shapes", not bad,
              "; ".join("%s %s != %s" % (k, got[k], shapes[k]) for k in bad[:4]))
        check(preset + ": float32", all(np.asarray(v).dtype == np.float32 for v in flat.values()))
        hm = "stack/layers/block/hadamard_mlp/"
        ok = True
        for k in (1, 2, 3):
            for suffix, size in (("a", ba), ("b", bb)):
                w = np.asarray(flat[hm + "w%d%s" % (k, suffix)])
                ok &= bool(np.all(w.reshape(-1, size, size) == walsh(size)))
        check(preset + ": Walsh factors", ok)
        check(preset + ": d1 d2 d3 = 1, b2 = 0, d4 = 0.02, cond_u = 0",
              all(np.all(np.asarray(flat[hm + x]) == 1) for x in ("d1", "d2", "d3"))
              and np.all(np.asarray(flat[hm + "b2"]) == 0)
              and np.all(np.asarray(flat[hm + "d4"]) == np.float32(0.02))
              and np.all(np.asarray(flat[hm + "cond_u"]) == 0))
        cv = np.asarray(flat[hm + "cond_v"])
        check(preset + ": cond_v ~ N(0, 0.02)", abs(cv.std() - 0.02) < 0.004, "std %.4f" % cv.std())
        taps = np.asarray(flat["stack/layers/block/self_attn/v_taps"])
        check(preset + ": identity taps per layer", bool(np.all(taps[:, 0] == 1)
                                                          and np.all(taps[:, 1:] == 0)))
        check(preset + ": heads", np.all(np.asarray(flat["router_head/gain"]) == 1)
              and np.all(np.asarray(flat["confidence_head/row_bias"]) == 0)
              and abs(float(flat["embedding_head/log_temp"]) - math.log(10)) < 1e-6
              and float(flat["embedding_head/bias"]) == -10)
        r = run([needle, "inspect", path])
        check(preset + ": inspect says Needle 3", r.returncode == 0 and "Needle 3" in r.stdout,
              r.stderr[-200:])
        for k, v in expect.items():
            shown = {"engram_bank_ids": "(0, 0)", "cla_pairs": "((1, 2))"}.get(k, str(v))
            check(preset + ": inspect shows " + k,
                  any(line.split()[:1] == [k] and shown in line for line in r.stdout.splitlines()))
    path = os.path.join(tmp, "tiny.pkl")
    r = run([needle, "init", path, "--preset", "tiny"])
    r = run([needle, "inspect", path])
    check("tiny (v2): inspect says Needle 2", r.returncode == 0 and "Needle 2" in r.stdout)
    # a 3.x config that 3.x refuses is refused, naming the key
    t3 = os.path.join(tmp, "tiny3.pkl")
    if check("tiny3 checkpoint for the refusal check", os.path.exists(t3)):
        with open(t3, "rb") as f:
            ck = pickle.load(f)
        ck["config"]["cla_pairs"] = ((0, 2),)
        bad = os.path.join(tmp, "bad.pkl")
        with open(bad, "wb") as f:
            pickle.dump(ck, f, protocol=2)
        r = run([needle, "inspect", bad])
        check("non-adjacent CLA pair refused", r.returncode != 0 and "cla_pairs" in r.stderr,
              r.stderr[-200:])
        # build writes the Needle 3 archive (tag 0x05E12A84; tests/test_cact3.py
        # checks its layout)
        out = os.path.join(tmp, "t3.cact")
        r = run([needle, "build", t3, "--no-tokenizer", "--out", out])
        ok = r.returncode == 0 and os.path.exists(out)
        if ok:
            with open(out, "rb") as f:
                ok = f.read(4) == b"\x84\x2a\xe1\x05"
        check("build writes a Needle 3 archive", ok, r.stderr[-200:])
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9",
                   NEEDLE_TOKENIZER="")
        notok = os.path.join(tmp, "notok.cact")
        r = subprocess.run([needle, "build", t3, "--out", notok], capture_output=True, text=True,
                           timeout=120, env=env)
        check("build without a tokenizer names Needle 3's repository",
              r.returncode != 0 and "Cactus-Compute/needle3" in r.stderr
              and "needle2" not in r.stderr and not os.path.exists(notok), r.stderr[-300:])
    for name in os.listdir(tmp):
        os.unlink(os.path.join(tmp, name))
    os.rmdir(tmp)
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
