#!/usr/bin/python3
"""Independent float64 numpy reference of upstream Needle 3 (cactus-needle 3.x).

Written from upstream's 3.x architecture.py / checkpoints.py / finetune.py
(the math, not our C code). docs/model.md "Needle 3 (3.x) math" is the
specification; the comments "§6.N" below cite its numbered pieces.

What it computes, all in float64 from the values stored in the file:
  * the forward logits of token sequences under the causal mask only (how
    finetune applies the model: model.apply(params, ids) with mask None),
    float numerics (quant=False: no CQ weights, no 8-bit activations);
  * the fine-tune loss (finetune.loss_fn): logits[:-1] vs ids[1:], weighted
    by mask[1:], summed over all sequences / max(sum(mask[1:]), 1);
  * with a 3.x LoRA adapter, the merged kernels W + scale * A @ B on the five
    attention kernels, and dL/dA, dL/dB by central finite differences.

CLI:
  ref_needle3.py CKPT.safetensors (--tokens 1,5,7,... | --tokens-file F) ...
      [--adapter ADAPTER.safetensors]
      [--mask 0,0,1,... | --mask-file F]      loss mask (default all ones)
      [--logits OUT.bin [--logits-dtype f32|f64]]
      [--loss]                                 print a JSON line to stdout
      [--grads OUT.json [--grad-entries N|all] [--grad-seed S] [--fd-step H]]
      [--trace OUT.json] [--rope f32|f64]
      [--check-logits F] [--check-loss X] [--check-grads F.json]
      [--tol 1e-5] [--grad-tol 1e-4]
  --rope f32 (default) takes RoPE angles as upstream's float32 tables hold
  them; f64 computes them exactly.
  --tokens may be repeated (one sequence each; --mask repeated to match);
  a tokens/mask file has one sequence per line, ids separated by commas or
  blanks. Several sequences form one batch: the loss is token-weighted over
  all of them (the same as upstream's padded batch, since pads sit after the
  last real token and are masked).

Output formats:
  --logits  raw little-endian float32 (or float64), the sequences' logits
            concatenated, each T x Vout row-major (Vout = out_vocab or vocab).
  --loss    {"loss": L, "count": sum(mask[1:]), "per_sequence": [{"sum": s,
            "count": c}, ...]} on one line.
  --grads   {"loss": L, "scale": s, "fd_step": h, "tensors": {"lora/<path>/A":
            {"shape": [...], "index": [flat row-major indices], "grad":
            [dL/d entry, ...]}, ...}}; needs --adapter.
  --trace   {"engram_indices": [T x K ints, per sequence], "hada_perms":
            [p1, p2], "vout": Vout, "hidden": [per sequence: L + 1 lists of
            T x d floats: x0, then the lane mean after each layer]}.
Comparison (for tests of another implementation; each prints one JSON line):
  --check-logits FILE   FILE laid out as --logits writes (float32): per
                        sequence max|c - r| / max|r| <= --tol (1e-5)
  --check-loss VALUE    |VALUE - loss| / |loss| <= --tol
  --check-grads FILE    JSON of the --grads layout (entries without "index"
                        list every entry); per tensor, at the reference's
                        entries, max|c - r| / max(max|r|, 1e-3 * max|r| over
                        all tensors) <= --grad-tol (1e-4)
Exit status 0 on success, 1 on a bad file or input (message on stderr names
the file and the field), 2 on usage errors, 3 when a --check-* disagrees.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fq3_ref import ref_cq_ste, ref_cq_ste_leaf, ref_fake_quant  # noqa: E402

M32 = 0xFFFFFFFF
ENGRAM_SEED = 0x9E3779B9
ENGRAM_PRIME = 0x01000193
ENGRAM_SUB_DIM = 128
ENGRAM_CONV_TAPS = 4
HADA_PERM_SEEDS = (11, 13)
SPLIT_PERM_OFFSET = 977
SINKHORN_ROUNDS = 20
EPS = 1e-6
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "gate_proj", "out_proj")
ATTN = "stack/layers/block/self_attn/"
BLOCK = "stack/layers/block/"
MLP = "stack/layers/block/hadamard_mlp/"


class RefError(Exception):
    pass


# ---------------------------------------------------------------- safetensors

_DT = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": (None, 2), "F64": ("<f8", 8)}


def read_safetensors(path):
    """-> ({name: float64 array}, {metadata str: str}, {name: dtype str})."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise RefError("%s: cannot read: %s" % (path, e.strerror))
    if len(data) < 8:
        raise RefError("%s: shorter than the 8-byte header length" % path)
    (hlen,) = struct.unpack("<Q", data[:8])
    if hlen > len(data) - 8:
        raise RefError("%s: header length %d runs past the end (%d bytes)" % (path, hlen, len(data)))
    try:
        header = json.loads(data[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RefError("%s: header is not JSON: %s" % (path, e))
    if not isinstance(header, dict):
        raise RefError("%s: header is not a JSON object" % path)
    body = data[8 + hlen:]
    meta = header.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise RefError("%s: __metadata__ must map names to strings" % path)
    tensors, dtypes = {}, {}
    for name, info in header.items():
        where = "%s: tensor %r" % (path, name)
        if not isinstance(info, dict):
            raise RefError(where + ": entry is not an object")
        dt = info.get("dtype")
        if dt not in _DT:
            raise RefError(where + ": unsupported dtype %r" % (dt,))
        shape = info.get("shape")
        offs = info.get("data_offsets")
        if (not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape)):
            raise RefError(where + ": bad shape %r" % (shape,))
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) for o in offs)
                or not 0 <= offs[0] <= offs[1] <= len(body)):
            raise RefError(where + ": data_offsets %r outside the %d data bytes" % (offs, len(body)))
        count = int(np.prod(shape)) if shape else 1
        npdt, size = _DT[dt]
        if offs[1] - offs[0] != count * size:
            raise RefError(where + ": %d bytes for shape %r of %s (want %d)"
                           % (offs[1] - offs[0], shape, dt, count * size))
        raw = body[offs[0]:offs[1]]
        if dt == "BF16":
            u = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
            a = u.astype("<u4").view("<f4")
        else:
            a = np.frombuffer(raw, npdt)
        tensors[name] = a.astype(np.float64).reshape(shape)
        dtypes[name] = dt
    return tensors, meta, dtypes


