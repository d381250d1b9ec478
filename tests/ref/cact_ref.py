#!/usr/bin/python3
"""numpy-only reference for the .cact archive (upstream needle/model/export.py
and quantize.py, re-expressed here without jax so the tests can run it).

Used by tests/test_cact.py and tests/test_cq.c:
  * writer   -- build(params, config, ...) -> bytes, the same steps as
                upstream's write_export: Lloyd-Max codebooks from
                RandomState(0), float32 Walsh rotation via numpy matmul,
                FP16 norms, nearest level (ties low), LSB-first packing,
                64-byte aligned blobs, probe heads, tokenizer last;
  * reader   -- parse(buf): an independent parser of the layout with
                dequantisation;
  * merge    -- merge_lora(params, adapter): W + (scale * A @ B) cast to
                W's dtype (upstream finetune.merge_lora).

CLI:
  cact_ref.py randn N            raw float64 bytes of RandomState(0).randn(N)
  cact_ref.py levels             Lloyd-Max levels (float64 repr) per width
  cact_ref.py codebooks          the 28 header floats as hex bit patterns
  cact_ref.py build CKPT OUT [--bits N] [--lora A.pkl] [--tokenizer-blob F]
"""
import pickle
import struct
import sys

import numpy as np

TAG = 0x05E12A83
ALIGN = 64
FP16, FP32, CQ, RAW = 1, 2, 3, 4
TERNARY = 1.58
TERNARY_REC = 5
HEADER = struct.Struct("<29If")
RECORD = struct.Struct("<BBHIIIIQQII")
SUB = 128
TAPS = 4

# Upstream rotates with numpy's float32 matmul, whose rounding depends on the
# BLAS and CPU. EXACT_ROTATION = True instead rounds the float64 product once
# to float32 (what the C writer does), making the comparison deterministic.
EXACT_ROTATION = False

_levels_cache = {}


def lloyd_max(bits):
    """Levels of N(0,1): 400k RandomState(0) samples, 200 Lloyd rounds."""
    if bits in _levels_cache:
        return _levels_cache[bits]
    n, k = 400000, 1 << bits
    xs = np.sort(np.random.RandomState(0).randn(n))
    c = xs[((np.arange(k) + 0.5) / k * n).astype(int)].astype(np.float64)
    for _ in range(200):
        edges = (c[:-1] + c[1:]) / 2.0
        cell = np.searchsorted(edges, xs)
        for j in range(k):
            sel = cell == j
            if sel.any():
                c[j] = xs[sel].mean()
    _levels_cache[bits] = np.sort(c)
    return _levels_cache[bits]


def codebook(bits, group=128):
    if bits == TERNARY:
        lv = np.array([-1.2240064, 0.0, 1.2240064])
    else:
        lv = lloyd_max(bits)
    return (lv / np.sqrt(group)).astype(np.float32)


def walsh(group):
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < group:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(group)).astype(np.float32)


def nearest(v, cb):
    flat = v.reshape(-1)
    hi = np.clip(np.searchsorted(cb, flat), 1, len(cb) - 1)
    lo_d = np.abs(flat - cb[hi - 1])
    hi_d = np.abs(flat - cb[hi])
    return np.where(lo_d <= hi_d, hi - 1, hi).astype(np.uint8).reshape(v.shape)


