#!/usr/bin/python3
"""numpy-only reference for the Needle 3 .cact archive (cactus-needle 3.x
needle/model/export.py), written from reading it, independent of the C code.

  * build3(params, cfg, bits, tokenizer_blob, kv_window) -> bytes: the steps
    of 3.x's write_export for a flat {flax path: array} checkpoint;
  * parse3(buf) -> (header dict, codebook, records): an independent parser
    (every header field by name, the directory, blob slices);
  * effective_kv_window(cfg): 3.x architecture.py's rule;
  * hada_perms(n, split): 3.x _hada_perms (numpy RandomState 11 / 13).

Layout (little-endian):
  header "<48If" (196 bytes): tag 0x05E12A84, num_tensors, codebook_len,
    kv_window, kv_bits, vocab, out_vocab, d_model, num_heads, num_kv_heads,
    num_layers, qk_head_dim, v_head_dim, max_seq_len, hada_n, mhc_lanes,
    sliding_window, global_mask_lo, global_mask_hi, qkv_conv_taps,
    engram_slots, engram_sub_dim, num_engram_tables, engram_conv_taps (4),
    engram_conv_dilation (max order), engram_seed_heads, num_engram_orders,
    engram_orders[4], num_engram_sites, engram_sites[16], rope_theta (f32);
  28 float32 codebook levels (cb2 | cb3 | cb4 at group 128);
  num_tensors records "<BBHIIIIQQII" (dtype, ndim, 0, shape[4], offset,
    nbytes, group, bits); blobs at 64-byte aligned offsets, zero gaps.
Order: embedding; per layer norm_in, q, k, v, [q_taps, k_taps, v_taps],
  q_norm, k_norm, gate, out, post_norm, attn_gate, pre_hada, d1, d2, b2, d3,
  d4, w1a, w1b, w2a, w2b, w3a, w3b, cond_v, cond_u; mhc a_pre a_post a_res
  b_pre b_post b_res (FP16), phi_pre phi_post phi_res (CQ, (L*k, nC));
  hada_p1, hada_p2 (FP32); per engram site tables, key_proj, value_proj (CQ),
  taps; final_norm; heads (manifest, then per head probes, gain, query,
  row_bias, proj, bias [, calibration]); the RAW tokenizer.

One deliberate extension, marked below: a checkpoint with engram banks
(which 3.x's exporter cannot read: it indexes params["engrams_<s>"]) gets,
per site, its bank's tables.
"""
import struct

import numpy as np

import cact_ref as R

TAG3 = 0x05E12A84
HEADER3 = struct.Struct("<48If")
RECORD = R.RECORD
ALIGN = 64
FP16, FP32, CQ, RAW = 1, 2, 3, 4
HEAD_BITS = 4
FIELDS = ("tag num_tensors codebook_len kv_window kv_bits vocab out_vocab d_model num_heads "
          "num_kv_heads num_layers qk_head_dim v_head_dim max_seq_len hada_n mhc_lanes "
          "sliding_window global_mask_lo global_mask_hi qkv_conv_taps engram_slots "
          "engram_sub_dim num_engram_tables engram_conv_taps engram_conv_dilation "
          "engram_seed_heads num_engram_orders").split()
BLK = "stack/layers/block/"


def head_dims(cfg):
    legacy = (cfg.get("attn_dim", 0) or cfg["d_model"]) // cfg["num_heads"]
    return cfg.get("qk_head_dim") or legacy, cfg.get("v_head_dim") or legacy