# ---------------------------------------------------------------- config

# upstream TransformerConfig class defaults (3.x)
_CLASS_DEFAULTS = dict(
    vocab_size=16384, d_model=768, num_heads=12, num_kv_heads=2, num_layers=20,
    qk_head_dim=48, v_head_dim=64, max_seq_len=4096, pad_token_id=0,
    embedding_dim=128, embedding_probes=4, embedding_queries=4,
    confidence_probes=4, confidence_queries=4, router_probes=4, router_queries=4,
    rope_theta=100000.0, dtype="bfloat16", flash=True, engram_orders=(2, 3),
    engram_heads=0, engram_slots=18432, engram_seed_heads=0,
    engram_layers=(3, 7, 11, 15, 19), global_layers=(4, 9, 14, 19),
    sliding_window=1024, ladder_depths=(), ladder_sample=False, ladder_widths=(),
    ladder_order=(), mhc_lanes=4, qkv_conv_taps=3, out_vocab=0, kv_window=0,
    kv_bits=8, act_bits=8, weight_bits="", remat=True, scan_unroll=1,
    attention_gate="elementwise", hada_factor_mode="shared", engram_bank_ids=(),
    cla_pairs=())

# TransformerConfig.from_saved: a key missing from a saved config means "off"
_MISSING_MEANS_OFF = dict(
    qk_head_dim=0, v_head_dim=0, sliding_window=0, global_layers=(), ladder_depths=(),
    ladder_sample=False, ladder_widths=(), ladder_order=(), engram_seed_heads=0,
    qkv_conv_taps=0, out_vocab=0, attention_gate="elementwise",
    hada_factor_mode="shared", engram_bank_ids=(), cla_pairs=())


