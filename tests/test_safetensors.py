#!/usr/bin/python3
"""safetensors checkpoints and adapters (docs/formats.md "safetensors").

- files written here by an independent writer (struct + json; float16 by
  struct's 'e' format, bfloat16 by rounding float32 bits in this file) with
  F32/F16/BF16/F64 tensors, 0-d scalars and metadata are read back through
  `needle inspect` (table, metadata) and `--dequant` (values);
- our writer (`needle init X.safetensors`, `needle convert`) is read by the
  reader in this file: header length, 8-byte alignment, offsets tiling the
  buffer, metadata (format_version, config JSON, step, run), values equal to
  the pickle written from the same seed;
- the generation is told by content: a pickle named .safetensors and a
  safetensors file named .pkl load; eval gives the same losses either way;
- hostile files (truncated, lying offsets, overlap, gap, huge header length,
  bad dtype, bad JSON, non-string metadata, shape overflow, duplicate names,
  negative shape) each fail with exit 1 and a message naming the file and
  the tensor or field;
- an adapter in upstream 3.x's format (lora/<path>/A|B, metadata
  scale/base/rank/seed as JSON) is used by eval and build exactly as the same
  adapter as a pickle; finetune on a safetensors base writes one (default
  name needle_lora.safetensors) in that layout, and --resume reads it."""
import json
import os
import pickle
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
NEEDLE = os.environ.get("NEEDLE", os.path.join(SRC, "build", "needle"))
TOKENS = os.path.join(SRC, "examples", "tokens.txt")
TOK = os.path.join(SRC, "models", "tokenizer.model")
DATA = os.path.join(SRC, "examples", "data.jsonl")
fails = 0


def check(cond, what, detail=""):
    global fails
    print(f"{'ok  ' if cond else 'FAIL'} {what}  {detail}")
    fails += not cond


def run(*args, **kw):
    return subprocess.run([NEEDLE, *args], capture_output=True, **kw)


# ---- an independent writer and reader ----

SIZES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I32": 4, "I64": 8, "BOOL": 1, "U8": 1}


def st_bytes(tensors, meta=None, header=None, pad=True):
    """tensors: list of (name, dtype, shape, raw bytes), laid out in order."""
    hdr, data = {}, b""
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape, raw in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = header if header is not None else json.dumps(hdr).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def st_read(path):
    with open(path, "rb") as f:
        buf = f.read()
    (hl,) = struct.unpack("<Q", buf[:8])
    hdr = json.loads(buf[8:8 + hl])
    meta = hdr.pop("__metadata__", {})
    data = buf[8 + hl:]
    return hl, hdr, meta, data


def f32_bytes(vals):
    return struct.pack(f"<{len(vals)}f", *vals)


