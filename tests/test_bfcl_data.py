#!/usr/bin/env python3
"""tools/bfcl_data.py on a small hand-written fixture in BFCL's file layout
(tests/data/bfcl_mini): the schema mapping, the answers taken from the
ground truth, the split, and the BFCL-style scorer's accept/reject rules."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "bfcl_data.py")
FIX = os.path.join(ROOT, "tests", "data", "bfcl_mini")


def run(*args, ok=True):
    p = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)
    if ok and p.returncode != 0:
        sys.exit("FAIL: %s: %s" % (args, p.stderr))
    if not ok and p.returncode == 0:
        sys.exit("FAIL: %s should fail" % (args,))
    return p


def lines(path):
    with open(path) as f:
        return [json.loads(x) for x in f]


def check(cond, msg):
    if not cond:
        sys.exit("FAIL: " + msg)


with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "out")
    p = run("convert", FIX, out, "--categories", "simple_python", "--train", "1")
    check("3 examples (1 skipped" in p.stdout, "counts: " + p.stdout)
    rows = lines(os.path.join(out, "simple_python.jsonl"))
    conv, fact, book = rows
    props = conv["tools"][0]["parameters"]["properties"]
    check(conv["tools"][0]["parameters"]["type"] == "object", "dict -> object")
    check(props["value"]["type"] == "number", "float -> number")
    check(props["pair"] == {"type": "array", "description": "Any pair.", "items": {}}, "tuple -> array: %r" % props["pair"])
    check("type" not in props["extra"], "any -> no type")
    check("default" not in props["to_unit"], "defaults dropped")
    check(conv["answers"] == [{"name": "units.convert", "arguments": {"value": 3.0, "from_unit": "miles", "to_unit": "km"}}],
          "answers: first acceptable value, optional-only args left out: %r" % conv["answers"])
    check(fact["system"] == "You are terse." and fact["query"] == "Factorial of five.", "system turn")
    check(book["answers"][0]["arguments"] == {"party": 2, "place": "Nopa, San Francisco", "tags": ["quiet", "window"]},
          "array answer")
    train, test = lines(os.path.join(out, "train.jsonl")), lines(os.path.join(out, "test.jsonl"))
    check(len(train) == 1 and len(test) == 2, "split sizes")
    check(sorted(r["bfcl_id"] for r in train + test) == sorted(r["bfcl_id"] for r in rows), "split covers all")
    out2 = os.path.join(tmp, "out2")
    run("convert", FIX, out2, "--categories", "simple_python", "--train", "1")
    check(open(os.path.join(out, "train.jsonl")).read() == open(os.path.join(out2, "train.jsonl")).read(),
          "same seed, same split")
    run("convert", FIX, os.path.join(tmp, "o3"), "--categories", "simple_python", "--train", "3", ok=False)
    run("convert", tmp, os.path.join(tmp, "o4"), ok=False)  # no BFCL folder

    data = os.path.join(out, "simple_python.jsonl")

    def score(preds):
        path = os.path.join(tmp, "pred.jsonl")
        with open(path, "w") as f:
            for line, pred in preds:
                f.write(json.dumps({"line": line, "predicted": pred}) + "\n")
        return json.loads(run("score", path, data, "--json").stdout)

    call = lambda name, **a: {"name": name, "arguments": a}
    cases = [  # (line, prediction, name right, args accepted)
        (1, [call("units.convert", value=3, from_unit="MI")], True, True),  # 3 == 3.0, case and spelling
        (1, [call("units.convert", value=3, from_unit="miles", to_unit="km")], True, True),
        (1, [call("units.convert", value=3)], True, False),  # required arg missing
        (1, [call("units.convert", value=3, from_unit="miles", speed=1)], True, False),  # unknown arg
        (1, [call("units.convert", value=4, from_unit="miles")], True, False),  # wrong value
        (2, [call("math.factorial", number=5.0)], True, True),
        (2, [call("math.factorial", number=True)], True, False),  # true != 1
        (2, [call("math.fact", number=5)], False, False),
        (2, [], False, False),
        (2, None, False, False),  # engine gave no answer
        (3, [call("book", party=2, place="nopa san francisco")], True, True),
        (3, [call("book", party=2, place="Nopa, San Francisco", tags=["Quiet", "window"])], True, True),
        (3, [call("book", party=2, place="Nopa", tags=["quiet"])], True, False),
        (3, [call("book", party=2, place="Nopa, San Francisco")] * 2, False, False),  # one call too many
    ]
    for line, pred, name_ok, args_ok in cases:
        r = score([(line, pred)])
        check(r["tool_name"] == float(name_ok) and r["bfcl_args"] == float(args_ok),
              "line %d %r: got %r, want name %s args %s" % (line, pred, r, name_ok, args_ok))
    r = score([(c[0], c[1]) for c in cases])
    check(r["examples"] == len(cases), "all scored together")
print("test_bfcl_data: ok")
