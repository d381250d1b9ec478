#!/usr/bin/python3
"""The catalogue run of docs/engine.md (Tool retrieval): the first 200 distinct
real tools of tests/data/openapi_sample in one session of a tiny random
model with a contrastive head (max_seq_len 1024), each of the first 50
tools' descriptions as a fresh first turn; prints how many turns answered,
how many tools each rendered, and any refusal. Run from the repository root
after `make`: /usr/bin/python3 tools/catalogue_run.py"""
import sys, os, json, ctypes, tempfile, math, time
sys.path.insert(0, "tests"); sys.path.insert(0, "tests/ref")
import numpy as np, make_ckpt
import test_retrieval_fit as T
tmp = tempfile.mkdtemp()
cfg = make_ckpt.make_config(**dict(make_ckpt.TINY, max_seq_len=1024))
params = make_ckpt.make_params(cfg, seed=5, perturb=True, probe_heads=True)
d, cd = cfg["d_model"], cfg["contrastive_dim"]
rng = np.random.default_rng(4)
params["contrastive_head"] = {"probes": rng.normal(0, 1.0, (4, d)).astype(np.float32),
    "proj": {"kernel": rng.normal(0, 0.5, (4 * d, cd)).astype(np.float32)}, "log_temp": np.float32(math.log(0.07))}
ck, cact = tmp + "/m.pkl", tmp + "/m.cact"
make_ckpt.write_checkpoint(ck, cfg, params)
T.sh("build", ck, "--tokenizer", T.TOK, "--out", cact)
seen, tools = set(), []
for line in open(T.SETS):
    for t in json.loads(line)["tools"]:
        if t["name"] not in seen:
            seen.add(t["name"]); tools.append(t)
tools = tools[:200]
lib = ctypes.CDLL(os.path.join(T.BUILD, "libneedle.so")); vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
for name, args, res in [("needle_model_load", [cp], vp), ("needle_session_new", [vp, cp, cp], vp),
    ("needle_session_complete", [vp, cp, i, cp, i], i), ("needle_session_warnings", [vp], cp),
    ("needle_session_context_tools", [vp], cp), ("needle_thread_error", [], cp), ("needle_session_reset", [vp], i)]:
    getattr(lib, name).argtypes = args; getattr(lib, name).restype = res
m = lib.needle_model_load(cact.encode()); s = lib.needle_session_new(m, b"", json.dumps(tools).encode())
print("tools", len(tools), "session", bool(s), lib.needle_thread_error())
ok = 0; t0 = time.time(); shown_counts = []
for t in tools[:50]:
    lib.needle_session_reset(s)
    buf = ctypes.create_string_buffer(1 << 20)
    rc = lib.needle_session_complete(s, (t["description"][:120] or t["name"]).encode(), 24, buf, len(buf))
    env = json.loads(buf.value.decode())
    shown_counts.append(len(json.loads(lib.needle_session_context_tools(s) or b"[]")))
    good = rc > 0 and not env.get("error")
    ok += good
    if not good: print("FAIL", rc, t["name"], json.dumps(env)[:600])
print("answered", ok, "of 50; rendered tools per turn min/max", min(shown_counts), max(shown_counts), "%.1f s" % (time.time() - t0))
