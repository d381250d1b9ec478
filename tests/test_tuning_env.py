#!/usr/bin/python3
"""The tuning switches, now read at the entry points only (src/core/tuning.h),
still reach the library through both entries:

  * the program (`needle`, main() reads them): NEEDLE_QKERNEL=ref makes
    `bench decode` run the reference kernel, NEEDLE_FLOAT=1 the float path,
    NEEDLE_BACKEND_DECLINE with an unknown op fails naming it, and
    NEEDLE_KV_WINDOW=0 makes `run` fail naming it while `run --kv-window 48`
    overrides a bad value in the environment (the flag replaces it);
  * the C ABI (libneedle.so through ctypes, as upstream's Python client):
    needle_init refuses NEEDLE_KV_WINDOW=0 naming it; with a good value the
    session runs;
  * a value too long for its field is refused at the entry, naming the
    variable: `needle` exits 2, needle_load fails.
"""
import ctypes
import json
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("NEEDLE_BUILD", os.path.join(SRC, "build"))
NEEDLE = os.path.abspath(os.environ.get("NEEDLE") or os.path.join(BUILD, "needle"))
TOK = os.path.join(SRC, "models", "tokenizer.model")
SWITCHES = ("NEEDLE_QKERNEL", "NEEDLE_FLOAT", "NEEDLE_BACKEND_DECLINE", "NEEDLE_KV_WINDOW",
            "NEEDLE_ATT")
FAIL = []
TOOLS = [{"name": "get_weather", "description": "weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}]


def check(cond, msg):
    print(("ok  " if cond else "FAIL") + " " + msg)
    if not cond:
        FAIL.append(msg)
    return cond


def env_with(**kw):
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    env.update(kw)
    return env


def needle(*args, **env):
    return subprocess.run([NEEDLE] + list(args), capture_output=True, text=True, timeout=120,
                          env=env_with(**env))


ABI_CHILD = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.needle_load.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
lib.needle_init.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
lib.needle_last_error.restype = ctypes.c_char_p
lib.needle_complete.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
blob = open(sys.argv[2], "rb").read()
out = {"load": lib.needle_load(blob, len(blob))}
out["load_err"] = lib.needle_last_error().decode()
if out["load"] == 0:
    out["init"] = lib.needle_init(b"", sys.argv[3].encode(), None)
    out["init_err"] = lib.needle_last_error().decode()
    if out["init"] >= 0:
        buf = ctypes.create_string_buffer(65536)
        out["complete"] = lib.needle_complete(b"weather in Paris", 32, buf, len(buf))
print(json.dumps(out))
"""


def abi(cact, **env):
    p = subprocess.run([sys.executable, "-c", ABI_CHILD, os.path.join(BUILD, "libneedle.so"),
                        cact, json.dumps(TOOLS)], capture_output=True, text=True, timeout=120,
                       env=env_with(**env))
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        check(False, f"ABI child ran: {p.stderr[-400:]!r}")
        return {}


def main():
    tmp = tempfile.mkdtemp(prefix="needle_tuning_")
    try:
        ck, cact = os.path.join(tmp, "t.pkl"), os.path.join(tmp, "t.cact")
        r = needle("init", ck, "--preset", "tiny", "--max-seq-len", "512", "--seed", "3")
        check(r.returncode == 0, "init tiny " + r.stderr[-200:])
        r = needle("build", ck, "--bits", "4", "--tokenizer", TOK, "--out", cact)
        if not check(r.returncode == 0, "build tiny W4 " + r.stderr[-200:]):
            return 1
        bench = ["bench", "decode", "--weights", cact, "--prompt", "8", "--gen", "2", "--iters",
                 "1", "--threads", "1"]

        # the program
        r = needle(*bench, NEEDLE_QKERNEL="ref")
        check(r.returncode == 0 and "\nkernel ref\n" in r.stdout,
              f"NEEDLE_QKERNEL=ref: bench decode runs the reference kernel {r.stdout[-300:]!r}")
        r = needle(*bench, NEEDLE_FLOAT="1")
        check(r.returncode == 0 and "float32 after dequant" in r.stdout,
              f"NEEDLE_FLOAT=1: bench decode dequantises {r.stdout[-300:]!r}")
        r = needle("bench", "forward", "--preset", "tiny", "--batch", "1", "--seq", "8",
                   "--iters", "1", "--device", "cpu", "--threads", "1",
                   NEEDLE_BACKEND_DECLINE="no_such_op")
        check(r.returncode != 0 and "NEEDLE_BACKEND_DECLINE" in r.stderr and
              "no_such_op" in r.stderr,
              f"NEEDLE_BACKEND_DECLINE=no_such_op: refused, named {r.stderr[-300:]!r}")
        tools = os.path.join(tmp, "tools.json")
        with open(tools, "w") as f:
            json.dump(TOOLS, f)
        run = ["run", "--weights", cact, "--tools", tools, "--max-new-tokens", "32",
               "weather in Paris"]
        r = needle(*run, NEEDLE_KV_WINDOW="0")
        check(r.returncode != 0 and "NEEDLE_KV_WINDOW" in r.stderr,
              f"NEEDLE_KV_WINDOW=0: run fails naming it {r.stderr[-300:]!r}")
        r = needle(*run, "--kv-window", "48", NEEDLE_KV_WINDOW="0")
        check(r.returncode == 0, f"run --kv-window 48 replaces NEEDLE_KV_WINDOW=0 "
                                 f"{r.stderr[-300:]!r}")
        long = "x" * 200
        for var in ("NEEDLE_ATT",):
            r = needle(*bench, **{var: long})
            check(r.returncode == 2 and var in r.stderr and "longer than 63 bytes" in r.stderr,
                  f"{var} of 200 bytes: exit 2 naming it {r.returncode} {r.stderr[-200:]!r}")

        # the C ABI
        a = abi(cact)
        check(a.get("load") == 0 and a.get("init", -1) >= 0 and a.get("complete", -1) >= 0,
              f"C ABI: load, init, complete {a}")
        a = abi(cact, NEEDLE_KV_WINDOW="0")
        check(a.get("load") == 0 and a.get("init", 0) < 0 and
              "NEEDLE_KV_WINDOW" in a.get("init_err", ""),
              f"C ABI: NEEDLE_KV_WINDOW=0 refused by needle_init, named {a}")
        a = abi(cact, NEEDLE_KV_WINDOW="64")
        check(a.get("init", -1) >= 0 and a.get("complete", -1) >= 0,
              f"C ABI: NEEDLE_KV_WINDOW=64 runs {a}")
        a = abi(cact, NEEDLE_QKERNEL=long)
        check(a.get("load", 0) != 0 and "NEEDLE_QKERNEL" in a.get("load_err", ""),
              f"C ABI: a 200-byte NEEDLE_QKERNEL refused by needle_load, named {a}")
    finally:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(FAIL)} failed")
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
