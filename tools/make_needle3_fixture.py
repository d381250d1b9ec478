#!/usr/bin/python3
"""Write a tiny random Needle 3 (cactus-needle 3.x) checkpoint as .safetensors.

The file is what upstream's `checkpoints.write_checkpoint` produces for a
model of the given config: one tensor per flax parameter, named by its flax
path joined with "/", and the string metadata

    format_version  "2"
    config          json.dumps(config dict)      (every TransformerConfig field)
    step            str(step)
    run             json.dumps(run dict)

Optionally also a 3.x LoRA adapter (upstream `write_adapter`): tensors
`lora/<kernel path>/A` (L, in, r) and `lora/<kernel path>/B` (L, r, out),
float32, for the five attention kernels q_proj, k_proj, v_proj, gate_proj,
out_proj, and metadata scale/base/rank/seed, each a JSON string.

The safetensors writer here is our own (struct + json), independent of the
C one: u64 little-endian header length, the JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}
padded with spaces to a multiple of 8 bytes, then the tensors' bytes
(little-endian, row-major, in header order, no gaps).

Every parameter is random and away from its upstream initialiser (taps are
not [1, 0, 0], Hadamard factors are not Walsh matrices, d1..d4, b2, cond_u,
gates, norm scales and the mHC a/b are all non-trivial), so every path of
the forward carries signal.

Presets (docs/model.md "Needle 3 (3.x) math" lists what each exercises):
  tiny3   d 24 (Hadamard pads to 32: ba 4, bb 8), H 3 / G 1, qk 6, v 10,
          4 layers, 3 lanes, sliding_window 2 with global layer 1,
          qkv_conv_taps 3 (tap 2 is masked on the local layers), engrams at
          layers (0, 2, 3) with engram_bank_ids (0, 1, 0), engram_heads 2,
          engram_seed_heads 3, cla_pairs ((2, 3),), elementwise gate,
          shared factors, ladder_widths (12,) (split permutations).
  tiny3b  d 20 (pads to 32), H 4 / G 2, qk 4, v 6, 3 layers, 2 lanes,
          sliding_window 4 with global layer 2, qkv_conv_taps 2, one engram
          site (layer 1) without banks, orders (2, 4), headwise gate,
          hada_factor_mode block_untied, vocab 48 with out_vocab 40.

CLI:
  make_needle3_fixture.py OUT.safetensors [--preset tiny3|tiny3b]
      [--dtype f32|f16|bf16] [--seed N] [--no-heads] [--mtp] [--step N]
      [--adapter ADAPTER.safetensors [--lora-rank R] [--lora-scale S]]
      [--set KEY=JSON ...]          (override config fields, e.g.
                                     --set sliding_window=0; not validated,
                                     so refused configs can be written too)
Library use: config_for(preset, **overrides), param_shapes(cfg),
random_params(cfg, rng, heads=True), write_safetensors(path, tensors, meta),
lora_targets(cfg), random_adapter(cfg, rng, rank).
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

FORMAT_VERSION = 2

# Every field of upstream's 3.x TransformerConfig with its class default.
CONFIG_DEFAULTS = dict(
    vocab_size=16384, d_model=768, num_heads=12, num_kv_heads=2, num_layers=20,
    qk_head_dim=48, v_head_dim=64, max_seq_len=4096, pad_token_id=0,
    embedding_dim=128, embedding_probes=4, embedding_queries=4,
    confidence_probes=4, confidence_queries=4, router_probes=4,
    router_queries=4, rope_theta=100000.0, dtype="bfloat16", flash=True,
    engram_orders=[2, 3], engram_heads=0, engram_slots=18432,
    engram_seed_heads=0, engram_layers=[3, 7, 11, 15, 19],
    global_layers=[4, 9, 14, 19], sliding_window=1024, ladder_depths=[],
    ladder_sample=False, ladder_widths=[], ladder_order=[], mhc_lanes=4,
    qkv_conv_taps=3, out_vocab=0, kv_window=0, kv_bits=8, act_bits=8,
    weight_bits="", remat=True, scan_unroll=1, attention_gate="elementwise",
    hada_factor_mode="shared", engram_bank_ids=[], cla_pairs=[],
)

PRESETS = {
    "tiny3": dict(
        vocab_size=64, d_model=24, num_heads=3, num_kv_heads=1, num_layers=4,
        qk_head_dim=6, v_head_dim=10, max_seq_len=64, rope_theta=10000.0,
        embedding_dim=8, embedding_probes=2, embedding_queries=2,
        confidence_probes=2, confidence_queries=1, router_probes=2,
        router_queries=2, engram_orders=[2, 3], engram_heads=2,
        engram_slots=13, engram_seed_heads=3, engram_layers=[0, 2, 3],
        engram_bank_ids=[0, 1, 0], global_layers=[1], sliding_window=2,
        ladder_widths=[12], mhc_lanes=3, qkv_conv_taps=3,
        attention_gate="elementwise", hada_factor_mode="shared",
        cla_pairs=[[2, 3]], out_vocab=0, dtype="float32"),
    "tiny3b": dict(
        vocab_size=48, d_model=20, num_heads=4, num_kv_heads=2, num_layers=3,
        qk_head_dim=4, v_head_dim=6, max_seq_len=64, rope_theta=10000.0,
        embedding_dim=8, embedding_probes=2, embedding_queries=2,
        confidence_probes=2, confidence_queries=2, router_probes=1,
        router_queries=2, engram_orders=[2, 4], engram_heads=1,
        engram_slots=11, engram_seed_heads=0, engram_layers=[1],
        engram_bank_ids=[], global_layers=[2], sliding_window=4,
        ladder_widths=[], mhc_lanes=2, qkv_conv_taps=2,
        attention_gate="headwise", hada_factor_mode="block_untied",
        cla_pairs=[], out_vocab=40, dtype="float32"),
}

ENGRAM_SUB_DIM = 128
ENGRAM_CONV_TAPS = 4
HADA_COND_RANK = 8
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "gate_proj", "out_proj")
ATTN = "stack/layers/block/self_attn/"
MLP = "stack/layers/block/hadamard_mlp/"


def config_for(preset, **overrides):
    """Full config dict: class defaults, then the preset, then overrides."""
    cfg = json.loads(json.dumps(CONFIG_DEFAULTS))
    cfg.update(json.loads(json.dumps(PRESETS[preset])))
    for k, v in overrides.items():
        if k not in CONFIG_DEFAULTS:
            raise KeyError("unknown config field %r" % k)
        cfg[k] = v
    return cfg


def hada_sizes(d):
    n = 1 << (d - 1).bit_length()
    ba = 1 << ((n - 1).bit_length() // 2)
    return n, ba, n // ba


def engram_dims(cfg):
    orders = list(cfg["engram_orders"])
    heads = cfg["engram_heads"] or max(1, cfg["d_model"] // (len(orders) * ENGRAM_SUB_DIM))
    sub = cfg["d_model"] // (len(orders) * heads)
    return orders, heads, sub


def param_shapes(cfg, heads=True):
    """{flax path: shape} of every parameter a 3.x model of cfg has."""
    V, d, L, n = cfg["vocab_size"], cfg["d_model"], cfg["num_layers"], cfg["mhc_lanes"]
    H, G = cfg["num_heads"], cfg["num_kv_heads"]
    qk = cfg["qk_head_dim"] or d // H
    vd = cfg["v_head_dim"] or d // H
    s = {"embedding/embedding": (V, d)}
    nd = n * d
    s["stack/mhc_phi_pre"] = (L, nd, n)
    s["stack/mhc_phi_post"] = (L, nd, n)
    s["stack/mhc_phi_res"] = (L, nd, n * n)
    s["stack/mhc_b_pre"] = (L, n)
    s["stack/mhc_b_post"] = (L, n)
    s["stack/mhc_b_res"] = (L, n, n)
    for a in ("pre", "post", "res"):
        s["stack/mhc_a_" + a] = (L,)
    s["stack/final_norm/scale"] = (d,)
    s["stack/layers/block/ZCRMSNorm_0/scale"] = (L, d)
    s[ATTN + "q_proj/kernel"] = (L, d, H * qk)
    s[ATTN + "k_proj/kernel"] = (L, d, G * qk)
    s[ATTN + "v_proj/kernel"] = (L, d, G * vd)
    taps = cfg["qkv_conv_taps"]
    if taps:
        s[ATTN + "q_taps"] = (L, taps, H * qk)
        s[ATTN + "k_taps"] = (L, taps, G * qk)
        s[ATTN + "v_taps"] = (L, taps, G * vd)
    s[ATTN + "q_norm/scale"] = (L, qk)
    s[ATTN + "k_norm/scale"] = (L, qk)
    if cfg["attention_gate"] == "headwise":
        s[ATTN + "gate_proj/kernel"] = (L, d, H)
    else:
        s[ATTN + "gate_proj/kernel"] = (L, d, H * vd)
    s[ATTN + "out_proj/kernel"] = (L, H * vd, d)
    s["stack/layers/block/post_attn_norm/scale"] = (L, d)
    s["stack/layers/block/pre_hada_norm/scale"] = (L, d)
    s["stack/layers/block/attn_gate"] = (L,)
    N, ba, bb = hada_sizes(d)
    for i in (1, 2, 3):
        if cfg["hada_factor_mode"] == "block_untied":
            s[MLP + "w%da" % i] = (L, bb, ba, ba)
            s[MLP + "w%db" % i] = (L, ba, bb, bb)
        else:
            s[MLP + "w%da" % i] = (L, ba, ba)
            s[MLP + "w%db" % i] = (L, bb, bb)
    for nm in ("d1", "d2", "b2", "d3", "d4"):
        s[MLP + nm] = (L, N)
    s[MLP + "cond_v"] = (L, d, HADA_COND_RANK)
    s[MLP + "cond_u"] = (L, HADA_COND_RANK, N)
    sites = list(cfg["engram_layers"])
    if sites:
        orders, eh, sub = engram_dims(cfg)
        K = len(orders) * eh
        banks = list(cfg["engram_bank_ids"])
        if banks:
            for b in range(max(banks) + 1):
                s["engram_banks_%d/embedding" % b] = (K, cfg["engram_slots"], sub)
            reader = "engram_readers_%d/"
        else:
            reader = "engrams_%d/"
        for i in range(len(sites)):
            r = reader % i
            if not banks:
                s[r + "embedding"] = (K, cfg["engram_slots"], sub)
            s[r + "key_proj/kernel"] = (K * sub, d)
            s[r + "value_proj/kernel"] = (K * sub, d)
            s[r + "taps"] = (ENGRAM_CONV_TAPS, d)
    if heads:
        L1 = L + 1
        for head, out in (("embedding", cfg["embedding_dim"]), ("confidence", 1), ("router", 3)):
            k, q = cfg[head + "_probes"], cfg[head + "_queries"]
            p = head + "_head/"
            s[p + "probes"] = (L1, k, d)
            s[p + "gain"] = (L1, k)
            s[p + "query"] = (q, d)
            s[p + "row_bias"] = (q, L1, k)
            s[p + "proj/kernel"] = (q * d, out)
            if head == "embedding":
                s[p + "log_temp"] = ()
                s[p + "bias"] = ()
            else:
                s[p + "proj/bias"] = (out,)
    return s


def _random_param(name, shape, rng):
    """A random value for one parameter, away from its initialiser."""
    last = name.rsplit("/", 1)[1]
    size = shape[-2] if len(shape) >= 2 else 1

    def normal(std):
        return rng.standard_normal(shape) * std

    if last == "scale":                       # zero-centred norm scales
        return normal(0.3)
    if last.endswith("_taps") or last == "taps":
        w = normal(0.4)
        w[..., 0, :] += 1.0                   # tap 0 near (not at) identity
        return w
    if name.startswith("stack/mhc_phi"):
        return normal(0.5)
    if name.startswith("stack/mhc_a_"):
        return rng.uniform(0.3, 1.2, shape)
    if name == "stack/mhc_b_res":
        n = shape[-1]
        return 2.0 * np.eye(n) + normal(0.7)
    if name.startswith("stack/mhc_b_"):
        return normal(0.8)
    if last == "attn_gate":
        return normal(1.0)
    if last in ("d1", "d2", "d3"):
        return rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
    if last == "d4":
        return normal(0.3)
    if last == "b2":
        return normal(0.3)
    if last == "cond_v":
        return normal(1.0 / math.sqrt(shape[-2]))
    if last == "cond_u":
        return normal(0.5)
    if last[0] == "w" and last[-1] in "ab" and "hadamard_mlp" in name:
        return normal(1.0 / math.sqrt(shape[-1]))
    if name == "embedding/embedding" or last == "embedding":
        return normal(0.3)
    if last == "kernel":
        return normal(1.0 / math.sqrt(size))
    if last in ("probes", "query"):
        return normal(0.3)
    if last == "gain":
        return rng.uniform(0.5, 1.5, shape)
    if last in ("row_bias", "bias", "log_temp"):
        return normal(0.5)
    raise KeyError("no random rule for parameter " + name)


def random_params(cfg, rng, heads=True):
    return {name: np.asarray(_random_param(name, shape, rng), np.float64).reshape(shape)
            for name, shape in param_shapes(cfg, heads).items()}


def lora_targets(cfg):
    """Adapter key and (in, out) of the five attention kernels."""
    shapes = param_shapes(cfg, heads=False)
    out = []
    for t in LORA_TARGETS:
        key = ATTN + t + "/kernel"
        out.append((key, shapes[key]))
    return out


def random_adapter(cfg, rng, rank):
    """{lora/<path>/A|B: array}; A and B random and non-zero."""
    tensors = {}
    for key, (L, fin, fout) in lora_targets(cfg):
        tensors["lora/%s/A" % key] = rng.standard_normal((L, fin, rank)) / rank
        tensors["lora/%s/B" % key] = rng.standard_normal((L, rank, fout)) * 0.2
    return tensors


def _bf16_bytes(a):
    """float64 -> bfloat16 by round-to-nearest-even of the float32 value."""
    f = np.ascontiguousarray(a, dtype="<f4")
    u = f.view("<u4").astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(f)
    rounded = np.where(nan, (u >> 16) | 0x40, rounded)
    return rounded.astype("<u2").tobytes()


DTYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "f64": "F64"}


def encode(a, dtype):
    """Little-endian bytes of a in the safetensors dtype ("F32", "F16", ...)."""
    if dtype == "F32":
        return np.ascontiguousarray(a, "<f4").tobytes()
    if dtype == "F16":
        return np.ascontiguousarray(a, "<f2").tobytes()
    if dtype == "BF16":
        return _bf16_bytes(a)
    if dtype == "F64":
        return np.ascontiguousarray(a, "<f8").tobytes()
    raise ValueError("unsupported dtype " + dtype)


def safetensors_bytes(tensors, metadata, dtype="F32"):
    """tensors: {name: array} (or {name: (array, dtype)}); metadata: {str: str}."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        v = tensors[name]
        a, dt = v if isinstance(v, tuple) else (v, dtype)
        a = np.asarray(a)
        raw = encode(a, dt)
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    for k, v in metadata.items():
        if not isinstance(v, str):
            raise TypeError("metadata value of %r must be a string" % k)
    header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def write_safetensors(path, tensors, metadata, dtype="F32"):
    """Write atomically: a temporary file renamed into place."""
    data = safetensors_bytes(tensors, metadata, dtype)
    tmp = path + ".tmp%d" % os.getpid()
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def checkpoint_metadata(cfg, step=0, run=None):
    return {
        "format_version": str(FORMAT_VERSION),
        "config": json.dumps(cfg),
        "step": "" if step is None else str(step),
        "run": json.dumps(run or {}),
    }