class Config:
    """The fields the forward uses, resolved as upstream's load_checkpoint does."""

    def __init__(self, saved, where="config"):
        if not isinstance(saved, dict):
            raise RefError(where + ": not a JSON object")
        if "attn_dim" in saved and "qk_head_dim" not in saved:
            raise RefError(where + ": a Needle 2 config (attn_dim without qk_head_dim)")
        s = {k: v for k, v in saved.items() if k in _CLASS_DEFAULTS}
        for k, off in _MISSING_MEANS_OFF.items():
            s.setdefault(k, off)
        c = dict(_CLASS_DEFAULTS)
        c.update(s)
        if "engram_layers" not in s:      # the class default, cut to the depth
            c["engram_layers"] = tuple(l for l in c["engram_layers"] if l < c["num_layers"])
        self.raw = c
        g = lambda k: c[k]
        self.V, self.d, self.H, self.G = g("vocab_size"), g("d_model"), g("num_heads"), g("num_kv_heads")
        self.L, self.n = g("num_layers"), g("mhc_lanes")
        self.qk = g("qk_head_dim") or self.d // self.H
        self.vd = g("v_head_dim") or self.d // self.H
        self.theta = float(g("rope_theta"))
        self.orders = tuple(int(o) for o in g("engram_orders"))
        self.engram_layers = tuple(int(l) for l in g("engram_layers"))
        self.global_layers = tuple(int(l) for l in g("global_layers"))
        self.window = int(g("sliding_window"))
        self.taps = int(g("qkv_conv_taps"))
        self.out_vocab = int(g("out_vocab"))
        self.gate = g("attention_gate")
        self.factor_mode = g("hada_factor_mode")
        self.bank_ids = tuple(int(b) for b in g("engram_bank_ids"))
        self.cla_pairs = tuple(tuple(int(x) for x in p) for p in g("cla_pairs"))
        self.split_perms = bool(tuple(g("ladder_widths")))
        self.slots = int(g("engram_slots"))
        self.seed_heads = int(g("engram_seed_heads"))
        self.eheads = g("engram_heads") or max(1, self.d // (len(self.orders) * ENGRAM_SUB_DIM))
        self.esub = self.d // (len(self.orders) * self.eheads)
        self._validate(where)

    def _validate(self, where):
        bad = lambda msg: RefError("%s: %s" % (where, msg))
        if self.gate not in ("elementwise", "headwise"):
            raise bad("attention_gate %r unsupported" % (self.gate,))
        if self.factor_mode not in ("shared", "block_untied"):
            raise bad("hada_factor_mode %r unsupported" % (self.factor_mode,))
        if self.H % self.G:
            raise bad("num_heads %d not a multiple of num_kv_heads %d" % (self.H, self.G))
        if self.qk % 2:
            raise bad("qk head dim %d is odd (RoPE splits it in halves)" % self.qk)
        if any(not 0 <= l < self.L for l in self.engram_layers):
            raise bad("engram_layers %r outside the depth" % (self.engram_layers,))
        if self.bank_ids:
            if len(self.bank_ids) != len(self.engram_layers):
                raise bad("engram_bank_ids must contain one bank id per Engram site")
            if set(self.bank_ids) != set(range(max(self.bank_ids) + 1)):
                raise bad("engram bank ids must be contiguous starting at zero")
        used = set()
        for p in self.cla_pairs:
            if len(p) != 2:
                raise bad("CLA pair %r is not (producer, consumer)" % (p,))
            a, b = p
            if not (0 <= a < self.L and 0 <= b < self.L):
                raise bad("CLA pair %r outside the depth" % (p,))
            if b != a + 1:
                raise bad("CLA pair %r is not adjacent" % (p,))
            if a in used or b in used:
                raise bad("CLA layer in more than one pair: %r" % (p,))
            if (a in self.global_layers) != (b in self.global_layers):
                raise bad("CLA pair %r mixes local and global masks" % (p,))
            used.update(p)

    @property
    def vout(self):
        return self.out_vocab or self.V


def load_checkpoint(path):
    """-> (params {name: float64 array}, Config, metadata)."""
    tensors, meta, _ = read_safetensors(path)
    version = meta.get("format_version")
    if version != "2":
        raise RefError("%s: __metadata__.format_version is %r, want \"2\"" % (path, version))
    try:
        saved = json.loads(meta.get("config") or "{}")
    except ValueError as e:
        raise RefError("%s: __metadata__.config is not JSON: %s" % (path, e))
    cfg = Config(saved, "%s: __metadata__.config" % path)
    params = {k: v for k, v in tensors.items() if not k.startswith("mtp_")}
    return params, cfg, meta


def load_adapter(path, cfg, params):
    """-> ({kernel path: (A, B)}, scale, metadata) of a 3.x adapter."""
    tensors, meta, _ = read_safetensors(path)
    fields = {}
    for key in ("scale", "base", "rank", "seed"):
        text = meta.get(key)
        try:
            fields[key] = None if text in (None, "") else json.loads(text)
        except ValueError:
            raise RefError("%s: __metadata__.%s is not JSON: %r" % (path, key, text))
    if not isinstance(fields["scale"], (int, float)) or isinstance(fields["scale"], bool):
        raise RefError("%s: __metadata__.scale must be a number, got %r" % (path, fields["scale"]))
    pairs = {}
    for name, a in tensors.items():
        if not name.startswith("lora/") or name.count("/") < 3:
            raise RefError("%s: tensor %r is not lora/<path>/A|B" % (path, name))
        key, _, which = name[5:].rpartition("/")
        if which not in ("A", "B"):
            raise RefError("%s: tensor %r does not end in /A or /B" % (path, name))
        pairs.setdefault(key, {})[which] = a
    out = {}
    for key, ab in sorted(pairs.items()):
        parts = key.split("/")
        if not (parts[-1] == "kernel" and "stack" in parts and "layers" in parts
                and any(t in parts for t in LORA_TARGETS)):
            raise RefError("%s: lora/%s is not a LoRA target kernel" % (path, key))
        if key not in params:
            raise RefError("%s: lora/%s names no kernel of the checkpoint" % (path, key))
        if set(ab) != {"A", "B"}:
            raise RefError("%s: lora/%s lacks %s" % (path, key, ({"A", "B"} - set(ab)).pop()))
        W, A, B = params[key], ab["A"], ab["B"]
        if (A.ndim != W.ndim or B.ndim != W.ndim or A.shape[:-1] != W.shape[:-1]
                or B.shape[:-2] != W.shape[:-2] or B.shape[-1] != W.shape[-1]
                or A.shape[-1] != B.shape[-2]):
            raise RefError("%s: lora/%s: A %r and B %r do not fit the kernel %r"
                           % (path, key, A.shape, B.shape, W.shape))
        out[key] = (A, B)
    return out, float(fields["scale"]), fields


def merge_lora(params, lora, scale):
    """finetune.merge_lora: W + scale * A @ B (batched over the layer axis)."""
    merged = dict(params)
    for key, (A, B) in lora.items():
        merged[key] = params[key] + scale * np.matmul(A, B)
    return merged


# ---------------------------------------------------------------- pieces

def need(P, name, shape, used=None):
    if used is not None:
        used.add(name)
    a = P.get(name)
    if a is None:
        raise RefError("checkpoint lacks tensor %s (shape %r)" % (name, shape))
    if tuple(a.shape) != tuple(shape):
        raise RefError("tensor %s has shape %r, want %r" % (name, tuple(a.shape), tuple(shape)))
    return a


def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def logsumexp(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    return m + np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))


def softmax(x, axis=-1):
    return np.exp(x - logsumexp(x, axis))


