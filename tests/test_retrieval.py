#!/usr/bin/python3
"""Tool retrieval and the confidence head (issue 14, part B).

Three archives of one tiny perturbed checkpoint, built by `needle build`:
  A  contrastive + confidence heads with hand-set random weights
  B  A's weights, but the confidence head is proj 0, bias -30
     (so its probability is sigmoid(-30) whatever the sequence)
  C  no heads (what `needle init` checkpoints give)
Asserted:
  * the heads against an independent float64 numpy computation
    (tests/ref/san_ref.py on the weights dequantised from the archive by
    tests/ref/cact_ref.py): needle_model_embed of the query and of every
    tool's compact JSON, needle_model_head_confidence of a token sequence;
  * retrieval with 8 tools renders and allows exactly the numpy top 5;
  * a hand-made index (crafted embeddings with known scores against the
    query) is trusted and decides the subset;
  * the index is written once, then reused (inode, mtime and bytes
    unchanged, nothing embedded); other tools re-embed only what changed;
    another model rebuilds it; a truncated, bit-flipped or foreign file is
    refused (a warning says so) and rebuilt;
  * the global ABI (needle_init's tool_index_path) and `needle run
    --tool-index` use the index;
  * envelope confidence: B reports sigmoid(-30) (the head wins the
    minimum), C the decoding probability alone, A at most C's.
"""
import ctypes
import hashlib
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "ref"))
import cact_ref as R  # noqa: E402
import make_ckpt  # noqa: E402
import san_ref  # noqa: E402

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(HERE))
BUILD = os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build")
NEEDLE = os.environ.get("NEEDLE") or os.path.join(BUILD, "needle")
TOK = os.path.join(SRC, "models", "tokenizer.model")
FAIL = []


def check(cond, msg):
    if not cond:
        FAIL.append(msg)
        print("FAIL:", msg)


def sh(*args, stdin=None):
    p = subprocess.run([NEEDLE] + [str(a) for a in args], capture_output=True, input=stdin)
    if p.returncode:
        raise SystemExit("needle %s: %s" % (args[:2], p.stderr.decode()))
    return p.stdout.decode()


def tool(name, desc, props):
    return {"name": name, "description": desc,
            "parameters": {"type": "object", "properties": props,
                           "required": list(props)[:1]}}


S = {"type": "string"}
TOOLS = [
    tool("set_lights", "Turn a room's lights on or off", {"room": S, "on": {"type": "boolean"}}),
    tool("set_timer", "Start a countdown timer", {"minutes": {"type": "number"}}),
    tool("send_message", "Send a text message to a contact", {"to": S, "body": S}),
    tool("get_weather", "Weather forecast for a city", {"city": S}),
    tool("play_music", "Play a song, album or artist", {"query": S}),
    tool("set_alarm", "Wake-up alarm at a time", {"time": S}),
    tool("call_contact", "Phone call to a contact", {"name": S}),
    tool("add_note", "Write down a note", {"text": S}),
]
QUERY = "wake me up at seven tomorrow"


def compact(v):
    return json.dumps(v, separators=(",", ":"))


