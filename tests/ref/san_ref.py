#!/usr/bin/python3
"""Independent float64 numpy reference of the Needle "Simple Attention Network".

Behaviour follows upstream needle/model/architecture.py (SimpleAttentionNetwork
.__call__ without quantisation, causal mask only) as summarised in
docs/model.md §2.  Everything is computed in float64 from the stored
arrays (float16/float32 -> float64 is exact).  Two deliberate upstream
details are reproduced: the Walsh matrix entries are float32-rounded
(+-1 float32 / sqrt(N) -> float32) and Sinkhorn runs exactly 20 rounds.

Sub-parts are exposed for focused tests: engram_indices, ngram_mask,
tap_mask, engram_rows, engram_taps, engram_kv, rms_unit, zcrms, sinkhorn,
hyper_coeffs, walsh_matrix, hadamard_mlp, rope_tables, rope, attention,
block, forward, losses.  forward(..., trace=dict) records intermediates
(names documented in parts_check.py).

CLI:  san_ref.py CKPT.pkl TOKENS.txt OUT.bin
  TOKENS.txt: whitespace-separated token ids, one sequence per line (blank
  lines ignored).  OUT.bin: float32 little-endian logits of every sequence
  back to back, each [len, V].  Prints one JSON object:
  {"examples": [{"loss": mean next-token CE or null, "tokens": len-1}, ...],
   "mean_loss": mean over all predicted positions}
"""
import json
import math
import os
import pickle
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_ckpt import full_config, engram_geometry, flatten, hada_n  # noqa: E402

ENGRAM_SEED = 0x9E3779B9
ENGRAM_PRIME = 0x01000193
TAPS = 4
EPS = 1e-6
M32 = 0xFFFFFFFF


# ---------------------------------------------------------------- loading
class Model:
    def __init__(self, cfg, params):
        self.cfg = full_config(cfg)
        flat = flatten(params) if isinstance(params, dict) and any(
            isinstance(v, dict) for v in params.values()) else dict(params)
        self.P = {k: np.asarray(v, dtype=np.float64) for k, v in flat.items()}
        c = self.cfg
        self.V, self.d = c["vocab_size"], c["d_model"]
        self.H, self.G, self.L = c["num_heads"], c["num_kv_heads"], c["num_layers"]
        self.n = c["mhc_lanes"]
        self.hd = c["attn_dim"] // self.H
        self.orders, self.eheads, self.sub = engram_geometry(c)
        self.K = len(self.orders) * self.eheads
        self.D = max(self.orders)
        self.sites = tuple(c["engram_layers"])

    def layer(self, l):
        b = "stack/layers/block/"
        return {k[len(b):]: v[l] for k, v in self.P.items() if k.startswith(b)}


def load(path):
    with open(path, "rb") as f:
        ck = pickle.load(f)
    if not isinstance(ck, dict) or ck.get("format_version") != 2:
        raise ValueError("%s: not a format_version 2 checkpoint" % path)
    return Model(ck["config"], ck["params"])


# ---------------------------------------------------------------- helpers
def sigmoid(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def silu(x):
    return x * sigmoid(x)


def logsumexp(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    return m + np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))


def rms_unit(x):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS)


def zcrms(x, scale):
    return (1.0 + scale) * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS)


# ---------------------------------------------------------------- engram
def engram_indices(tokens, orders, heads, slots):
    """[T, K] int64 table rows; table k = oi*heads + h.

    acc = seed_k; for j < order: acc = (acc ^ tok[t-j]) * PRIME (mod 2^32),
    tok[t-j] = 0 before the start; acc ^= acc >> 15; idx = acc % slots."""
    u = np.asarray(tokens, dtype=np.uint64) & M32
    T = u.shape[0]
    cols = []
    for oi, order in enumerate(orders):
        for h in range(heads):
            k = oi * heads + h
            acc = np.full(T, (ENGRAM_SEED * (k + 1)) & M32, dtype=np.uint64)
            for j in range(order):
                sh = np.zeros(T, dtype=np.uint64)
                if j < T:
                    sh[j:] = u[:T - j]
                acc = ((acc ^ sh) * np.uint64(ENGRAM_PRIME)) & np.uint64(M32)
            acc = acc ^ (acc >> np.uint64(15))
            cols.append((acc % np.uint64(slots)).astype(np.int64))
    return np.stack(cols, axis=-1) if cols else np.zeros((T, 0), np.int64)


def ngram_mask(T, orders, heads):
    """[T, K]: 1 where t >= order-1 (row kept), else 0."""
    t = np.arange(T)
    return np.stack([(t >= o - 1).astype(np.float64)
                     for o in orders for _ in range(heads)], axis=-1)


def tap_mask(T, D, taps=TAPS):
    """[taps, T]: tap j valid where t >= j*D."""
    t = np.arange(T)
    return np.stack([(t >= j * D).astype(np.float64) for j in range(taps)])


def engram_rows(tables, idx, ok):
    """tables [K, slots, sub], idx [T, K], ok [T, K] -> e [T, K*sub]."""
    K = tables.shape[0]
    rows = tables[np.arange(K)[None, :], idx] * ok[..., None]  # [T, K, sub]
    return rows.reshape(idx.shape[0], K * tables.shape[2])


