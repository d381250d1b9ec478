#!/usr/bin/python3
"""Retrieval keeps the context within max_seq_len (issue 33): a catalogue
of real tools (tests/data/openapi_sample, converted from public OpenAPI
specifications) whose five best tools for a query take more tokens than a
1,024-token context holds. Each turn renders the best-ranked tools that fit
(k <= 5) instead of failing, and needle_session_warnings names how many
(and which) were left out. Checked independently with `needle tokenize`:
the rendered prompt fits, and adding the best tool left out would not.
`needle run` prints the same warning. The archive is a tiny random model
with a contrastive head (tests/ref/make_ckpt.py), built by `needle build`.
Old code: the turn failed with "even the 5 tools retrieval picked do not
fit"."""
import ctypes
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "ref"))
import make_ckpt  # noqa: E402

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(HERE))
BUILD = os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build")
NEEDLE = os.environ.get("NEEDLE") or os.path.join(BUILD, "needle")
TOK = os.path.join(SRC, "models", "tokenizer.model")
SETS = os.path.join(SRC, "tests", "data", "openapi_sample", "sets.jsonl")
CTX = 1024
FAIL = []
NOTE = re.compile(r"tool retrieval: the (\d+) best tools for this query take (\d+) tokens of "
                  r"prompt, at most (\d+) fit with room for the query and answer: rendered the "
                  r"best (\d+), left out (\d+) \((.*)\)$", re.M)
# the context less the session's room (16) and the answer's (64)
FIT = CTX - 16 - 64


def check(cond, msg):
    if not cond:
        FAIL.append(msg)
        print("FAIL:", msg)


def sh(*args, stdin=None):
    p = subprocess.run([NEEDLE] + [str(a) for a in args], capture_output=True, input=stdin)
    if p.returncode:
        raise SystemExit("needle %s: %s" % (args[:2], p.stderr.decode()))
    return p.stdout.decode()


def compact(v):
    return json.dumps(v, separators=(",", ":"))


def n_tokens(text):
    """BOS + the tokens of the text (`needle tokenize --whole`: newlines
    included, as the session encodes its prompt)"""
    out = sh("tokenize", "--tokenizer", TOK, "--whole", stdin=text.encode())
    return 1 + len(out.split())


def catalogue():
    """40 real tools, one per name, of 700-1400 characters each (about 250
    to 500 tokens, as real API tools are): any five overflow a 1,024-token
    context, one or two fit"""
    seen, tools = set(), []
    with open(SETS) as f:
        for line in f:
            for t in json.loads(line)["tools"]:
                if t["name"] not in seen and 700 <= len(compact(t)) <= 1400:
                    seen.add(t["name"])
                    tools.append(t)
    return tools[:40]


