#!/usr/bin/python3
"""`needle build` of a Needle 3 checkpoint: the v3 .cact archive (tag
0x05E12A84) against tests/ref/cact3_ref.py, an independent numpy port of
cactus-needle 3.x export.py (exact with the rotation rounded once, as
tests/test_cact.py does for v2):

  * byte-for-byte equal archives for the tiny3b and tiny3 fixtures
    (tools/make_needle3_fixture.py: probe heads, out_vocab, headwise gate,
    block_untied factors; engram banks, split permutations, CLA) at 4 bits,
    and at --bits 2 and 3 (heads stay at 3.x's HEAD_BITS 4);
  * the header of tiny3b field by field against values worked out by hand;
  * record order, 64-byte alignment, zero gaps, FP16 tensors equal to the
    checkpoint's in half precision, the permutation tables 3.x derives;
  * `needle inspect` shows the v3 header and names; --dequant agrees with
    the independent parser;
  * --lora (a 3.x safetensors adapter) changes exactly the five attention
    kernels, towards W + scale * A @ B;
  * hostile archives (truncated, lying sizes) fail cleanly, and `needle
    run` refuses a v3 archive with a clear message.
"""
import json
import os
import pickle
import struct
import subprocess
import sys
import tempfile

import numpy as np

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "tests", "ref"))
sys.path.insert(0, os.path.join(SRC, "tools"))
import cact_ref as R  # noqa: E402
import cact3_ref as R3  # noqa: E402
import make_needle3_fixture as F  # noqa: E402

R.EXACT_ROTATION = True  # what the C writer does; see tests/ref/cact_ref.py
NEEDLE = os.environ.get("NEEDLE") or os.path.join(SRC, "build", "needle")
FAIL = []


def check(cond, msg):
    if not cond:
        FAIL.append(msg)
        print("FAIL:", msg)
    return cond


def run(*args, ok=True):
    p = subprocess.run([NEEDLE] + [str(a) for a in args], capture_output=True)
    if ok and p.returncode != 0:
        raise SystemExit("needle %s failed (%d): %s" % (" ".join(map(str, args)), p.returncode,
                                                        p.stderr.decode()))
    return p


def tok_blob(pieces):
    """A tokenizer blob in export.py's layout (fewer pieces than the vocab is allowed)."""
    out = bytearray(struct.pack("<IIIIIBBH", pieces, 0, 1, 2, 3, 1, 1, 0))
    for i in range(pieces):
        piece = ("<%d>" % i if i < 4 else "\u2581p%d" % i).encode()
        out += struct.pack("<fBH", -0.5 * i, 2 if i < 3 else 0, len(piece)) + piece
    return bytes(out)


def fixture(tmp, preset, seed=1, heads=True, tag="", **over):
    cfg = F.config_for(preset, **over)
    params = F.random_params(cfg, np.random.default_rng(seed), heads=heads)
    path = os.path.join(tmp, preset + tag + ".safetensors")
    F.write_safetensors(path, params, F.checkpoint_metadata(cfg), dtype="F32")
    return path, cfg, {k: np.asarray(v, np.float32) for k, v in params.items()}


def first_difference(ours, ref, names):
    ho, _, ro = R3.parse3(ours)
    hr, _, rr = R3.parse3(ref)
    for k in ho:
        if ho[k] != hr.get(k):
            return "header %s: %r vs %r" % (k, ho[k], hr.get(k))
    for i, (a, b) in enumerate(zip(ro, rr)):
        for k in ("dtype", "shape4", "offset", "nbytes", "group", "bits", "blob"):
            if a[k] != b[k]:
                return "tensor %d (%s): %s differs" % (i, names[i] if i < len(names) else "?", k)
    return "lengths %d vs %d" % (len(ours), len(ref))


def same_bytes(what, ours, ref, names):
    if not check(ours == ref, "%s: our archive differs from 3.x's layout (%s)"
                 % (what, "" if ours == ref else first_difference(ours, ref, names))):
        return False
    print("ok   %s: %d bytes, identical to the reference" % (what, len(ours)))
    return True