def pack_bits(idx, bits):
    rows, cols = idx.shape
    out = np.zeros((rows, cols * bits // 8), np.uint8)
    for k in range(cols):
        for b in range(bits):
            bit = k * bits + b
            out[:, bit // 8] |= (((idx[:, k] >> b) & 1) << (bit % 8)).astype(np.uint8)
    return out


def unpack_bits(packed, bits, cols):
    idx = np.zeros((packed.shape[0], cols), np.uint8)
    for k in range(cols):
        for b in range(bits):
            bit = k * bits + b
            idx[:, k] |= (((packed[:, bit // 8] >> (bit % 8)) & 1) << b).astype(np.uint8)
    return idx


def cq_pack(w, bits, group=128):
    cb = codebook(bits, group)
    h = walsh(group)
    rows, cols = w.shape
    pad = (-cols) % group
    if pad:
        w = np.pad(w, ((0, 0), (0, pad)))
    cols_p = w.shape[1]
    g = w.reshape(rows, cols_p // group, group).astype(np.float32)
    if EXACT_ROTATION:
        rot = (g.astype(np.float64) @ h.astype(np.float64)).astype(np.float32)
    else:
        rot = g @ h
    norm = np.sqrt((rot ** 2).sum(-1, keepdims=True))
    unit = rot / np.maximum(norm, 1e-12)
    idx = nearest(unit, cb).reshape(rows, cols_p)
    if bits == TERNARY:
        packed = pack_bits(np.where(idx == 0, 3, idx - 1).astype(np.uint8), 2)
    else:
        packed = pack_bits(idx, bits)
    return packed.tobytes() + norm[:, :, 0].astype(np.float16).tobytes()


def cq_unpack(blob, rows, cols, bits, group=128):
    tern = bits == TERNARY_REC
    cb = codebook(TERNARY if tern else bits, group)
    h = walsh(group)
    cols_p = (cols + group - 1) // group * group
    sb = 2 if tern else bits
    nb = rows * cols_p * sb // 8
    packed = np.frombuffer(blob[:nb], np.uint8).reshape(rows, -1)
    norms = np.frombuffer(blob[nb:], np.float16).reshape(rows, cols_p // group)
    idx = unpack_bits(packed, sb, cols_p)
    if tern:
        idx = np.where(idx == 3, 0, idx + 1).astype(np.uint8)
    unit = cb[idx].reshape(rows, cols_p // group, group)
    w = (unit * norms[:, :, None].astype(np.float32)) @ h
    return w.reshape(rows, cols_p)[:, :cols]


def canonical(name):
    import re
    n = re.sub(r"^layer\d+\.", "attn.", name)
    n = re.sub(r"^engrams?_?(\d+)[./]?", r"engram\1.", n)
    if n.startswith("stack/"):
        n = n[6:]
    n = n.replace("layers/block/self_attn/", "attn.").replace("mtp_block/self_attn/", "mtp.")
    if n.endswith("/kernel"):
        n = n[:-7]
    if n == "embedding/embedding":
        n = "embedding"
    n = re.sub(r"^(engram\d+\.)embedding$", r"\1tables", n)
    return n.replace("/", ".")


def parse_bits_map(spec):
    table, default = {}, None
    for part in spec.split(","):
        if not part.strip():
            continue
        key, val = part.split("=", 1)
        b = TERNARY if float(val) == TERNARY else int(val)
        if key.strip() == "default":
            default = b
        else:
            table[canonical(key.strip())] = b
    if default is None:
        raise ValueError("bits map needs default=")
    return table, default


def bits_for(name, spec):
    if not isinstance(spec, tuple):
        return spec
    table, default = spec
    canon = canonical(name)
    keys = [k for k in table if canon.startswith(k)]
    return table[max(keys, key=len)] if keys else default


CFG_DEFAULTS = dict(vocab_size=8192, d_model=512, attn_dim=0, num_heads=8, num_kv_heads=4,
                    num_layers=12, max_seq_len=2048, engram_orders=(2, 3), engram_heads=0,
                    engram_slots=8192, engram_layers=(2, 15), mhc_lanes=4, kv_window=0,
                    kv_bits=8, weight_bits="", rope_theta=100000.0)


def full_config(cfg):
    c = dict(CFG_DEFAULTS)
    c.update({k: v for k, v in cfg.items() if k in CFG_DEFAULTS})
    return c


def kv_window(c):
    hd = (c["attn_dim"] or c["d_model"]) // c["num_heads"]
    kv = c["num_kv_heads"] * hd
    d, L, s = c["d_model"], c["num_layers"], len(tuple(c["engram_layers"]))
    per = L * (2 * kv + 2 * (kv // 32) * 4) + s * (d + (d // 32) * 4)
    w = max(160, min((11 * 1024 * 1024 + 512 * 1024) // per // 32 * 32, c["max_seq_len"]))
    return min(w, c["kv_window"]) if c["kv_window"] else w


def tensors(params, c, spec, group=128):
    d, L = c["d_model"], c["num_layers"]
    orders = tuple(c["engram_orders"])
    heads = c["engram_heads"] or max(1, d // (len(orders) * SUB))
    sub = d // (len(orders) * heads)
    ts = []

    def f16(name, a):
        a = np.asarray(a, np.float16)
        ts.append((name, FP16, a.shape, a.tobytes(), 0, 0))

    def q(name, m):
        b = bits_for(name, spec)
        m = np.asarray(m, np.float32)
        ts.append((name, CQ, m.shape, cq_pack(m, b, group), group,
                   TERNARY_REC if b == TERNARY else b))

    q("embedding", params["embedding"]["embedding"])
    blk = params["stack"]["layers"]["block"]
    at, mlp = blk["self_attn"], blk["hadamard_mlp"]
    for i in range(L):
        p = "layer%02d." % i
        f16(p + "norm_in", blk["ZCRMSNorm_0"]["scale"][i])
        for k in ("q_proj", "k_proj", "v_proj"):
            q(p + k, np.asarray(at[k]["kernel"][i]).T)
        f16(p + "q_norm", at["q_norm"]["scale"][i])
        f16(p + "k_norm", at["k_norm"]["scale"][i])
        q(p + "gate_proj", np.asarray(at["gate_proj"]["kernel"][i]).T)
        q(p + "out_proj", np.asarray(at["out_proj"]["kernel"][i]).T)
        f16(p + "post_norm", blk["post_attn_norm"]["scale"][i])
        f16(p + "attn_gate", np.asarray(blk["attn_gate"][i]).reshape(1))
        f16(p + "pre_hada", blk["pre_hada_norm"]["scale"][i])
        for k in ("d1", "d2", "d3"):
            f16(p + k, mlp[k][i])
    st = params["stack"]
    for k in ("a_pre", "a_post", "a_res", "b_pre", "b_post", "b_res"):
        f16("mhc_" + k, st["mhc_" + k])
    for k in ("pre", "post", "res"):
        phi = np.asarray(st["mhc_phi_" + k])
        q("mhc_phi_" + k, phi.transpose(0, 2, 1).reshape(-1, phi.shape[1]))
    for s in range(len(tuple(c["engram_layers"]))):
        e = params["engrams_%d" % s]
        q("engram%d.tables" % s, np.asarray(e["embedding"]).reshape(-1, sub))
        q("engram%d.key_proj" % s, np.asarray(e["key_proj"]["kernel"]).T)
        q("engram%d.value_proj" % s, np.asarray(e["value_proj"]["kernel"]).T)
        f16("engram%d.taps" % s, e["taps"])
    f16("final_norm", st["final_norm"]["scale"])
    present = [(k, code) for k, code in (("contrastive_head", 1), ("confidence_head", 2))
               if k in params]
    if present:
        f16("heads.manifest", np.array([code for _, code in present], np.float16))
        for k, _ in present:
            h = params[k]
            ker = np.asarray(h["proj"]["kernel"]).T
            f16(k + ".probes", h["probes"])
            f16(k + ".proj", ker)
            f16(k + ".bias", h["proj"]["bias"] if "bias" in h["proj"]
                else np.zeros(ker.shape[0], np.float16))
    return ts, orders, heads, sub


def build(params, cfg, bits=4, bits_map=None, tokenizer_blob=None, group=128):
    c = full_config(cfg)
    spec = parse_bits_map(bits_map) if bits_map else bits
    ts, orders, heads, sub = tensors(params, c, spec, group)
    if tokenizer_blob is not None:
        ts.append(("tokenizer", RAW, (), bytes(tokenizer_blob), 0, 0))
    cb = np.concatenate([codebook(b, group) for b in (2, 3, 4)]).astype(np.float32)
    d = c["d_model"]
    hd = (c["attn_dim"] or d) // c["num_heads"]
    sites = tuple(c["engram_layers"])
    o4 = (list(orders) + [0] * 4)[:4]
    s4 = (list(sites) + [0] * 4)[:4]
    head = HEADER.pack(TAG, len(ts), len(cb), kv_window(c), int(c["kv_bits"] or 8),
                       c["vocab_size"], d, c["num_heads"], c["num_kv_heads"], c["num_layers"],
                       hd, c["max_seq_len"], 1 << (d - 1).bit_length(), c["mhc_lanes"],
                       c["engram_slots"], sub, len(orders) * heads, TAPS, max(orders),
                       len(orders), *o4, len(sites), *s4, float(c["rope_theta"]))
    head += cb.tobytes()
    pos = len(head) + RECORD.size * len(ts)
    offs = []
    for t in ts:
        pos = (pos + ALIGN - 1) // ALIGN * ALIGN
        offs.append(pos)
        pos += len(t[3])
    out = bytearray(head)
    for t, off in zip(ts, offs):
        shape = (list(t[2]) + [0] * 4)[:4]
        out += RECORD.pack(t[1], len(t[2]), 0, *shape, off, len(t[3]), t[4], t[5])
    for t, off in zip(ts, offs):
        out += b"\0" * (off - len(out))
        out += t[3]
    return bytes(out), [t[0] for t in ts]


def parse(buf):
    """Independent parser: header dict, records, and per-record blobs."""
    if len(buf) < HEADER.size:
        raise ValueError("short")
    h = HEADER.unpack_from(buf, 0)
    if h[0] != TAG:
        raise ValueError("tag")
    names = ("tag num_tensors codebook_len kv_window kv_bits vocab d_model num_heads "
             "num_kv_heads num_layers head_dim max_seq_len hada_n mhc_lanes engram_slots "
             "engram_sub_dim num_engram_tables conv_taps conv_dilation num_orders").split()
    hdr = dict(zip(names, h[:20]))
    hdr["orders"] = h[20:20 + h[19]]
    hdr["num_sites"] = h[24]
    hdr["sites"] = h[25:25 + h[24]]
    hdr["rope_theta"] = h[29]
    off = HEADER.size
    hdr["codebook"] = np.frombuffer(buf[off:off + 4 * hdr["codebook_len"]], np.float32)
    off += 4 * hdr["codebook_len"]
    recs = []
    for i in range(hdr["num_tensors"]):
        r = RECORD.unpack_from(buf, off + i * RECORD.size)
        rec = dict(dtype=r[0], ndim=r[1], shape=tuple(r[3:3 + r[1]]), offset=r[7],
                   nbytes=r[8], group=r[9], bits=r[10])
        if rec["offset"] + rec["nbytes"] > len(buf):
            raise ValueError("blob past end")
        rec["blob"] = buf[rec["offset"]:rec["offset"] + rec["nbytes"]]
        recs.append(rec)
    return hdr, recs


def dequant(rec):
    if rec["dtype"] == FP16:
        return np.frombuffer(rec["blob"], np.float16).astype(np.float32).reshape(rec["shape"])
    if rec["dtype"] == FP32:
        return np.frombuffer(rec["blob"], np.float32).reshape(rec["shape"])
    if rec["dtype"] == CQ:
        return cq_unpack(rec["blob"], rec["shape"][0], rec["shape"][1], rec["bits"],
                         rec["group"])
    return rec["blob"]


def merge_lora(params, adapter):
    """W + (scale * A @ B) in float32, cast to W's dtype before the add."""
    import copy
    params = copy.deepcopy(params)
    scale = np.float32(adapter["scale"])
    for path, ab in adapter["lora"].items():
        node = params
        keys = path.split("/")
        for k in keys[:-1]:
            node = node[k]
        w = node[keys[-1]]
        a = np.asarray(ab["A"], np.float32)
        b = np.asarray(ab["B"], np.float32)
        delta = (scale * np.matmul(a.astype(np.float64), b).astype(np.float32)).astype(w.dtype)
        node[keys[-1]] = (w + delta).astype(w.dtype)
    return params


def main(argv):
    if argv[0] == "randn":
        sys.stdout.buffer.write(np.random.RandomState(0).randn(int(argv[1])).tobytes())
    elif argv[0] == "levels":
        for b in (2, 3, 4):
            print(" ".join(repr(float(v)) for v in lloyd_max(b)))
    elif argv[0] == "codebooks":
        cb = np.concatenate([codebook(b) for b in (2, 3, 4)]).astype(np.float32)
        print(" ".join("%08x" % v for v in cb.view(np.uint32)))
    elif argv[0] == "build":
        ckpt, out = argv[1], argv[2]
        bits, lora, tok = None, None, None
        rest = argv[3:]
        while rest:
            flag, val, rest = rest[0], rest[1], rest[2:]
            if flag == "--bits":
                bits = int(val)
            elif flag == "--lora":
                lora = val
            elif flag == "--tokenizer-blob":
                with open(val, "rb") as f:
                    tok = f.read()
        with open(ckpt, "rb") as f:
            ck = pickle.load(f)
        params, cfg = ck["params"], ck["config"]
        if lora:
            with open(lora, "rb") as f:
                params = merge_lora(params, pickle.load(f))
        spec = None if bits else (full_config(cfg)["weight_bits"] or None)
        buf, _ = build(params, cfg, bits=bits or 4, bits_map=spec, tokenizer_blob=tok)
        with open(out, "wb") as f:
            f.write(buf)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
