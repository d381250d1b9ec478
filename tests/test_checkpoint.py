#!/usr/bin/python3
"""Checkpoint loading errors and tolerances, through `needle eval`:
wrong format_version, missing tensor, wrong shape, wrong dtype, unknown and
missing config keys, hostile and truncated files. Every failure must exit
non-zero with a message naming the file and (for tensors) the flax path and
the expected shape."""
import os
import pickle
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
NEEDLE = os.environ.get("NEEDLE", os.path.join(SRC, "build", "needle"))
TOKENS = os.path.join(SRC, "examples", "tokens.txt")
fails = 0


def check(cond, what, detail=""):
    global fails
    print(f"{'ok  ' if cond else 'FAIL'} {what}  {detail}")
    fails += not cond


def evaluate(path):
    return subprocess.run([NEEDLE, "eval", "--checkpoint", path, "--tokens", TOKENS, "--json"],
                          capture_output=True, text=True)


def write(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f)
    return path


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /tmp/needle_pwned",))


def main():
    tmp = tempfile.mkdtemp(prefix="needle-ck-")
    base = os.path.join(tmp, "tiny.pkl")
    r = subprocess.run([NEEDLE, "init", base, "--preset", "tiny"], capture_output=True, text=True)
    check(r.returncode == 0, "init tiny", r.stderr.strip())
    with open(base, "rb") as f:
        ck = pickle.load(f)

    def variant(name, edit):
        c = pickle.loads(pickle.dumps(ck))
        edit(c)
        return write(os.path.join(tmp, name + ".pkl"), c)

    def expect_fail(name, path, *needles):
        r = evaluate(path)
        msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        check(r.returncode != 0 and all(n in r.stderr for n in needles), name, msg[:200])

    def expect_ok(name, path):
        r = evaluate(path)
        check(r.returncode == 0, name, r.stderr.strip()[-200:] if r.returncode else "")

    expect_fail("format_version 1 refused", variant("v1", lambda c: c.update(format_version=1)),
                "format-v2", "v1.pkl")
    expect_fail("format_version missing refused",
                variant("nov", lambda c: c.pop("format_version")), "format-v2")
    expect_fail("missing tensor named with its expected shape",
                variant("miss", lambda c: c["params"]["stack"]["final_norm"].pop("scale")),
                "stack/final_norm/scale", "(64,)")
    expect_fail("wrong shape named with both shapes",
                variant("shape", lambda c: c["params"]["embedding"].update(
                    embedding=np.zeros((8192, 32), np.float32))),
                "embedding/embedding", "(8192, 32)", "(8192, 64)")
    expect_fail("integer tensor refused",
                variant("int", lambda c: c["params"]["stack"].update(
                    mhc_a_pre=np.zeros((2,), np.int64))), "stack/mhc_a_pre", "int64")
    expect_fail("config with a wrong type refused",
                variant("cfgtype", lambda c: c["config"].update(d_model="64")), "d_model")
    expect_fail("inconsistent config refused",
                variant("heads", lambda c: c["config"].update(num_heads=3)), "num_heads")
    expect_ok("unknown config keys ignored",
              variant("extra", lambda c: c["config"].update(future_knob=[1, 2], qapt=True)))
    expect_ok("float16 tensors accepted", variant("f16", lambda c: c["params"]["stack"].update(
        mhc_phi_pre=c["params"]["stack"]["mhc_phi_pre"].astype(np.float16))))
    expect_ok("checkpoint without mtp_* tensors accepted",
              variant("nomtp", lambda c: [c["params"].pop(k) for k in list(c["params"])
                                          if k.startswith("mtp_")]))

    # hostile and broken files
    evil = write(os.path.join(tmp, "evil.pkl"), {"format_version": 2, "params": Evil()})
    if os.path.exists("/tmp/needle_pwned"):
        os.remove("/tmp/needle_pwned")
    expect_fail("pickle calling os.system refused (never executed)", evil, "posix.system")
    check(not os.path.exists("/tmp/needle_pwned"), "nothing was executed")
    with open(base, "rb") as f:
        data = f.read()
    for cut in (0, 1, 17, len(data) // 3, len(data) - 1):
        p = os.path.join(tmp, f"cut{cut}.pkl")
        with open(p, "wb") as f:
            f.write(data[:cut])
        expect_fail(f"truncated at {cut} bytes refused", p, f"cut{cut}.pkl")
    expect_fail("a text file is not a checkpoint", TOKENS, "not a pickle")
    expect_fail("missing file", os.path.join(tmp, "nope.pkl"), "nope.pkl")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
