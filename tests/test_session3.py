#!/usr/bin/python3
"""Needle 3 archives in the engine's sessions (issue 32), through libneedle
with ctypes, the way upstream's 3.x Python package drives its engine.

  * a random tiny3 checkpoint (tools/make_needle3_fixture.py, vocab 8192,
    the three probe heads) built with `needle build --tokenizer`;
  * the 3.x client's exact call sequence on the global ABI, with 3.x's
    argtypes (needle/__init__.py _lib): needle_load(bytes, len) ->
    needle_init(system with the date fact, tools JSON, NULL) ->
    needle_complete(query, 512, buf, 65536) -> needle_embed(text, NULL, 0)
    then with a buffer of that size -> needle_reset -> needle_complete;
    every envelope parses, succeeds, its calls validate against the tool
    schemas, the confidence is the confidence head's probability;
  * "the model picks": two archives that differ only in the <think> row
    of the embedding (+2x and -2x the <tool_call> row) see the same hidden
    state at the pick, so exactly one of them reasons (non-empty
    "reasoning") and the other calls at once; both still give valid calls;
  * a v2 archive (the built-in needle-nano.cact) and v3 archives loaded
    side by side in one process through the handle API, each completing;
  * an archive without probe heads: confidence null, needle_embed and
    needle_model_embed_dim NEEDLE_EUNSUPPORTED with a message naming the
    embedding head;
  * 100 turns of one session (tool results and user turns in 3.x's
    multi-turn form, well past max_seq_len): needle_session_memory_bytes
    stays within needle_session_memory_bound and is flat over the second
    half (no growth after the window filled);
  * the float path (NEEDLE_FLOAT=1, a second process) completes too.
"""
import ctypes
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "ref"))
sys.path.insert(0, os.path.join(SRC, "tools"))
from harness import Checker, find_needle, run  # noqa: E402
import make_needle3_fixture as fixture  # noqa: E402

TOK = os.path.join(SRC, "models", "tokenizer.model")
BUILD = os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build")
NEEDLE_EUNSUPPORTED = -9

TOOLS = [
    {"name": "get_weather", "description": "Weather for a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}},
    {"name": "set_timer", "description": "Start a timer",
     "parameters": {"type": "object",
                    "properties": {"minutes": {"type": "integer"},
                                   "label": {"type": "string"}},
                    "required": ["minutes"]}},
]
SYSTEM = "date: 2026-12-05 Sat 02:45; You are a helpful assistant."


def make_checkpoint(path, heads=True, think_sign=0.0, max_seq_len=256):
    cfg = fixture.config_for("tiny3", vocab_size=8192, max_seq_len=max_seq_len)
    params = fixture.random_params(cfg, np.random.default_rng(5), heads=heads)
    params["stack/layers/block/attn_gate"] *= 150
    params["stack/layers/block/hadamard_mlp/d4"] *= 150
    if think_sign:
        emb = params["embedding/embedding"]
        emb[6] = think_sign * 2.0 * emb[10]  # <think> vs <tool_call>
    fixture.write_safetensors(path, params, fixture.checkpoint_metadata(cfg, 7, {"seed": 5}))
    return cfg


def validate_calls(calls):
    """Each call names a declared tool, has its required arguments, no
    undeclared ones, each of the declared type."""
    by_name = {t["name"]: t["parameters"] for t in TOOLS}
    for c in calls:
        p = by_name.get(c.get("name"))
        if p is None or not isinstance(c.get("arguments"), dict):
            return False
        args = c["arguments"]
        if any(r not in args for r in p.get("required", [])):
            return False
        for k, v in args.items():
            t = p["properties"].get(k, {}).get("type")
            if t is None:
                return False
            if t == "string" and not isinstance(v, str):
                return False
            if t == "integer" and (not isinstance(v, int) or isinstance(v, bool)):
                return False
    return True


def bind(lib):
    """3.x's _lib(generation=3) argtypes, then the handle API."""
    lib.needle_init.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
    lib.needle_init.restype = ctypes.c_int
    lib.needle_complete.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.needle_complete.restype = ctypes.c_int
    lib.needle_embed.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int]
    lib.needle_embed.restype = ctypes.c_int
    lib.needle_reset.argtypes = []
    lib.needle_reset.restype = None
    lib.needle_load.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
    lib.needle_load.restype = ctypes.c_int
    vp = ctypes.c_void_p
    lib.needle_model_load.argtypes = [ctypes.c_char_p]
    lib.needle_model_load.restype = vp
    lib.needle_model_free.argtypes = [vp]
    lib.needle_session_new.argtypes = [vp, ctypes.c_char_p, ctypes.c_char_p]
    lib.needle_session_new.restype = vp
    lib.needle_session_free.argtypes = [vp]
    lib.needle_session_complete.argtypes = [vp, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                                            ctypes.c_int]
    lib.needle_session_complete.restype = ctypes.c_int
    lib.needle_session_memory_bytes.argtypes = [vp]
    lib.needle_session_memory_bytes.restype = ctypes.c_longlong
    lib.needle_session_memory_bound.argtypes = [vp]
    lib.needle_session_memory_bound.restype = ctypes.c_longlong
    lib.needle_session_require_call.argtypes = [vp, ctypes.c_int]
    lib.needle_session_require_call.restype = ctypes.c_int
    lib.needle_model_embed_dim.argtypes = [vp]
    lib.needle_model_embed_dim.restype = ctypes.c_int
    lib.needle_last_error.argtypes = []
    lib.needle_last_error.restype = ctypes.c_char_p
    lib.needle_thread_error.argtypes = []
    lib.needle_thread_error.restype = ctypes.c_char_p
    return lib