# ---------------------------------------------------------------- numpy side
def flat_params_from_cact(path, cfg):
    """The float32 weights an archive holds, under checkpoint (flax) names."""
    hdr, recs = R.parse(open(path, "rb").read())
    c = make_ckpt.full_config(cfg)
    L, d, n = c["num_layers"], c["d_model"], c["mhc_lanes"]
    orders, eh, sub = make_ckpt.engram_geometry(c)
    K = len(orders) * eh
    it = iter(recs)

    def nx():
        return R.dequant(next(it)).astype(np.float64)

    P = {"embedding/embedding": nx()}
    b = "stack/layers/block/"
    names = ["ZCRMSNorm_0/scale", "self_attn/q_proj/kernel", "self_attn/k_proj/kernel",
             "self_attn/v_proj/kernel", "self_attn/q_norm/scale", "self_attn/k_norm/scale",
             "self_attn/gate_proj/kernel", "self_attn/out_proj/kernel",
             "post_attn_norm/scale", "attn_gate", "pre_hada_norm/scale",
             "hadamard_mlp/d1", "hadamard_mlp/d2", "hadamard_mlp/d3"]
    per = {k: [] for k in names}
    for _ in range(L):
        for k in names:
            a = nx()
            per[k].append(a.T if k.endswith("kernel") else a.reshape(-1))
    for k in names:
        P[b + k] = np.stack(per[k]) if k != "attn_gate" else np.concatenate(per[k])
    for k in ("a_pre", "a_post", "a_res", "b_pre", "b_post", "b_res"):
        P["stack/mhc_" + k] = nx()
    for k, kk in (("pre", n), ("post", n), ("res", n * n)):
        P["stack/mhc_phi_" + k] = nx().reshape(L, kk, n * d).transpose(0, 2, 1)
    for s in range(len(c["engram_layers"])):
        e = "engrams_%d/" % s
        P[e + "embedding"] = nx().reshape(K, c["engram_slots"], sub)
        P[e + "key_proj/kernel"] = nx().T
        P[e + "value_proj/kernel"] = nx().T
        P[e + "taps"] = nx()
    P["stack/final_norm/scale"] = nx()
    rest = list(it)[:-1]  # the tokenizer is last
    heads = {}
    if rest:
        codes = R.dequant(rest[0]).astype(int)
        for i, code in enumerate(codes):
            trip = rest[1 + 3 * i:4 + 3 * i]
            probes, proj, bias = (R.dequant(r).astype(np.float64) for r in trip)
            heads[{1: "contrastive", 2: "confidence"}[code]] = (probes, proj, bias)
    return c, P, heads


def head_out(model, head, tokens):
    """probe_pool over [x0, lane mean after each layer] -> pooled @ proj^T + bias."""
    tr = {}
    san_ref.forward(model, tokens, trace=tr)
    cells = [tr["x0"]] + [tr["layer%d.X" % l].mean(axis=1) for l in range(model.L)]
    cells = np.concatenate(cells, axis=0)  # order does not matter to the pooling
    probes, proj, bias = head
    sc = cells @ probes.T / math.sqrt(model.d)  # [C, P]
    w = np.exp(sc - sc.max(axis=0))
    w /= w.sum(axis=0)
    pooled = (w.T @ cells).reshape(-1)
    return proj @ pooled + bias


def np_embed(model, head, tokens):
    p = head_out(model, head, tokens[:256])
    return p / math.sqrt(float(p @ p) + 1e-12)


def tokenize(lines):
    out = sh("tokenize", "--tokenizer", TOK, stdin=("\n".join(lines) + "\n").encode())
    return [[int(x) for x in ln.split()] for ln in out.splitlines()]


# ---------------------------------------------------------------- ctypes
def bind():
    lib = ctypes.CDLL(os.path.join(BUILD, "libneedle.so"))
    vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    sig = {
        "needle_model_load": ([cp], vp), "needle_model_free": ([vp], None),
        "needle_session_new_with_index": ([vp, cp, cp, cp], vp),
        "needle_session_free": ([vp], None),
        "needle_session_complete": ([vp, cp, i, cp, i], i),
        "needle_session_reset": ([vp], i),
        "needle_session_warnings": ([vp], cp),
        "needle_session_tools_embedded": ([vp], i),
        "needle_session_context_tools": ([vp], cp),
        "needle_thread_error": ([], cp),
        "needle_model_embed": ([vp, cp, ctypes.POINTER(ctypes.c_float), i], i),
        "needle_model_head_confidence": ([vp, ctypes.POINTER(i), i,
                                          ctypes.POINTER(ctypes.c_double)], i),
        "needle_load": ([cp, ctypes.c_uint64], i),
        "needle_init": ([cp, cp, cp], i),
        "needle_complete": ([cp, i, cp, i], i),
        "needle_last_error": ([], cp),
        "needle_embed": ([cp, ctypes.POINTER(ctypes.c_float), i], i),
        "needle_model_embed_dim": ([vp], i),
    }
    for name, (args, res) in sig.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = res
    return lib


