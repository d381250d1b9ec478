#!/usr/bin/python3
"""The nano base as the build packages it, and the commands that fall back
on it.

Checks: the build made needle-nano.cact (plus the checkpoint and tokenizer)
beside the program; `needle run` without --weights and upstream's ctypes
client (needle_init without needle_load) answer with it, no env var set;
`needle finetune`, `needle build` and `needle playground` without a
checkpoint use the nano base when checkpoints/needle2.pkl is absent and say
so in their first lines (the playground also starts with the archive),
use checkpoints/needle2.pkl when it is there, and fail naming both when
neither is; `build --lora A` takes the base A records; recommended settings
(`needle convert --recommend`) are printed and used, explicit flags win,
bad ones are refused; the converted file still loads as upstream's
checkpoint (pickle + numpy: same config and params, one extra top-level
key). A cross build without a runnable needle has no archive: skipped (77).
"""
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile

import numpy as np

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build")
NEEDLE = os.environ.get("NEEDLE") or os.path.join(BUILD, "needle")
DATA = os.path.join(SRC, "examples", "data.jsonl")
NANO_CACT = os.path.join(BUILD, "needle-nano.cact")
NANO_PKL = os.path.join(BUILD, "needle-nano.pkl")
FAIL = []

TOOLS = [{"name": "set_timer", "description": "Start a timer",
          "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}},
                         "required": ["minutes"]}}]

CLIENT = r'''
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.needle_init.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
lib.needle_init.restype = ctypes.c_int
lib.needle_complete.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
lib.needle_complete.restype = ctypes.c_int
lib.needle_last_error.restype = ctypes.c_char_p
rc = lib.needle_init(b"", sys.argv[2].encode(), None)
out = {"init": rc, "error": lib.needle_last_error().decode()}
if rc >= 0:
    buf = ctypes.create_string_buffer(65536)
    out["complete"] = lib.needle_complete(b"start a timer for 5 minutes", 32, buf, len(buf))
    out["envelope"] = json.loads(buf.value.decode())
print(json.dumps(out))
'''


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg)
    if not cond:
        FAIL.append(msg)


def clean_env(**extra):
    env = dict(os.environ)
    for k in ("NEEDLE_BASE_WEIGHTS", "NEEDLE_BASE_CHECKPOINT", "NEEDLE_TOKENIZER"):
        env.pop(k, None)
    env["HF_HUB_OFFLINE"] = "1"  # the needle2 fallback must never reach the network
    env.update(extra)
    return env


def needle(*args, cwd=None, env=None):
    return subprocess.run([NEEDLE] + [str(a) for a in args], capture_output=True, text=True,
                          cwd=cwd, env=env or clean_env())


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def first_lines(text, n=2):
    return "\n".join(text.splitlines()[:n])