def header_by_hand(buf):
    """tiny3b fixture: vocab 48, out_vocab 40, d 20, H 4, G 2, L 3, qk 4, v 6,
    max_seq_len 64, lanes 2, window 4, global (2,), taps 2, slots 11, orders
    (2, 4), engram_heads 1, site (1,), rope 1e4.
      hada_n = 32 (next power of two >= 20); sub = 20 // (2 * 1) = 10;
      tables = 2; dilation = max(2, 4) = 4; global mask = 1 << 2 = 4;
      kv_window: kd 8, vd 12, per_layer 8 + 12 + 0 = 20, per_site 20 + 0 = 20,
      local min(4, 64) = 4, fixed ((3 - 1) * 20 + 20) * 4 = 240,
      ctx (12058624 - 240) // 20 // 32 * 32 = 602912 -> min(., 64) = 64
      -> max(160, 64) = 160;
      tensors 1 + 3 * 27 + 9 + 2 + 4 + 1 = 98, heads 1 + 6 + 6 + 7 = 20,
      tokenizer 1: 119."""
    want = [0x05E12A84, 119, 28, 160, 8, 48, 40, 20, 4, 2, 3, 4, 6, 64, 32, 2,
            4, 4, 0, 2, 11, 10, 2, 4, 4, 0, 2, 2, 4, 0, 0, 1, 1] + [0] * 15
    got = struct.unpack_from("<48I", buf, 0)
    for i, (g, w) in enumerate(zip(got, want)):
        check(g == w, "header field %d = %d, worked out by hand %d" % (i, g, w))
    check(struct.unpack_from("<f", buf, 192)[0] == 10000.0, "rope_theta")


def layout(buf, cfg, p, names):
    h, cb, recs = R3.parse3(buf)
    check(np.array_equal(cb, np.concatenate([R.codebook(b) for b in (2, 3, 4)])),
          "the 28 codebook floats")
    pos = 196 + 28 * 4 + len(recs) * 44
    for i, r in enumerate(recs):
        al = (pos + 63) // 64 * 64
        check(r["offset"] == al, "tensor %d offset %d, aligned %d" % (i, r["offset"], al))
        check(buf[pos:al] == b"\0" * (al - pos), "gap before tensor %d is zero" % i)
        pos = r["offset"] + r["nbytes"]
    check(pos == len(buf), "the last blob ends the file")
    # every FP16 tensor is the checkpoint value in half precision
    blk = "stack/layers/block/"
    for i, name in enumerate(names):
        r = recs[i]
        if name.startswith("layer") and r["dtype"] == R3.FP16:
            layer, leaf = int(name[5:7]), name[8:]
            src = {"norm_in": blk + "ZCRMSNorm_0/scale", "post_norm": blk + "post_attn_norm/scale",
                   "pre_hada": blk + "pre_hada_norm/scale", "attn_gate": blk + "attn_gate",
                   "q_norm": blk + "self_attn/q_norm/scale",
                   "k_norm": blk + "self_attn/k_norm/scale"}.get(leaf)
            if src is None:
                src = blk + ("self_attn/" if leaf.endswith("_taps") else "hadamard_mlp/") + leaf
            want = np.asarray(p[src][layer], np.float16).reshape(-1)
            check(np.array_equal(np.frombuffer(r["blob"], np.float16), want), name)
    n = 1 << (cfg["d_model"] - 1).bit_length()
    for k, perm in zip(("hada_p1", "hada_p2"), R3.hada_perms(n, bool(cfg["ladder_widths"]))):
        r = recs[names.index(k)]
        check(r["dtype"] == R3.FP32 and np.array_equal(np.frombuffer(r["blob"], np.float32), perm),
              "%s is 3.x's permutation" % k)
    return recs