class Session:
    def __init__(self, lib, model, tools, index=None, system=b""):
        self.lib = lib
        self.s = lib.needle_session_new_with_index(
            model, system, json.dumps(tools).encode(), index.encode() if index else None)
        if not self.s:
            raise SystemExit("session: %s" % lib.needle_thread_error())
        self.embedded = lib.needle_session_tools_embedded(self.s)
        self.warnings = lib.needle_session_warnings(self.s).decode()

    def complete(self, text, max_new=48):
        buf = ctypes.create_string_buffer(65536)
        rc = self.lib.needle_session_complete(self.s, text.encode(), max_new, buf, len(buf))
        check(rc > 0, "complete: rc %d %r" % (rc, buf.value[:300]))
        return json.loads(buf.value.decode())

    def context_names(self):
        text = self.lib.needle_session_context_tools(self.s) or b"[]"
        return [t["name"] for t in json.loads(text)]

    def close(self):
        self.lib.needle_session_free(self.s)


def c_embed(lib, model, text):
    out = (ctypes.c_float * 512)()
    dim = lib.needle_model_embed(model, text.encode(), out, 512)
    check(dim == 128, "needle_model_embed: %d %r" % (dim, lib.needle_thread_error()))
    return np.array(out[:dim], np.float64)


def abi_embed(lib, arch, want):
    """Upstream 3.x's embed() through the global ABI: the size call with no
    buffer, then the call with room; a model without the head says so."""
    check(lib.needle_embed(QUERY.encode(), None, 0) == -11,
          "needle_embed before any needle_load: %r" % lib.needle_last_error())
    data = open(arch["A"], "rb").read()
    check(lib.needle_load(data, len(data)) == 0, "needle_load A: %r" % lib.needle_last_error())
    dim = lib.needle_embed(QUERY.encode(), None, 0)
    out = (ctypes.c_float * dim)() if dim > 0 else None
    rc = lib.needle_embed(QUERY.encode(), out, dim) if out else dim
    check(dim == 128 and rc == dim, "needle_embed: dim %d rc %d %r" % (
        dim, rc, lib.needle_last_error()))
    if out:
        got = np.array(out[:], np.float64)
        check(np.abs(got - want).max() < 1e-6, "needle_embed == needle_model_embed: %.3g"
              % np.abs(got - want).max())
    data = open(arch["C"], "rb").read()
    check(lib.needle_load(data, len(data)) == 0, "needle_load C: %r" % lib.needle_last_error())
    rc = lib.needle_embed(QUERY.encode(), None, 0)
    msg = lib.needle_last_error().decode()
    check(rc == -9 and "head" in msg, "needle_embed without a head: %d %r" % (rc, msg))


def stat(path):
    st = os.stat(path)
    return (st.st_ino, st.st_mtime_ns, open(path, "rb").read())


def write_index(path, model_digest, texts, embs):
    tool_d = [hashlib.sha256(t.encode()).digest() for t in texts]
    body = b"NDTIDX01" + struct.pack("<IIII", 1, embs.shape[1], len(texts), 0)
    body += model_digest + hashlib.sha256(b"".join(tool_d)).digest()
    for dg, e in zip(tool_d, embs):
        body += dg + np.asarray(e, "<f4").tobytes()
    with open(path, "wb") as f:
        f.write(body + hashlib.sha256(body).digest())


def read_index(path):
    b = open(path, "rb").read()
    check(b[:8] == b"NDTIDX01" and hashlib.sha256(b[:-32]).digest() == b[-32:],
          "index file format / checksum")
    ver, dim, n, _ = struct.unpack_from("<IIII", b, 8)
    check(len(b) == 88 + n * (32 + 4 * dim) + 32, "index size")
    ents = [(b[88 + k * (32 + 4 * dim):120 + k * (32 + 4 * dim)],
             np.frombuffer(b, "<f4", dim, 120 + k * (32 + 4 * dim))) for k in range(n)]
    return b[24:56], ents