def f32_round(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even (NaN not used)."""
    (b,) = struct.unpack("<I", struct.pack("<f", x))
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def bf16_value(bits):
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def dequant(path, name):
    r = run("inspect", path, "--dequant", name)
    if r.returncode != 0:
        return None, r.stderr.decode()
    n = len(r.stdout) // 4
    return list(struct.unpack(f"<{n}f", r.stdout)), ""


def eval_losses(ckpt, *extra):
    r = run("eval", "--checkpoint", ckpt, "--tokens", TOKENS, "--json", *extra)
    if r.returncode != 0:
        return None, r.stderr.decode()
    return json.loads(r.stdout)["examples"], ""


def main():
    tmp = tempfile.mkdtemp(prefix="needle-st-")
    P = lambda n: os.path.join(tmp, n)

    # ---- 1. our reader on files written here ----
    a = [0.1, -2.5, 3.0e-3, 65504.0, -0.0, 1.0e-8]
    h = [1.0, -0.333251953125, 6.103515625e-05, 5.960464477539063e-08, 65504.0, 0.1]
    b = [1.0, 3.14159, -1.0e-3, 2.5e20, 0.1]
    hraw = struct.pack(f"<{len(h)}e", *h)
    hexp = list(struct.unpack(f"<{len(h)}e", hraw))
    try:  # numpy, when installed, agrees with struct's half
        import numpy as np
        check(np.frombuffer(hraw, np.float16).astype(np.float32).tolist() == hexp,
              "numpy and struct agree on the float16 fixture")
    except ImportError:
        pass
    bbits = [bf16_bits(x) for x in b]
    braw = struct.pack(f"<{len(b)}H", *bbits)
    meta = {"format_version": "2", "note": "caf\u00e9 \u2603", "empty": ""}
    mixed = P("mixed.safetensors")
    with open(mixed, "wb") as f:
        f.write(st_bytes([("group/a", "F32", [2, 3], f32_bytes(a)),
                          ("group/half", "F16", [6], hraw),
                          ("bf", "BF16", [5], braw),
                          ("scalar", "F32", [], f32_bytes([7.25])),
                          ("wide", "F64", [2], struct.pack("<2d", 1.0 / 3, -2.0)),
                          ("empty", "F32", [0, 4], b""),
                          ("count", "I64", [1], struct.pack("<q", 3))], meta))
    r = run("inspect", mixed)
    out = r.stdout.decode()
    check(r.returncode == 0, "inspect reads a safetensors file written here", r.stderr.decode())
    for frag in ("format          safetensors", "num_tensors     7", "format_version = 2",
                 "note = caf\u00e9 \u2603", "group/half", "BF16", "(2, 3)", "(5,)", "()",
                 "(0, 4)", "I64"):
        check(frag in out, f"inspect shows {frag!r}")
    got, err = dequant(mixed, "group/a")
    check(got == [f32_round(x) for x in a], "F32 values", err)
    got, err = dequant(mixed, "group/half")
    check(got == hexp, "F16 values (exact float16 -> float32)", f"{got} {hexp} {err}")
    got, err = dequant(mixed, "bf")
    check(got == [bf16_value(x) for x in bbits], "BF16 values (bits << 16)", f"{got} {err}")
    check(got is not None and abs(got[1] - 3.14159) < 0.02 and got[1] != f32_round(3.14159),
          "BF16 really is rounded to 8 mantissa bits")
    got, err = dequant(mixed, "scalar")
    check(got == [7.25], "0-d scalar", err)
    got, err = dequant(mixed, "wide")
    check(got == [f32_round(1.0 / 3), -2.0], "F64 values", err)
    got, err = dequant(mixed, "#4")
    check(got == [f32_round(1.0 / 3), -2.0], "--dequant #INDEX", err)
    got, err = dequant(mixed, "count")
    check(got is None and "not a float type" in err, "--dequant of an integer tensor refused", err)

    # ---- 2. our writer, read here; generation by content ----
    stp, pkp = P("tiny.safetensors"), P("tiny.pkl")
    for path in (stp, pkp):
        r = run("init", path, "--preset", "tiny", "--seed", "5")
        check(r.returncode == 0, f"init {os.path.basename(path)}", r.stderr.decode()[-300:])
    hl, hdr, smeta, data = st_read(stp)
    check((8 + hl) % 8 == 0, "our header is padded to an 8-byte boundary", str(hl))
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in hdr.items())
    tiled = spans[0][0] == 0 and spans[-1][1] == len(data) and all(
        spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))
    check(tiled, "our data_offsets tile the buffer exactly")
    sizes_ok = all(e - s == SIZES[hdr[k]["dtype"]] * eval("*".join(map(str, hdr[k]["shape"])) or "1")
                   for s, e, k in spans)
    check(sizes_ok, "every tensor's bytes match its shape and dtype")
    check(set(smeta) == {"format_version", "config", "step", "run"} and
          smeta["format_version"] == "2" and smeta["step"] == "" and json.loads(smeta["run"]) == {},
          "metadata as upstream writes it (format_version, config JSON, step, run)", str(smeta)[:200])
    cfg = json.loads(smeta["config"])
    check(cfg.get("d_model") == 64 and isinstance(cfg.get("engram_orders"), list),
          "config is a JSON object with its lists", smeta["config"][:120])
    check(all(v["dtype"] == "F32" for v in hdr.values()), "checkpoint tensors are F32")
    check("stack/layers/block/self_attn/q_proj/kernel" in hdr and "mtp_block/attn_gate" in hdr and
          hdr["mtp_block/attn_gate"]["shape"] == [], "flax paths joined by '/', 0-d mtp gate kept")
    try:
        import numpy as np
        with open(pkp, "rb") as f:
            pk = pickle.load(f)

        def flat(tree, pre=""):
            for k, v in tree.items():
                if isinstance(v, dict):
                    yield from flat(v, pre + k + "/")
                else:
                    yield pre + k, v
        pflat = dict(flat(pk["params"]))
        same = set(pflat) == set(hdr) and all(
            np.array_equal(np.frombuffer(data[hdr[k]["data_offsets"][0]:hdr[k]["data_offsets"][1]],
                                         "<f4").reshape(hdr[k]["shape"]), np.asarray(v, np.float32))
            for k, v in pflat.items())
        check(same, "safetensors tensors equal the pickle's from the same seed")
        # JSON has no tuples: upstream's json.dumps makes them lists too
        check(json.loads(smeta["config"]) == json.loads(json.dumps(pk["config"])),
              "config equals the pickle's (tuples as lists)")
    except ImportError:
        print("skip pickle comparison: no numpy")
    l_st, e1 = eval_losses(stp)
    l_pk, e2 = eval_losses(pkp)
    check(l_st is not None and l_st == l_pk, "eval: same losses from safetensors and pickle", e1 + e2)
    # content, not name
    swapped_st, swapped_pk = P("really_st.pkl"), P("really_pickle.safetensors")
    with open(stp, "rb") as f, open(swapped_st, "wb") as g:
        g.write(f.read())
    with open(pkp, "rb") as f, open(swapped_pk, "wb") as g:
        g.write(f.read())
    check(eval_losses(swapped_st)[0] == l_pk, "a safetensors file named .pkl loads")
    check(eval_losses(swapped_pk)[0] == l_pk, "a pickle named .safetensors loads")
    # convert both ways
    back, again = P("back.pkl"), P("again.safetensors")
    r = run("convert", stp, back)
    check(r.returncode == 0 and b"pickle" in r.stdout, "convert safetensors -> pickle",
          r.stderr.decode())
    r = run("convert", back, again)
    check(r.returncode == 0, "convert pickle -> safetensors", r.stderr.decode())
    _, hdr2, meta2, data2 = st_read(again)
    check(hdr2 == hdr and data2 == data and json.loads(meta2["config"]) == cfg,
          "safetensors -> pickle -> safetensors keeps every tensor byte and the config")
    r = run("convert", stp, P("same.safetensors"))
    check(r.returncode == 2 and b"nothing to do" in r.stderr,
          "convert to the same format with nothing else to do is a usage error")
    h16 = P("half.safetensors")
    r = run("convert", pkp, h16, "--dtype", "float16")
    _, hdr3, _, _ = st_read(h16)
    check(r.returncode == 0 and all(v["dtype"] == "F16" for v in hdr3.values()),
          "convert --dtype float16 writes F16 tensors")
    l16, e = eval_losses(h16)
    check(l16 is not None and all(abs(x["loss"] - y["loss"]) < 0.05 for x, y in zip(l16, l_pk)),
          "the float16 safetensors checkpoint loads", e)

    h16b, h16c = P("half_back.pkl"), P("half_again.safetensors")
    r1, r2 = run("convert", h16, h16b), run("convert", h16b, h16c)
    _, hdr4, _, data4 = st_read(h16c)
    _, _, _, data3 = st_read(h16)
    check(r1.returncode == 0 and r2.returncode == 0 and hdr4 == hdr3 and data4 == data3,
          "F16 safetensors -> pickle -> safetensors keeps float16 bit for bit")
    # a bfloat16 checkpoint made here from ours: every tensor rounded
    bf_tensors = []
    for k, v in hdr.items():
        b0, b1 = v["data_offsets"]
        vals = struct.unpack(f"<{(b1 - b0) // 4}f", data[b0:b1])
        bf_tensors.append((k, "BF16", v["shape"],
                           struct.pack(f"<{len(vals)}H", *[bf16_bits(x) for x in vals])))
    bfp = P("bf16.safetensors")
    with open(bfp, "wb") as f:
        f.write(st_bytes(bf_tensors, smeta))
    lbf, e = eval_losses(bfp)
    check(lbf is not None and lbf != l_pk and
          all(abs(x["loss"] - y["loss"]) < 0.05 for x, y in zip(lbf, l_pk)),
          "a BF16 checkpoint loads (bfloat16 -> float32), losses close to float32's", e)

    # ---- 3. hostile files ----
    good = [("w", "F32", [2, 2], f32_bytes([1, 2, 3, 4])), ("v", "F32", [2], f32_bytes([5, 6]))]
    gb = st_bytes(good, {"format_version": "2"})
    (ghl,) = struct.unpack("<Q", gb[:8])

    def hdr_file(hdict, data_len=24, meta=None):
        if meta is not None:
            hdict = {"__metadata__": meta, **hdict}
        return st_bytes([], header=json.dumps(hdict).encode())[:] + b"\0" * data_len

    W = lambda off, shape=(2, 2), dt="F32": {"dtype": dt, "shape": list(shape), "data_offsets": list(off)}
    hostile = [
        ("truncated data", gb[:-3], ["'v'", "run past the data buffer"]),
        ("truncated header", gb[:20], ["header length", "truncated"]),
        ("shorter than 8 bytes", gb[:5], ["8-byte header length"]),
        ("huge header length", struct.pack("<Q", 1 << 40) + b"{}", ["header length", "limit"]),
        ("header length past the file", struct.pack("<Q", 5000) + b'{"a":1}' + b" " * 100,
         ["header length 5000", "past the end"]),
        ("lying offsets (too short for the shape)",
         hdr_file({"w": W((0, 12)), "v": W((12, 24), (3,))}), ["'w'", "needs 16"]),
        ("offsets past the buffer", hdr_file({"w": W((8, 24)), "v": W((0, 8), (2,))}, 16),
         ["'w'", "run past the data buffer"]),
        ("overlapping tensors", hdr_file({"w": W((0, 16)), "v": W((8, 16), (2,))}, 16),
         ["overlaps", "'w'"]),
        ("gap between tensors", hdr_file({"w": W((0, 16)), "v": W((20, 28), (2,))}, 28),
         ["unused bytes before tensor 'v'"]),
        ("trailing bytes", hdr_file({"w": W((0, 16))}, 20), ["4 bytes after the last tensor"]),
        ("end before begin", hdr_file({"w": W((16, 0))}, 16), ["'w'", "end before"]),
        ("unknown dtype", hdr_file({"w": W((0, 16), dt="F13")}, 16), ["'w'", "unknown dtype 'F13'"]),
        ("unsupported dtype", hdr_file({"w": W((0, 4), (4,), "U8")}, 4),
         ["'w'", "dtype U8", "does not read"]),
        ("bad JSON", struct.pack("<Q", 16) + b'{"w": {"dtype":,' + b"\0" * 8, ["not valid JSON"]),
        ("header not an object", struct.pack("<Q", 8) + b'{"a":[1]' + b"\0" * 8,
         ["not valid JSON"]),
        ("non-string metadata", hdr_file({"w": W((0, 16))}, 16, {"format_version": 2}),
         ["__metadata__ 'format_version'", "not a string"]),
        ("shape overflow", hdr_file({"w": W((0, 16), (1 << 62, 1 << 62))}, 16),
         ["'w'", "overflows"]),
        ("negative shape", hdr_file({"w": W((0, 16), (-2, -2))}, 16), ["'w'", "negative"]),
        ("duplicate tensor name",
         st_bytes([], header=b'{"w":' + json.dumps(W((0, 16))).encode() + b',"w":' +
                  json.dumps(W((0, 16))).encode() + b"}") + b"\0" * 16, ["'w'", "twice"]),
        ("duplicate field", st_bytes([], header=b'{"w":{"dtype":"F32","dtype":"F16","shape":[2,2],'
                                     b'"data_offsets":[0,16]}}') + b"\0" * 16,
         ["'dtype' appears twice"]),
        ("shape not an array", hdr_file({"w": {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]}},
                                        16), ["'w'", "shape is an integer"]),
        ("too many dimensions", hdr_file({"w": W((0, 4), [1] * 9)}, 4), ["'w'", "9 dimensions"]),
        ("name clash in the tree", hdr_file({"a/b": W((0, 16)), "a/b/c": W((16, 24), (2,))}, 24,
                                            {"format_version": "2"}),
         ["'a/b", "clashes"]),
        ("empty path component", hdr_file({"a//b": W((0, 16))}, 16, {"format_version": "2"}),
         ["'a//b'", "empty path component"]),
        ("config metadata not JSON", hdr_file({"w": W((0, 16))}, 16,
                                              {"format_version": "2", "config": "{nope"}),
         ["__metadata__ 'config'", "not valid JSON"]),
        ("format_version not an integer", hdr_file({"w": W((0, 16))}, 16, {"format_version": "two"}),
         ["format_version", "not an integer"]),
    ]
    for name, blob, needles in hostile:
        path = P("hostile.safetensors")
        with open(path, "wb") as f:
            f.write(blob)
        r = run("eval", "--checkpoint", path, "--tokens", TOKENS, "--json")
        err = r.stderr.decode()
        last = err.strip().splitlines()[-1] if err.strip() else ""
        check(r.returncode == 1 and path in err and all(n in err for n in needles),
              f"hostile: {name}", last[:220])
    # the same checks guard inspect (no tree built)
    with open(P("h2.safetensors"), "wb") as f:
        f.write(hdr_file({"w": W((0, 16)), "v": W((8, 16), (2,))}, 16))
    r = run("inspect", P("h2.safetensors"))
    check(r.returncode == 1 and b"overlaps" in r.stderr, "inspect refuses an overlapping file")
    # an adapter given as the checkpoint is named as such
    ad_meta = {"scale": "2.0", "base": '"x"', "rank": "1", "seed": "0"}
    with open(P("ad_as_ck.safetensors"), "wb") as f:
        f.write(st_bytes([("lora/q/A", "F32", [1], f32_bytes([1])),
                          ("lora/q/B", "F32", [1], f32_bytes([1]))], ad_meta))
    r = run("eval", "--checkpoint", P("ad_as_ck.safetensors"), "--tokens", TOKENS)
    check(r.returncode == 1 and b"LoRA adapter, not a checkpoint" in r.stderr,
          "an adapter passed as --checkpoint is named as an adapter", r.stderr.decode()[-200:])
    # a text file: neither format
    r = run("eval", "--checkpoint", TOKENS, "--tokens", TOKENS)
    check(r.returncode == 1 and b"not a pickle" in r.stderr and b"safetensors" in r.stderr,
          "a text file is neither a pickle nor a safetensors file", r.stderr.decode()[-200:])

    # ---- 4. adapters in 3.x's format ----
    L, d, r_ = 2, 64, 2
    q_out, kv_out = 64, 32
    targets = {"stack/layers/block/self_attn/q_proj/kernel": (d, q_out),
               "stack/layers/block/self_attn/v_proj/kernel": (d, kv_out)}
    import random
    rnd = random.Random(7)
    tensors, pk_lora = [], {}
    try:
        import numpy as np
    except ImportError:
        np = None
    for path, (din, dout) in targets.items():
        A = [rnd.uniform(-0.05, 0.05) for _ in range(L * din * r_)]
        B = [rnd.uniform(-0.05, 0.05) for _ in range(L * r_ * dout)]
        tensors.append((f"lora/{path}/A", "F32", [L, din, r_], f32_bytes(A)))
        tensors.append((f"lora/{path}/B", "F32", [L, r_, dout], f32_bytes(B)))
        if np is not None:
            pk_lora[path] = {"A": np.array(A, np.float32).reshape(L, din, r_),
                             "B": np.array(B, np.float32).reshape(L, r_, dout)}
    st_ad = P("adapter3.safetensors")
    with open(st_ad, "wb") as f:
        f.write(st_bytes(tensors, {"scale": json.dumps(1.5), "base": json.dumps(stp),
                                   "rank": json.dumps(r_), "seed": json.dumps(11)}))
    r = run("inspect", st_ad)
    check(r.returncode == 0 and b"kind            adapter" in r.stdout, "inspect: an adapter")
    l_ad, e = eval_losses(stp, "--lora", st_ad)
    check(l_ad is not None and l_ad != l_st, "eval --lora takes a 3.x safetensors adapter", e)
    out_st, out_pk = P("st.cact"), P("pk.cact")
    r = run("build", stp, "--lora", st_ad, "--out", out_st, "--tokenizer", TOK)
    check(r.returncode == 0, "build --lora takes a 3.x safetensors adapter",
          r.stderr.decode()[-300:])
    if np is not None:
        pk_ad = P("adapter3.pkl")
        with open(pk_ad, "wb") as f:
            pickle.dump({"lora": pk_lora, "scale": 1.5, "base": stp, "rank": r_}, f)
        check(eval_losses(stp, "--lora", pk_ad)[0] == l_ad,
              "the same adapter as a pickle gives the same eval losses")
        r = run("build", stp, "--lora", pk_ad, "--out", out_pk, "--tokenizer", TOK)
        with open(out_st, "rb") as f1, open(out_pk, "rb") as f2:
            check(r.returncode == 0 and f1.read() == f2.read(),
                  "build: the same .cact from the safetensors and the pickle adapter")
    # finetune on a safetensors base: a safetensors adapter by default
    with open(DATA) as f:
        lines = f.readlines()[:24]
    data = P("data.jsonl")
    with open(data, "w") as f:
        f.writelines(lines)
    ckdir = P("ckdir")
    common = ["--checkpoint", stp, "--tokenizer", TOK, "--batch-size", "8", "--max-len", "256",
              "--lora-rank", "4", "--seed", "3"]
    r = run("finetune", data, *common, "--epochs", "1", "--checkpoint-dir", ckdir)
    ad_out = os.path.join(ckdir, "needle_lora.safetensors")
    ft_out = r.stdout.decode()
    check(r.returncode == 0 and os.path.exists(ad_out),
          "finetune on a safetensors base writes needle_lora.safetensors", r.stderr.decode()[-300:])
    if os.path.exists(ad_out):
        hl, ahdr, ameta, _ = st_read(ad_out)
        names_ok = all(k.startswith("lora/stack/layers/block/self_attn/") and k[-2:] in ("/A", "/B")
                       for k in ahdr)
        check(names_ok and len(ahdr) >= 2, "adapter tensors are lora/<path>/A|B only",
              str(list(ahdr))[:200])
        alpha = [float(l.split("alpha")[1].split()[0]) for l in ft_out.splitlines()
                 if l.strip().startswith("lora")]
        check(alpha and isinstance(json.loads(ameta["scale"]), float) and
              abs(json.loads(ameta["scale"]) - alpha[0] / 4) < 1e-6,
              "metadata scale = alpha / rank as a JSON float", ameta.get("scale"))
        check(json.loads(ameta["rank"]) == 4 and json.loads(ameta["seed"]) == 3 and
              json.loads(ameta["base"]) == stp, "metadata rank, seed, base as JSON",
              str({k: ameta[k] for k in ("rank", "seed", "base")}))
        check((8 + hl) % 8 == 0, "adapter header 8-byte aligned")
        l_ft, e = eval_losses(stp, "--lora", ad_out)
        check(l_ft is not None, "eval reads the finetune's safetensors adapter", e)
        r = run("finetune", data, *common, "--epochs", "1", "--out", ad_out, "--resume", ad_out)
        check(r.returncode == 0 and b"resume" in r.stdout,
              "--resume reads a safetensors adapter", (r.stderr + r.stdout).decode()[-300:])
    # a stopped run's safetensors adapter carries the moments; resumed, the
    # result is bit for bit the uninterrupted run's, and the finished file
    # has upstream's layout only
    full_ad, cut_ad = P("uninterrupted.safetensors"), P("cut.safetensors")
    r = run("finetune", data, *common, "--epochs", "2", "--out", full_ad)
    check(r.returncode == 0, "finetune --out X.safetensors", r.stderr.decode()[-300:])
    r = run("finetune", data, *common, "--epochs", "2", "--out", cut_ad, "--stop-after", "2")
    check(r.returncode == 1 and os.path.exists(cut_ad), "--stop-after 2 saves the adapter so far",
          r.stderr.decode()[-300:])
    if os.path.exists(cut_ad) and os.path.exists(full_ad):
        _, chdr, cmeta, _ = st_read(cut_ad)
        st_state = json.loads(cmeta.get("needle_c_state", "{}"))
        check("needle_c_state/mu" in chdr and "needle_c_state/nu" in chdr and
              st_state.get("count") == 2 and st_state.get("batch_size") == 8,
              "the stopped adapter holds the moments and the run settings",
              str(sorted(chdr))[:200])
        r = run("finetune", data, *common, "--epochs", "2", "--out", cut_ad, "--resume", cut_ad)
        check(r.returncode == 0 and b"moments restored" in r.stdout, "resume from it",
              (r.stdout + r.stderr).decode()[-300:])
        _, h1, m1, d1 = st_read(full_ad)
        _, h2, m2, d2 = st_read(cut_ad)
        check(h1 == h2 and d1 == d2, "the resumed adapter equals the uninterrupted one bit for bit")
        check(all(k.startswith("lora/") for k in h2) and
              set(m2) == {"scale", "base", "rank", "seed", "needle_c_state"},
              "the finished adapter: lora tensors only; metadata upstream's + run settings",
              str(sorted(m2)))
    # the same through --full checkpoints
    full_ck, cut_ck = P("full_a.safetensors"), P("full_b.safetensors")
    fcommon = [*common, "--full", "--epochs", "2", "--lr", "1e-3"]
    r1 = run("finetune", data, *fcommon, "--out", full_ck)
    r2 = run("finetune", data, *fcommon, "--out", cut_ck, "--stop-after", "2")
    cut_ok = r2.returncode == 1 and os.path.exists(cut_ck)
    if cut_ok:
        _, fh, fm, _ = st_read(cut_ck)
        cut_ok = "needle_c_state/mu" in fh and "format_version" in fm
    check(r1.returncode == 0 and cut_ok, "--full: a stopped safetensors checkpoint holds the state",
          (r1.stderr + r2.stderr).decode()[-300:])
    r3 = run("finetune", data, *fcommon, "--out", cut_ck, "--resume", cut_ck)
    if r3.returncode == 0 and os.path.exists(full_ck):
        _, h1, m1, d1 = st_read(full_ck)
        _, h2, m2, d2 = st_read(cut_ck)
        check(h1 == h2 and d1 == d2 and m1 == m2 and not any(k.startswith("needle_c_state")
                                                             for k in h2),
              "--full resumed through safetensors equals the uninterrupted run, no state left")
    else:
        check(False, "--full resume from a safetensors checkpoint", r3.stderr.decode()[-300:])
    r = run("finetune", data, *common, "--epochs", "1", "--out", P("explicit.pkl"))
    check(r.returncode == 0 and open(P("explicit.pkl"), "rb").read(1) == b"\x80",
          "--out X.pkl still writes a pickle on a safetensors base")
    print(f"{fails} failure(s)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