def rms_unit(x):
    """§6.2: x / sqrt(mean(x^2) + 1e-6) over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS)


def zcrms(x, scale):
    """§6.2 ZCRMSNorm: (1 + scale) * rms_unit(x)."""
    return (1.0 + scale) * rms_unit(x)


def shift_right(z, k):
    """z[t - k] along axis 0, zero for t < k."""
    if k == 0:
        return z
    out = np.zeros_like(z)
    if k < z.shape[0]:
        out[k:] = z[:-k]
    return out


def mask_diag(mask, k):
    """§6.3 upstream _mask_diag: ok[t] = mask[t, t - k] for t >= k, else 0."""
    T = mask.shape[0]
    ok = np.zeros(T)
    for t in range(k, T):
        ok[t] = 1.0 if mask[t, t - k] else 0.0
    return ok


def causal_mask(T):
    return np.tril(np.ones((T, T), dtype=bool))


def local_mask(T, window):
    pos = np.arange(T)
    return causal_mask(T) & ((pos[:, None] - pos[None, :]) < window)


def engram_indices(tokens, orders, heads, slots, seed_heads=0):
    """§6.5: (T, K) table rows; table k = oi * heads + h."""
    u = np.asarray(tokens, dtype=np.uint64) & M32
    stride = seed_heads or heads
    cols = []
    for oi, order in enumerate(orders):
        for h in range(heads):
            seed = (ENGRAM_SEED * (oi * stride + h + 1)) & M32
            acc = np.full(u.shape, seed, dtype=np.uint64)
            for j in range(order):
                acc = ((acc ^ shift_right(u, j)) * ENGRAM_PRIME) & M32
            acc = acc ^ (acc >> np.uint64(15))
            cols.append(acc % np.uint64(slots))
    return np.stack(cols, axis=-1).astype(np.int64)


def sinkhorn(logits, rounds=SINKHORN_ROUNDS):
    """§6.6: rounds of (row, then column) log-normalisation, then exp."""
    lk = logits
    for _ in range(rounds):
        lk = lk - logsumexp(lk, -1)
        lk = lk - logsumexp(lk, -2)
    return np.exp(lk)


def rope_tables(qk, T, theta, f32=True):
    """§6.8 step 4: (cos, sin) of angle[t, i] = t * theta^(-2i/qk), i < qk/2.
    f32: the angles as upstream's float32 tables hold them (exponent, power,
    reciprocal and product each rounded to float32); else exact float64."""
    if f32:
        expo = np.arange(0, qk, 2).astype(np.float32) / np.float32(qk)
        freqs = np.float32(1.0) / (np.float32(theta) ** expo)
        ang = np.outer(np.arange(T).astype(np.float32), freqs).astype(np.float32)
        ang = ang.astype(np.float64)
    else:
        freqs = 1.0 / (theta ** (np.arange(0, qk, 2, dtype=np.float64) / qk))
        ang = np.outer(np.arange(T, dtype=np.float64), freqs)
    return np.cos(ang), np.sin(ang)


def apply_rope(x, cos, sin):
    """x (T, heads, qk): halves [x1 cos - x2 sin, x2 cos + x1 sin]."""
    half = x.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def hada_sizes(d):
    n = 1 << (d - 1).bit_length()
    ba = 1 << ((n - 1).bit_length() // 2)
    return n, ba, n // ba


def hada_perms(n, split):
    """§6.9: numpy legacy RandomState permutations, seeds 11 and 13."""
    if split:
        h = n // 2
        return tuple(np.concatenate([np.random.RandomState(s).permutation(h),
                                     h + np.random.RandomState(s + SPLIT_PERM_OFFSET).permutation(h)])
                     for s in HADA_PERM_SEEDS)
    return tuple(np.random.RandomState(s).permutation(n) for s in HADA_PERM_SEEDS)


def kron_apply(z, wa, wb, mode):
    """§6.9: z (..., ba*bb) viewed as (ba, bb); shared: out[k,l] = sum_ij
    z[i,j] wa[i,k] wb[j,l]; block_untied: sum_ij z[i,j] wa[j,i,k] wb[k,j,l]."""
    lead = z.shape[:-1]
    if mode == "block_untied":
        ba, bb = wa.shape[1], wb.shape[1]
        w = z.reshape(*lead, ba, bb)
        tmp = np.einsum("...ij,jik->...kj", w, wa)       # sum over i
        out = np.einsum("...kj,kjl->...kl", tmp, wb)     # sum over j
    else:
        ba, bb = wa.shape[0], wb.shape[0]
        w = z.reshape(*lead, ba, bb)
        tmp = np.einsum("...ij,ik->...kj", w, wa)         # sum over i
        out = np.einsum("...kj,jl->...kl", tmp, wb)       # sum over j
    return out.reshape(*lead, ba * bb)


def hadamard_mlp(x, p, mode, perms):
    """§6.9 on x (T, d); p holds this layer's w1a..w3b, d1, d2, b2, d3, d4, cond_v, cond_u."""
    d = x.shape[-1]
    n = p["d1"].shape[-1]
    p1, p2 = perms
    cond = 1.0 + softmax(x @ p["cond_v"], -1) @ p["cond_u"]
    z = np.concatenate([x, np.zeros(x.shape[:-1] + (n - d,))], axis=-1) if n > d else x
    z = kron_apply(p["d1"] * z, p["w1a"], p["w1b"], mode)[..., p1]
    g = p["d2"] * cond * z + p["b2"]
    z = kron_apply(g * sigmoid(g), p["w2a"], p["w2b"], mode)[..., p2]
    z = kron_apply(p["d3"] * z, p["w3a"], p["w3b"], mode)
    return (p["d4"] * z)[..., :d]


def attend(q, k, v, mask):
    """§6.8 step 6: q (T, H, qk), k (T, G, qk), v (T, G, vd) -> (T, H, vd);
    query head h reads kv head h // (H / G); scores scaled by 1/sqrt(qk)."""
    H, G = q.shape[1], k.shape[1]
    group = np.arange(H) // (H // G)
    s = np.einsum("thd,shd->hts", q, k[:, group]) / math.sqrt(q.shape[-1])
    s = np.where(mask[None], s, -np.inf)
    return np.einsum("hts,shd->thd", softmax(s, -1), v[:, group])


def conv_taps(z, taps, ok):
    """§6.8: sum_j taps[j] * z[t - j] * ok[j][t] (ok[0] is all ones)."""
    out = taps[0] * z
    for j in range(1, taps.shape[0]):
        out = out + taps[j] * shift_right(z, j) * ok[j][:, None]
    return out


# ---------------------------------------------------------------- the model

class Quant:
    """3.x's quant=True numerics (quantize.py; finetune's loss): the
    quantisers in float32 (tools/fq3_ref.py), their outputs carried on in
    float64. act/kv bits from the config (3.x defaults 8), weights CQ at
    WEIGHT_BITS 4, group 128; q at 8 bits; k/v: 0 none, >= 8 the 8-bit
    rule, 2/3/4 CQ with group 64 along the head."""

    def __init__(self, cfg):
        self.act_bits = int(cfg.raw.get("act_bits", 8))
        self.kv_bits = int(cfg.raw.get("kv_bits", 8))
        if not 2 <= self.act_bits <= 16 or self.kv_bits not in (0, 2, 3, 4) and self.kv_bits < 8:
            raise RefError("config: act_bits %d / kv_bits %d not trainable"
                           % (self.act_bits, self.kv_bits))

    @staticmethod
    def weights(P):
        return {k: ref_cq_ste_leaf(k, np.asarray(v, np.float32), 4, 128).astype(np.float64)
                for k, v in P.items()}

    def act(self, x):
        return ref_fake_quant(x, x.shape[-1], self.act_bits).astype(np.float64)

    def query(self, q):
        return ref_fake_quant(q, q.shape[-1], 8).astype(np.float64)

    def kv(self, x):
        if self.kv_bits == 0:
            return x
        if self.kv_bits >= 8:
            return ref_fake_quant(x, x.shape[-1], 8).astype(np.float64)
        return ref_cq_ste(x, self.kv_bits, 64).astype(np.float64)