# ---------------------------------------------------------------- main
def main():
    tmp = tempfile.mkdtemp(prefix="needle_retr_")
    try:
        return run_all(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_all(tmp):
    cfg = make_ckpt.make_config(**dict(make_ckpt.TINY, max_seq_len=1024))
    params = make_ckpt.make_params(cfg, seed=5, perturb=True, probe_heads=True)
    d, cd = cfg["d_model"], cfg["contrastive_dim"]
    rng = np.random.default_rng(9)

    def normal(s, shape):
        return rng.normal(0, s, shape).astype(np.float32)

    params["contrastive_head"] = {"probes": normal(1.0, (4, d)),
                                  "proj": {"kernel": normal(0.5, (4 * d, cd))},
                                  "log_temp": np.float32(math.log(0.07))}
    params["confidence_head"] = {"probes": normal(1.0, (8, d)),
                                 "proj": {"kernel": normal(0.05, (8 * d, 1)),
                                          "bias": np.array([0.3], np.float32)}}
    arch = {}
    for tag in "ABC":
        p = dict(params)
        if tag == "B":
            p["confidence_head"] = {"probes": params["confidence_head"]["probes"],
                                    "proj": {"kernel": np.zeros((8 * d, 1), np.float32),
                                             "bias": np.array([-30.0], np.float32)}}
        if tag == "C":
            del p["contrastive_head"], p["confidence_head"]
        ck = os.path.join(tmp, tag + ".pkl")
        make_ckpt.write_checkpoint(ck, cfg, p)
        arch[tag] = os.path.join(tmp, tag + ".cact")
        sh("build", ck, "--tokenizer", TOK, "--out", arch[tag])

    lib = bind()
    mA, mB, mC = (lib.needle_model_load(arch[t].encode()) for t in "ABC")
    check(mA and mB and mC, "models load: %r" % lib.needle_thread_error())
    # the engine's float path (dequantised weights, float activations): the
    # heads' math exactly; the default quantised path (int8 activations)
    # within its rounding
    os.environ["NEEDLE_FLOAT"] = "1"
    mAf = lib.needle_model_load(arch["A"].encode())
    del os.environ["NEEDLE_FLOAT"]
    check(mAf, "float-path model loads: %r" % lib.needle_thread_error())

    # ---- heads against numpy ----
    c, P, heads = flat_params_from_cact(arch["A"], cfg)
    model = san_ref.Model(c, P)
    texts = [compact(t) for t in TOOLS]
    toks = tokenize([QUERY] + texts)
    q_np = np_embed(model, heads["contrastive"], toks[0])
    t_np = np.array([np_embed(model, heads["contrastive"], t) for t in toks[1:]])
    q_c = c_embed(lib, mAf, QUERY)
    t_c = np.array([c_embed(lib, mAf, t) for t in texts])
    err = max(np.abs(q_c - q_np).max(), np.abs(t_c - t_np).max())
    check(err < 2e-4, "contrastive embeddings (float path) vs numpy: max error %.3g" % err)
    q_q = c_embed(lib, mA, QUERY)
    t_q = np.array([c_embed(lib, mA, t) for t in texts])
    err_q = max(np.abs(q_q - q_np).max(), np.abs(t_q - t_np).max())
    check(err_q < 1e-2, "contrastive embeddings (quantised path) vs numpy: max error %.3g" % err_q)
    scores = t_np @ q_np
    order = sorted(range(len(TOOLS)), key=lambda i: -scores[i])
    gap = scores[order[4]] - scores[order[5]]
    check(gap > 1e-3, "test setup: 5th and 6th tool scores %.4g apart" % gap)
    want = [TOOLS[i]["name"] for i in sorted(order[:5])]
    print("embeddings: max |C - numpy| %.3g; scores %s; top 5 %s" % (
        err, np.round(scores, 4).tolist(), want))

    seq = [2] + tokenize(["<|im_start|>user\nturn on the lights<|im_end|>\n"])[0]
    ids = (ctypes.c_int * len(seq))(*seq)
    p = ctypes.c_double()
    check(lib.needle_model_head_confidence(mAf, ids, len(seq), ctypes.byref(p)) == 0,
          "head confidence: %r" % lib.needle_thread_error())
    logit = head_out(model, heads["confidence"], seq)[0]
    p_np = 1 / (1 + math.exp(-logit))
    print("confidence head (float path): C %.8g, numpy %.8g" % (p.value, p_np))
    check(abs(p.value - p_np) < 1e-5 and 0.02 < p_np < 0.98,
          "confidence head (float path): C %.8g vs numpy %.8g" % (p.value, p_np))
    pq = ctypes.c_double()
    check(lib.needle_model_head_confidence(mA, ids, len(seq), ctypes.byref(pq)) == 0,
          "head confidence (quantised): %r" % lib.needle_thread_error())
    print("confidence head (quantised path): C %.8g" % pq.value)
    check(abs(pq.value - p_np) < 3e-3,
          "confidence head (quantised path): C %.8g vs numpy %.8g" % (pq.value, p_np))
    check(lib.needle_model_head_confidence(mC, ids, len(seq), ctypes.byref(p)) == -9,
          "no confidence head: NEEDLE_EUNSUPPORTED")
    check(lib.needle_model_embed(mC, b"x", None, 0) == -9, "no contrastive head")
    check(lib.needle_model_embed_dim(mA) == 128 and lib.needle_model_embed_dim(mC) == -9,
          "needle_model_embed_dim")
    abi_embed(lib, arch, q_q)

    # ---- retrieval picks the numpy top 5 ----
    s = Session(lib, mA, TOOLS)
    check(s.embedded == 8 and s.context_names() == [], "session without index: %d" % s.embedded)
    env = s.complete(QUERY)
    check(s.context_names() == want, "retrieved %s, numpy says %s" % (s.context_names(), want))
    for call in env["function_calls"]:
        check(call["name"] in want, "call to an unretrieved tool %r" % call)
    s.close()
    # with 5 tools nothing is embedded and all render
    s = Session(lib, mA, TOOLS[:5])
    check(s.embedded == 0 and s.context_names() == [t["name"] for t in TOOLS[:5]],
          "five tools: no retrieval")
    s.close()
    # no contrastive head: every tool renders, with a warning
    s = Session(lib, mC, TOOLS)
    check(s.embedded == 0 and len(s.context_names()) == 8 and "retrieval" in s.warnings,
          "no head: all tools, warning %r" % s.warnings)
    s.close()

    # ---- the index file ----
    idx = os.path.join(tmp, "tools.idx")
    s = Session(lib, mA, TOOLS, idx)
    check(s.embedded == 8 and os.path.exists(idx), "index created (%d embedded)" % s.embedded)
    s.close()
    digA = hashlib.sha256(open(arch["A"], "rb").read()).digest()
    mdig, ents = read_index(idx)
    check(mdig == digA, "index keyed by the archive's SHA-256")
    check(len(ents) == 8 and all(
        e[0] == hashlib.sha256(t.encode()).digest() and np.array_equal(e[1], t_q[i].astype("<f4"))
        for i, (e, t) in enumerate(zip(ents, texts))), "index entries: tool digest + embedding")
    before = stat(idx)
    s = Session(lib, mA, TOOLS, idx)
    check(s.embedded == 0, "matching index reused: %d embedded" % s.embedded)
    check(stat(idx) == before, "reused index untouched (inode, mtime, bytes)")
    s.complete(QUERY)
    check(s.context_names() == want, "same subset from the index")
    s.close()

    # other tools: only the changed one is embedded
    tools2 = json.loads(json.dumps(TOOLS))
    tools2[2]["description"] = "Send an SMS"
    s = Session(lib, mA, tools2, idx)
    check(s.embedded == 1, "one changed tool re-embedded: %d" % s.embedded)
    s.close()
    check(stat(idx)[0] != before[0], "stale index replaced (atomic rename)")
    s = Session(lib, mA, tools2, idx)
    check(s.embedded == 0, "rewritten index reused: %d" % s.embedded)
    s.close()
    s = Session(lib, mA, list(reversed(tools2)), idx)
    check(s.embedded == 0, "reordered tools reuse their entries: %d" % s.embedded)
    s.close()
    # another model: rebuilt
    s = Session(lib, mB, TOOLS, idx)
    check(s.embedded == 8, "index of another model rebuilt: %d" % s.embedded)
    s.close()
    check(read_index(idx)[0] == hashlib.sha256(open(arch["B"], "rb").read()).digest(),
          "rebuilt index keyed by the new model")

    # corrupt files are refused and rebuilt
    good = open(idx, "rb").read()
    damaged = {"truncated": good[:len(good) // 2], "empty": b"",
               "bit flip": good[:200] + bytes([good[200] ^ 1]) + good[201:],
               "foreign": b"not an index at all\n" * 50}
    for what, data in damaged.items():
        with open(idx, "wb") as f:
            f.write(data)
        s = Session(lib, mB, TOOLS, idx)
        check(s.embedded == 8 and "refused" in s.warnings,
              "%s index: %d embedded, warnings %r" % (what, s.embedded, s.warnings))
        s.close()
        s = Session(lib, mB, TOOLS, idx)
        check(s.embedded == 0, "%s index rebuilt and valid" % what)
        s.close()

    # an index that cannot be written is a warning; the session works
    s = Session(lib, mA, TOOLS, os.path.join(tmp, "no", "such", "dir", "t.idx"))
    check(s.embedded == 8 and "not saved" in s.warnings, "unwritable index: %r" % s.warnings)
    s.complete(QUERY)
    check(s.context_names() == want, "unwritable index: retrieval still works")
    s.close()

    # a hand-made index decides: crafted scores against the query
    want_sc = [0.1, 0.9, -0.2, 0.8, 0.7, 0.3, 0.95, 0.6]  # top 5: 1, 3, 4, 6, 7
    embs = []
    for i, sc in enumerate(want_sc):
        u = rng.normal(0, 1, q_q.shape)
        u -= (u @ q_q) / (q_q @ q_q) * q_q
        u /= np.linalg.norm(u)
        embs.append(sc * q_q / np.linalg.norm(q_q) + math.sqrt(1 - sc * sc) * u)
    crafted = os.path.join(tmp, "crafted.idx")
    write_index(crafted, digA, texts, np.array(embs))
    before = stat(crafted)
    s = Session(lib, mA, TOOLS, crafted)
    check(s.embedded == 0, "crafted index trusted")
    s.complete(QUERY)
    check(s.context_names() == [TOOLS[i]["name"] for i in (1, 3, 4, 6, 7)],
          "crafted index decides the subset: %s" % s.context_names())
    s.close()
    check(stat(crafted) == before, "crafted index untouched")

    # ---- global ABI and CLI ----
    blob = open(arch["A"], "rb").read()
    check(lib.needle_load(blob, len(blob)) == 0, "needle_load")
    abi_idx = os.path.join(tmp, "abi.idx")
    check(lib.needle_init(b"", json.dumps(TOOLS).encode(), abi_idx.encode()) >= 0
          and os.path.exists(abi_idx), "needle_init writes tool_index_path")
    # (libneedle.so exports only the public API, so no embed counter here:
    # needle_init is needle_session_new_with_index on the global model, whose
    # reuse of an index is counted through needle_session_tools_embedded above)
    mdig, ents = read_index(abi_idx)
    check(mdig == digA and len(ents) == 8 and all(
        e[0] == hashlib.sha256(t.encode()).digest() and np.array_equal(e[1], t_q[i].astype("<f4"))
        for i, (e, t) in enumerate(zip(ents, texts))), "needle_init embedded the 8 tools")
    before = stat(abi_idx)
    check(lib.needle_init(b"", json.dumps(TOOLS).encode(), abi_idx.encode()) >= 0, "re-init")
    check(stat(abi_idx) == before, "needle_init reuses tool_index_path")
    buf = ctypes.create_string_buffer(65536)
    check(lib.needle_complete(QUERY.encode(), 48, buf, len(buf)) > 0, "needle_complete")

    tj = os.path.join(tmp, "tools.json")
    with open(tj, "w") as f:
        json.dump(TOOLS, f)
    cli_idx = os.path.join(tmp, "cli.idx")
    out = sh("run", "--weights", arch["A"], "--tools", tj, "--tool-index", cli_idx,
             "--max-new-tokens", "48", QUERY)
    env = json.loads(out.splitlines()[-1])
    check(os.path.exists(cli_idx) and all(c["name"] in want for c in env["function_calls"]),
          "needle run --tool-index: %r" % env)
    before = stat(cli_idx)
    sh("run", "--weights", arch["A"], "--tools", tj, "--tool-index", cli_idx,
       "--max-new-tokens", "48", QUERY)
    check(stat(cli_idx) == before, "needle run reuses the index")

    # ---- envelope confidence ----
    few = TOOLS[:2]
    conf = {}
    for tag, m in (("A", mA), ("B", mB), ("C", mC)):
        s = Session(lib, m, few)
        env = s.complete("turn on the kitchen lights")
        check(env["success"] is True, "%s: %r" % (tag, env))
        conf[tag] = env["confidence"]
        s.close()
    print("envelope confidence: %r" % conf)
    check(conf["B"] == float("%.6g" % (1 / (1 + math.exp(30)))),
          "B: the head's sigmoid(-30) wins the minimum: %r" % conf["B"])
    check(isinstance(conf["C"], float) and 0 < conf["C"] <= 1 and conf["C"] > conf["B"],
          "C (no head): decoding probability %r" % conf["C"])
    check(isinstance(conf["A"], float) and 0 < conf["A"] <= conf["C"],
          "A: min(head, decoding) %r <= %r" % (conf["A"], conf["C"]))

    # ---- a large catalogue (issue 33): retrieval picks before the grammar ----
    # 300 tools: with a contrastive head the session checks every tool but
    # compiles a grammar for the 5 rendered ones only (one grammar holds at
    # most 64 tools); without one, the context message says why it fails
    big = [tool("op_%04d" % i, "operation %d of a large catalogue" % i,
                {"id": {"type": "integer", "minimum": i}, "note": {"type": "string"}})
           for i in range(300)]
    big[234]["parameters"]["properties"]["id"]["multipleOf"] = 3
    t0 = time.time()
    s = lib.needle_session_new_with_index(mA, b"", json.dumps(big).encode(), None)
    check(bool(s), "300 tools with a retrieval head: %r" % lib.needle_thread_error())
    if s:
        sess = Session.__new__(Session)
        sess.lib, sess.s = lib, s
        w = lib.needle_session_warnings(s).decode()
        check("op_0234.parameters.id" in w and "multipleOf" in w,
              "a warning of the 235th tool names it: %r" % w[:300])
        for q in ("turn on the lights", "operation 17", "turn on the lights"):
            env = sess.complete(q, 64)
            names = sess.context_names()
            check(len(names) == 5 and set(names) <= {t["name"] for t in big},
                  "300 tools: 5 rendered, got %r" % names)
            check(env["success"] is False or all(c["name"] in names for c in env["function_calls"]),
                  "300 tools: calls name rendered tools: %r" % env)
            sess.lib.needle_session_reset(s)
        sess.close()
    print("300-tool catalogue through retrieval: %.1f s" % (time.time() - t0))
    bad = json.loads(json.dumps(big))
    del bad[250]["name"]
    s = lib.needle_session_new_with_index(mA, b"", json.dumps(bad).encode(), None)
    check(not s and b"tools[250]" in lib.needle_thread_error(),
          "a nameless tool among 300 is named: %r" % lib.needle_thread_error())
    s = lib.needle_session_new_with_index(mC, b"", json.dumps(big[:80]).encode(), None)
    err = lib.needle_thread_error().decode()
    check(not s and "no retrieval head, so all 80 tools are rendered" in err
          and re.search(r"take \d+ tokens, at most \d+ fit", err),
          "80 tools, no retrieval head: %r" % err)

    for m in (mA, mB, mC, mAf):
        lib.needle_model_free(m)
    if FAIL:
        print("%d failure(s)" % len(FAIL))
        return 1
    print("test_retrieval: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
