#!/usr/bin/python3
"""Write random Needle (SAN) checkpoints in upstream's pickle format.

Format (upstream needle/model/run.py, tests/conftest.py):
    {"format_version": 2,
     "params": nested dict of numpy arrays (flax names, docs/formats.md §1.4),
     "config": dict of TransformerConfig fields}

Two initialisations:
  * default  -- upstream's model.init initialisers (normal(0.02) kernels,
                normal(0.02/sqrt(2L)) for out_proj / engram value_proj,
                zero norm scales, identity taps, b_res = 4I, a_* = 0.01,
                d1 = d2 = 1, d3 = 0.02).  Many terms are zero/identity.
  * perturb  -- every parameter randomised with moderate magnitudes so each
                code path carries signal (norm scales, taps, d1/d2/d3, a_*,
                b_*, attn_gate, ...).

Library use:
    from make_ckpt import make_config, make_params, write_checkpoint
CLI:
    make_ckpt.py OUT.pkl [--preset tiny] [--vocab N] [--d-model N] ...
                 [--perturb] [--dtype float16|float32] [--seed S]
"""
import argparse
import math
import pickle
import sys

import numpy as np

ENGRAM_SUB_DIM = 128
ENGRAM_CONV_TAPS = 4

# TransformerConfig fields and defaults (upstream architecture.py).
CONFIG_DEFAULTS = dict(
    vocab_size=8192, d_model=512, attn_dim=0, num_heads=8, num_kv_heads=4,
    num_layers=12, max_seq_len=2048, pad_token_id=0, contrastive_dim=128,
    rope_theta=100000.0, dtype="bfloat16", flash=True, engram_orders=(2, 3),
    engram_heads=0, engram_slots=8192, engram_layers=(2, 15), mhc_lanes=4,
    kv_window=0, kv_bits=8, act_bits=8, weight_bits="", remat=True,
    scan_unroll=1,
)

# Shape of upstream tests/conftest.py tiny_checkpoint.
TINY = dict(vocab_size=8192, d_model=64, num_heads=4, num_kv_heads=2,
            num_layers=2, max_seq_len=128, engram_layers=(1,),
            engram_slots=64, mhc_lanes=2)


def make_config(minimal=False, **kw):
    """Full config dict (all fields) with kw overrides.

    minimal=True mimics upstream's conftest `dict(vars(config))`: only the
    keys passed explicitly plus attn_dim and engram_layers are present (the
    class-level defaults are NOT in vars()), so a reader must default the
    rest (engram_orders, rope_theta, engram_heads, ...)."""
    for k in kw:
        if k not in CONFIG_DEFAULTS:
            raise KeyError("unknown config field %r" % k)
    cfg = dict(CONFIG_DEFAULTS)
    cfg.update(kw)
    cfg["attn_dim"] = cfg["attn_dim"] or cfg["d_model"]
    cfg["engram_layers"] = tuple(int(x) for x in cfg["engram_layers"])
    cfg["engram_orders"] = tuple(int(x) for x in cfg["engram_orders"])
    if minimal:
        keep = set(kw) | {"attn_dim", "engram_layers"}
        cfg = {k: v for k, v in cfg.items() if k in keep}
    return cfg


def full_config(cfg):
    """Config dict with defaults filled in (as TransformerConfig(**cfg))."""
    out = dict(CONFIG_DEFAULTS)
    for k, v in cfg.items():
        if k in CONFIG_DEFAULTS:
            out[k] = v
    out["attn_dim"] = out["attn_dim"] or out["d_model"]
    out["engram_layers"] = tuple(out["engram_layers"])
    out["engram_orders"] = tuple(out["engram_orders"])
    return out


