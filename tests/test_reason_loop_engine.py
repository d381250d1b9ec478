#!/usr/bin/python3
"""The reasoning's loop guard in the engine's decoder, through `needle run`
with the built-in base (src/engine/session.c, reasoning_loops).

Free reasoning ends once its text ends in a cycle of 1..16 bytes repeated
over more than 32 bytes. Upstream's own Contact tool (no description; from
tests/test_inference.py, tests/data/upstream_inference/cases.json) made the
base reason "The user wants to describe S An St St St ..." up to the cap.
Checks that no reasoning of the queries below ends in a longer loop than
the guard allows and that each turn still answers (a call or a reply).
A cross build without a runnable needle or without the
archive: skipped (77).
"""
import json
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build")
NEEDLE = os.environ.get("NEEDLE") or os.path.join(BUILD, "needle")
NANO_CACT = os.path.join(BUILD, "needle-nano.cact")
CASES = os.path.join(SRC, "tests", "data", "upstream_inference", "cases.json")
PERIOD, PERIODIC = 16, 32
FAIL = []


def check(cond, msg):
    if not cond:
        FAIL.append(msg)
        print("FAIL", msg)


def loop_tail(text):
    """The longest tail of text (bytes) that repeats a cycle of 1..PERIOD
    bytes (a text that does not loop: at most PERIOD, the cycle itself)."""
    b = text.encode()
    best = 0
    for p in range(1, PERIOD + 1):
        i = len(b) - p
        while i > 0 and b[i - 1] == b[i - 1 + p]:
            i -= 1
        best = max(best, len(b) - i)
    return best


def run(tools, query):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(tools, f)
    try:
        r = subprocess.run([NEEDLE, "run", "--weights", NANO_CACT, "--tools", f.name, query],
                           capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(f.name)
    check(r.returncode == 0, f"needle run {query!r}: exit {r.returncode}: {r.stderr[-300:]}")
    return json.loads(r.stdout) if r.returncode == 0 else None


def main():
    if not os.access(NEEDLE, os.X_OK) or not os.path.exists(NANO_CACT):
        print("skip: no runnable needle or no built-in base archive")
        return 77
    with open(CASES) as f:
        tools = json.load(f)["tools"]
    pets = [{"name": "log_feeding", "description": "Log how much a pet ate",
             "parameters": {"type": "object",
                            "properties": {"pet": {"type": "string"}, "grams": {"type": "integer"}},
                            "required": ["pet", "grams"]}}]
    turns = [
        ([tools["Contact"]], "John Doe can be reached at john@doe.com"),
        ([tools["Contact"], tools["send_email"]], "John Doe can be reached at john@doe.com"),
        ([tools["send_email"]], "email finance@cactus.dev, subject expenses, body coffee $14"),
        (pets, "log that I fed Rocky 296 grams"),
    ]
    for t, q in turns:
        out = run(t, q)
        if out is None:
            continue
        reasoning = out.get("reasoning") or ""
        tail = loop_tail(reasoning)
        print(f"{q!r}: reasoning {reasoning[:80]!r}... ({len(reasoning)} bytes, loop tail {tail})")
        check(tail <= PERIODIC + 2 * PERIOD,
              f"{q!r}: the reasoning ends in a {tail}-byte loop: {reasoning[-120:]!r}")
        check(out.get("type") in ("call", "respond"), f"{q!r}: no answer: {out}")
    print("test_reason_loop_engine:", "FAIL" if FAIL else "ok")
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
