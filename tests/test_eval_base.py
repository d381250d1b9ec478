#!/usr/bin/python3
"""tools/eval_base.py's first-tool parts on the built-in base: the mixed
part lists tools of other APIs (more tools, a lower guess rate than the
one-API part), and every rate it reports is recomputed here from the data
and predictions it wrote; an unknown part is refused."""
import json
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build")
NEEDLE = os.environ.get("NEEDLE") or os.path.join(BUILD, "needle")
EVAL = [sys.executable, os.path.join(SRC, "tools", "eval_base.py"), "--needle", NEEDLE]

failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL:", msg)


def recompute(out, stem):
    exs = [json.loads(x) for x in open(os.path.join(out, stem + ".jsonl"))]
    preds = [json.loads(x) for x in open(os.path.join(out, stem + ".pred.jsonl"))]
    right = sum(bool(p["predicted"]) and p["predicted"][0].get("name") == e["answers"][0]["name"]
                for e, p in zip(exs, preds))
    n = len(exs)
    return {"examples": n, "right": right,
            "chance": sum(1 / len(e["tools"]) for e in exs) / n,
            "tools_listed": sum(len(e["tools"]) for e in exs) / n}


def main():
    builtin = os.path.join(BUILD, "needle-nano.cact")
    if not os.path.exists(NEEDLE) or not os.path.exists(builtin):
        print("test_eval_base: FAILED (build first: no needle or needle-nano.cact)")
        return 1
    with tempfile.TemporaryDirectory() as out:
        p = subprocess.run(EVAL + ["--parts", "first-tool,first-tool-mixed", "--num", "30",
                                   "--threads", "1", "--out", out],
                           capture_output=True, text=True)
        if p.returncode != 0:
            fail(f"eval_base exited {p.returncode}: {p.stderr[-500:]}")
            return 1
        scores = json.load(open(os.path.join(out, "scores.json")))
        plain, mixed = scores.get("first_tool"), scores.get("first_tool_mixed")
        if not plain or not mixed:
            fail(f"scores.json lacks a first-tool part: {sorted(scores)}")
            return 1
        for key, stem, s in (("first_tool", "first", plain), ("first_tool_mixed", "first-mixed",
                                                              mixed)):
            r = recompute(out, stem)
            if s["examples"] != r["examples"] or s["right"] != r["right"]:
                fail(f"{key}: {s['right']}/{s['examples']} reported, {r['right']}/{r['examples']} "
                     "in its predictions")
            for k in ("chance", "tools_listed"):
                if abs(s[k] - r[k]) > 1e-9:
                    fail(f"{key}: {k} {s[k]} reported, {r[k]} from its data")
        if not mixed["tools_listed"] > plain["tools_listed"] + 0.5:
            fail(f"the mixed part lists {mixed['tools_listed']:.2f} tools, the one-API part "
                 f"{plain['tools_listed']:.2f}: no tools of other APIs added")
        if not mixed["chance"] < plain["chance"] - 0.1:
            fail(f"guess rates: mixed {mixed['chance']:.2f}, one API {plain['chance']:.2f}")
        if "providers" in mixed or "providers" not in plain:
            fail("providers are counted for the one-API part only")
        table = open(os.path.join(out, "table.md")).read()
        if "with tools of other APIs" not in table or "a random listed tool" not in table:
            fail(f"table.md lacks the mixed row or its guess rate:\n{table}")

        p = subprocess.run(EVAL + ["--parts", "first-tool-everything", "--out", out],
                           capture_output=True, text=True)
        if p.returncode == 0 or "unknown part" not in p.stderr:
            fail(f"an unknown part: rc {p.returncode}, {p.stderr[-200:]!r}")
    print("test_eval_base:", "FAILED" if failures else "ok", f"({failures} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