def envelope(check, name, rc, buf, call=False):
    raw = buf.value.decode("utf-8")
    try:
        e = json.loads(raw)
    except json.JSONDecodeError:
        check(name + ": envelope parses", False, raw[:200])
        return None
    check(name + ": rc is the envelope's length", rc == len(buf.value), "rc %d" % rc)
    ok = e.get("success") is True and validate_calls(e.get("function_calls", []))
    check(name + ": success, calls valid against the schemas", ok, raw[:300])
    if call:  # require_call on: a non-empty list of calls
        check(name + ": a call", e.get("type") == "call" and len(e.get("function_calls")) > 0)
    return e


def client(check, lib, path, heads):
    """3.x's Needle(tools, system) then complete / embed / reset."""
    with open(path, "rb") as f:
        data = f.read()
    check("needle_load(bytes) of the v3 archive", lib.needle_load(data, len(data)) >= 0,
          lib.needle_last_error().decode())
    tools = json.dumps(TOOLS).encode()
    rc = lib.needle_init(SYSTEM.encode(), tools, None)
    check("needle_init(system, tools, NULL) >= 0", rc >= 0, lib.needle_last_error().decode())
    buf = ctypes.create_string_buffer(65536)
    rc = lib.needle_complete("What's the weather in Paris?".encode(), 512, buf, len(buf))
    e = envelope(check, "complete", rc, buf)
    if e is not None:
        conf = e.get("confidence")
        if heads:
            check("confidence: the head's probability", isinstance(conf, float) and 0 < conf < 1,
                  repr(conf))
        else:
            check("confidence null without a confidence head", conf is None, repr(conf))
        check("envelope keys as v2's", set(e) >= {"type", "success", "error", "function_calls",
                                                  "reasoning", "confidence", "prefill_tps",
                                                  "decode_tps"}, str(sorted(e)))
        # the answer turn after a call: 3.x's client sends the tool results
        if e.get("type") == "call":
            rc = lib.needle_complete(json.dumps([{"temp_c": 21}]).encode(), 512, buf, len(buf))
            envelope(check, "complete after a tool result", rc, buf)
    text = "remind me about the weather".encode()
    dim = lib.needle_embed(text, None, 0)
    if heads:
        check("needle_embed(text, NULL, 0) = embedding_dim", dim == 8, "dim %d" % dim)
        if dim > 0:
            out = (ctypes.c_float * dim)()
            rc = lib.needle_embed(text, out, dim)
            v = np.array(list(out))
            check("needle_embed with the buffer returns dim", rc == dim, "rc %d" % rc)
            check("the embedding is unit length", abs(np.linalg.norm(v) - 1) < 1e-4,
                  str(np.linalg.norm(v)))
            out2 = (ctypes.c_float * dim)()
            lib.needle_embed("something else entirely".encode(), out2, dim)
            check("another text embeds differently",
                  np.max(np.abs(np.array(list(out2)) - v)) > 1e-3)
    else:
        msg = lib.needle_last_error().decode()
        check("needle_embed without an embedding head: NEEDLE_EUNSUPPORTED",
              dim == NEEDLE_EUNSUPPORTED and "embedding head" in msg, "%d %s" % (dim, msg))
    lib.needle_reset()
    rc = lib.needle_complete("Set a timer for 5 minutes".encode(), 512, buf, len(buf))
    return envelope(check, "complete after needle_reset", rc, buf)