class Model:
    """The 3.x forward for one Config and parameter dict (float64); with
    quant, 3.x's quant=True forward on cq_ste(P) (class Quant)."""

    def __init__(self, P, cfg, rope_f32=True, quant=False):
        self.q = Quant(cfg) if quant else None
        if quant:
            P = Quant.weights(P)
        self.P, self.cfg, self.rope_f32 = P, cfg, rope_f32
        c = cfg
        d, L, n, H, G, qk, vd = c.d, c.L, c.n, c.H, c.G, c.qk, c.vd
        if c.out_vocab > c.V:
            raise RefError("config: out_vocab %d > vocab_size %d" % (c.out_vocab, c.V))
        self.used = set()
        s = lambda name, shape: need(P, name, shape, self.used)
        self.E = s("embedding/embedding", (c.V, d))
        self.mhc = {k: s("stack/mhc_" + k, sh) for k, sh in (
            ("phi_pre", (L, n * d, n)), ("phi_post", (L, n * d, n)), ("phi_res", (L, n * d, n * n)),
            ("b_pre", (L, n)), ("b_post", (L, n)), ("b_res", (L, n, n)),
            ("a_pre", (L,)), ("a_post", (L,)), ("a_res", (L,)))}
        self.final_norm = s("stack/final_norm/scale", (d,))
        gate_out = H if c.gate == "headwise" else H * vd
        self.blk = {
            "norm_in": s(BLOCK + "ZCRMSNorm_0/scale", (L, d)),
            "wq": s(ATTN + "q_proj/kernel", (L, d, H * qk)),
            "wk": s(ATTN + "k_proj/kernel", (L, d, G * qk)),
            "wv": s(ATTN + "v_proj/kernel", (L, d, G * vd)),
            "q_norm": s(ATTN + "q_norm/scale", (L, qk)),
            "k_norm": s(ATTN + "k_norm/scale", (L, qk)),
            "wg": s(ATTN + "gate_proj/kernel", (L, d, gate_out)),
            "wo": s(ATTN + "out_proj/kernel", (L, H * vd, d)),
            "post_norm": s(BLOCK + "post_attn_norm/scale", (L, d)),
            "pre_hada": s(BLOCK + "pre_hada_norm/scale", (L, d)),
            "attn_gate": s(BLOCK + "attn_gate", (L,)),
        }
        if c.taps:
            self.blk["qt"] = s(ATTN + "q_taps", (L, c.taps, H * qk))
            self.blk["kt"] = s(ATTN + "k_taps", (L, c.taps, G * qk))
            self.blk["vt"] = s(ATTN + "v_taps", (L, c.taps, G * vd))
        N, ba, bb = hada_sizes(d)
        self.mlp = {}
        for i in (1, 2, 3):
            if c.factor_mode == "block_untied":
                self.mlp["w%da" % i] = s(MLP + "w%da" % i, (L, bb, ba, ba))
                self.mlp["w%db" % i] = s(MLP + "w%db" % i, (L, ba, bb, bb))
            else:
                self.mlp["w%da" % i] = s(MLP + "w%da" % i, (L, ba, ba))
                self.mlp["w%db" % i] = s(MLP + "w%db" % i, (L, bb, bb))
        for k in ("d1", "d2", "b2", "d3", "d4"):
            self.mlp[k] = s(MLP + k, (L, N))
        self.mlp["cond_v"] = s(MLP + "cond_v", (L, d, 8))
        self.mlp["cond_u"] = s(MLP + "cond_u", (L, 8, N))
        self.perms = hada_perms(N, c.split_perms)
        self.sites = []
        if c.engram_layers:
            K, sub = len(c.orders) * c.eheads, c.esub
            if c.bank_ids:
                banks = [s("engram_banks_%d/embedding" % b, (K, c.slots, sub))
                         for b in range(max(c.bank_ids) + 1)]
                for i in range(len(c.engram_layers)):
                    r = "engram_readers_%d/" % i
                    self.sites.append(dict(table=banks[c.bank_ids[i]],
                                           wk=s(r + "key_proj/kernel", (K * sub, d)),
                                           wv=s(r + "value_proj/kernel", (K * sub, d)),
                                           taps=s(r + "taps", (ENGRAM_CONV_TAPS, d))))
            else:
                for i in range(len(c.engram_layers)):
                    r = "engrams_%d/" % i
                    self.sites.append(dict(table=s(r + "embedding", (K, c.slots, sub)),
                                           wk=s(r + "key_proj/kernel", (K * sub, d)),
                                           wv=s(r + "value_proj/kernel", (K * sub, d)),
                                           taps=s(r + "taps", (ENGRAM_CONV_TAPS, d))))

    # §6.5
    def aq(self, x):
        """_aq: the A8 activation rounding (identity in float)."""
        return self.q.act(x) if self.q else x

    def engram_kv(self, tokens, mask, trace=None):
        c = self.cfg
        if not c.engram_layers:
            return []
        idx = engram_indices(tokens, c.orders, c.eheads, c.slots, c.seed_heads)
        if trace is not None:
            trace.setdefault("engram_indices", []).append(idx.tolist())
        T, K = idx.shape
        ngram_ok = np.stack([mask_diag(mask, o - 1) for o in c.orders for _ in range(c.eheads)], -1)
        dil = max(c.orders)
        tap_ok = [mask_diag(mask, j * dil) for j in range(ENGRAM_CONV_TAPS)]
        out = []
        for site in self.sites:
            rows = site["table"][np.arange(K)[None, :], idx]          # (T, K, sub)
            e = self.aq((rows * ngram_ok[..., None]).reshape(T, K * c.esub))
            k = e @ site["wk"]
            v0 = e @ site["wv"]
            v = sum(site["taps"][j] * shift_right(v0, j * dil) * tap_ok[j][:, None]
                    for j in range(ENGRAM_CONV_TAPS))
            out.append((k, v))
        return out

    # §6.8
    def attention(self, l, a, mask, rope, cla_in, is_cons):
        c, b = self.cfg, self.blk
        T = a.shape[0]
        q, k, v = a @ b["wq"][l], a @ b["wk"][l], a @ b["wv"][l]
        if c.taps:
            ok = [None] + [mask_diag(mask, j) for j in range(1, c.taps)]
            q = conv_taps(q, b["qt"][l], ok)
            k = conv_taps(k, b["kt"][l], ok)
            v = conv_taps(v, b["vt"][l], ok)
        cos, sin = rope
        q = apply_rope(zcrms(q.reshape(T, c.H, c.qk), b["q_norm"][l]), cos, sin)
        k = apply_rope(zcrms(k.reshape(T, c.G, c.qk), b["k_norm"][l]), cos, sin)
        v = v.reshape(T, c.G, c.vd)
        if self.q:
            q, k, v = self.q.query(q), self.q.kv(k), self.q.kv(v)
        produced = (k, v)
        if is_cons:
            k, v = cla_in
        o = attend(q, k, v, mask)
        if c.gate == "headwise":
            o = o * sigmoid(a @ b["wg"][l])[:, :, None]
            o = o.reshape(T, c.H * c.vd)
        else:
            o = o.reshape(T, c.H * c.vd) * sigmoid(a @ b["wg"][l])
        return self.aq(o) @ b["wo"][l], produced

    # §6.6 - §6.10
    def block(self, l, u, mask, rope, ekv, cla_in, is_cons):
        c, b = self.cfg, self.blk
        x = u
        for si, layer in enumerate(c.engram_layers):
            if layer == l:
                ek, ev = ekv[si]
                alpha = sigmoid(np.sum(rms_unit(u) * rms_unit(ek), -1) / math.sqrt(c.d))
                x = x + alpha[:, None] * ev
        attn, produced = self.attention(l, self.aq(zcrms(x, b["norm_in"][l])), mask, rope, cla_in,
                                        is_cons)
        x = x + sigmoid(b["attn_gate"][l]) * zcrms(attn, b["post_norm"][l])
        mp = {k: w[l] for k, w in self.mlp.items()}
        x = x + hadamard_mlp(zcrms(x, b["pre_hada"][l]), mp, c.factor_mode, self.perms)
        return x, produced

    def begin(self, tokens, trace=None):
        """The state before layer 0: masks, RoPE tables, engram k/v, lanes."""
        c = self.cfg
        tokens = [int(t) for t in tokens]
        T = len(tokens)
        if T == 0:
            raise RefError("empty token sequence")
        if any(not 0 <= t < c.V for t in tokens):
            raise RefError("token id outside [0, %d)" % c.V)
        full = causal_mask(T)
        x0 = self.E[tokens] * math.sqrt(c.d)
        return dict(T=T, full=full, local=local_mask(T, c.window) if c.window else full,
                    rope=rope_tables(c.qk, T, c.theta, self.rope_f32), ekv=self.engram_kv(tokens, full, trace),
                    X=np.repeat(x0[:, None, :], c.n, axis=1),                  # (T, n, d)
                    cla=(np.zeros((T, c.G, c.qk)), np.zeros((T, c.G, c.vd))))

    def layer(self, st, l):
        """§6.6: advance the state st through layer l (returns a new state)."""
        c, m = self.cfg, self.mhc
        T, X = st["T"], st["X"]
        mask = st["full"] if (not c.window or l in c.global_layers) else st["local"]
        lane = np.eye(c.n)[l % c.n]
        nx = self.aq(rms_unit(X.reshape(T, c.n * c.d)))
        hpre = sigmoid(m["a_pre"][l] * (nx @ m["phi_pre"][l]) + m["b_pre"][l] + 8 * lane - 4)
        u = np.einsum("ti,tic->tc", hpre, X)
        consumer = any(q == l for _, q in c.cla_pairs)
        out, produced = self.block(l, u, mask, st["rope"], st["ekv"], st["cla"], consumer)
        y = out - u
        hpost = 2 * sigmoid(m["a_post"][l] * (nx @ m["phi_post"][l]) + m["b_post"][l]
                            - 4 * (1 - lane))
        res = (nx @ m["phi_res"][l]).reshape(T, c.n, c.n)
        M = sinkhorn(m["a_res"][l] * res + m["b_res"][l])
        new = dict(st)
        new["X"] = np.einsum("tij,tjc->tic", M, X) + hpost[:, :, None] * y[:, None, :]
        if any(p == l for p, _ in c.cla_pairs):
            new["cla"] = produced
        return new

    def finish(self, st):
        """§6.10: logits (T, Vout)."""
        h = self.aq(zcrms(st["X"].mean(axis=1), self.final_norm))
        return h @ self.E[:self.cfg.vout].T

    def forward(self, tokens, trace=None):
        """Logits (T, Vout) of one sequence under the causal mask."""
        st = self.begin(tokens, trace)
        hidden = [st["X"].mean(axis=1).tolist()]
        for l in range(self.cfg.L):
            st = self.layer(st, l)
            hidden.append(st["X"].mean(axis=1).tolist())
        if trace is not None:
            trace.setdefault("hidden", []).append(hidden)
        return self.finish(st)


