"""Shared helpers for the Python tests that drive the C `needle` program."""
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("NEEDLE_SRC") or os.path.dirname(os.path.dirname(HERE))


class Checker:
    def __init__(self):
        self.failed = []

    def __call__(self, name, ok, detail=""):
        print("%-64s %s %s" % (name, "ok  " if ok else "FAIL", detail), flush=True)
        if not ok:
            self.failed.append(name)
        return ok

    def finish(self):
        print("%d failure(s)%s" % (len(self.failed),
                                   "" if not self.failed else ": " + "; ".join(self.failed)))
        return 1 if self.failed else 0


def find_needle():
    """$NEEDLE, else $NEEDLE_BUILD/needle, else <src>/build/needle.
    Returns the path or None when no executable exists (callers FAIL)."""
    cands = []
    if os.environ.get("NEEDLE"):
        cands = [os.environ["NEEDLE"]]
    else:
        if os.environ.get("NEEDLE_BUILD"):
            cands.append(os.path.join(os.environ["NEEDLE_BUILD"], "needle"))
        cands.append(os.path.join(SRC, "build", "needle"))
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def run(cmd, timeout=600):
    print("  $ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def write_tokens(path, seqs, blank_lines=True):
    with open(path, "w") as f:
        for i, s in enumerate(seqs):
            f.write(" ".join(str(t) for t in s) + "\n")
            if blank_lines and i == 0:
                f.write("\n   \n")  # blank / whitespace-only lines are ignored


def split_logits(path, seqs, V):
    raw = np.fromfile(path, dtype="<f4")
    want = sum(len(s) for s in seqs) * V
    if raw.size != want:
        raise ValueError("logits file has %d floats, expected %d" % (raw.size, want))
    out, o = [], 0
    for s in seqs:
        out.append(raw[o:o + len(s) * V].reshape(len(s), V).astype(np.float64))
        o += len(s) * V
    return out


def check_eval_json(check, text, seqs, tag):
    """Asserts the exact `needle eval --json` shape; returns the object or None."""
    try:
        js = json.loads(text.strip())
    except ValueError as e:
        check(tag + " stdout is exactly one JSON object", False, repr(e) + " " + text[:200])
        return None
    ok = isinstance(js, dict) and set(js) == {"examples", "mean_loss"}
    ok = ok and isinstance(js["examples"], list) and len(js["examples"]) == len(seqs)
    if ok:
        for ex, s in zip(js["examples"], seqs):
            ok &= isinstance(ex, dict) and set(ex) == {"loss", "tokens"}
            ok &= type(ex.get("tokens")) is int and ex.get("tokens") == len(s) - 1
            if len(s) > 1:
                ok &= type(ex.get("loss")) in (int, float)
        ok &= type(js["mean_loss"]) in (int, float)
    check(tag + " --json shape {examples:[{loss,tokens}],mean_loss}", ok,
          "" if ok else text[:300])
    return js if ok else None
