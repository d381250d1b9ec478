#!/usr/bin/python3
"""`needle build checkpoints/needle2.pkl --lora adapter.pkl` with an adapter
trained on the built-in nano base (issue 34): refused before needle2 is
fetched, saying which base the adapter was trained on and giving the
command that builds it -- with the recorded base while it is there, else
the nano base installed beside the program. An adapter of another base
is not refused by this check. The adapters are pickles with the run
record our finetune writes (needle_c_state.base_checkpoint). stdlib only;
nothing is downloaded (HF_HUB_OFFLINE=1, a loopback endpoint)."""
import os
import pickle
import shutil
import subprocess
import sys
import tempfile

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.realpath(os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build"))
NEEDLE = os.path.realpath(os.environ.get("NEEDLE") or os.path.join(BUILD, "needle"))
FAIL = []


def check(cond, msg):
    if not cond:
        FAIL.append(msg)
        print("FAIL:", msg)


def adapter(path, base):
    with open(path, "wb") as f:
        pickle.dump({"lora": {}, "needle_c_state": {"format": "needle-c adamw 1",
                                                    "base_checkpoint": base}}, f, protocol=4)


def build(cwd, *args):
    env = {k: v for k, v in os.environ.items() if k != "NEEDLE_BASE_CHECKPOINT"}
    env.update(HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")
    return subprocess.run([NEEDLE, "build"] + list(args), cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def main():
    tmp = tempfile.mkdtemp(prefix="needle_adbase_")
    try:
        nano = os.path.join(tmp, "models", "needle-nano.pkl")
        os.makedirs(os.path.dirname(nano))
        shutil.copy(os.path.join(SRC, "models", "needle-nano.pkl"), nano)
        adapter(os.path.join(tmp, "adapter.pkl"), nano)
        r = build(tmp, "checkpoints/needle2.pkl", "--lora", "adapter.pkl")
        want = "  needle build %s --lora adapter.pkl" % nano
        check(r.returncode == 1 and "adapter.pkl was trained on the built-in nano base (%s), "
              "not on checkpoints/needle2.pkl" % nano in r.stderr and want in r.stderr,
              "nano adapter on needle2: exit %d, %r" % (r.returncode, r.stderr[-800:]))
        print(r.stderr.strip())
        # a copy of the nano base under another name: the adapter fits, not refused
        copy = os.path.join(tmp, "mybase.pkl")
        shutil.copy(nano, copy)
        r = build(tmp, "mybase.pkl", "--lora", "adapter.pkl", "--out", "x.cact")
        check("nano base" not in r.stderr, "a copy of the nano base refused: %r" % r.stderr[-600:])
        # another local checkpoint of other dimensions: refused
        other = os.path.join(tmp, "other_base.pkl")
        subprocess.run([NEEDLE, "init", other, "--preset", "tiny", "--seed", "1"],
                       check=True, capture_output=True, timeout=120)
        r = build(tmp, "other_base.pkl", "--lora", "adapter.pkl")
        check(r.returncode == 1 and "was trained on the built-in nano base" in r.stderr,
              "a tiny checkpoint with a nano adapter: exit %d, %r" % (r.returncode,
                                                                    r.stderr[-600:]))
        # the recorded base gone: the nano base installed beside the program
        os.remove(nano)
        r = build(tmp, "checkpoints/needle2.pkl", "--lora", "adapter.pkl")
        beside = os.path.join(os.path.dirname(NEEDLE), "needle-nano.pkl")
        if os.path.exists(beside):
            want = "  needle build %s --lora adapter.pkl" % beside
            check(r.returncode == 1 and want in r.stderr,
                  "recorded base gone: exit %d, no %r in %r" % (r.returncode, want,
                                                                r.stderr[-800:]))
        # another base: not this check's business (the merge checks shapes)
        adapter(os.path.join(tmp, "other.pkl"), os.path.join(tmp, "checkpoints", "needle2.pkl"))
        r = build(tmp, "checkpoints/needle2.pkl", "--lora", "other.pkl")
        check(r.returncode != 0 and "nano base" not in r.stderr,
              "needle2 adapter: exit %d, %r" % (r.returncode, r.stderr[-600:]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if FAIL:
        print("%d failure(s)" % len(FAIL))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
