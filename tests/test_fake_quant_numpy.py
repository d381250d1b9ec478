#!/usr/bin/env python3
"""Needle 3 training numerics (src/model/fake_quant.c) against numpy.

The reference below is written from reading upstream's 3.x quantize.py
(fake_quant, fake_quant_act, maybe_quant_query, maybe_quant_kv,
cq_quantize, cq_ste_params' leaf rule) as float32 numpy. C's results
(build/fake_quant_tool) must equal it bit for bit: the quantisers are
elementwise float32 operations (no sums) except CQ's rotation and norm,
where both sides use the same order (rotation: each output the float32
rounding of a float64 sum of exact float32 products; norm: numpy's
float32 pairwise sum).
"""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from fq3_ref import (F32, ref_cq_ste, ref_cq_ste_leaf, ref_fake_quant,  # noqa: E402
                     ref_leaf_rule)

BUILD = os.environ.get("NEEDLE_BUILD", "build")
TOOL = os.path.join(BUILD, "fake_quant_tool")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL", what, file=sys.stderr)


# ---------------------------------------------------------------- reference:
# tools/fq3_ref.py

# ---------------------------------------------------------------- C side

TMP = tempfile.mkdtemp(prefix="fq3_")


def run_tool(args, x, out_shape):
    src, dst = os.path.join(TMP, "in.f32"), os.path.join(TMP, "out.f32")
    np.ascontiguousarray(x, F32).tofile(src)
    if os.path.exists(dst):
        os.remove(dst)
    args = [a if a not in ("IN", "OUT") else (src if a == "IN" else dst) for a in args]
    p = subprocess.run([TOOL] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=300)
    if p.returncode:
        return None, p.stdout.strip() + p.stderr.strip()
    return np.fromfile(dst, F32).reshape(out_shape), p.stdout.strip()


def same_bits(a, b):
    """bit-for-bit, NaN matching NaN (payloads aside)"""
    if a is None or a.shape != b.shape:
        return False
    na, nb = np.isnan(a), np.isnan(b)
    return bool((na == nb).all() and (a[~na].view(np.uint32) == b[~nb].view(np.uint32)).all())


def diff(a, b):
    if a is None or a.shape != b.shape:
        return "no output of the right shape"
    bad = (a.view(np.uint32) != b.view(np.uint32)) & ~(np.isnan(a) & np.isnan(b))
    if not bad.any():
        return ""
    i = tuple(np.argwhere(bad)[0])
    return f"{int(bad.sum())} of {a.size} differ, first at {list(i)}: {a[i]!r} vs {b[i]!r}"


# ---------------------------------------------------------------- inputs


