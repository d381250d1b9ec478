#!/usr/bin/python3
"""A tools block longer than the context: `needle run`, the upstream ABI
(needle_init's error and then needle_complete's envelope) and the
playground's /complete all give the same message, which says how many
tokens the tools take and how many fit; with more than 5 tools and an
archive without a retrieval head it also says that. stdlib only (ctypes,
a loopback playground)."""
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "tests"))
import playground_util as pu  # noqa: E402

FAIL = []
MSG = re.compile(r"the tools do not fit the context: the system prompt and tools take (\d+) "
                 r"tokens, at most (\d+) fit \(max_seq_len (\d+) less (\d+) for the query and "
                 r"answer\); (.*)$")


def check(cond, msg):
    if not cond:
        FAIL.append(msg)
        print("FAIL:", msg)


def tools(n, words):
    return [{"name": f"tool_{i}", "description": " ".join(["describe the lights"] * words),
             "parameters": {"type": "object", "properties": {"room": {"type": "string"}}}}
            for i in range(n)]


def message(text):
    """the context message inside text (the part from 'the tools do not fit' on)"""
    i = text.find("the tools do not fit the context")
    return text[i:].splitlines()[0] if i >= 0 else None


def main():
    if not os.path.exists(pu.NEEDLE):
        print("no needle binary at", pu.NEEDLE)
        return 1
    tmp = tempfile.mkdtemp(prefix="needle_ctxmsg_")
    base, cact = pu.tiny_model(tmp)  # max_seq_len 256
    cases = {"few": tools(3, 40), "many": tools(12, 6)}
    lib = ctypes.CDLL(os.path.join(pu.BUILD, "libneedle.so"))
    lib.needle_load.argtypes = [ctypes.c_char_p, ctypes.c_ulonglong]
    lib.needle_init.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
    lib.needle_complete.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.needle_last_error.restype = ctypes.c_char_p
    with open(cact, "rb") as f:
        blob = f.read()
    check(lib.needle_load(blob, len(blob)) == 0, "needle_load")
    got = {}
    for name, ts in cases.items():
        path = os.path.join(tmp, name + ".json")
        with open(path, "w") as f:
            json.dump(ts, f)
        # the CLI
        r = subprocess.run([pu.NEEDLE, "run", "--weights", cact, "--tools", path, "hi"],
                           capture_output=True, text=True, timeout=120)
        cli = message(r.stderr)
        check(r.returncode == 1 and cli, f"{name}: run: exit {r.returncode}, {r.stderr!r}")
        # the ABI: init's error, then the envelope of complete
        rc = lib.needle_init(b"", json.dumps(ts).encode(), None)
        abi = message(lib.needle_last_error().decode())
        check(rc < 0 and abi, f"{name}: needle_init {rc}: {lib.needle_last_error()!r}")
        buf = ctypes.create_string_buffer(65536)
        rc = lib.needle_complete(b"hi", 32, buf, len(buf))
        env = json.loads(buf.value.decode() or "{}")
        envm = message(env.get("error") or "")
        check(rc < 0 and env.get("success") is False and envm,
              f"{name}: needle_complete {rc}: envelope {env}")
        got[name] = [cli, abi, envm]
        m = MSG.match(cli or "")
        check(m is not None, f"{name}: message shape: {cli!r}")
        if m:
            take, fit, ctx, keep = (int(m.group(k)) for k in range(1, 5))
            check(ctx == 256 and fit == ctx - keep and take > fit,
                  f"{name}: numbers {take} {fit} {ctx} {keep}")
            if name == "many":
                check("no retrieval head, so all 12 tools are rendered" in m.group(5),
                      f"many: no word of the missing retrieval head: {cli!r}")
            else:
                check("retrieval" not in m.group(5), f"few: {cli!r}")
    # the playground, with the same archive
    pg = pu.Playground(tmp, base, cact)
    try:
        for name, ts in cases.items():
            status, body = pg.json("POST", "/complete", {"tools": ts, "query": "hi"})
            pgm = message(body.get("error") or "")
            check(status == 400 and body.get("success") is False and pgm,
                  f"{name}: playground {status} {body}")
            got[name].append(pgm)
    finally:
        pg.stop()
    for name, msgs in got.items():
        check(len(set(msgs)) == 1, f"{name}: the messages differ: {msgs}")
        print(f"{name}: {msgs[0]}")
    if FAIL:
        print(f"{len(FAIL)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