def main():
    tmp = tempfile.mkdtemp(prefix="needle_rfit_")
    try:
        return run(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(tmp):
    cfg = make_ckpt.make_config(**dict(make_ckpt.TINY, max_seq_len=CTX))
    params = make_ckpt.make_params(cfg, seed=5, perturb=True, probe_heads=True)
    d, cd = cfg["d_model"], cfg["contrastive_dim"]
    rng = np.random.default_rng(4)
    params["contrastive_head"] = {
        "probes": rng.normal(0, 1.0, (4, d)).astype(np.float32),
        "proj": {"kernel": rng.normal(0, 0.5, (4 * d, cd)).astype(np.float32)},
        "log_temp": np.float32(math.log(0.07))}
    ck = os.path.join(tmp, "m.pkl")
    cact = os.path.join(tmp, "m.cact")
    make_ckpt.write_checkpoint(ck, cfg, params)
    sh("build", ck, "--tokenizer", TOK, "--out", cact)
    tools = catalogue()
    by_name = {t["name"]: t for t in tools}

    lib = ctypes.CDLL(os.path.join(BUILD, "libneedle.so"))
    vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    for name, args, res in [("needle_model_load", [cp], vp), ("needle_model_free", [vp], None),
                            ("needle_session_new", [vp, cp, cp], vp),
                            ("needle_session_free", [vp], None),
                            ("needle_session_complete", [vp, cp, i, cp, i], i),
                            ("needle_session_warnings", [vp], cp),
                            ("needle_session_context_tools", [vp], cp),
                            ("needle_thread_error", [], cp)]:
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = res
    model = lib.needle_model_load(cact.encode())
    check(model, "model loads: %r" % lib.needle_thread_error())
    sess = lib.needle_session_new(model, b"", json.dumps(tools).encode())
    check(sess, "session: %r" % lib.needle_thread_error())
    if not (model and sess):
        return 1
    head = "<|im_start|>user\n<tools>"
    dropped_turns = 0
    queries = [t["description"][:120] or t["name"] for t in tools[:12]]
    lib.needle_session_reset.argtypes = [vp]
    for q in queries:
        lib.needle_session_reset(sess)  # a fresh conversation: retrieval picks again
        buf = ctypes.create_string_buffer(1 << 20)
        rc = lib.needle_session_complete(sess, q.encode(), 12, buf, len(buf))
        env = json.loads(buf.value.decode() or "{}")
        check(rc > 0 and "do not fit" not in (env.get("error") or ""),
              "query %r: rc %d, %r" % (q[:40], rc, env.get("error")))
        shown = json.loads(lib.needle_session_context_tools(sess) or b"[]")
        names = [t["name"] for t in shown]
        check(1 <= len(names) <= 5, "query %r: %d tools rendered" % (q[:40], len(names)))
        used = n_tokens(head + compact(shown) + "</tools>\n")
        warn = lib.needle_session_warnings(sess).decode()
        m = NOTE.search(warn)
        if len(names) == 5:
            check(m is None, "5 rendered, yet a note: %r" % warn)
            check(used <= FIT, "query %r: 5 tools, %d tokens" % (q[:40], used))
            continue
        check(m is not None, "query %r: %d tools rendered, no note: %r" % (q[:40], len(names), warn))
        if not m:
            continue
        dropped_turns += 1
        best, took, fit, kept, left = (int(m.group(k)) for k in range(1, 6))
        left_names = m.group(6).split(", ")
        check(best == 5 and kept == len(names) and left == 5 - kept and
              len(left_names) == left and fit == FIT and took > fit,
              "note numbers: %s (rendered %d)" % (m.group(0), len(names)))
        check(not set(left_names) & set(names) and all(n in by_name for n in left_names),
              "left out %s vs rendered %s" % (left_names, names))
        check(used <= fit, "query %r: rendered prompt %d tokens > %d" % (q[:40], used, fit))
        # maximal: with the best tool left out too it would not fit
        more = [by_name[n] for n in names + left_names[:1]]
        order = {t["name"]: k for k, t in enumerate(tools)}
        more.sort(key=lambda t: order[t["name"]])
        over = n_tokens(head + compact(more) + "</tools>\n")
        check(over > fit, "query %r: %s would fit too (%d <= %d)" % (q[:40], left_names[0],
                                                                    over, fit))
        print("%-40.40s rendered %d (%d tokens), left out %d: %s" % (q, len(names), used, left,
                                                                     ", ".join(left_names)))
    check(dropped_turns > 0, "setup: no query's five best tools overflowed the context")
    lib.needle_session_free(sess)
    lib.needle_model_free(model)

    # the CLI says the same
    tj = os.path.join(tmp, "tools.json")
    with open(tj, "w") as f:
        json.dump(tools, f)
    r = subprocess.run([NEEDLE, "run", "--weights", cact, "--tools", tj, "--max-new-tokens", "12",
                        queries[0]], capture_output=True, text=True, timeout=300)
    check("do not fit" not in r.stderr, "needle run: %r" % r.stderr[-500:])
    m = NOTE.search(r.stderr)
    print("needle run: exit %d; %s" % (r.returncode, m.group(0) if m else "(no note)"))
    if FAIL:
        print("%d failure(s)" % len(FAIL))
        return 1
    print("ok: %d of %d turns left tools out to fit" % (dropped_turns, len(queries)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