def activation_rows(rng, rows, dim):
    """normal rows over 12 decades, plus rows built to hit the edges"""
    x = (rng.standard_normal((rows, dim)) * 10.0 ** rng.uniform(-6, 6, (rows, 1))).astype(F32)
    k = 0
    if rows > 12:
        e = F32(2.0) ** rng.integers(-20, 20)
        # exact ties: absmax 127*2^e gives scale 2^e; (m + 1/2) 2^e are halves
        x[k] = (rng.integers(-126, 126, dim) + 0.5).astype(F32) * e
        x[k, 0] = F32(127) * e
        k += 1
        x[k] = 0.0  # all-zero row: scale 1, zeros out
        k += 1
        x[k] = -np.abs(x[k])  # negative only
        k += 1
        x[k] = 0.0
        x[k, dim - 1] = F32(-3.5)  # one nonzero at the row's end
        k += 1
        x[k] = (rng.standard_normal(dim) * 1e-42).astype(F32)  # subnormal: scale 0, clips
        k += 1
        x[k] = rng.standard_normal(dim).astype(F32) * F32(400)
        x[k, dim // 2] = np.nan  # NaN absmax: scale 1, clipping
        k += 1
        x[k] = rng.standard_normal(dim).astype(F32)
        x[k, 0] = np.inf
        k += 1
        x[k] = F32(3.4e38) * np.sign(rng.standard_normal(dim)).astype(F32)  # near FLT_MAX
        k += 1
    return x


def main():
    if not os.path.exists(TOOL):
        print(f"{TOOL} not built", file=sys.stderr)
        return 1
    rng = np.random.default_rng(31)

    # fake_quant / fake_quant_act at several widths and row lengths
    for bits in (8, 4, 2, 16):
        for dim in (1, 3, 24, 48, 64, 96, 768, 3072):
            rows = 40 if dim < 3072 else 16
            x = activation_rows(rng, rows, dim)
            got, msg = run_tool(["fq", bits, rows, dim, "IN", "OUT"], x, x.shape)
            want = ref_fake_quant(x, dim, bits)
            check(same_bits(got, want), f"fake_quant bits {bits} dim {dim}: {msg} {diff(got, want)}")
    x = activation_rows(rng, 64, 768)
    for act_bits in (8, 4):
        got, msg = run_tool(["act", act_bits, 64, 768, "IN", "OUT"], x, x.shape)
        check(same_bits(got, ref_fake_quant(x, 768, act_bits)), f"act {act_bits}: {msg}")
        # maybe_quant_query: 8 bits whatever ACT_BITS is, per head vector
        got, msg = run_tool(["query", act_bits, 64 * 16, 48, "IN", "OUT"], x, (64 * 16, 48))
        check(same_bits(got, ref_fake_quant(x.reshape(-1, 48), 48, 8)), f"query {act_bits}: {msg}")
    got, msg = run_tool(["query", 0, 64 * 16, 48, "IN", "OUT"], x, (64 * 16, 48))
    check(same_bits(got, x.reshape(-1, 48)), f"query with act_bits 0 is the identity: {msg}")

    # maybe_quant_kv: 0 off, >= 8 int8 per head, 1..7 CQ at group 64 (48 pads;
    # 1 bit: +-sqrt(2/pi), 5..7: Lloyd-Max of 32..128 levels, no stored form)
    for hd in (48, 64, 128):
        kv = (rng.standard_normal((300, hd)) * rng.uniform(0.1, 10, (300, 1))).astype(F32)
        kv[3] = 0.0
        for kv_bits in (0, 8, 16, 2, 3, 4, 1, 5, 6, 7):
            got, msg = run_tool(["kv", kv_bits, 64, 300, hd, "IN", "OUT"], kv, kv.shape)
            if kv_bits == 0:
                want = kv
            elif kv_bits >= 8:
                want = ref_fake_quant(kv, hd, 8)
            else:
                want = ref_cq_ste(kv, kv_bits, 64)
            check(same_bits(got, want), f"kv bits {kv_bits} hd {hd}: {msg} {diff(got, want)}")
            if kv_bits == 4:
                check(np.all(got[3] == 0), "an all-zero head vector stays zero under CQ")

    # cq_ste_params leaves at W4 group 128 (and W2/W3), kernels reduce their input axis
    leaves = [
        ("stack/layers/block/self_attn/q_proj/kernel", (3, 200, 40)),
        ("stack/layers/block/self_attn/out_proj/kernel", (2, 128, 24)),
        ("embedding/embedding", (50, 160)),
        ("engrams_0/embedding", (2, 30, 128)),
        ("engrams_1/key_proj/kernel", (256, 24)),
        ("stack/mhc_phi_res", (2, 96, 9)),
        ("stack/layers/block/ZCRMSNorm_0/scale", (3, 24)),
        ("stack/layers/block/hadamard_mlp/w1a", (3, 8, 8)),
        ("embedding_head/probes", (4, 4, 24)),
    ]
    for bits in (4, 2, 3):
        for path, shape in leaves:
            w = (rng.standard_normal(shape) * 0.02).astype(F32)
            if len(shape) == 3 and shape[1] >= 128:
                w[0, :128, 0] = 0.0  # one all-zero group
            got, msg = run_tool(["leaf", path, bits, 128, "IN", "OUT", *shape], w, shape)
            want = ref_cq_ste_leaf(path, w, bits, 128)
            check(msg == str(ref_leaf_rule(path, len(shape))) or got is None,
                  f"leaf rule of {path}: {msg}")
            check(same_bits(got, want), f"cq_ste {path} W{bits}: {msg} {diff(got, want)}")
            if ref_leaf_rule(path, len(shape)):
                check(not np.array_equal(got, w), f"{path} W{bits} is quantised")

    # the rule over every leaf name of a 3.x checkpoint (TEAM.md list)
    names = {
        "embedding/embedding": 2, "stack/mhc_phi_pre": 3, "stack/mhc_phi_post": 3,
        "stack/mhc_phi_res": 3, "stack/mhc_b_pre": 2, "stack/mhc_b_res": 3, "stack/mhc_a_pre": 1,
        "stack/final_norm/scale": 1, "stack/layers/block/ZCRMSNorm_0/scale": 2,
        "stack/layers/block/self_attn/q_proj/kernel": 3,
        "stack/layers/block/self_attn/k_proj/kernel": 3,
        "stack/layers/block/self_attn/v_proj/kernel": 3,
        "stack/layers/block/self_attn/gate_proj/kernel": 3,
        "stack/layers/block/self_attn/out_proj/kernel": 3,
        "stack/layers/block/self_attn/q_taps": 3, "stack/layers/block/self_attn/k_taps": 3,
        "stack/layers/block/self_attn/q_norm/scale": 2, "stack/layers/block/attn_gate": 1,
        "stack/layers/block/post_attn_norm/scale": 2,
        "stack/layers/block/hadamard_mlp/w1a": 3, "stack/layers/block/hadamard_mlp/w2b": 4,
        "stack/layers/block/hadamard_mlp/d4": 2, "stack/layers/block/hadamard_mlp/cond_v": 3,
        "stack/layers/block/hadamard_mlp/cond_u": 3, "engrams_2/embedding": 3,
        "engrams_2/key_proj/kernel": 2, "engrams_2/value_proj/kernel": 2, "engrams_2/taps": 2,
        "engram_banks_0/embedding": 3, "engram_readers_1/key_proj/kernel": 2,
        "embedding_head/probes": 3, "embedding_head/query": 2, "embedding_head/gain": 2,
        "embedding_head/proj/kernel": 2, "embedding_head/log_temp": 0,
        "confidence_head/proj/kernel": 2, "confidence_head/proj/bias": 1,
    }
    for path, ndim in names.items():
        out = subprocess.run([TOOL, "rule", path, str(ndim)], capture_output=True, text=True)
        check(out.stdout.strip() == str(ref_leaf_rule(path, ndim)),
              f"rule {path}: {out.stdout.strip()} != {ref_leaf_rule(path, ndim)}")

    # widths the numerics refuse, with the config field named
    x = rng.standard_normal((2, 8)).astype(F32)
    for args, field in ((["act", 0, 2, 8, "IN", "OUT"], "act_bits"),
                        (["act", 1, 2, 8, "IN", "OUT"], "act_bits"),
                        (["kv", -1, 64, 2, 8, "IN", "OUT"], "kv_bits"),
                        (["kv", 4, 48, 2, 8, "IN", "OUT"], "kv group")):
        got, msg = run_tool(args, x, x.shape)
        check(got is None and msg.startswith("ERROR ND_EARG") and field in msg,
              f"{args[:2]} refused naming {field}: {msg}")

    if failures:
        print(f"test_fake_quant_numpy: {len(failures)} failure(s)", file=sys.stderr)
        return 1
    print("test_fake_quant_numpy: ok")
    return 0


if __name__ == "__main__":
    try:
        rc = main()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(rc)