def engram_taps(vp, taps, D):
    """v[t] = sum_j taps[j] * vp[t - j*D] * [t >= j*D]."""
    T = vp.shape[0]
    v = np.zeros_like(vp)
    for j in range(taps.shape[0]):
        off = j * D
        if off < T:
            v[off:] += taps[j] * vp[:T - off]
    return v


def engram_kv(m, tokens, trace=None):
    """Per site s: (k_s, v_s), each [T, d]."""
    T = len(tokens)
    if not m.sites:
        return []
    idx = engram_indices(tokens, m.orders, m.eheads, m.cfg["engram_slots"])
    ok = ngram_mask(T, m.orders, m.eheads)
    out = []
    if trace is not None:
        trace["engram.indices"] = idx
    for s in range(len(m.sites)):
        p = "engrams_%d/" % s
        e = engram_rows(m.P[p + "embedding"], idx, ok)
        k = e @ m.P[p + "key_proj/kernel"]
        vp = e @ m.P[p + "value_proj/kernel"]
        v = engram_taps(vp, m.P[p + "taps"], m.D)
        if trace is not None:
            trace["site%d.e" % s] = e
            trace["site%d.k" % s] = k
            trace["site%d.vp" % s] = vp
            trace["site%d.v" % s] = v
        out.append((k, v))
    return out


# ---------------------------------------------------------------- hyper-connections
def sinkhorn(logits, iters=20):
    """Log-space Sinkhorn over the last two axes: each round normalises rows
    (last axis) then columns (second-to-last axis); returns exp."""
    lk = np.asarray(logits, dtype=np.float64)
    for _ in range(iters):
        lk = lk - logsumexp(lk, axis=-1)
        lk = lk - logsumexp(lk, axis=-2)
    return np.exp(lk)


def lane_onehot(l, n):
    e = np.zeros(n)
    e[l % n] = 1.0
    return e


def hyper_coeffs(m, l, X):
    """X [T, n, d] -> hpre [T,n], hpost [T,n], M [T,n,n] for layer l."""
    T, n, d = X.shape
    P = m.P
    lane = lane_onehot(l, n)
    nx = rms_unit(X.reshape(T, n * d))
    hpre = sigmoid(P["stack/mhc_a_pre"][l] * (nx @ P["stack/mhc_phi_pre"][l])
                   + P["stack/mhc_b_pre"][l] + 8.0 * lane - 4.0)
    hpost = 2.0 * sigmoid(P["stack/mhc_a_post"][l] * (nx @ P["stack/mhc_phi_post"][l])
                          + P["stack/mhc_b_post"][l] - 4.0 * (1.0 - lane))
    res = (nx @ P["stack/mhc_phi_res"][l]).reshape(T, n, n)
    M = sinkhorn(P["stack/mhc_a_res"][l] * res + P["stack/mhc_b_res"][l])
    return hpre, hpost, M


# ---------------------------------------------------------------- block parts
def walsh_matrix(N):
    """Sylvester +-1 matrix / sqrt(N), entries rounded to float32 like upstream
    (np float32 array / np.sqrt(N) stays float32 in numpy < 2)."""
    Hm = np.array([[1.0]], dtype=np.float32)
    while Hm.shape[0] < N:
        Hm = np.block([[Hm, Hm], [Hm, -Hm]])
    return (Hm / np.float32(np.sqrt(N))).astype(np.float32).astype(np.float64)


def hadamard_mlp(z, d1, d2, d3):
    """z [..., d]; d1,d2,d3 [N]; returns [..., d]."""
    d = z.shape[-1]
    N = d1.shape[0]
    W = walsh_matrix(N)
    zp = np.zeros(z.shape[:-1] + (N,))
    zp[..., :d] = z
    a = (d1 * zp) @ W
    b = silu(d2 * a) @ W
    return (d3 * b)[..., :d]


def rope_tables(T, hd, theta):
    half = hd // 2
    freq = theta ** (-(2.0 * np.arange(half)) / hd)
    ang = np.arange(T)[:, None] * freq[None, :]
    return np.cos(ang), np.sin(ang)


def rope(x, theta):
    """x [T, heads, hd]; half-split rotation by pos * theta^(-2i/hd)."""
    T, _, hd = x.shape
    half = hd // 2
    cos, sin = rope_tables(T, hd, theta)
    cos, sin = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def attention(q, k, v):
    """Causal GQA attention. q [T,H,hd], k,v [T,G,hd] -> [T,H,hd].
    Query head h uses kv head h // (H/G); scores scaled by 1/sqrt(hd)."""
    T, H, hd = q.shape
    G = k.shape[1]
    rep = H // G
    kk = np.repeat(k, rep, axis=1)  # [T,H,hd]
    vv = np.repeat(v, rep, axis=1)
    s = np.einsum("thd,shd->hts", q, kk) / math.sqrt(hd)
    causal = np.tril(np.ones((T, T), dtype=bool))
    s = np.where(causal[None], s, -np.inf)
    s = s - np.max(s, axis=-1, keepdims=True)
    w = np.exp(s)
    w = w / np.sum(w, axis=-1, keepdims=True)
    return np.einsum("hts,shd->thd", w, vv)