def engram_geometry(cfg):
    orders = tuple(cfg["engram_orders"])
    heads = cfg["engram_heads"] or max(1, cfg["d_model"] // (len(orders) * ENGRAM_SUB_DIM))
    sub = cfg["d_model"] // (len(orders) * heads)
    return orders, heads, sub


def hada_n(d):
    return 1 << (d - 1).bit_length()


def param_shapes(cfg, probe_heads=False):
    """{path: shape} of every parameter model.init creates (flat '/' paths)."""
    c = full_config(cfg)
    V, d, A = c["vocab_size"], c["d_model"], c["attn_dim"]
    H, G, L, n = c["num_heads"], c["num_kv_heads"], c["num_layers"], c["mhc_lanes"]
    hd = A // H
    N = hada_n(d)
    orders, eh, sub = engram_geometry(c)
    K = len(orders) * eh
    s = {"embedding/embedding": (V, d)}

    def block(prefix, lead):
        s[prefix + "ZCRMSNorm_0/scale"] = lead + (d,)
        s[prefix + "self_attn/q_proj/kernel"] = lead + (d, H * hd)
        s[prefix + "self_attn/k_proj/kernel"] = lead + (d, G * hd)
        s[prefix + "self_attn/v_proj/kernel"] = lead + (d, G * hd)
        s[prefix + "self_attn/q_norm/scale"] = lead + (hd,)
        s[prefix + "self_attn/k_norm/scale"] = lead + (hd,)
        s[prefix + "self_attn/gate_proj/kernel"] = lead + (d, H * hd)
        s[prefix + "self_attn/out_proj/kernel"] = lead + (H * hd, d)
        s[prefix + "post_attn_norm/scale"] = lead + (d,)
        s[prefix + "attn_gate"] = lead
        s[prefix + "pre_hada_norm/scale"] = lead + (d,)
        s[prefix + "hadamard_mlp/d1"] = lead + (N,)
        s[prefix + "hadamard_mlp/d2"] = lead + (N,)
        s[prefix + "hadamard_mlp/d3"] = lead + (N,)

    block("stack/layers/block/", (L,))
    s["stack/mhc_phi_pre"] = (L, n * d, n)
    s["stack/mhc_phi_post"] = (L, n * d, n)
    s["stack/mhc_phi_res"] = (L, n * d, n * n)
    s["stack/mhc_b_pre"] = (L, n)
    s["stack/mhc_b_post"] = (L, n)
    s["stack/mhc_b_res"] = (L, n, n)
    s["stack/mhc_a_pre"] = (L,)
    s["stack/mhc_a_post"] = (L,)
    s["stack/mhc_a_res"] = (L,)
    s["stack/final_norm/scale"] = (d,)
    for i, _ in enumerate(c["engram_layers"]):
        p = "engrams_%d/" % i
        s[p + "embedding"] = (K, c["engram_slots"], sub)
        s[p + "key_proj/kernel"] = (K * sub, d)
        s[p + "value_proj/kernel"] = (K * sub, d)
        s[p + "taps"] = (ENGRAM_CONV_TAPS, d)
    s["mtp_combine/kernel"] = (2 * d, d)
    block("mtp_block/", ())
    s["mtp_emb_norm/scale"] = (d,)
    s["mtp_final_norm/scale"] = (d,)
    if probe_heads:
        s["contrastive_head/probes"] = (4, d)
        s["contrastive_head/proj/kernel"] = (4 * d, c["contrastive_dim"])
        s["contrastive_head/log_temp"] = ()
        s["confidence_head/probes"] = (8, d)
        s["confidence_head/proj/kernel"] = (8 * d, 1)
        s["confidence_head/proj/bias"] = (1,)
    return s


def default_init(path, shape, L, rng):
    """Upstream's initialiser for a parameter (by its flat path)."""
    leaf = path.rsplit("/", 1)[-1]
    resid = 0.02 / math.sqrt(2 * L)
    if path.endswith("out_proj/kernel") or path.endswith("value_proj/kernel"):
        return rng.normal(0.0, resid, shape)
    if leaf in ("kernel", "embedding", "probes") or path.startswith("stack/mhc_phi"):
        return rng.normal(0.0, 0.02, shape)
    if leaf in ("scale", "attn_gate", "mhc_b_pre", "mhc_b_post", "bias"):
        return np.zeros(shape)
    if leaf == "taps":
        t = np.zeros(shape)
        t[0] = 1.0
        return t
    if leaf == "mhc_b_res":
        return np.broadcast_to(4.0 * np.eye(shape[-1]), shape).copy()
    if leaf.startswith("mhc_a_"):
        return np.full(shape, 0.01)
    if leaf in ("d1", "d2"):
        return np.ones(shape)
    if leaf == "d3":
        return np.full(shape, 0.02)
    if leaf == "log_temp":
        return np.full(shape, math.log(0.07))
    raise KeyError(path)


def perturb_init(path, shape, L, rng):
    """Moderate random values for every parameter (all paths carry signal)."""
    leaf = path.rsplit("/", 1)[-1]
    g = lambda m, s: rng.normal(m, s, shape)
    if path == "embedding/embedding":
        return g(0.0, 0.1)
    if leaf == "embedding":  # engram tables
        return g(0.0, 0.5)
    if path.endswith("out_proj/kernel"):
        return g(0.0, 0.05)
    if path.endswith("value_proj/kernel") or path.endswith("key_proj/kernel"):
        return g(0.0, 0.1)
    if leaf == "kernel" or leaf == "probes":
        return g(0.0, 0.1)
    if path.startswith("stack/mhc_phi"):
        return g(0.0, 0.1)
    if leaf == "scale":
        return g(0.0, 0.3)
    if leaf == "attn_gate":
        return g(0.0, 1.0)
    if leaf in ("mhc_b_pre", "mhc_b_post", "bias"):
        return g(0.0, 1.0)
    if leaf == "mhc_b_res":
        return np.broadcast_to(4.0 * np.eye(shape[-1]), shape) + g(0.0, 0.7)
    if leaf.startswith("mhc_a_"):
        return rng.uniform(0.3, 1.5, shape)
    if leaf == "taps":
        t = g(0.0, 0.4)
        t[0] += 1.0
        return t
    if leaf in ("d1", "d2"):
        return g(1.0, 0.3)
    if leaf == "d3":
        return g(0.0, 0.3)
    if leaf == "log_temp":
        return g(math.log(0.07), 0.1)
    raise KeyError(path)


def nest(flat):
    out = {}
    for path, v in flat.items():
        parts = path.split("/")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return out


def flatten(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        p = prefix + k
        if isinstance(v, dict):
            out.update(flatten(v, p + "/"))
        else:
            out[p] = v
    return out


def make_params(cfg, seed=0, perturb=False, dtype="float32", probe_heads=False):
    c = full_config(cfg)
    rng = np.random.default_rng(seed)
    init = perturb_init if perturb else default_init
    flat = {}
    for path, shape in param_shapes(c, probe_heads).items():
        flat[path] = np.asarray(init(path, shape, c["num_layers"], rng),
                                dtype=np.dtype(dtype)).reshape(shape)
    return nest(flat)


def write_checkpoint(path, cfg, params, extra=None):
    obj = {"format_version": 2, "params": params, "config": cfg}
    if extra:
        obj.update(extra)
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def make_checkpoint(path, seed=0, perturb=False, store_dtype="float32", minimal=False,
                    probe_heads=False, **cfg_kw):
    """cfg_kw: TransformerConfig fields (config 'dtype' included);
    store_dtype: numpy dtype of the stored arrays."""
    cfg = make_config(minimal=minimal, **cfg_kw)
    params = make_params(cfg, seed=seed, perturb=perturb, dtype=store_dtype,
                         probe_heads=probe_heads)
    write_checkpoint(path, cfg, params)
    return cfg, params


def _ints(s):
    return tuple(int(x) for x in s.split(",") if x.strip() != "")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--preset", choices=["tiny"], default=None)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--d-model", type=int)
    ap.add_argument("--attn-dim", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--max-seq-len", type=int)
    ap.add_argument("--engram-layers", type=_ints)
    ap.add_argument("--engram-orders", type=_ints)
    ap.add_argument("--engram-slots", type=int)
    ap.add_argument("--engram-heads", type=int)
    ap.add_argument("--lanes", type=int)
    ap.add_argument("--rope-theta", type=float)
    ap.add_argument("--dtype", choices=["float16", "float32"], default="float32",
                    help="storage dtype of the arrays")
    ap.add_argument("--config-dtype", default="float32",
                    help="value of config['dtype'] (does not change the math)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--perturb", action="store_true")
    ap.add_argument("--minimal-config", action="store_true",
                    help="only explicit keys in config, like upstream conftest vars(config)")
    ap.add_argument("--probe-heads", action="store_true",
                    help="also write contrastive_head / confidence_head params")
    a = ap.parse_args(argv)
    kw = dict(TINY) if a.preset == "tiny" else {}
    for arg, key in [("vocab", "vocab_size"), ("d_model", "d_model"),
                     ("attn_dim", "attn_dim"), ("heads", "num_heads"),
                     ("kv_heads", "num_kv_heads"), ("layers", "num_layers"),
                     ("max_seq_len", "max_seq_len"), ("engram_layers", "engram_layers"),
                     ("engram_orders", "engram_orders"), ("engram_slots", "engram_slots"),
                     ("engram_heads", "engram_heads"), ("lanes", "mhc_lanes"),
                     ("rope_theta", "rope_theta")]:
        v = getattr(a, arg)
        if v is not None:
            kw[key] = v
    if not a.minimal_config:
        kw["dtype"] = a.config_dtype
    make_checkpoint(a.out, seed=a.seed, perturb=a.perturb, store_dtype=a.dtype,
                    minimal=a.minimal_config, probe_heads=a.probe_heads, **kw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