def adapter_metadata(scale, base, rank, seed):
    return {"scale": json.dumps(float(scale)), "base": json.dumps(base),
            "rank": json.dumps(int(rank)), "seed": json.dumps(int(seed))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--preset", default="tiny3", choices=sorted(PRESETS))
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step", type=int, default=7)
    ap.add_argument("--no-heads", action="store_true",
                    help="leave out the probe heads (as model.init makes none)")
    ap.add_argument("--mtp", action="store_true",
                    help="add an mtp_head/kernel tensor (upstream's load_checkpoint drops mtp_*)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="override one config field")
    ap.add_argument("--adapter", help="also write a random 3.x LoRA adapter here")
    ap.add_argument("--lora-rank", type=int, default=2)
    ap.add_argument("--lora-scale", type=float, default=2.0)
    args = ap.parse_args(argv)
    if not args.out.endswith(".safetensors"):
        ap.error("output must end in .safetensors (upstream refuses other names)")
    overrides = {}
    for item in args.set:
        k, sep, v = item.partition("=")
        if not sep:
            ap.error("--set wants KEY=JSON, got %r" % item)
        try:
            overrides[k] = json.loads(v)
        except ValueError:
            ap.error("--set %s: value is not JSON: %r" % (k, v))
    try:
        cfg = config_for(args.preset, **overrides)
    except KeyError as e:
        ap.error(str(e))
    rng = np.random.default_rng(args.seed)
    params = random_params(cfg, rng, heads=not args.no_heads)
    if args.mtp:
        params["mtp_head/kernel"] = rng.standard_normal((cfg["d_model"], cfg["vocab_size"]))
    run = {"tool": "make_needle3_fixture", "preset": args.preset, "seed": args.seed}
    write_safetensors(args.out, params, checkpoint_metadata(cfg, args.step, run),
                      DTYPES[args.dtype])
    if args.adapter:
        if not args.adapter.endswith(".safetensors"):
            ap.error("--adapter must end in .safetensors")
        lora = random_adapter(cfg, rng, args.lora_rank)
        write_safetensors(args.adapter, lora,
                          adapter_metadata(args.lora_scale, args.out, args.lora_rank, args.seed),
                          "F32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
