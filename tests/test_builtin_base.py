#!/usr/bin/python3
"""The built-in base model: upstream's client calls needle_init without
needle_load and gets the base. libneedle.so looks for needle-nano.cact
beside itself, in ../share/needle, or at $NEEDLE_BASE_WEIGHTS; a failed
needle_load never falls back to it; when nothing is found the error names
every place it looked. Each case runs in a fresh process (the ABI's model
is process-global), on a copy of libneedle.so in a temporary layout."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build")
NEEDLE = os.environ.get("NEEDLE") or os.path.join(BUILD, "needle")
FAIL = []

TOOLS = [{"name": "set_timer", "description": "Start a timer",
          "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}},
                         "required": ["minutes"]}}]

# upstream's calls, exactly as needle/__init__.py makes them, with no weights
CLIENT = r'''
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.needle_init.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
lib.needle_init.restype = ctypes.c_int
lib.needle_complete.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
lib.needle_complete.restype = ctypes.c_int
lib.needle_load.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
lib.needle_load.restype = ctypes.c_int
lib.needle_last_error.restype = ctypes.c_char_p
lib.needle_default_weights_path.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
lib.needle_default_weights_path.restype = ctypes.c_int
if sys.argv[3] == "garbage":
    lib.needle_load(b"\0" * 64, 64)
path = ctypes.create_string_buffer(4096)
prc = lib.needle_default_weights_path(path, 4096)
rc = lib.needle_init(b"", sys.argv[2].encode(), None)
out = {"init": rc, "error": lib.needle_last_error().decode(), "path_rc": prc,
       "path": path.value.decode()}
if rc >= 0:
    buf = ctypes.create_string_buffer(65536)
    out["complete"] = lib.needle_complete(b"start a timer for 5 minutes", 32, buf, len(buf))
    out["envelope"] = json.loads(buf.value.decode())
print(json.dumps(out))
'''


def check(cond, msg):
    if not cond:
        FAIL.append(msg)
        print("FAIL:", msg)


def sh(*args):
    p = subprocess.run([NEEDLE] + [str(a) for a in args], capture_output=True)
    if p.returncode:
        raise SystemExit("needle %s: %s" % (args, p.stderr.decode()))


def client(lib, mode="plain", env_extra=None):
    env = dict(os.environ)
    env.pop("NEEDLE_BASE_WEIGHTS", None)
    env.update(env_extra or {})
    p = subprocess.run([sys.executable, "-c", CLIENT, lib, json.dumps(TOOLS), mode],
                       capture_output=True, env=env)
    if p.returncode:
        raise SystemExit("client failed: %s" % p.stderr.decode())
    return json.loads(p.stdout)


def answered(r, where):
    env = r.get("envelope") or {}
    check(r["init"] > 0 and r.get("complete", -1) >= 0 and env.get("success") is True,
          "%s: the base answers (%r)" % (where, r))
    for c in env.get("function_calls", []):
        check(c["name"] == "set_timer" and type(c["arguments"].get("minutes")) is int,
              "%s: call %r" % (where, c))


def main():
    tmp = tempfile.mkdtemp(prefix="needle_base_")
    ck, cact = os.path.join(tmp, "t.pkl"), os.path.join(tmp, "t.cact")
    sh("init", ck, "--preset", "tiny", "--seed", "5")
    sh("build", ck, "--tokenizer", os.path.join(SRC, "models", "tokenizer.model"), "--out", cact)
    libdir = os.path.join(tmp, "lib")
    os.makedirs(libdir)
    lib = os.path.join(libdir, "libneedle.so")
    shutil.copy(os.path.join(BUILD, "libneedle.so"), lib)

    # nothing installed: init fails and says where it looked
    r = client(lib)
    check(r["init"] == -11 and r["path_rc"] != 0, "no base: NEEDLE_ESTATE (%r)" % r)
    check("no built-in base model" in r["error"] and
          os.path.join(libdir, "needle-nano.cact") in r["error"] and
          "share/needle" in r["error"], "no base: the error lists the places (%s)" % r["error"])

    # beside the library
    beside = os.path.join(libdir, "needle-nano.cact")
    shutil.copy(cact, beside)
    r = client(lib)
    check(r["path"] == beside, "found beside the library: %r" % r["path"])
    answered(r, "beside the library")
    # `needle run` without --weights: the program finds it beside itself
    prog = os.path.join(libdir, "needle")
    shutil.copy(NEEDLE, prog)
    tools = os.path.join(tmp, "tools.json")
    with open(tools, "w") as f:
        json.dump(TOOLS, f)
    env = dict(os.environ)
    env.pop("NEEDLE_BASE_WEIGHTS", None)
    p = subprocess.run([prog, "run", "--tools", tools, "--max-new-tokens", "24",
                        "start a timer for 5 minutes"], capture_output=True, env=env)
    err = p.stderr.decode()
    check(p.returncode == 0 and beside in err and "built-in base" in err,
          "run without --weights uses the base: rc %d, %s" % (p.returncode, err))
    try:
        check(json.loads(p.stdout.decode().splitlines()[0])["success"] is True, "run: envelope")
    except (ValueError, IndexError, KeyError):
        check(False, "run: no envelope in %r" % p.stdout[:200])
    os.remove(beside)
    p = subprocess.run([prog, "run", "--tools", tools, "hi"], capture_output=True, env=env)
    check(p.returncode == 1 and b"no built-in base model" in p.stderr,
          "run without --weights and no base: %r" % p.stderr)
    shutil.copy(cact, beside)

    # a failed needle_load is an error, never the base in disguise
    r = client(lib, "garbage")
    check(r["init"] == -11 and "needle_load" in r["error"], "failed load, no fallback: %r" % r)
    os.remove(beside)

    # installed layout: lib/../share/needle
    share = os.path.join(tmp, "share", "needle")
    os.makedirs(share)
    shutil.copy(cact, os.path.join(share, "needle-nano.cact"))
    r = client(lib)
    check(os.path.realpath(r["path"]) == os.path.join(share, "needle-nano.cact"),
          "found in ../share/needle: %r" % r["path"])
    answered(r, "share/needle")

    # NEEDLE_BASE_WEIGHTS wins, and a wrong one is named, not skipped
    other = os.path.join(tmp, "other.cact")
    shutil.copy(cact, other)
    r = client(lib, env_extra={"NEEDLE_BASE_WEIGHTS": other})
    check(r["path"] == other, "NEEDLE_BASE_WEIGHTS chosen: %r" % r["path"])
    answered(r, "NEEDLE_BASE_WEIGHTS")
    missing = os.path.join(tmp, "missing.cact")
    r = client(lib, env_extra={"NEEDLE_BASE_WEIGHTS": missing})
    check(r["init"] == -11 and missing in r["error"], "bad NEEDLE_BASE_WEIGHTS named: %r" % r)
    corrupt = os.path.join(tmp, "corrupt.cact")
    with open(corrupt, "wb") as f:
        f.write(b"CACT" + b"\0" * 60)
    r = client(lib, env_extra={"NEEDLE_BASE_WEIGHTS": corrupt})
    check(r["init"] == -11, "corrupt base refused: %r" % r)

    shutil.rmtree(tmp)
    if FAIL:
        print("%d failure(s)" % len(FAIL))
        sys.exit(1)
    print("built-in base: all checks passed")


main()