def main():
    check = Checker()
    needle = find_needle()
    libpath = os.path.join(BUILD, "libneedle3.so")
    if not check("needle and libneedle3.so found", needle is not None and os.path.exists(libpath),
                 libpath):
        return check.finish()
    tmp = tempfile.mkdtemp(prefix="needle_session3_")
    archives = {}
    for name, kw in (("heads", {}), ("noheads", {"heads": False}),
                     ("think_plus", {"think_sign": 1.0}), ("think_minus", {"think_sign": -1.0})):
        ck = os.path.join(tmp, name + ".safetensors")
        make_checkpoint(ck, **kw)
        out = os.path.join(tmp, name + ".cact")
        r = run([needle, "build", ck, "--tokenizer", TOK, "--out", out])
        check("build " + name, r.returncode == 0, r.stderr[-300:])
        archives[name] = out
    os.environ.pop("NEEDLE_FLOAT", None)
    lib = bind(ctypes.CDLL(libpath))

    # 1. the 3.x client's call sequence
    client(check, lib, archives["heads"], True)
    client(check, lib, archives["noheads"], False)

    # 2. the model picks: exactly one of the two archives reasons
    reasoned = []
    for name in ("think_plus", "think_minus"):
        m = lib.needle_model_load(archives[name].encode())
        s = lib.needle_session_new(m, SYSTEM.encode(), json.dumps(TOOLS).encode())
        check(name + ": session", bool(m) and bool(s))
        lib.needle_session_require_call(s, 1)
        buf = ctypes.create_string_buffer(65536)
        rc = lib.needle_session_complete(s, "Set a timer for 5 minutes".encode(), 256, buf,
                                         len(buf))
        e = envelope(check, name, rc, buf, call=True)
        reasoned.append(bool(e and e.get("reasoning")))
        lib.needle_session_free(s)
        lib.needle_model_free(m)
    check("exactly one of +<tool_call> / -<tool_call> as the <think> row reasons",
          reasoned in ([True, False], [False, True]), str(reasoned))

    # 3. both generations in one process
    nano = os.path.join(BUILD, "needle-nano.cact")
    m2 = lib.needle_model_load(nano.encode())
    m3 = lib.needle_model_load(archives["heads"].encode())
    check("v2 (%s) and v3 models loaded side by side" % os.path.basename(nano), bool(m2) and bool(m3),
          "" if os.path.exists(nano) else nano + " missing: build the needle_nano target")
    s2 = lib.needle_session_new(m2, None, json.dumps(TOOLS).encode())
    s3 = lib.needle_session_new(m3, SYSTEM.encode(), json.dumps(TOOLS).encode())
    lib.needle_session_require_call(s2, 1)
    lib.needle_session_require_call(s3, 1)
    buf = ctypes.create_string_buffer(65536)
    for turn in range(2):
        for name, s in (("v2", s2), ("v3", s3)):
            rc = lib.needle_session_complete(s, "Weather in Oslo please".encode(), 256, buf,
                                             len(buf))
            envelope(check, "%s session, turn %d, interleaved" % (name, turn), rc, buf, call=True)
    check("the v2 model has no v3 embedding; the v3 one has 8",
          lib.needle_model_embed_dim(m3) == 8, str(lib.needle_model_embed_dim(m3)))
    lib.needle_session_free(s2)
    lib.needle_model_free(m2)

    # 4. a long conversation: memory flat
    lib.needle_session_free(s3)
    s3 = lib.needle_session_new(m3, SYSTEM.encode(), json.dumps(TOOLS).encode())
    mem, bound, bad, last = [], lib.needle_session_memory_bound(s3), 0, None
    for turn in range(100):
        text = json.dumps([{"temp_c": turn}]) if last == "call" else "And in city %d?" % turn
        rc = lib.needle_session_complete(s3, text.encode(), 64, buf, len(buf))
        try:
            e = json.loads(buf.value.decode())
            last = e.get("type")
            bad += rc < 0 or not e.get("success")
        except json.JSONDecodeError:
            bad += 1
        mem.append(lib.needle_session_memory_bytes(s3))
    check("100 turns complete", bad == 0, "%d failed" % bad)
    check("memory within needle_session_memory_bound", max(mem) <= bound,
          "max %d bound %d" % (max(mem), bound))
    check("memory flat over turns 50..100", max(mem[50:]) <= max(mem[:50]),
          "first half max %d, second half max %d" % (max(mem[:50]), max(mem[50:])))
    print("  memory (bytes) at turns 1, 10, 50, 100: %d %d %d %d (bound %d)"
          % (mem[0], mem[9], mem[49], mem[99], bound))
    lib.needle_session_free(s3)
    lib.needle_model_free(m3)

    # 5. the float path in a fresh process
    code = ("import ctypes,json,sys;sys.path.insert(0,%r);import test_session3 as t;"
            "lib=t.bind(ctypes.CDLL(%r));m=lib.needle_model_load(%r);"
            "s=lib.needle_session_new(m,None,json.dumps(t.TOOLS).encode());"
            "b=ctypes.create_string_buffer(65536);"
            "rc=lib.needle_session_complete(s,b'Weather in Rome',256,b,65536);"
            "print(rc, b.value.decode())") % (HERE, libpath, archives["heads"].encode())
    env = dict(os.environ, NEEDLE_FLOAT="1")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=600)
    rc, _, raw = p.stdout.partition(" ")
    ok = p.returncode == 0 and rc.lstrip("-").isdigit() and int(rc) > 0
    e = json.loads(raw) if ok else {}
    check("float path (NEEDLE_FLOAT=1): a valid call",
          ok and e.get("success") and validate_calls(e.get("function_calls", [])),
          (p.stderr or raw)[-300:])
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