# ---------------------------------------------------------------- loss, grads

def sequence_ce(logits, ids, mask):
    """(sum of mask[1:] * CE(logits[:-1], ids[1:]), sum(mask[1:]))."""
    ids = np.asarray(ids, dtype=np.int64)
    mask = np.asarray(mask, dtype=np.float64)
    if len(mask) != len(ids):
        raise RefError("mask has %d entries for %d tokens" % (len(mask), len(ids)))
    if len(ids) < 2:
        return 0.0, 0.0
    lg, tg, m = logits[:-1], ids[1:], mask[1:]
    if np.any(tg >= lg.shape[-1]):
        raise RefError("target id %d >= output vocabulary %d (upstream's CE would be NaN)"
                       % (int(tg.max()), lg.shape[-1]))
    ce = logsumexp(lg, -1)[:, 0] - lg[np.arange(len(tg)), tg]
    return float(np.sum(ce * m)), float(np.sum(m))


def batch_loss(model, seqs, masks):
    tot = cnt = 0.0
    per = []
    for ids, mk in zip(seqs, masks):
        s, n = sequence_ce(model.forward(ids), ids, mk)
        per.append({"sum": s, "count": n})
        tot += s
        cnt += n
    return tot / max(cnt, 1.0), cnt, per


def lora_loss(params, cfg, lora, scale, seqs, masks):
    return batch_loss(Model(merge_lora(params, lora, scale), cfg), seqs, masks)[0]


