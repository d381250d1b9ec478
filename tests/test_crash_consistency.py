#!/usr/bin/python3
"""Crash consistency of `needle finetune --save-every 1` under kill -9.

A reference run trains uninterrupted. Then the same run is started again and
again (with --resume once an adapter exists) and killed with SIGKILL at a
random moment, N times. After every kill: the output is either exactly the
file the previous kill left or a complete, loadable newer adapter (never a
partial file); temporaries of earlier killed runs are gone once a later run
has saved. Finally the run is resumed to the end: the adapter is
byte-identical to the uninterrupted run's, and no temporary file is left.

NEEDLE_CRASH_KILLS (default 10) and NEEDLE_CRASH_SEED choose the kills.
"""
import glob
import os
import pickle
import random
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(HERE))
NEEDLE = os.environ.get("NEEDLE", os.path.join(SRC, "build", "needle"))
TOK = os.path.join(SRC, "models", "tokenizer.model")
DATA = os.path.join(SRC, "examples", "data.jsonl")
fails = 0


def check(cond, what, detail=""):
    global fails
    print(f"{'ok  ' if cond else 'FAIL'} {what}  {detail}", flush=True)
    if not cond:
        fails += 1


def temps(d):
    return glob.glob(os.path.join(d, ".*.tmp.*"))


def temp_pid(path):
    m = re.search(r"\.tmp\.(\d+)", os.path.basename(path))
    return int(m.group(1)) if m else -1


def complete_adapter(blob):
    """The adapter loads and is whole: every A/B has its shape, is finite,
    and the optimiser state matches the adapter's size."""
    obj = pickle.loads(blob)
    n = 0
    for g in obj["lora"].values():
        A, B = g["A"], g["B"]
        assert A.ndim == 3 and B.ndim == 3 and A.shape[2] == B.shape[1] == obj["rank"]
        assert np.isfinite(A).all() and np.isfinite(B).all()
        n += A.size + B.size
    st = obj["needle_c_state"]
    assert st["mu"].size == n and st["nu"].size == n
    return int(st["count"]), int(st["total_steps"])


def main():
    kills = int(os.environ.get("NEEDLE_CRASH_KILLS", "10"))
    seed = int(os.environ.get("NEEDLE_CRASH_SEED", str(int(time.time()))))
    rng = random.Random(seed)
    print(f"kills {kills}, seed {seed} (NEEDLE_CRASH_SEED={seed} replays it)")
    tmp = tempfile.mkdtemp(prefix="needle-crash-")
    ck = os.path.join(tmp, "tiny.pkl")
    r = subprocess.run([NEEDLE, "init", ck, "--preset", "tiny", "--seed", "2"],
                       capture_output=True, text=True)
    check(r.returncode == 0, "init tiny", r.stderr[-200:])
    data = os.path.join(tmp, "d.jsonl")
    with open(DATA) as f:
        lines = f.readlines()[:36]
    with open(data, "w") as f:
        f.writelines(lines)
    base = [NEEDLE, "finetune", data, "--checkpoint", ck, "--tokenizer", TOK, "--batch-size",
            "8", "--max-len", "256", "--epochs", "4", "--save-every", "1", "--threads", "1",
            "--seed", "7", "--lr", "1e-3"]

    ref = os.path.join(tmp, "ref.pkl")
    t0 = time.time()
    r = subprocess.run(base + ["--out", ref], capture_output=True, text=True)
    t_ref = time.time() - t0
    check(r.returncode == 0, f"uninterrupted run ({t_ref:.1f} s)", r.stderr[-300:])
    with open(ref, "rb") as f:
        ref_bytes = f.read()
    total = complete_adapter(ref_bytes)[1]

    out = os.path.join(tmp, "run.pkl")
    prev, prev_count, killed_pids = None, -1, []
    outcomes = {"before the first save": 0, "old file": 0, "newer complete adapter": 0,
                "finished": 0}
    for i in range(kills):
        cmd = base + ["--out", out] + (["--resume", out] if os.path.exists(out) else [])
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        delay = rng.uniform(0.05, max(0.3, 0.6 * t_ref))
        try:
            p.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            p.kill()  # SIGKILL
            p.wait()
        finished = p.returncode == 0
        if p.returncode not in (0, -9):
            check(False, f"kill {i + 1}: run failed by itself (rc {p.returncode})",
                  p.stderr.read().decode()[-300:])
        p.stderr.close()
        if not finished:
            killed_pids.append(p.pid)
        if not os.path.exists(out):
            check(prev is None, f"kill {i + 1} at {delay:.2f} s: no output yet",
                  "" if prev is None else "the output disappeared")
            outcomes["before the first save"] += 1
            continue
        with open(out, "rb") as f:
            blob = f.read()
        try:
            count, _ = complete_adapter(blob)
            ok = True
        except Exception as e:  # noqa: BLE001 - any failure to load is the finding
            ok, count = False, -1
            print("     load error:", repr(e))
        same = blob == prev
        check(ok and count >= prev_count,
              f"kill {i + 1} at {delay:.2f} s: output is "
              + ("the old file" if same else "a complete newer adapter")
              + f" (step {count}/{total})")
        outcomes["finished" if finished else "old file" if same else
                 "newer complete adapter"] += 1
        # this run saved (the output changed): every earlier killed run's
        # temporary must be gone
        if not same:
            stale = [t for t in temps(tmp) if temp_pid(t) in killed_pids[:-1] or
                     (finished and temp_pid(t) in killed_pids)]
            check(not stale, f"kill {i + 1}: earlier temporaries removed", str(stale))
        prev, prev_count = blob, count
        if finished:
            # a run that got to the end between kills: it must equal the
            # reference; then start over from nothing for the next kills
            check(blob == ref_bytes, f"run {i + 1} finished: == uninterrupted run")
            os.unlink(out)
            prev, prev_count = None, -1

    # resume to the end; plant the temporary a save killed mid-write leaves
    # (its process is gone): this run's first save must remove it
    dead = subprocess.Popen(["true"])
    dead.wait()
    with open(os.path.join(tmp, f".run.pkl.tmp.{dead.pid}"), "wb") as f:
        f.write(b"half a pickle")
    cmd = base + ["--out", out] + (["--resume", out] if os.path.exists(out) else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 0, "final resume finishes", r.stderr[-300:])
    with open(out, "rb") as f:
        final = f.read()
    check(final == ref_bytes, "resumed after every kill == uninterrupted run, byte for byte",
          f"{len(final)} vs {len(ref_bytes)} bytes")
    check(not temps(tmp), "no temporary file survives", str(temps(tmp)))
    print("outcomes:", outcomes)
    subprocess.run(["rm", "-rf", tmp])
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