def same_tree(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same_tree(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b and type(a) is type(b)


def packaged(tmp):
    for f in ("needle-nano.pkl", "tokenizer.model"):
        check(os.path.isfile(os.path.join(BUILD, f)), "the build copied %s beside needle" % f)
    tools = os.path.join(tmp, "tools.json")
    with open(tools, "w") as f:
        json.dump(TOOLS, f)
    p = needle("run", "--tools", tools, "--max-new-tokens", "24", "start a timer for 5 minutes",
               cwd=tmp)
    check(p.returncode == 0 and NANO_CACT in p.stderr,
          "run without --weights uses build/needle-nano.cact: rc %d %s" % (p.returncode, p.stderr))
    try:
        env = json.loads(p.stdout.splitlines()[0])
        check(env["success"] is True, "run: a successful envelope %r" % env)
    except (ValueError, IndexError, KeyError):
        check(False, "run: no envelope in %r" % p.stdout[:200])
    lib = os.path.join(BUILD, "libneedle.so")
    c = subprocess.run([sys.executable, "-c", CLIENT, lib, json.dumps(TOOLS)],
                       capture_output=True, text=True, env=clean_env())
    r = json.loads(c.stdout) if c.returncode == 0 else {"init": None, "error": c.stderr}
    check(r["init"] is not None and r["init"] > 0 and r.get("complete", -1) >= 0 and
          r["envelope"].get("success") is True,
          "upstream's client, no needle_load, no env: the nano base answers (%r)" % r)


def playground(tmp):
    """Started bare: the built-in archive is loaded, the nano base is its
    fine-tune base, both said on stderr (skipped without libmicrohttpd)."""
    p = subprocess.Popen([NEEDLE, "playground", "--port", "0", "--workdir", tmp],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=clean_env(), cwd=tmp)
    try:
        ready = p.stdout.readline()
    finally:
        p.terminate()
        out, err = p.communicate(timeout=60)
    if "has no playground" in err:
        print("skip playground: built without libmicrohttpd")
        return
    check(ready.startswith("needle playground ready") and '"name":"needle-nano.cact"' in ready and
          '"loaded":true' in ready, "playground starts with the built-in base: %r" % ready)
    check(NANO_CACT in err and "built-in base" in err and NANO_PKL in err and "--base PATH" in err,
          "playground says which model and which fine-tune base: %s" % err)


def fallback(tmp, data):
    work = os.path.join(tmp, "fallback")
    os.makedirs(work)
    ad = os.path.join(work, "a.pkl")
    p = needle("finetune", data, "--epochs", "1", "--batch-size", "8", "--val-split", "0",
               "--threads", "2", "--out", ad, cwd=work)
    head = first_lines(p.stdout)
    check(p.returncode == 0, "finetune without --checkpoint runs: %s" % p.stderr[-400:])
    check(NANO_PKL in p.stdout.splitlines()[0] and "nano base" in head and
          "needle download Cactus-Compute/needle2/checkpoints/needle2.pkl" in head and
          "--checkpoint" in head, "finetune: the first lines name the nano base and needle2:\n" +
          head)
    st = load(ad)["needle_c_state"] if os.path.exists(ad) else {}
    check(st.get("base_checkpoint") == os.path.realpath(NANO_PKL),
          "the adapter records the nano base: %r" % st.get("base_checkpoint"))

    # build with no CKPT: the base the adapter records
    p = needle("build", "--lora", ad, "--out", "a.cact", cwd=work)
    check(p.returncode == 0 and os.path.realpath(NANO_PKL) in p.stdout.splitlines()[0] and
          "trained on" in p.stdout.splitlines()[0] and os.path.isfile(os.path.join(work, "a.cact")),
          "build --lora A: the recorded base: rc %d %s %s" % (p.returncode, p.stdout, p.stderr))
    # build with nothing: the nano base, said first, default output name
    p = needle("build", cwd=work)
    check(p.returncode == 0 and "nano base" in first_lines(p.stdout) and
          os.path.isfile(os.path.join(work, "needle-nano.cact")),
          "build without CKPT: the nano base: rc %d %s %s" % (p.returncode, p.stdout, p.stderr))

    # checkpoints/needle2.pkl present: used, no nano line
    os.makedirs(os.path.join(work, "checkpoints"))
    n2 = os.path.join(work, "checkpoints", "needle2.pkl")
    p = needle("init", n2, "--preset", "tiny", "--seed", "3")
    check(p.returncode == 0, "init tiny: %s" % p.stderr)
    shutil.copy(os.path.join(SRC, "models", "tokenizer.model"),
                os.path.join(work, "checkpoints", "tokenizer.model"))
    p = needle("build", "--out", "n2.cact", cwd=work)
    check(p.returncode == 0 and "nano base" not in p.stdout and
          os.path.isfile(os.path.join(work, "n2.cact")),
          "build with checkpoints/needle2.pkl here uses it: %s %s" % (p.stdout, p.stderr))
    shutil.rmtree(os.path.join(work, "checkpoints"))

    # neither: a missing NEEDLE_BASE_CHECKPOINT is named, so is needle2
    missing = os.path.join(tmp, "missing.pkl")
    p = needle("finetune", data, "--epochs", "1", "--out", ad, cwd=work,
               env=clean_env(NEEDLE_BASE_CHECKPOINT=missing))
    check(p.returncode != 0 and "needle2.pkl" in p.stderr and missing in p.stderr and
          "nano base" in p.stderr, "neither base: a clear error (rc %d): %s" %
          (p.returncode, p.stderr))
    # an adapter whose recorded base is gone: named, not guessed
    moved = os.path.join(tmp, "gone.pkl")
    shutil.copy(NANO_PKL, moved)
    shutil.copy(os.path.join(BUILD, "tokenizer.model"), os.path.join(tmp, "tokenizer.model"))
    ad2 = os.path.join(work, "gone_lora.pkl")
    p = needle("finetune", data, "--checkpoint", moved, "--epochs", "1", "--batch-size", "8",
               "--val-split", "0", "--threads", "2", "--out", ad2, cwd=work)
    check(p.returncode == 0, "finetune --checkpoint COPY: %s" % p.stderr[-300:])
    os.remove(moved)
    p = needle("build", "--lora", ad2, "--out", "g.cact", cwd=work)
    check(p.returncode == 1 and moved in p.stderr and "CKPT" in p.stderr,
          "build --lora A with A's base gone: named (%d) %s" % (p.returncode, p.stderr))


def recommended(tmp, data):
    work = os.path.join(tmp, "rec")
    os.makedirs(work)
    base = os.path.join(work, "base.pkl")
    rec = os.path.join(work, "rec.pkl")
    p = needle("init", base, "--preset", "tiny", "--seed", "4")
    check(p.returncode == 0, "init: %s" % p.stderr)
    shutil.copy(os.path.join(SRC, "models", "tokenizer.model"), work)
    p = needle("convert", base, rec, "--recommend", "lr=1e-3,lora_rank=8,lora_alpha=16")
    check(p.returncode == 0, "convert --recommend: %s" % p.stderr)

    # upstream's loader: pickle + numpy, format_version, params, config
    a, b = load(base), load(rec)
    check(b.get("format_version") == 2 and same_tree(a["config"], b["config"]) and
          same_tree(a["params"], b["params"]), "the converted file: same config and params")
    check(set(b) - set(a) == {"needle_c_recommended"} and
          b["needle_c_recommended"] == {"lr": 1e-3, "lora_rank": 8, "lora_alpha": 16.0} and
          type(b["needle_c_recommended"]["lora_rank"]) is int,
          "one extra top-level key: %r" % {k: b[k] for k in set(b) - set(a)})
    check("needle_c_recommended" not in b["config"], "config untouched (TransformerConfig(**config))")

    common = ["--epochs", "1", "--batch-size", "8", "--val-split", "0", "--threads", "2"]
    ad = os.path.join(work, "a.pkl")
    p = needle("finetune", data, "--checkpoint", rec, "--out", ad, *common, cwd=work)
    lines = p.stdout.splitlines()[:3]
    check(p.returncode == 0, "finetune on it: %s" % p.stderr[-300:])
    check(any(l.split()[:3] == ["settings", "lr", "0.001"] and "recommended by the checkpoint" in l
              for l in lines), "the chosen lr is printed with why: %r" % lines)
    st = load(ad)["needle_c_state"] if os.path.exists(ad) else {}
    check(st.get("lr") == 1e-3 and st.get("lora_rank") == 8 and st.get("lora_alpha") == 16.0,
          "the adapter trained with them: %r" % {k: st.get(k) for k in ("lr", "lora_rank",
                                                                       "lora_alpha")})
    p = needle("finetune", data, "--checkpoint", rec, "--out", ad, "--lr", "5e-4", *common,
               cwd=work)
    st = load(ad)["needle_c_state"]
    check(p.returncode == 0 and st.get("lr") == 5e-4 and st.get("lora_rank") == 8 and
          "--lr given" in p.stdout, "an explicit --lr wins: %r %s" % (st.get("lr"), p.stdout[:300]))
    # no recommendations: today's defaults, no settings lines
    p = needle("finetune", data, "--checkpoint", base, "--out", ad, *common, cwd=work)
    st = load(ad)["needle_c_state"]
    check(p.returncode == 0 and st.get("lr") == 1e-4 and "settings" not in p.stdout,
          "without recommendations: lr 1e-4, nothing printed (%r)" % st.get("lr"))

    # `none` removes the record; --dtype keeps it
    p = needle("convert", rec, os.path.join(work, "plain.pkl"), "--recommend", "none")
    check(p.returncode == 0 and "needle_c_recommended" not in load(os.path.join(work, "plain.pkl")),
          "--recommend none removes it")
    p = needle("convert", rec, os.path.join(work, "f16.pkl"), "--dtype", "float16")
    check(p.returncode == 0 and
          load(os.path.join(work, "f16.pkl")).get("needle_c_recommended") == b["needle_c_recommended"],
          "--dtype keeps the record")

    for spec, words in (("lr=2", "(0, 1]"), ("lr=0", "(0, 1]"), ("lora_rank=1.5", "integer"),
                        ("speed=3", "unknown setting 'speed'"), ("lr", "KEY=VALUE"),
                        ("lr=fast", "not a number"), ("lr=1e-3,lr=1e-3", "twice"),
                        ("epochs=0", "integer"), ("", "empty")):
        out = os.path.join(work, "bad.pkl")
        p = needle("convert", rec, out, "--recommend", spec)
        check(p.returncode == 2 and words in p.stderr and not os.path.exists(out),
              "--recommend %r refused: %s" % (spec, p.stderr.strip().splitlines()[0]
                                              if p.stderr else "(no message)"))

    # a malformed record (written by hand) fails finetune, naming file and key
    bad = dict(b)
    bad["needle_c_recommended"] = {"lr": "fast"}
    badp = os.path.join(work, "badrec.pkl")
    with open(badp, "wb") as f:
        pickle.dump(bad, f)
    p = needle("finetune", data, "--checkpoint", badp, "--out", ad, *common, cwd=work)
    check(p.returncode == 1 and badp in p.stderr and "needle_c_recommended.lr" in p.stderr,
          "a malformed record is named: %s" % p.stderr.strip())


def main():
    if not os.path.isfile(NANO_CACT):
        if os.path.basename(NEEDLE) == "needle-emu":
            print("skip: cross build without a host needle: no needle-nano.cact")
            sys.exit(77)
        check(False, "the build made %s" % NANO_CACT)
        sys.exit(1)
    tmp = tempfile.mkdtemp(prefix="needle_nano_")
    data = os.path.join(tmp, "data.jsonl")
    with open(DATA) as f:
        lines = f.readlines()[:8]
    with open(data, "w") as f:
        f.writelines(lines)
    packaged(tmp)
    playground(tmp)
    fallback(tmp, data)
    recommended(tmp, data)
    shutil.rmtree(tmp)
    if FAIL:
        print("%d failure(s)" % len(FAIL))
        sys.exit(1)
    print("nano base: all checks passed")


main()
