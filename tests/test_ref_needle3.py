#!/usr/bin/python3
"""Self-tests of the Needle 3 reference (tools/ref_needle3.py) and its fixture
writer (tools/make_needle3_fixture.py); docs/model.md §6 is what they check.

Each check compares two independent routes to the same number, or asserts
that a piece of the model does (or, where upstream says so, does not)
change the output; every one of them fails when the piece it names is
computed differently. Python stdlib + numpy only; no build needed.
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "tools"))
import make_needle3_fixture as fx  # noqa: E402
import ref_needle3 as ref  # noqa: E402

TMP = tempfile.mkdtemp(prefix="ref_needle3_")
failures = []
TOKENS = [1, 5, 7, 5, 7, 9, 0, 39, 5, 7, 5, 2]


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else "  " + detail))
    if not ok:
        failures.append(name)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def fixture(preset, dtype="f32", seed=0, adapter=False, extra=()):
    out = os.path.join(TMP, "%s_%s_%d%s.safetensors" % (preset, dtype, seed, "".join(extra)))
    argv = [out, "--preset", preset, "--dtype", dtype, "--seed", str(seed)] + list(extra)
    if adapter:
        argv += ["--adapter", out.replace(".safetensors", ".lora.safetensors")]
    if fx.main(argv) != 0:
        raise SystemExit("fixture writer failed")
    return out


def model_of(P, cfg):
    return ref.Model(P, cfg)


# ------------------------------------------------------------------ file format

def test_safetensors_layout():
    path = fixture("tiny3")
    raw = open(path, "rb").read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    check("header length is a multiple of 8", hlen % 8 == 0, str(hlen))
    meta = header.pop("__metadata__")
    check("metadata keys are write_checkpoint's",
          sorted(meta) == ["config", "format_version", "run", "step"], str(sorted(meta)))
    check("metadata values are strings", all(isinstance(v, str) for v in meta.values()))
    cfg = json.loads(meta["config"])
    check("config carries every TransformerConfig field",
          sorted(cfg) == sorted(fx.CONFIG_DEFAULTS), str(set(fx.CONFIG_DEFAULTS) ^ set(cfg)))
    spans = sorted(v["data_offsets"] for v in header.values())
    contiguous = spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    check("tensor data is contiguous and fills the file",
          contiguous and spans[-1][1] == len(raw) - 8 - hlen)
    want = fx.param_shapes(fx.config_for("tiny3"))
    got = {k: tuple(v["shape"]) for k, v in header.items()}
    check("tensor names and shapes = param_shapes", got == want,
          str(set(got.items()) ^ set(want.items())))
    check("0-d scalars are stored with shape []",
          header["embedding_head/log_temp"]["shape"] == [] and
          header["embedding_head/log_temp"]["data_offsets"][1]
          - header["embedding_head/log_temp"]["data_offsets"][0] == 4)


def test_agreed_names():
    """TEAM.md's agreed flax paths (tiny3 has banks + taps + elementwise gate,
    tiny3b has plain engram sites + headwise gate + block_untied)."""
    a = fx.param_shapes(fx.config_for("tiny3"))
    b = fx.param_shapes(fx.config_for("tiny3b"))
    L, d, n, H, G, qk, vd = 4, 24, 3, 3, 1, 6, 10
    expect_a = {
        "embedding/embedding": (64, d), "stack/mhc_phi_pre": (L, n * d, n),
        "stack/mhc_phi_res": (L, n * d, n * n), "stack/mhc_b_res": (L, n, n),
        "stack/mhc_a_post": (L,), "stack/final_norm/scale": (d,),
        "stack/layers/block/ZCRMSNorm_0/scale": (L, d),
        "stack/layers/block/self_attn/q_proj/kernel": (L, d, H * qk),
        "stack/layers/block/self_attn/v_taps": (L, 3, G * vd),
        "stack/layers/block/self_attn/k_norm/scale": (L, qk),
        "stack/layers/block/self_attn/gate_proj/kernel": (L, d, H * vd),
        "stack/layers/block/self_attn/out_proj/kernel": (L, H * vd, d),
        "stack/layers/block/attn_gate": (L,),
        "stack/layers/block/hadamard_mlp/w2a": (L, 4, 4),
        "stack/layers/block/hadamard_mlp/w2b": (L, 8, 8),
        "stack/layers/block/hadamard_mlp/cond_u": (L, 8, 32),
        "engram_banks_1/embedding": (4, 13, 6),
        "engram_readers_2/value_proj/kernel": (24, d), "engram_readers_0/taps": (4, d),
        "embedding_head/row_bias": (2, L + 1, 2), "router_head/proj/kernel": (2 * d, 3),
    }
    bad = {k: (a.get(k), v) for k, v in expect_a.items() if a.get(k) != v}
    check("tiny3 names/shapes as agreed", not bad, str(bad))
    check("banked model has no engrams_<s>", not any(k.startswith("engrams_") for k in a))
    expect_b = {
        "stack/layers/block/self_attn/gate_proj/kernel": (3, 20, 4),
        "stack/layers/block/hadamard_mlp/w1a": (3, 8, 4, 4),
        "stack/layers/block/hadamard_mlp/w1b": (3, 4, 8, 8),
        "engrams_0/embedding": (2, 11, 10), "engrams_0/key_proj/kernel": (20, 20),
    }
    bad = {k: (b.get(k), v) for k, v in expect_b.items() if b.get(k) != v}
    check("tiny3b names/shapes as agreed", not bad, str(bad))


def test_roundtrip_and_dtypes():
    for preset in ("tiny3", "tiny3b"):
        cfg = fx.config_for(preset)
        gen = fx.random_params(cfg, np.random.default_rng(0))
        for dt, cast in (("f32", np.float32), ("f16", np.float16)):
            P, c, meta = ref.load_checkpoint(fixture(preset, dt))
            worst = max(float(np.max(np.abs(P[k] - gen[k].astype(cast).astype(np.float64))))
                        if gen[k].size else 0.0 for k in gen)
            check("%s %s decodes to the written values" % (preset, dt),
                  set(P) == set(gen) and worst == 0.0, "max diff %g" % worst)
        P, c, meta = ref.load_checkpoint(fixture(preset, "bf16"))
        # bf16 = float32 with the low 16 bits rounded off to nearest even: the
        # decoded value is within half a bf16 ulp (2^-8 relative) of float32
        ok = True
        for k in gen:
            f = gen[k].astype(np.float32).astype(np.float64)
            err = np.abs(P[k] - f)
            if np.any(err > np.abs(f) * 2.0 ** -8 + 1e-38):
                ok = False
            low = (P[k].astype(np.float32).view(np.uint32) & 0xFFFF)
            if np.any(low != 0):
                ok = False
        check("%s bf16 decodes within half an ulp, low bits zero" % preset, ok)
        check("%s config round-trips" % preset, c.raw["cla_pairs"] == cfg["cla_pairs"]
              and c.d == cfg["d_model"] and meta["step"] == "7" and meta["format_version"] == "2")
        used = model_of(P, c).used
        heads = {k for k in P if k.split("/")[0].endswith("_head")}
        check("%s: the forward uses every non-head tensor" % preset, used | heads == set(P),
              str(set(P) - used - heads))
    # hand-checked bf16 encodings (round to nearest, ties to even)
    vals = np.array([1.0, -2.5, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, np.inf])
    got = list(struct.unpack("<5H", fx.encode(vals, "BF16")))
    check("bf16 encoding by hand", got == [0x3F80, 0xC020, 0x3F80, 0x3F82, 0x7F80],
          str([hex(g) for g in got]))


def test_mtp_and_no_heads():
    a = ref.Model(*ref.load_checkpoint(fixture("tiny3b", seed=4))[:2]).forward(TOKENS)
    P, c, _ = ref.load_checkpoint(fixture("tiny3b", seed=4, extra=["--mtp", "--no-heads"]))
    raw, _, _ = ref.read_safetensors(fixture("tiny3b", seed=4, extra=["--mtp", "--no-heads"]))
    check("mtp_* tensors are in the file but dropped, heads optional",
          "mtp_head/kernel" in raw and "mtp_head/kernel" not in P
          and not any(k.startswith("router_head") for k in P)
          and rel(ref.Model(P, c).forward(TOKENS), a) == 0.0)


def test_reader_rejects():
    path = fixture("tiny3b")
    raw = bytearray(open(path, "rb").read())
    (hlen,) = struct.unpack("<Q", raw[:8])
    bad = os.path.join(TMP, "truncated.safetensors")
    open(bad, "wb").write(raw[:-4])
    try:
        ref.read_safetensors(bad)
        check("truncated file refused", False, "accepted")
    except ref.RefError as e:
        check("truncated file refused, naming file and tensor", bad in str(e) and "tensor" in str(e),
              str(e))
    header = json.loads(raw[8:8 + hlen])
    header["__metadata__"]["format_version"] = "1"
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    v1 = os.path.join(TMP, "v1.safetensors")
    open(v1, "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + hlen:])
    try:
        ref.load_checkpoint(v1)
        check("format_version 1 refused", False, "accepted")
    except ref.RefError as e:
        check("format_version 1 refused", "format_version" in str(e), str(e))


def test_config_rules():
    base = fx.config_for("tiny3")
    c2 = {k: v for k, v in base.items() if k != "qk_head_dim"}
    c2["attn_dim"] = 24
    try:
        ref.Config(c2)
        check("Needle 2 config refused", False)
    except ref.RefError:
        check("Needle 2 config refused", True)
    for field, value in (("cla_pairs", [[1, 2]]), ("cla_pairs", [[0, 2]]),
                         ("engram_bank_ids", [0, 2, 0]), ("engram_bank_ids", [0, 1]),
                         ("attention_gate", "none"), ("hada_factor_mode", "untied")):
        c = dict(base)
        c[field] = value
        try:
            ref.Config(c)
            check("config %s=%r refused" % (field, value), False)
        except ref.RefError:
            check("config %s=%r refused" % (field, value), True)
    minimal = {"vocab_size": 64, "d_model": 24, "num_heads": 3, "num_kv_heads": 1, "num_layers": 2,
               "engram_layers": []}
    c = ref.Config(minimal)
    check("missing 3.x keys mean off",
          (c.taps, c.window, c.out_vocab, c.seed_heads, c.gate, c.factor_mode, c.bank_ids,
           c.cla_pairs, c.qk, c.vd, c.global_layers)
          == (0, 0, 0, 0, "elementwise", "shared", (), (), 8, 8, ()), str(vars(c)))
    c = ref.Config({"num_layers": 8})
    check("missing engram_layers = class default cut to depth", c.engram_layers == (3, 7))


# ------------------------------------------------------------------ pieces

def test_engram_hash():
    M = (1 << 32) - 1

    def by_hand(tokens, order, mult, slots, t):
        acc = (0x9E3779B9 * mult) & M
        for j in range(order):
            tok = tokens[t - j] if t - j >= 0 else 0
            acc = ((acc ^ tok) * 0x01000193) & M
        acc ^= acc >> 15
        return acc % slots

    toks = [3, 70000, 4294967295, 12, 3, 70000]
    orders, heads, slots = (2, 3), 2, 1009
    for sh in (0, 3):
        idx = ref.engram_indices(toks, orders, heads, slots, sh)
        stride = sh or heads
        want = [[by_hand(toks, o, oi * stride + h + 1, slots, t)
                 for oi, o in enumerate(orders) for h in range(heads)] for t in range(len(toks))]
        check("engram hash by hand (seed_heads %d)" % sh, idx.tolist() == want)
    a = ref.engram_indices(toks, orders, heads, slots, 0)[:, 2]
    b = ref.engram_indices(toks, orders, heads, slots, 3)[:, 2]
    check("engram_seed_heads changes the order-3 seeds", not np.array_equal(a, b))
    # worked example: one token, order 1
    acc = (0x9E3779B9 ^ 5) * 0x01000193 % (1 << 32)
    acc ^= acc >> 15
    check("engram hash worked example", ref.engram_indices([5], (1,), 1, 1 << 31)[0, 0]
          == acc % (1 << 31))


def test_mask_diag():
    T = 6
    loc = ref.local_mask(T, 2)
    check("mask_diag of a local mask kills taps >= window",
          ref.mask_diag(loc, 1).tolist() == [0, 1, 1, 1, 1, 1]
          and ref.mask_diag(loc, 2).tolist() == [0] * 6
          and ref.mask_diag(ref.causal_mask(T), 2).tolist() == [0, 0, 1, 1, 1, 1]
          and ref.mask_diag(ref.causal_mask(T), 9).tolist() == [0] * 6)


def dense_factor(wa, wb, mode):
    """The factor pair as an explicit N x N matrix M (out = z @ M), entry by entry."""
    if mode == "shared":
        ba, bb = wa.shape[0], wb.shape[0]
    else:
        ba, bb = wa.shape[1], wb.shape[1]
    N = ba * bb
    M = np.zeros((N, N))
    for i in range(ba):
        for j in range(bb):
            for k in range(ba):
                for l in range(bb):
                    if mode == "shared":
                        M[i * bb + j, k * bb + l] = wa[i, k] * wb[j, l]
                    else:
                        M[i * bb + j, k * bb + l] = wa[j, i, k] * wb[k, j, l]
    return M


def test_hadamard():
    rng = np.random.default_rng(3)
    ba, bb = 4, 8
    z = rng.standard_normal((5, ba * bb))
    wa, wb = rng.standard_normal((ba, ba)), rng.standard_normal((bb, bb))
    check("shared factors = z @ kron(wa, wb)",
          rel(ref.kron_apply(z, wa, wb, "shared"), z @ np.kron(wa, wb)) < 1e-13)
    check("shared factors = dense operator",
          rel(ref.kron_apply(z, wa, wb, "shared"), z @ dense_factor(wa, wb, "shared")) < 1e-13)
    ua, ub = rng.standard_normal((bb, ba, ba)), rng.standard_normal((ba, bb, bb))
    check("block_untied factors = dense operator",
          rel(ref.kron_apply(z, ua, ub, "block_untied"), z @ dense_factor(ua, ub, "block_untied"))
          < 1e-13)
    # untied with every block equal is the shared form
    check("block_untied with equal blocks = shared",
          rel(ref.kron_apply(z, np.broadcast_to(wa, (bb, ba, ba)), np.broadcast_to(wb, (ba, bb, bb)),
                             "block_untied"), ref.kron_apply(z, wa, wb, "shared")) < 1e-13)
    # the whole MLP against dense matrices and permutation matrices
    d, N = 20, 32
    for mode, split in (("shared", False), ("block_untied", True)):
        p = {}
        for s in (1, 2, 3):
            if mode == "shared":
                p["w%da" % s], p["w%db" % s] = rng.standard_normal((ba, ba)), rng.standard_normal((bb, bb))
            else:
                p["w%da" % s] = rng.standard_normal((bb, ba, ba))
                p["w%db" % s] = rng.standard_normal((ba, bb, bb))
        for k in ("d1", "d2", "b2", "d3", "d4"):
            p[k] = rng.standard_normal(N)
        p["cond_v"], p["cond_u"] = rng.standard_normal((d, 8)), rng.standard_normal((8, N))
        perms = ref.hada_perms(N, split)
        x = rng.standard_normal((3, d))
        Pm = [np.eye(N)[:, q] for q in perms]          # z @ Pm = z[q]
        Ms = [dense_factor(p["w%da" % s], p["w%db" % s], mode) for s in (1, 2, 3)]
        sm = np.exp(x @ p["cond_v"])
        cond = 1 + (sm / sm.sum(-1, keepdims=True)) @ p["cond_u"]
        zz = np.hstack([x, np.zeros((3, N - d))])
        zz = ((p["d1"] * zz) @ Ms[0]) @ Pm[0]
        g = p["d2"] * cond * zz + p["b2"]
        zz = ((g / (1 + np.exp(-g))) @ Ms[1]) @ Pm[1]
        zz = ((p["d3"] * zz) @ Ms[2]) * p["d4"]
        check("Hadamard MLP (%s, split %s) = dense form" % (mode, split),
              rel(ref.hadamard_mlp(x, p, mode, perms), zz[:, :d]) < 1e-12)
    for split in (False, True):
        for q in ref.hada_perms(32, split):
            check("perm is a permutation (split %s)" % split, sorted(q.tolist()) == list(range(32)))
    q1, _ = ref.hada_perms(32, True)
    check("split perms keep the halves", sorted(q1[:16].tolist()) == list(range(16))
          and not np.array_equal(q1, ref.hada_perms(32, False)[0]))


def test_flash_scaling():
    """Upstream's flash path: q * sqrt(F/qk), q/k/v zero-padded to F = max(qk, vd),
    scale 1/sqrt(F) -- equals the 1/sqrt(qk) path of attend()."""
    rng = np.random.default_rng(5)
    T, H, G, qk, vd = 7, 4, 2, 6, 10
    q, k, v = rng.standard_normal((T, H, qk)), rng.standard_normal((T, G, qk)), rng.standard_normal((T, G, vd))
    mask = ref.local_mask(T, 3)
    F = max(qk, vd)
    pad = lambda a: np.concatenate([a, np.zeros(a.shape[:-1] + (F - a.shape[-1],))], -1)
    qf, kf, vf = pad(q * math.sqrt(F / qk)), pad(k), pad(v)
    out = np.zeros((T, H, F))
    for h in range(H):
        g = h // (H // G)
        for t in range(T):
            s = np.array([qf[t, h] @ kf[u, g] / math.sqrt(F) if mask[t, u] else -np.inf
                          for u in range(T)])
            w = np.exp(s - s.max())
            out[t, h] = (w / w.sum()) @ vf[:, g]
    check("flash-path scaling = 1/sqrt(qk_head_dim), GQA grouping h // (H/G)",
          rel(ref.attend(q, k, v, mask), out[..., :vd]) < 1e-13)


def test_rope():
    c64, s64 = ref.rope_tables(6, 64, 10000.0, f32=False)
    c32, s32 = ref.rope_tables(6, 64, 10000.0, f32=True)
    ang64 = np.arctan2(s64, c64)
    ang32 = np.arctan2(s32, c32)
    d = np.abs(np.angle(np.exp(1j * (ang32 - ang64))))
    check("float32 RoPE angles: within float32 rounding of exact, not equal",
          d.max() < 64 * 2.0 ** -22 and d.max() > 0, str(d.max()))
    t = 50
    want = np.float32(np.float32(t) * (np.float32(1.0) / np.float32(10000.0) ** (np.float32(2) / np.float32(6))))
    check("float32 angle by hand", abs(np.arctan2(s32[t, 1], c32[t, 1])
                                     - np.angle(np.exp(1j * float(want)))) < 1e-12)
    x = np.random.default_rng(1).standard_normal((3, 2, 6))
    cs, sn = ref.rope_tables(6, 3, 10000.0, f32=False)
    y = ref.apply_rope(x, cs, sn)
    check("RoPE keeps norms, position 0 unchanged",
          rel(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1)) < 1e-13 and rel(y[0], x[0]) == 0.0)


def test_sinkhorn():
    rng = np.random.default_rng(2)
    Z = rng.standard_normal((3, 4, 4)) * 2
    S = ref.sinkhorn(Z)
    K = Z.copy()
    for _ in range(20):
        K = K - np.log(np.exp(K).sum(-1, keepdims=True))
        K = K - np.log(np.exp(K).sum(-2, keepdims=True))
    check("sinkhorn: 20 rounds, rows then columns", rel(S, np.exp(K)) < 1e-13
          and np.allclose(S.sum(-2), 1) and rel(S, ref.sinkhorn(Z, 19)) > 1e-9)


# ------------------------------------------------------------------ model-level

def with_cfg(path, **over):
    P, c, _ = ref.load_checkpoint(path)
    raw = dict(c.raw)
    raw.update(over)
    return P, ref.Config(raw)


def test_taps_identity_and_masking():
    path = fixture("tiny3")
    P, c, _ = ref.load_checkpoint(path)
    Q = dict(P)
    for t in ("q_taps", "k_taps", "v_taps"):
        a = np.zeros_like(P[ref.ATTN + t])
        a[:, 0, :] = 1.0
        Q[ref.ATTN + t] = a
    with_id = model_of(Q, c).forward(TOKENS)
    R = {k: v for k, v in P.items() if not k.endswith("_taps")}
    raw = dict(c.raw)
    raw["qkv_conv_taps"] = 0
    no_conv = model_of(R, ref.Config(raw)).forward(TOKENS)
    check("identity taps = no conv", rel(with_id, no_conv) < 1e-12, str(rel(with_id, no_conv)))
    check("random taps matter", rel(model_of(P, c).forward(TOKENS), no_conv) > 1e-3)
    base = model_of(P, c).forward(TOKENS)
    # tiny3: window 2, 3 taps: tap 2 is dead on local layer 0 and live on global layer 1
    for layer, live in ((0, False), (1, True)):
        Q = dict(P)
        a = P[ref.ATTN + "q_taps"].copy()
        a[layer, 2] += 1.0
        Q[ref.ATTN + "q_taps"] = a
        moved = rel(model_of(Q, c).forward(TOKENS), base)
        check("q tap 2 on %s layer %d %s" % ("global" if live else "local", layer,
                                                 "matters" if live else "is masked"),
              (moved > 1e-6) if live else (moved == 0.0), str(moved))


def test_window():
    path = fixture("tiny3b")
    P, c = with_cfg(path, sliding_window=len(TOKENS))
    wide = model_of(P, c).forward(TOKENS)
    P, c = with_cfg(path, sliding_window=0)
    glob = model_of(P, c).forward(TOKENS)
    P, c = with_cfg(path)
    narrow = model_of(P, c).forward(TOKENS)
    check("window >= T = all global", rel(wide, glob) < 1e-13)
    check("window < T differs", rel(narrow, glob) > 1e-4)
    P, c = with_cfg(path, global_layers=[0, 1, 2])
    check("every layer global = no window", rel(model_of(P, c).forward(TOKENS), glob) < 1e-13)


def test_cla():
    path = fixture("tiny3")
    P, c, _ = ref.load_checkpoint(path)
    base = model_of(P, c).forward(TOKENS)
    for name in ("k_proj/kernel", "v_proj/kernel", "k_taps", "v_taps", "k_norm/scale"):
        for layer, used in ((3, False), (2, True)):
            Q = dict(P)
            a = P[ref.ATTN + name].copy()
            a[layer] += 0.5
            Q[ref.ATTN + name] = a
            moved = rel(model_of(Q, c).forward(TOKENS), base)
            check("CLA: %s of %s %d %s" % (name, "consumer" if not used else "producer", layer,
                                          "matters" if used else "is unused"),
                  (moved > 1e-6) if used else moved == 0.0, str(moved))
    # the consumer attends over exactly the producer's k, v
    m = model_of(P, c)
    seen = {}
    orig = ref.attend

    def spy(q, k, v, mask):
        seen.setdefault("kv", []).append((k, v))
        return orig(q, k, v, mask)
    ref.attend = spy
    try:
        m.forward(TOKENS)
    finally:
        ref.attend = orig
    kv = seen["kv"]
    check("CLA: consumer's k, v are the producer's", len(kv) == 4 and kv[3][0] is kv[2][0]
          and kv[3][1] is kv[2][1] and kv[1][0] is not kv[0][0])
    P2, c2 = with_cfg(path, cla_pairs=[])
    check("CLA changes the output", rel(model_of(P2, c2).forward(TOKENS), base) > 1e-4)


def test_banks():
    path = fixture("tiny3")
    P, c, _ = ref.load_checkpoint(path)
    base = model_of(P, c).forward(TOKENS)
    # bank 0 feeds sites 0 and 2 (layers 0 and 3); bank 1 feeds site 1
    Q = dict(P)
    Q["engram_banks_0/embedding"] = P["engram_banks_0/embedding"] * 1.5
    m = model_of(Q, c)
    ek = m.engram_kv(TOKENS, ref.causal_mask(len(TOKENS)))
    e0 = model_of(P, c).engram_kv(TOKENS, ref.causal_mask(len(TOKENS)))
    check("a bank is shared by its sites", rel(ek[0][0], 1.5 * e0[0][0]) < 1e-13
          and rel(ek[2][0], 1.5 * e0[2][0]) < 1e-13 and rel(ek[1][0], e0[1][0]) == 0.0)
    check("engrams matter", rel(m.forward(TOKENS), base) > 1e-6)
    # ngram_ok: position 0 has no order-2/3 n-gram, so e[0] = 0 and k_0 = 0
    check("ngram_ok zeroes the first position", np.all(e0[0][0][0] == 0.0)
          and np.any(e0[0][0][1] != 0.0))


def test_out_vocab_and_adapter():
    path = fixture("tiny3b", adapter=True)
    apath = path.replace(".safetensors", ".lora.safetensors")
    P, c, _ = ref.load_checkpoint(path)
    lg = model_of(P, c).forward(TOKENS)
    Pf, cf = with_cfg(path, out_vocab=0)
    full = model_of(Pf, cf).forward(TOKENS)
    check("out_vocab keeps the first rows of the tied head", lg.shape == (len(TOKENS), 40)
          and full.shape[1] == 48 and rel(lg, full[:, :40]) == 0.0)
    lora, scale, meta = ref.load_adapter(apath, c, P)
    check("adapter metadata", scale == 2.0 and meta["rank"] == 2 and meta["base"] == path
          and sorted(k.split("/")[-2] for k in lora) == sorted(ref.LORA_TARGETS))
    merged = ref.merge_lora(P, lora, scale)
    key = ref.ATTN + "gate_proj/kernel"
    A, B = lora[key]
    by_layer = np.stack([P[key][l] + 2.0 * A[l] @ B[l] for l in range(c.L)])
    check("merge = W + scale * A @ B per layer", rel(merged[key], by_layer) < 1e-14)
    check("adapter changes the logits", rel(model_of(merged, c).forward(TOKENS), lg) > 1e-4)


# ------------------------------------------------------------------ loss and gradients

def test_loss():
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((5, 9))
    ids = [0, 3, 8, 1, 4]
    mask = [0, 1, 0, 1, 1]
    want = sum(math.log(np.exp(logits[t]).sum()) - logits[t, ids[t + 1]]
               for t in range(4) if mask[t + 1])
    s, n = ref.sequence_ce(logits, ids, mask)
    check("CE: logits[:-1] vs ids[1:], mask[1:]", abs(s - want) < 1e-12 and n == 3)
    try:
        ref.sequence_ce(logits, [0, 9, 1, 1, 1], mask)
        check("target >= Vout refused", False)
    except ref.RefError:
        check("target >= Vout refused", True)
    path = fixture("tiny3")
    P, c, _ = ref.load_checkpoint(path)
    m = model_of(P, c)
    seqs = [TOKENS, TOKENS[:7]]
    masks = [[0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 1, 1, 1]]
    loss, cnt, per = ref.batch_loss(m, seqs, masks)
    check("batch loss is token-weighted", cnt == 15 and
          abs(loss - (per[0]["sum"] + per[1]["sum"]) / 15) < 1e-12
          and abs(loss - (per[0]["sum"] / 10 + per[1]["sum"] / 5) / 2) > 1e-6)
    # dL/dlogits by hand = (softmax - onehot) * mask / count, vs central differences
    lg = m.forward(TOKENS)
    mk = masks[0]
    f = lambda L_: ref.sequence_ce(L_, TOKENS, mk)[0] / 10
    G = np.zeros_like(lg)
    for t in range(len(TOKENS) - 1):
        p = np.exp(lg[t] - lg[t].max())
        p /= p.sum()
        p[TOKENS[t + 1]] -= 1
        G[t] = p * mk[t + 1] / 10
    fd = np.zeros_like(lg)
    h = 1e-6
    for t in range(lg.shape[0]):
        for v in range(lg.shape[1]):
            a, b = lg.copy(), lg.copy()
            a[t, v] += h
            b[t, v] -= h
            fd[t, v] = (f(a) - f(b)) / (2 * h)
    check("dL/dlogits by hand = finite differences", rel(fd, G) < 1e-7, str(rel(fd, G)))


def test_lora_grads():
    """FD dL/dA, dL/dB equal scale * G B^T and scale * A^T G with G = FD dL/dW of
    the merged kernel (checks the merge orientation, the scale and the FD code)."""
    path = fixture("tiny3b", adapter=True, seed=1)
    apath = path.replace(".safetensors", ".lora.safetensors")
    P, c, _ = ref.load_checkpoint(path)
    lora, scale, _ = ref.load_adapter(apath, c, P)
    key = ref.ATTN + "k_proj/kernel"
    seqs, masks = [TOKENS[:9]], [[0, 0, 1, 1, 1, 1, 1, 1, 1]]
    g = ref.lora_fd_grads(P, c, {key: lora[key]}, scale, seqs, masks)
    merged = ref.merge_lora(P, {key: lora[key]}, scale)
    h = 1e-5
    layer = 1
    W = merged[key]
    G = np.zeros(W.shape[1:])
    for i in range(W.shape[1]):
        for j in range(W.shape[2]):
            vals = []
            for sgn in (1, -1):
                Q = dict(merged)
                a = W.copy()
                a[layer, i, j] += sgn * h
                Q[key] = a
                vals.append(ref.batch_loss(ref.Model(Q, c), seqs, masks)[0])
            G[i, j] = (vals[0] - vals[1]) / (2 * h)
    A, B = lora[key]
    shapeA, idxA, gA = g["lora/%s/A" % key]
    shapeB, idxB, gB = g["lora/%s/B" % key]
    gA = np.array(gA).reshape(shapeA)[layer]
    gB = np.array(gB).reshape(shapeB)[layer]
    check("dL/dA = scale * dL/dW @ B^T", rel(gA, scale * G @ B[layer].T) < 1e-6,
          str(rel(gA, scale * G @ B[layer].T)))
    check("dL/dB = scale * A^T @ dL/dW", rel(gB, scale * A[layer].T @ G) < 1e-6,
          str(rel(gB, scale * A[layer].T @ G)))
    # the cached-prefix FD equals a plain full-forward FD
    full = []
    for i in (5, 77):
        vals = []
        for sgn in (1, -1):
            Aa = A.copy().reshape(-1)
            Aa[i] += sgn * h
            vals.append(ref.lora_loss(P, c, {key: (Aa.reshape(A.shape), B)}, scale, seqs, masks))
        full.append((vals[0] - vals[1]) / (2 * h))
    gAll = np.array(g["lora/%s/A" % key][2])
    check("cached FD = full-forward FD", rel(gAll[[5, 77]], full) < 1e-9)
    # CLA consumer's k/v LoRA gradients are zero, the producer's are not
    path = fixture("tiny3", adapter=True)
    P, c, _ = ref.load_checkpoint(path)
    lora, scale, _ = ref.load_adapter(path.replace(".safetensors", ".lora.safetensors"), c, P)
    key = ref.ATTN + "v_proj/kernel"
    A = lora[key][0]
    per = A.size // A.shape[0]
    pick = [2 * per + 3, 3 * per + 3]                 # the same entry on layers 2 and 3
    seqs = [TOKENS[:8]]
    masks = [[1] * 8]
    vals = {}
    for i in pick:
        r = []
        for sgn in (1, -1):
            Aa = A.copy().reshape(-1)
            Aa[i] += sgn * h
            r.append(ref.lora_loss(P, c, {**lora, key: (Aa.reshape(A.shape), lora[key][1])},
                                   scale, seqs, masks))
        vals[i] = (r[0] - r[1]) / (2 * h)
    check("CLA: consumer's v_proj LoRA gradient is 0, producer's is not",
          vals[pick[1]] == 0.0 and abs(vals[pick[0]]) > 1e-8, str(vals))


# ------------------------------------------------------------------ a second, loop-by-loop forward

def slow_forward(P, c, toks):
    """docs/model.md §6.3-§6.10 again, position by position and index by index,
    with no einsum, reshape tricks or shared helpers of the reference: a check
    of the vectorised forward against slips of indexing."""
    T, d, n, H, G, qk, vd, L = len(toks), c.d, c.n, c.H, c.G, c.qk, c.vd, c.L
    sig = lambda x: 1.0 / (1.0 + math.exp(-x))
    A = ref.ATTN
    B = "stack/layers/block/"
    Mp = "stack/layers/block/hadamard_mlp/"

    def rmsu(vec):
        return vec / math.sqrt(sum(float(v) * float(v) for v in vec) / len(vec) + 1e-6)

    def zc(vec, scale):
        return (1.0 + scale) * rmsu(vec)

    def allowed(l, t, u):
        if u > t or u < 0:
            return False
        if c.window and l not in c.global_layers:
            return t - u < c.window
        return True

    # engram (full causal mask)
    K = len(c.orders) * c.eheads
    stride = c.seed_heads or c.eheads
    dil = max(c.orders)
    e = np.zeros((T, K * c.esub))
    rows = [[0] * K for _ in range(T)]
    for t in range(T):
        k = 0
        for oi, o in enumerate(c.orders):
            for h in range(c.eheads):
                acc = (0x9E3779B9 * (oi * stride + h + 1)) % 2 ** 32
                for j in range(o):
                    tok = toks[t - j] if t - j >= 0 else 0
                    acc = ((acc ^ tok) * 0x01000193) % 2 ** 32
                acc ^= acc >> 15
                rows[t][k] = acc % c.slots
                k += 1
    sites = []
    for si, layer in enumerate(c.engram_layers):
        if c.bank_ids:
            table = P["engram_banks_%d/embedding" % c.bank_ids[si]]
            pre = "engram_readers_%d/" % si
        else:
            table = P["engrams_%d/embedding" % si]
            pre = "engrams_%d/" % si
        e = np.zeros((T, K * c.esub))
        for t in range(T):
            k = 0
            for oi, o in enumerate(c.orders):
                for h in range(c.eheads):
                    if t >= o - 1:
                        e[t, k * c.esub:(k + 1) * c.esub] = table[k, rows[t][k]]
                    k += 1
        ks = np.array([e[t] @ P[pre + "key_proj/kernel"] for t in range(T)])
        v0 = np.array([e[t] @ P[pre + "value_proj/kernel"] for t in range(T)])
        vs = np.zeros((T, d))
        for t in range(T):
            for j in range(4):
                if t - j * dil >= 0:
                    vs[t] += P[pre + "taps"][j] * v0[t - j * dil]
        sites.append((layer, ks, vs))

    # Hadamard pieces
    N = 1 << (d - 1).bit_length()
    ba = 1 << ((N - 1).bit_length() // 2)
    bb = N // ba
    if c.split_perms:
        perms = [list(np.random.RandomState(sd).permutation(N // 2))
                 + [N // 2 + x for x in np.random.RandomState(sd + 977).permutation(N // 2)]
                 for sd in (11, 13)]
    else:
        perms = [list(np.random.RandomState(sd).permutation(N)) for sd in (11, 13)]

    def factor(z, wa, wb):
        out = np.zeros(N)
        for k in range(ba):
            for l2 in range(bb):
                acc = 0.0
                for i in range(ba):
                    for j in range(bb):
                        if c.factor_mode == "shared":
                            acc += z[i * bb + j] * wa[i, k] * wb[j, l2]
                        else:
                            acc += z[i * bb + j] * wa[j, i, k] * wb[k, j, l2]
                out[k * bb + l2] = acc
        return out

    def mlp(l, hin):
        g = lambda name: P[Mp + name][l]
        sc = hin @ g("cond_v")
        ex = np.exp(sc - sc.max())
        cond = 1.0 + (ex / ex.sum()) @ g("cond_u")
        z = np.zeros(N)
        z[:d] = hin
        z = factor(g("d1") * z, g("w1a"), g("w1b"))
        z = np.array([z[perms[0][i]] for i in range(N)])
        pre = g("d2") * cond * z + g("b2")
        z = factor(np.array([x * sig(x) for x in pre]), g("w2a"), g("w2b"))
        z = np.array([z[perms[1][i]] for i in range(N)])
        z = factor(g("d3") * z, g("w3a"), g("w3b"))
        return (g("d4") * z)[:d]

    def rope(vec, t):
        half = qk // 2
        out = np.zeros(qk)
        for i in range(half):
            ang = t * (1.0 / c.theta ** (2.0 * i / qk))
            x1, x2 = vec[i], vec[i + half]
            out[i] = x1 * math.cos(ang) - x2 * math.sin(ang)
            out[i + half] = x2 * math.cos(ang) + x1 * math.sin(ang)
        return out

    X = np.zeros((T, n, d))
    for t in range(T):
        for i in range(n):
            X[t, i] = P["embedding/embedding"][toks[t]] * math.sqrt(d)
    carry = None
    producers = [p_ for p_, _ in c.cla_pairs]
    consumers = [q_ for _, q_ in c.cla_pairs]
    for l in range(L):
        gp = lambda name: P["stack/mhc_" + name][l]
        u = np.zeros((T, d))
        hpost = np.zeros((T, n))
        Ms = []
        for t in range(T):
            nx = rmsu(np.concatenate([X[t, i] for i in range(n)]))
            for i in range(n):
                on = (i == l % n)
                hpre = sig(gp("a_pre") * (nx @ gp("phi_pre")[:, i]) + gp("b_pre")[i] + (4.0 if on else -4.0))
                u[t] += hpre * X[t, i]
                hpost[t, i] = 2 * sig(gp("a_post") * (nx @ gp("phi_post")[:, i]) + gp("b_post")[i]
                                      + (0.0 if on else -4.0))
            Z = [[gp("a_res") * (nx @ gp("phi_res")[:, i * n + j]) + gp("b_res")[i, j]
                  for j in range(n)] for i in range(n)]
            for _ in range(20):
                for i in range(n):
                    lse = math.log(sum(math.exp(Z[i][j]) for j in range(n)))
                    Z[i] = [Z[i][j] - lse for j in range(n)]
                for j in range(n):
                    lse = math.log(sum(math.exp(Z[i][j]) for i in range(n)))
                    for i in range(n):
                        Z[i][j] -= lse
            Ms.append([[math.exp(Z[i][j]) for j in range(n)] for i in range(n)])
        # block
        x = u.copy()
        for layer, ks, vs in sites:
            if layer == l:
                for t in range(T):
                    alpha = sig(rmsu(u[t]) @ rmsu(ks[t]) / math.sqrt(d))
                    x[t] = x[t] + alpha * vs[t]
        a = np.array([zc(x[t], P[B + "ZCRMSNorm_0/scale"][l]) for t in range(T)])
        raw = {nm: np.array([a[t] @ P[A + nm + "_proj/kernel"][l] for t in range(T)])
               for nm in ("q", "k", "v")}
        conv = {}
        for nm in ("q", "k", "v"):
            if c.taps:
                taps = P[A + nm + "_taps"][l]
                conv[nm] = np.zeros_like(raw[nm])
                for t in range(T):
                    for j in range(c.taps):
                        if allowed(l, t, t - j):
                            conv[nm][t] += taps[j] * raw[nm][t - j]
            else:
                conv[nm] = raw[nm]
        Q = [[rope(zc(conv["q"][t][h * qk:(h + 1) * qk], P[A + "q_norm/scale"][l]), t)
              for h in range(H)] for t in range(T)]
        Kh = [[rope(zc(conv["k"][t][g * qk:(g + 1) * qk], P[A + "k_norm/scale"][l]), t)
               for g in range(G)] for t in range(T)]
        Vh = [[conv["v"][t][g * vd:(g + 1) * vd] for g in range(G)] for t in range(T)]
        if l in consumers:
            Kh, Vh = carry
        if l in producers:
            carry = (Kh, Vh)
        attn = np.zeros((T, d))
        for t in range(T):
            o = np.zeros(H * vd)
            for h in range(H):
                g = h * G // H
                keys = [s_ for s_ in range(T) if allowed(l, t, s_)]
                sc = [Q[t][h] @ Kh[s_][g] / math.sqrt(qk) for s_ in keys]
                mx = max(sc)
                w = [math.exp(v - mx) for v in sc]
                tot = sum(w)
                for wi, s_ in zip(w, keys):
                    o[h * vd:(h + 1) * vd] += wi / tot * Vh[s_][g]
            Wg = P[A + "gate_proj/kernel"][l]
            for h in range(H):
                for j in range(vd):
                    col = h if c.gate == "headwise" else h * vd + j
                    o[h * vd + j] *= sig(a[t] @ Wg[:, col])
            attn[t] = o @ P[A + "out_proj/kernel"][l]
        gate = sig(P[B + "attn_gate"][l])
        for t in range(T):
            x[t] = x[t] + gate * zc(attn[t], P[B + "post_attn_norm/scale"][l])
            x[t] = x[t] + mlp(l, zc(x[t], P[B + "pre_hada_norm/scale"][l]))
        newX = np.zeros_like(X)
        for t in range(T):
            y = x[t] - u[t]
            for i in range(n):
                for j in range(n):
                    newX[t, i] += Ms[t][i][j] * X[t, j]
                newX[t, i] += hpost[t, i] * y
        X = newX
    out = np.zeros((T, c.vout))
    for t in range(T):
        hfin = zc(sum(X[t, i] for i in range(n)) / n, P["stack/final_norm/scale"])
        for v in range(c.vout):
            out[t, v] = hfin @ P["embedding/embedding"][v]
    return out


def test_slow_forward():
    toks = [3, 7, 3, 7, 1, 0, 5]
    for preset in ("tiny3", "tiny3b"):
        P, c, _ = ref.load_checkpoint(fixture(preset, "bf16"))
        fast = ref.Model(P, c, rope_f32=False).forward(toks)
        slow = slow_forward(P, c, toks)
        check("%s: vectorised forward = loop-by-loop forward" % preset, rel(fast, slow) < 1e-10,
              str(rel(fast, slow)))
    P, c, _ = ref.load_checkpoint(fixture("tiny3"))
    P2, c2 = with_cfg(fixture("tiny3"), ladder_widths=[])
    check("ladder_widths selects the split permutations",
          [q.tolist() for q in ref.Model(P, c).perms] == [q.tolist() for q in ref.hada_perms(32, True)]
          and rel(ref.Model(P2, c2).forward(toks), ref.Model(P, c).forward(toks)) > 1e-6)


# ------------------------------------------------------------------ CLI

def test_cli():
    path = fixture("tiny3", adapter=True, seed=2)
    apath = path.replace(".safetensors", ".lora.safetensors")
    tool = os.path.join(SRC, "tools", "ref_needle3.py")
    out = os.path.join(TMP, "logits.bin")
    gj = os.path.join(TMP, "grads.json")
    tr = os.path.join(TMP, "trace.json")
    seqs = ["1,5,7,5,7,9,0,63", "4 4 4 2"]
    cmd = [sys.executable, tool, path, "--tokens", seqs[0], "--tokens", seqs[1],
           "--mask", "0,0,1,1,1,1,1,1", "--mask", "0,1,1,1", "--adapter", apath,
           "--logits", out, "--loss", "--grads", gj, "--grad-entries", "2", "--trace", tr]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    check("CLI exit 0", r.returncode == 0, r.stderr)
    if r.returncode:
        return
    P, c, _ = ref.load_checkpoint(path)
    lora, scale, _ = ref.load_adapter(apath, c, P)
    m = ref.Model(ref.merge_lora(P, lora, scale), c)
    ids = [[int(x) for x in s.replace(",", " ").split()] for s in seqs]
    want = np.concatenate([m.forward(s).reshape(-1) for s in ids])
    got = np.fromfile(out, "<f4")
    check("CLI logits file: f32 T x Vout per sequence", got.size == 12 * 64
          and rel(got, want) < 1e-6)
    doc = json.loads(r.stdout)
    loss, cnt, _ = ref.batch_loss(m, ids, [[0, 0, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1]])
    check("CLI --loss", abs(doc["loss"] - loss) < 1e-12 and doc["count"] == 9,
          "%r vs %r" % (doc, loss))
    g = json.load(open(gj))
    check("CLI --grads: 10 tensors, 2 entries each",
          len(g["tensors"]) == 10 and all(len(v["grad"]) == 2 and len(v["index"]) == 2
                                          for v in g["tensors"].values()))
    t = json.load(open(tr))
    check("CLI --trace", len(t["engram_indices"]) == 2 and len(t["hada_perms"][0]) == 32
          and t["engram_indices"][1] == ref.engram_indices(ids[1], (2, 3), 2, 13, 3).tolist()
          and len(t["hidden"]) == 2 and len(t["hidden"][1]) == 5
          and rel(t["hidden"][0][0], P["embedding/embedding"][ids[0]] * math.sqrt(24)) < 1e-15)
    # --check-*: a candidate equal to the reference passes, a perturbed one exits 3
    base = [sys.executable, tool, path, "--tokens", seqs[0], "--tokens", seqs[1],
            "--mask", "0,0,1,1,1,1,1,1", "--mask", "0,1,1,1", "--adapter", apath]
    near = os.path.join(TMP, "near.bin")
    (got * (1 + 1e-7)).astype("<f4").tofile(near)
    far = os.path.join(TMP, "far.bin")
    bad = got.copy()
    bad[700] += 1e-3 * np.max(np.abs(got))
    bad.astype("<f4").tofile(far)
    full = {k: {"shape": v["shape"], "grad": [0.0] * int(np.prod(v["shape"]))}
            for k, v in g["tensors"].items()}
    for k, v in g["tensors"].items():
        for i, x in zip(v["index"], v["grad"]):
            full[k]["grad"][i] = x * (1 + 1e-6)
    cand = os.path.join(TMP, "cand.json")
    json.dump({"tensors": full}, open(cand, "w"))
    key = sorted(full)[3]
    full[key]["grad"][g["tensors"][key]["index"][1]] += 1e-2 * max(abs(x) for x in full[key]["grad"])
    cand_bad = os.path.join(TMP, "cand_bad.json")
    json.dump({"tensors": full}, open(cand_bad, "w"))
    common = ["--grad-entries", "2"]
    for what, args, rc in (("logits near", ["--check-logits", near], 0),
                           ("logits far", ["--check-logits", far], 3),
                           ("loss equal", ["--check-loss", repr(doc["loss"])], 0),
                           ("loss off", ["--check-loss", repr(doc["loss"] * 1.001)], 3),
                           ("grads near", ["--check-grads", cand] + common, 0),
                           ("grads off", ["--check-grads", cand_bad] + common, 3)):
        r = subprocess.run(base + args, capture_output=True, text=True, timeout=600)
        check("CLI --check-%s exits %d" % (what, rc), r.returncode == rc, r.stdout + r.stderr)
    r = subprocess.run([sys.executable, tool, os.path.join(TMP, "missing.safetensors"),
                        "--tokens", "1,2", "--loss"], capture_output=True, text=True, timeout=60)
    check("CLI: missing file exits 1 naming it", r.returncode == 1 and "missing.safetensors" in r.stderr,
          r.stderr)
    r = subprocess.run([sys.executable, tool, path, "--tokens", "1,2", "--grads", gj],
                       capture_output=True, text=True, timeout=60)
    check("CLI: --grads without --adapter is a usage error", r.returncode == 2)


TESTS = [test_safetensors_layout, test_agreed_names, test_roundtrip_and_dtypes,
         test_mtp_and_no_heads, test_reader_rejects, test_config_rules, test_engram_hash, test_mask_diag,
         test_hadamard, test_flash_scaling, test_rope, test_sinkhorn, test_taps_identity_and_masking,
         test_window, test_cla, test_banks, test_out_vocab_and_adapter, test_loss,
         test_lora_grads, test_slow_forward, test_cli]

if __name__ == "__main__":
    only = sys.argv[1:]
    for t in TESTS:
        if not only or t.__name__ in only:
            t()
    if failures:
        print("%d failed (files kept in %s)" % (len(failures), TMP))
    else:
        shutil.rmtree(TMP, ignore_errors=True)
        print("all passed")
    sys.exit(1 if failures else 0)