def engram_geometry(cfg):
    orders = list(cfg.get("engram_orders", (2, 3)))
    heads = cfg.get("engram_heads", 0) or max(1, cfg["d_model"] // (len(orders) * 128))
    return orders, heads, cfg["d_model"] // (len(orders) * heads)


def effective_kv_window(cfg):
    budget, group, wmin = 11 * 1024 * 1024 + 512 * 1024, 32, 160
    qk, v = head_dims(cfg)
    kd, vd = cfg["num_kv_heads"] * qk, cfg["num_kv_heads"] * v
    d, L = cfg["d_model"], cfg["num_layers"]
    sites = len(cfg.get("engram_layers", (2, 15)))
    per_layer = kd + vd + (kd // group + vd // group) * 4
    per_site = d + (d // group) * 4
    sw = cfg.get("sliding_window", 0)
    if sw:
        n_global = len(cfg.get("global_layers", ()))
        local = min(sw, cfg["max_seq_len"])
        fixed = ((L - n_global) * per_layer + sites * per_site) * local
        if n_global == 0:
            w = cfg["max_seq_len"] if fixed <= budget else max(wmin, local)
        else:
            ctx = (budget - fixed) // (n_global * per_layer) // group * group
            w = max(wmin, min(ctx, cfg["max_seq_len"]))
    else:
        per_pos = L * per_layer + sites * per_site
        w = max(wmin, min((budget // per_pos) // group * group, cfg["max_seq_len"]))
    kw = cfg.get("kv_window", 0)
    return min(w, kw) if kw else w


def hada_perms(n, split):
    if split:
        h = n // 2
        return [np.concatenate([np.random.RandomState(s).permutation(h),
                                h + np.random.RandomState(s + 977).permutation(h)])
                for s in (11, 13)]
    return [np.random.RandomState(s).permutation(n) for s in (11, 13)]


def _fp16(name, a):
    a = np.asarray(a, np.float16)
    return (name, FP16, a.shape, a.tobytes(), 0, 0)


def _cq(name, mat, bits, group=128):
    mat = np.asarray(mat, np.float32)
    return (name, CQ, mat.shape, R.cq_pack(mat, bits, group), group, bits)


def tensors3(p, cfg, bits, group=128):
    """[(name, dtype, shape, blob, group, bits)] in archive order; p is the
    flat {flax path: array} checkpoint."""
    L, d = cfg["num_layers"], cfg["d_model"]
    taps = cfg.get("qkv_conv_taps", 0)
    ts = [_cq("embedding", p["embedding/embedding"], bits, group)]
    att = BLK + "self_attn/"
    mlp = BLK + "hadamard_mlp/"
    for i in range(L):
        pre = "layer%02d." % i
        ts.append(_fp16(pre + "norm_in", p[BLK + "ZCRMSNorm_0/scale"][i]))
        for k in ("q_proj", "k_proj", "v_proj"):
            ts.append(_cq(pre + k, p[att + k + "/kernel"][i].T, bits, group))
        if taps:
            for k in ("q_taps", "k_taps", "v_taps"):
                ts.append(_fp16(pre + k, p[att + k][i]))
        ts.append(_fp16(pre + "q_norm", p[att + "q_norm/scale"][i]))
        ts.append(_fp16(pre + "k_norm", p[att + "k_norm/scale"][i]))
        for k in ("gate_proj", "out_proj"):
            ts.append(_cq(pre + k, p[att + k + "/kernel"][i].T, bits, group))
        ts.append(_fp16(pre + "post_norm", p[BLK + "post_attn_norm/scale"][i]))
        ts.append(_fp16(pre + "attn_gate", np.asarray(p[BLK + "attn_gate"][i]).reshape(1)))
        ts.append(_fp16(pre + "pre_hada", p[BLK + "pre_hada_norm/scale"][i]))
        for k in ("d1", "d2", "b2", "d3", "d4", "w1a", "w1b", "w2a", "w2b", "w3a", "w3b",
                  "cond_v", "cond_u"):
            ts.append(_fp16(pre + k, p[mlp + k][i]))
    for k in ("a_pre", "a_post", "a_res", "b_pre", "b_post", "b_res"):
        ts.append(_fp16("mhc_" + k, p["stack/mhc_" + k]))
    for k in ("pre", "post", "res"):
        phi = np.asarray(p["stack/mhc_phi_" + k])
        nl, nc, lanes = phi.shape
        ts.append(_cq("mhc_phi_" + k, phi.transpose(0, 2, 1).reshape(nl * lanes, nc), bits, group))
    n = 1 << (d - 1).bit_length()
    for k, perm in zip(("hada_p1", "hada_p2"), hada_perms(n, bool(cfg.get("ladder_widths")))):
        ts.append((k, FP32, (n,), np.asarray(perm, np.float32).tobytes(), 0, 0))
    orders, heads, sub = engram_geometry(cfg)
    banks = list(cfg.get("engram_bank_ids", ()))
    for s in range(len(cfg.get("engram_layers", ()))):
        if banks:  # our extension (see the module docstring)
            table = p["engram_banks_%d/embedding" % banks[s]]
            rd = "engram_readers_%d/" % s
        else:
            table = p["engrams_%d/embedding" % s]
            rd = "engrams_%d/" % s
        ts.append(_cq("engram%d.tables" % s,
                      np.asarray(table).reshape(len(orders) * heads * cfg["engram_slots"], sub),
                      bits, group))
        ts.append(_cq("engram%d.key_proj" % s, p[rd + "key_proj/kernel"].T, bits, group))
        ts.append(_cq("engram%d.value_proj" % s, p[rd + "value_proj/kernel"].T, bits, group))
        ts.append(_fp16("engram%d.taps" % s, p[rd + "taps"]))
    ts.append(_fp16("final_norm", p["stack/final_norm/scale"]))
    present = [(code, key) for code, key in ((1, "embedding_head"), (2, "confidence_head"),
                                              (3, "router_head"))
               if any(name.startswith(key + "/") for name in p)]
    if present:
        ts.append(_fp16("heads.manifest", np.asarray([c for c, _ in present], np.float16)))
        for code, key in present:
            def get(sub_name, key=key):
                return p.get(key + "/" + sub_name)
            for part in ("probes", "gain", "query", "row_bias"):
                a = np.asarray(get(part))
                if part in ("probes", "query"):
                    ts.append(_cq(key + "." + part, a.reshape(-1, a.shape[-1]), HEAD_BITS, group))
                else:
                    ts.append(_fp16(key + "." + part, a))
            kernel = np.asarray(get("proj/kernel")).T
            ts.append(_cq(key + ".proj", kernel, HEAD_BITS, group))
            bias = get("proj/bias")
            ts.append(_fp16(key + ".bias", bias if bias is not None
                            else np.zeros(kernel.shape[0], np.float16)))
            if code == 3:
                cal = get("calibration")
                ts.append(_fp16(key + ".calibration",
                                cal if cal is not None else (0.90, 0.00, 0.60)))
    return ts


def header3(cfg, num_tensors, kv_window):
    qk, v = head_dims(cfg)
    orders, heads, sub = engram_geometry(cfg)
    sites = list(cfg.get("engram_layers", ()))
    gm = 0
    for g in cfg.get("global_layers", ()):
        gm |= 1 << int(g)
    vals = [TAG3, num_tensors, 28, int(kv_window or 0), int(cfg.get("kv_bits", 8) or 8),
            cfg["vocab_size"], int(cfg.get("out_vocab", 0) or 0), cfg["d_model"],
            cfg["num_heads"], cfg["num_kv_heads"], cfg["num_layers"], qk, v, cfg["max_seq_len"],
            1 << (cfg["d_model"] - 1).bit_length(), cfg["mhc_lanes"],
            int(cfg.get("sliding_window", 0) or 0), gm & 0xFFFFFFFF, (gm >> 32) & 0xFFFFFFFF,
            int(cfg.get("qkv_conv_taps", 0) or 0), cfg["engram_slots"], sub,
            len(orders) * heads, 4, max(orders), int(cfg.get("engram_seed_heads", 0) or 0),
            len(orders)] + (orders + [0] * 4)[:4] + [len(sites)] + (sites + [0] * 16)[:16]
    return HEADER3.pack(*vals, float(cfg["rope_theta"]))


def build3(p, cfg, bits=4, tokenizer_blob=None, kv_window=None, group=128):
    ts = tensors3(p, cfg, bits, group)
    if tokenizer_blob is not None:
        ts.append(("tokenizer", RAW, (), bytes(tokenizer_blob), 0, 0))
    if kv_window is None:
        kv_window = effective_kv_window(cfg)
    cb = np.concatenate([R.codebook(b, group) for b in (2, 3, 4)]).astype(np.float32)
    head = header3(cfg, len(ts), kv_window) + cb.tobytes()
    pos = len(head) + len(ts) * RECORD.size
    offs = []
    for t in ts:
        pos = (pos + ALIGN - 1) // ALIGN * ALIGN
        offs.append(pos)
        pos += len(t[3])
    out = bytearray(head)
    for (name, dt, shape, blob, g, b), off in zip(ts, offs):
        sh = (list(shape) + [0, 0, 0, 0])[:4]
        out += RECORD.pack(dt, len(shape), 0, *sh, off, len(blob), g, b)
    for (name, dt, shape, blob, g, b), off in zip(ts, offs):
        out += b"\0" * (off - len(out))
        out += blob
    return bytes(out), [t[0] for t in ts]


def parse3(buf):
    v = HEADER3.unpack_from(buf, 0)
    h = dict(zip(FIELDS, v[:27]))
    h["engram_orders"] = list(v[27:31])
    h["num_engram_sites"] = v[31]
    h["engram_sites"] = list(v[32:48])
    h["rope_theta"] = v[48]
    off = HEADER3.size
    cb = np.frombuffer(buf[off:off + 4 * h["codebook_len"]], np.float32)
    off += 4 * h["codebook_len"]
    recs = []
    for i in range(h["num_tensors"]):
        r = RECORD.unpack_from(buf, off + i * RECORD.size)
        recs.append(dict(dtype=r[0], ndim=r[1], pad=r[2], shape=tuple(r[3:3 + r[1]]),
                         shape4=r[3:7], offset=r[7], nbytes=r[8], group=r[9], bits=r[10],
                         blob=buf[r[7]:r[7] + r[8]]))
    return h, cb, recs


def dequant3(rec):
    if rec["dtype"] == FP16:
        return np.frombuffer(rec["blob"], np.float16).astype(np.float32).reshape(rec["shape"])
    if rec["dtype"] == FP32:
        return np.frombuffer(rec["blob"], np.float32).reshape(rec["shape"])
    if rec["dtype"] == CQ:
        rows, cols = rec["shape"]
        return R.cq_unpack(rec["blob"], rows, cols, rec["bits"], rec["group"])
    return rec["blob"]