def lora_fd_grads(params, cfg, lora, scale, seqs, masks, entries=None, seed=0, h=1e-5,
                  rope_f32=True):
    """Central differences of the loss in every (or `entries` random) entry of
    each A and B: (loss(a + h) - loss(a - h)) / 2h, the rest fixed.
    -> {"lora/<key>/A": (shape, flat indices, grads)}. An entry of layer l
    changes only layer l's merged kernel, so the unperturbed state before
    layer l is reused (the result is the same as a full forward)."""
    rng = np.random.default_rng(seed)
    base_model = Model(merge_lora(params, lora, scale), cfg, rope_f32)
    before = []                                   # per sequence: state before each layer
    for ids in seqs:
        st, states = base_model.begin(ids), []
        for l in range(cfg.L):
            states.append(st)
            st = base_model.layer(st, l)
        before.append(states)

    def trial_loss(trial, l):
        model = Model(merge_lora(params, trial, scale), cfg, rope_f32)
        tot = cnt = 0.0
        for ids, mk, states in zip(seqs, masks, before):
            st = states[l]
            for j in range(l, cfg.L):
                st = model.layer(st, j)
            s, n = sequence_ce(model.finish(st), ids, mk)
            tot, cnt = tot + s, cnt + n
        return tot / max(cnt, 1.0)

    out = {}
    for key in sorted(lora):
        for wi, which in enumerate("AB"):
            base = lora[key][wi]
            size = base.size
            if entries is None or entries >= size:
                idx = np.arange(size)
            else:
                idx = np.sort(rng.choice(size, entries, replace=False))
            per_layer = size // base.shape[0]
            grads = []
            for i in idx:
                vals = []
                for sign in (1.0, -1.0):
                    pert = base.copy().reshape(-1)
                    pert[i] += sign * h
                    pert = pert.reshape(base.shape)
                    trial = dict(lora)
                    trial[key] = (pert, lora[key][1]) if which == "A" else (lora[key][0], pert)
                    vals.append(trial_loss(trial, int(i) // per_layer))
                grads.append((vals[0] - vals[1]) / (2 * h))
            out["lora/%s/%s" % (key, which)] = (list(base.shape), idx.tolist(), grads)
    return out


# ---------------------------------------------------------------- comparisons

def compare_logits(path, logits, dtype="<f4"):
    """Per sequence max|c - r| / max|r| of a file laid out as --logits writes."""
    try:
        got = np.fromfile(path, dtype).astype(np.float64)
    except OSError as e:
        raise RefError("%s: cannot read: %s" % (path, e.strerror))
    want = sum(lg.size for lg in logits)
    if got.size != want:
        raise RefError("%s: %d values, want %d (sequences' T x Vout)" % (path, got.size, want))
    out, off = [], 0
    for lg in logits:
        c = got[off:off + lg.size].reshape(lg.shape)
        off += lg.size
        if not np.all(np.isfinite(c)):
            out.append(float("inf"))
        else:
            out.append(float(np.max(np.abs(c - lg)) / max(np.max(np.abs(lg)), 1e-300)))
    return out


def compare_grads(path, ref_grads):
    """{tensor: error} for a JSON of the --grads layout holding the candidate's
    gradients (an entry without "index" lists every entry). Compared at the
    reference's entries; error = max|c - r| / max(max|r| of the tensor,
    1e-3 * max|r| of all tensors), so an all-zero tensor must come out ~0."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise RefError("%s: cannot read as JSON: %s" % (path, e))
    tensors = doc.get("tensors") if isinstance(doc, dict) else None
    if not isinstance(tensors, dict):
        raise RefError("%s: no \"tensors\" object" % path)
    scale_all = max(max((abs(g) for g in v[2]), default=0.0) for v in ref_grads.values())
    errs = {}
    for name, (shape, idx, grads) in ref_grads.items():
        t = tensors.get(name)
        if not isinstance(t, dict) or "grad" not in t:
            raise RefError("%s: tensors.%s missing" % (path, name))
        if list(t.get("shape", shape)) != list(shape):
            raise RefError("%s: tensors.%s.shape %r, want %r" % (path, name, t.get("shape"), shape))
        cand = dict(zip(t.get("index", range(len(t["grad"]))), t["grad"]))
        missing = [i for i in idx if i not in cand]
        if missing:
            raise RefError("%s: tensors.%s lacks entry %d" % (path, name, missing[0]))
        c = np.array([cand[i] for i in idx], np.float64)
        r = np.array(grads, np.float64)
        den = max(float(np.max(np.abs(r))) if r.size else 0.0, 1e-3 * scale_all, 1e-300)
        errs[name] = float(np.max(np.abs(c - r)) / den) if np.all(np.isfinite(c)) else float("inf")
    return errs


# ---------------------------------------------------------------- CLI

def _parse_ids(text, what):
    parts = text.replace(",", " ").split()
    try:
        return [int(p) if what == "tokens" else float(p) for p in parts]
    except ValueError:
        raise RefError("%s: %r is not a list of numbers" % (what, text))


def _read_lines(path, what):
    try:
        with open(path) as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
    except OSError as e:
        raise RefError("%s: cannot read: %s" % (path, e.strerror))
    return [_parse_ids(ln, what) for ln in lines]


def _write_atomic(path, data):
    tmp = "%s.tmp%d" % (path, os.getpid())
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--tokens", action="append", default=[])
    ap.add_argument("--tokens-file")
    ap.add_argument("--mask", action="append", default=[])
    ap.add_argument("--mask-file")
    ap.add_argument("--adapter")
    ap.add_argument("--logits")
    ap.add_argument("--logits-dtype", choices=["f32", "f64"], default="f32")
    ap.add_argument("--loss", action="store_true")
    ap.add_argument("--grads")
    ap.add_argument("--grad-entries", default="all")
    ap.add_argument("--grad-seed", type=int, default=0)
    ap.add_argument("--fd-step", type=float, default=1e-5)
    ap.add_argument("--trace")
    ap.add_argument("--rope", choices=["f32", "f64"], default="f32")
    ap.add_argument("--quant", action="store_true",
                    help="3.x's quant=True forward (finetune's numerics): CQ 4-bit weights, "
                         "A8 activations, 8-bit q, kv_bits k/v")
    ap.add_argument("--check-logits", metavar="FILE")
    ap.add_argument("--check-loss", type=float, metavar="VALUE")
    ap.add_argument("--check-grads", metavar="FILE")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--grad-tol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    if not (args.logits or args.loss or args.grads or args.trace or args.check_logits
            or args.check_loss is not None or args.check_grads):
        ap.error("nothing to do: give --logits, --loss, --grads, --trace or a --check-*")
    if (args.grads or args.check_grads) and not args.adapter:
        ap.error("--grads and --check-grads need --adapter")
    if args.grad_entries == "all":
        entries = None
    else:
        try:
            entries = int(args.grad_entries)
        except ValueError:
            ap.error("--grad-entries wants a count or 'all'")
        if entries < 1:
            ap.error("--grad-entries must be >= 1")
    try:
        seqs = [_parse_ids(t, "tokens") for t in args.tokens]
        if args.tokens_file:
            seqs += _read_lines(args.tokens_file, "tokens")
        if not seqs:
            ap.error("no token sequence (--tokens or --tokens-file)")
        masks = [_parse_ids(t, "mask") for t in args.mask]
        if args.mask_file:
            masks += _read_lines(args.mask_file, "mask")
        if not masks:
            masks = [[1.0] * len(s) for s in seqs]
        if len(masks) != len(seqs):
            raise RefError("%d masks for %d token sequences" % (len(masks), len(seqs)))
        params, cfg, _ = load_checkpoint(args.checkpoint)
        lora, scale = {}, 1.0
        if args.adapter:
            lora, scale, _ = load_adapter(args.adapter, cfg, params)
        if args.quant and (args.grads or args.check_grads):
            raise RefError("--quant: finite differences do not apply across rounding")
        model = Model(merge_lora(params, lora, scale), cfg, args.rope == "f32", args.quant)
        trace = {} if args.trace else None
        logits = [model.forward(s, trace) for s in seqs]
        if args.logits:
            dt = "<f4" if args.logits_dtype == "f32" else "<f8"
            _write_atomic(args.logits, b"".join(np.ascontiguousarray(lg, dt).tobytes()
                                                for lg in logits))
        if args.loss or args.grads or args.check_grads or args.check_loss is not None:
            per, tot, cnt = [], 0.0, 0.0
            for lg, ids, mk in zip(logits, seqs, masks):
                s, n = sequence_ce(lg, ids, mk)
                per.append({"sum": s, "count": n})
                tot, cnt = tot + s, cnt + n
            loss = tot / max(cnt, 1.0)
            if args.loss:
                print(json.dumps({"loss": loss, "count": cnt, "per_sequence": per}))
        if args.grads or args.check_grads:
            g = lora_fd_grads(params, cfg, lora, scale, seqs, masks, entries,
                              args.grad_seed, args.fd_step, args.rope == "f32")
            doc = {"loss": loss, "scale": scale, "fd_step": args.fd_step,
                   "tensors": {k: {"shape": v[0], "index": v[1], "grad": v[2]}
                               for k, v in g.items()}}
            if args.grads:
                _write_atomic(args.grads, json.dumps(doc).encode())
        if args.trace:
            trace["hada_perms"] = [p.tolist() for p in model.perms]
            trace["vout"] = cfg.vout
            _write_atomic(args.trace, json.dumps(trace).encode())
        bad = []
        if args.check_logits:
            errs = compare_logits(args.check_logits, logits)
            print(json.dumps({"check": "logits", "tol": args.tol, "max_rel": errs}))
            bad += ["logits of sequence %d: %g" % (i, e) for i, e in enumerate(errs)
                    if not e <= args.tol]
        if args.check_loss is not None:
            err = abs(args.check_loss - loss) / max(abs(loss), 1e-300)
            print(json.dumps({"check": "loss", "tol": args.tol, "ref": loss,
                              "got": args.check_loss, "rel": err}))
            if not err <= args.tol:
                bad.append("loss %r vs %r: %g" % (args.check_loss, loss, err))
        if args.check_grads:
            errs = compare_grads(args.check_grads, g)
            print(json.dumps({"check": "grads", "tol": args.grad_tol, "rel": errs}))
            bad += ["%s: %g" % (k, e) for k, e in sorted(errs.items()) if not e <= args.grad_tol]
        if bad:
            print("ref_needle3: disagreement: " + "; ".join(bad), file=sys.stderr)
            return 3
    except RefError as e:
        print("ref_needle3: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