def block(m, lp, x, trace=None, pre=""):
    """Block without the engram add: x [T, d] -> [T, d]."""
    T, d = x.shape
    H, G, hd = m.H, m.G, m.hd
    a = zcrms(x, lp["ZCRMSNorm_0/scale"])
    q = (a @ lp["self_attn/q_proj/kernel"]).reshape(T, H, hd)
    k = (a @ lp["self_attn/k_proj/kernel"]).reshape(T, G, hd)
    v = (a @ lp["self_attn/v_proj/kernel"]).reshape(T, G, hd)
    q = rope(zcrms(q, lp["self_attn/q_norm/scale"]), m.cfg["rope_theta"])
    k = rope(zcrms(k, lp["self_attn/k_norm/scale"]), m.cfg["rope_theta"])
    att = attention(q, k, v).reshape(T, H * hd)
    gated = att * sigmoid(a @ lp["self_attn/gate_proj/kernel"])
    o = gated @ lp["self_attn/out_proj/kernel"]
    mid = x + sigmoid(lp["attn_gate"]) * zcrms(o, lp["post_attn_norm/scale"])
    mlp = hadamard_mlp(zcrms(mid, lp["pre_hada_norm/scale"]), lp["hadamard_mlp/d1"],
                       lp["hadamard_mlp/d2"], lp["hadamard_mlp/d3"])
    out = mid + mlp
    if trace is not None:
        trace.update({pre + "a": a, pre + "q": q, pre + "k": k, pre + "v": v,
                      pre + "attn": att, pre + "attn_out": o, pre + "mid": mid,
                      pre + "mlp": mlp, pre + "block": out})
    return out


# ---------------------------------------------------------------- forward
def forward(m, tokens, trace=None):
    """tokens: sequence of ints (length >= 1) -> logits [T, V] (float64)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    T = tokens.shape[0]
    E = m.P["embedding/embedding"]
    x0 = E[tokens] * math.sqrt(m.d)
    X = np.broadcast_to(x0[:, None, :], (T, m.n, m.d)).copy()
    kv = engram_kv(m, tokens, trace)
    if trace is not None:
        trace["x0"] = x0
    for l in range(m.L):
        pre = "layer%d." % l
        hpre, hpost, M = hyper_coeffs(m, l, X)
        u = np.einsum("ti,tid->td", hpre, X)
        bx = u
        for s, site_layer in enumerate(m.sites):
            if site_layer == l:
                ks, vs = kv[s]
                alpha = sigmoid(np.sum(rms_unit(u) * rms_unit(ks), axis=-1) / math.sqrt(m.d))
                bx = bx + alpha[:, None] * vs
                if trace is not None:
                    trace[pre + "alpha%d" % s] = alpha
        y = block(m, m.layer(l), bx, trace, pre) - u
        X = np.einsum("tij,tjd->tid", M, X) + hpost[:, :, None] * y[:, None, :]
        if trace is not None:
            trace.update({pre + "hpre": hpre, pre + "hpost": hpost, pre + "hres": M,
                          pre + "u": u, pre + "bx": bx, pre + "y": y, pre + "X": X})
    h = zcrms(np.mean(X, axis=1), m.P["stack/final_norm/scale"])
    logits = h @ E.T
    if trace is not None:
        trace["final.h"] = h
        trace["logits"] = logits
    return logits


def losses(logits, tokens):
    """Per-position next-token CE [T-1]: -log softmax(logits[t])[tok[t+1]]."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if len(tokens) < 2:
        return np.zeros(0)
    lg = logits[:-1]
    lse = logsumexp(lg, axis=-1)[:, 0]
    return lse - lg[np.arange(len(tokens) - 1), tokens[1:]]


def read_tokens(path):
    seqs = []
    with open(path) as f:
        for line in f:
            if line.strip():
                seqs.append([int(t) for t in line.split()])
    return seqs


def evaluate(m, seqs):
    """-> (list of logits arrays, summary dict in `needle eval --json` shape)."""
    all_logits, ex = [], []
    tot, cnt = 0.0, 0
    for s in seqs:
        lg = forward(m, s)
        all_logits.append(lg)
        ce = losses(lg, s)
        ex.append({"loss": float(ce.mean()) if len(ce) else None, "tokens": len(ce)})
        tot += float(ce.sum())
        cnt += len(ce)
    return all_logits, {"examples": ex, "mean_loss": tot / cnt if cnt else None}


def main(argv):
    if len(argv) != 4:
        sys.stderr.write("usage: san_ref.py CKPT.pkl TOKENS.txt OUT.bin\n")
        return 2
    m = load(argv[1])
    seqs = read_tokens(argv[2])
    for s in seqs:
        if any(t < 0 or t >= m.V for t in s):
            sys.stderr.write("token out of range\n")
            return 1
    logits, summary = evaluate(m, seqs)
    with open(argv[3], "wb") as f:
        for lg in logits:
            f.write(np.ascontiguousarray(lg, dtype="<f4").tobytes())
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