def main():
    tmp = tempfile.mkdtemp(prefix="cact3_")
    # ---- tiny3b: heads, out_vocab, headwise gate, block_untied ----
    ck, cfg, p = fixture(tmp, "tiny3b")
    blob = tok_blob(cfg["vocab_size"] - 8)
    bp = os.path.join(tmp, "tok.bin")
    with open(bp, "wb") as f:
        f.write(blob)
    out = os.path.join(tmp, "b.cact")
    run("build", ck, "--tokenizer-blob", bp, "--out", out)
    ours = open(out, "rb").read()
    ref, names = R3.build3(p, cfg, 4, blob)
    same_bytes("tiny3b W4", ours, ref, names)
    header_by_hand(ours)
    recs = layout(ours, cfg, p, names)
    check(len(recs) == 119 and names[-2] == "router_head.calibration", "heads then tokenizer")

    # inspect: the v3 header and the names; --dequant against the parser
    r = run("inspect", out).stdout.decode()
    for line in ("generation      Needle 3", "tag             0x05E12A84", "out_vocab       40",
                 "qk_head_dim     4", "v_head_dim      6", "global_layers   [2]",
                 "sliding_window  4", "qkv_conv_taps   2", "engram_orders   [2, 4]"):
        check(line in r, "inspect shows %r" % line)
    for nm in ("layer02.cond_u", "hada_p2", "engram0.value_proj", "router_head.calibration",
               "embedding_head.row_bias", "tokenizer"):
        check((" " + nm + " ") in r, "inspect names %s" % nm)
    dq = os.path.join(tmp, "q.f32")
    run("inspect", out, "--dequant", "layer01.q_proj", "--out", dq)
    got = np.fromfile(dq, np.float32)
    want = R3.dequant3(recs[names.index("layer01.q_proj")]).reshape(-1)
    check(got.shape == want.shape and np.allclose(got, want, rtol=1e-6, atol=1e-7),
          "--dequant layer01.q_proj equals the independent parser's")
    w = p["stack/layers/block/self_attn/q_proj/kernel"][1].T.reshape(-1)
    rel = np.linalg.norm(got - w) / np.linalg.norm(w)
    check(rel < 0.15, "layer01.q_proj within 4-bit CQ error of the checkpoint (%.3f)" % rel)

    # --bits 2 and 3 (3.x writes 4 only; heads stay at HEAD_BITS 4)
    for bits in (2, 3):
        o = os.path.join(tmp, "b%d.cact" % bits)
        run("build", ck, "--tokenizer-blob", bp, "--out", o, "--bits", bits)
        ref, names_b = R3.build3(p, cfg, bits, blob)
        same_bytes("tiny3b W%d" % bits, open(o, "rb").read(), ref, names_b)

    # --lora: exactly the five attention kernels change, towards W + s * A @ B
    rng = np.random.default_rng(5)
    ad = F.random_adapter(cfg, rng, 3)
    ap = os.path.join(tmp, "adapter.safetensors")
    F.write_safetensors(ap, ad, F.adapter_metadata(0.5, ck, 3, 0), dtype="F32")
    lo = os.path.join(tmp, "lora.cact")
    run("build", ck, "--lora", ap, "--tokenizer-blob", bp, "--out", lo)
    _, _, rl = R3.parse3(open(lo, "rb").read())
    changed = {names[i] for i, (a, b) in enumerate(zip(recs, rl)) if a["blob"] != b["blob"]}
    targets = {"layer%02d.%s" % (l, k) for l in range(cfg["num_layers"])
               for k in ("q_proj", "k_proj", "v_proj", "gate_proj", "out_proj")}
    check(changed == targets, "LoRA changes exactly the attention kernels (%s)"
          % sorted(changed ^ targets))
    key = "stack/layers/block/self_attn/q_proj/kernel"
    merged = (p[key][2] + (0.5 * (ad["lora/%s/A" % key][2].astype(np.float32)
                                  @ ad["lora/%s/B" % key][2].astype(np.float32)))).T
    deq = R3.dequant3(rl[names.index("layer02.q_proj")])
    check(np.linalg.norm(deq - merged) < 0.5 * np.linalg.norm(deq - p[key][2].T),
          "layer02.q_proj is the merged weight, not the base")

    # ---- tiny3: engram banks, split permutations, CLA, elementwise, shared ----
    ck3, cfg3, p3 = fixture(tmp, "tiny3", seed=2)
    blob3 = tok_blob(cfg3["vocab_size"])
    bp3 = os.path.join(tmp, "tok3.bin")
    with open(bp3, "wb") as f:
        f.write(blob3)
    out3 = os.path.join(tmp, "t3.cact")
    r3 = run("build", ck3, "--tokenizer-blob", bp3, "--out", out3)
    err = r3.stderr.decode()
    check("cla_pairs" in err and "engram_bank_ids" in err,
          "build notes what the header cannot hold: %r" % err[-300:])
    ref3, names3 = R3.build3(p3, cfg3, 4, blob3)
    buf3 = open(out3, "rb").read()
    same_bytes("tiny3 W4 (banks, split permutations)", buf3, ref3, names3)
    layout(buf3, cfg3, p3, names3)

    # ---- no window (the v2 budget rule), no taps (24 tensors a layer), no
    # heads, the config's kv_window and kv_bits, seed heads, rope_theta ----
    ck4, cfg4, p4 = fixture(tmp, "tiny3b", seed=3, heads=False, tag="v", sliding_window=0,
                            global_layers=[], qkv_conv_taps=0, out_vocab=0, kv_window=96,
                            kv_bits=4, engram_seed_heads=2, rope_theta=500000.0)
    out4 = os.path.join(tmp, "v.cact")
    run("build", ck4, "--no-tokenizer", "--out", out4)
    ref4, names4 = R3.build3(p4, cfg4, 4, None)
    buf4 = open(out4, "rb").read()
    same_bytes("tiny3b variant (no window, taps or heads)", buf4, ref4, names4)
    h4 = R3.parse3(buf4)[0]
    # by hand: no window, so per position 3 * 20 + 20 = 80 bytes, (12058624 //
    # 80) // 32 * 32 = 150720 -> min(., 64) = 64 -> max(160, 64) = 160, then
    # the config's kv_window 96 is smaller: 96; 1 + 3 * 24 + 9 + 2 + 4 + 1 = 89
    # tensors
    check((h4["kv_window"], h4["kv_bits"], h4["sliding_window"], h4["global_mask_lo"],
           h4["qkv_conv_taps"], h4["out_vocab"], h4["engram_seed_heads"], h4["num_tensors"],
           h4["rope_theta"]) == (96, 4, 0, 0, 0, 0, 2, 89, 500000.0),
          "variant header %r" % h4)

    # ---- a pickle checkpoint of float64 arrays (FP16 rounded once from
    # float64, CQ from the float32 values, as numpy does) ----
    cfg5 = F.config_for("tiny3b")
    p5 = F.random_params(cfg5, np.random.default_rng(4))
    tree = {}
    for name, a in p5.items():
        node = tree
        parts = name.split("/")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = np.asarray(a, np.float64)
    ck5 = os.path.join(tmp, "f64.pkl")
    with open(ck5, "wb") as f:
        pickle.dump({"params": tree, "config": cfg5, "format_version": 2}, f, protocol=2)
    out5 = os.path.join(tmp, "f64.cact")
    run("build", ck5, "--tokenizer-blob", bp, "--out", out5)
    ref5, names5 = R3.build3(p5, cfg5, 4, blob)
    same_bytes("tiny3b from a float64 pickle", open(out5, "rb").read(), ref5, names5)

    # ---- hostile archives and the engine's refusal ----
    for n in (0, 100, 196, 300, len(ours) // 2, len(ours) - 1):
        bad = os.path.join(tmp, "trunc.cact")
        with open(bad, "wb") as f:
            f.write(ours[:n])
        r = run("inspect", bad, ok=False)
        check(r.returncode == 1 and r.stderr, "truncated to %d bytes: a clean error (rc %d)"
              % (n, r.returncode))
    liar = bytearray(ours)
    at = 196 + 28 * 4 + 2 * 44 + 28  # tensor 2's nbytes
    liar[at:at + 8] = struct.pack("<Q", 1 << 40)
    bad = os.path.join(tmp, "liar.cact")
    with open(bad, "wb") as f:
        f.write(liar)
    r = run("inspect", bad, ok=False)
    check(r.returncode == 1 and b"tensor 2" in r.stderr, "a lying size names the tensor: %r"
          % r.stderr[-200:])
    tools = os.path.join(tmp, "tools.json")
    with open(tools, "w") as f:
        json.dump([{"name": "f", "description": "d",
                    "parameters": {"type": "object", "properties": {}}}], f)
    r = run("run", "--weights", out, "--tools", tools, "hi", ok=False)
    # the engine runs v3 archives (tests/test_session3.py); this one's
    # tokenizer blob is a stand-in without byte pieces, refused by name
    check(r.returncode != 0 and r.returncode < 128 and b"tokenizer" in r.stderr,
          "`needle run` refuses the stand-in tokenizer clearly: %r" % r.stderr[-300:])

    for name in os.listdir(tmp):
        os.unlink(os.path.join(tmp, name))
    os.rmdir(tmp)
    print("test_cact3: %d failures" % len(FAIL))
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
