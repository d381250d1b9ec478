#!/usr/bin/env python3
"""tools/bfcl_data.py on a small hand-written fixture in BFCL's file layout
(tests/data/bfcl_mini): the schema mapping, the answers taken from the
ground truth, the split, and the BFCL-style scorer's accept/reject rules;
`multi-turn`: positional arguments mapped to parameter names, the filter
(each rule's count), de-duplication, the tools' byte budget, the split."""
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
    # irrelevance: no answer file; every request expects no call
    p = run("convert", FIX, os.path.join(tmp, "o5"), "--categories", "irrelevance", "--train", "0")
    irr = lines(os.path.join(tmp, "o5", "irrelevance.jsonl"))
    check(len(irr) == 2 and all(r["answers"] == [] for r in irr), "irrelevance: no call expected: %r" % irr)
    check(irr[0]["query"] == "What is the capital of Peru?" and irr[0]["tools"][0]["name"] == "units.convert",
          "irrelevance: query and tools converted")

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

# --- multi-turn ---------------------------------------------------------------
sys.path.insert(0, os.path.join(ROOT, "tools"))
import bfcl_data  # noqa: E402

nums = bfcl_data.numbers_in_text("two hundred and ninety-six grams, 1,500 cars, forty two, 3.75 kg, "
                                 "one hundred thousand, twelve and seven, twenty one")
for want in (296, 1500, 42, 3.75, 100000, 12, 7, 21):
    check(float(want) in nums, "numbers_in_text: %s not in %r" % (want, sorted(nums)))
check(19.0 not in nums and 1.0 not in bfcl_data.numbers_in_text("no numbers here"), "numbers_in_text: extra %r" % nums)


def dropped(stdout):
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["dropped"]:
            out[parts[2].rstrip(":")] = int(parts[1])
        elif parts[:1] == ["kept"]:
            out["kept"] = int(parts[1])
    return out


BOTH = "gorilla_file_system,math_api"
ALL = ("--categories", "base,long_context,miss_param")
BIG = ("--max-tool-bytes", "3000", "--max-tools", "8") + ALL  # the fixture's 8 tools are 2096 bytes
TA = "Go into the 'reports' folder and show the file 'q3.txt'."
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "mt")
    p = run("multi-turn", FIX, out, "--classes", BOTH, "--train", "2", *BIG)
    check("18 user turns" in p.stdout, "turns: " + p.stdout)
    check(dropped(p.stdout) == {"no_call": 2, "other_tools": 0, "unparsed": 1, "string_not_in_text": 3,
                                "number_not_in_text": 2, "too_long": 0, "duplicate": 4, "kept": 6},
          "counts, both classes: " + p.stdout)
    rows = lines(os.path.join(out, "all.jsonl"))
    by_q = {r["query"]: r for r in rows}
    check(sorted(by_q) == sorted([TA, "Now add 12 and forty-five.", "List everything, hidden files too.",
                                  "Convert 3 MILES to kilometres.", "Show the end of 'log.txt'.", "Call it 'drafts'."]),
          "kept queries: %r" % sorted(by_q))
    check(len(by_q) == len(rows), "one row per query")
    r = by_q[TA]
    check(r["answers"] == [{"name": "cd", "arguments": {"folder": "reports"}},
                           {"name": "cat", "arguments": {"file_name": "q3.txt"}}],
          "positional argument mapped to its parameter, calls in order: %r" % r["answers"])
    check(r["bfcl_id"] == "multi_turn_base_0:turn0", "first occurrence kept (base before long_context): " + r["bfcl_id"])
    check(by_q["Now add 12 and forty-five."]["answers"][0]["arguments"] == {"a": 12, "b": 45}, "numbers in words")
    check(by_q["Convert 3 MILES to kilometres."]["answers"][0]["arguments"]["target"] == "km",
          "an enum value need not be in the text")
    check(by_q["Call it 'drafts'."]["bfcl_id"] == "multi_turn_miss_param_0:turn2", "miss_param adds its new query")
    check(by_q["Show the end of 'log.txt'."]["bfcl_accept"] == [{"tail": {"file_name": ["log.txt"], "lines": ["", 10]}}],
          "an optional parameter may be left out or given as its default: %r" % by_q["Show the end of 'log.txt'."]["bfcl_accept"])
    names = [t["name"] for t in r["tools"]]
    check(names == ["cd", "cat", "cp", "ls", "mkdir", "tail", "add", "convert_units"],
          "under the budget, every tool of the set in its order: %r" % names)
    check(r["tools"][3]["parameters"]["properties"]["a"] == {"type": "boolean", "description": "Show hidden files too."},
          "tools converted as convert does (default dropped, dict -> object)")
    check(r["tools"][6]["parameters"]["properties"]["a"]["type"] == "number", "float -> number")
    train, test = lines(os.path.join(out, "train.jsonl")), lines(os.path.join(out, "test.jsonl"))
    check(len(train) == 2 and len(test) == 4, "split 2 / 4")
    tq, sq = {x["query"] for x in train}, {x["query"] for x in test}
    check(not tq & sq and tq | sq == set(by_q), "split: disjoint, covers all")
    out2 = os.path.join(tmp, "mt2")
    run("multi-turn", FIX, out2, "--classes", BOTH, "--train", "2", *BIG)
    for name in ("all.jsonl", "train.jsonl", "test.jsonl"):
        check(open(os.path.join(out, name)).read() == open(os.path.join(out2, name)).read(), "deterministic: " + name)
    seeds = {tuple(sorted(tq))}
    for seed in (1, 2):
        run("multi-turn", FIX, out2, "--classes", BOTH, "--train", "2", "--seed", str(seed), "--test", "1")
        seeds.add(tuple(sorted(x["query"] for x in lines(os.path.join(out2, "train.jsonl")))))
        check(len(lines(os.path.join(out2, "test.jsonl"))) == 1, "--test caps the test set")
    check(len(seeds) > 1, "the seed picks the split")
    stats = json.load(open(os.path.join(out, "stats.json")))
    check(stats["kept"] == 6 and stats["train"] == 2 and stats["dropped"]["unparsed"] == 1, "stats.json: %r" % stats)

    # --max-tools (default 5): distractors stop at 5 tools, called tools stay
    p = run("multi-turn", FIX, os.path.join(tmp, "five"), "--classes", BOTH, "--train", "2", "--max-tool-bytes", "3000", *ALL)
    for x in lines(os.path.join(tmp, "five", "all.jsonl")):
        got = [t["name"] for t in x["tools"]]
        check(len(got) == 5 and all(a["name"] in got for a in x["answers"]), "--max-tools 5: %r" % got)

    # one class: the calculator's turns name tools outside the set
    p = run("multi-turn", FIX, os.path.join(tmp, "fs"), "--classes", "gorilla_file_system", "--train", "1", *ALL)
    check(dropped(p.stdout) == {"no_call": 2, "other_tools": 5, "unparsed": 1, "string_not_in_text": 3,
                                "number_not_in_text": 0, "too_long": 0, "duplicate": 3, "kept": 4},
          "counts, one class: " + p.stdout)
    # base only: miss_param's new query is not there
    p = run("multi-turn", FIX, os.path.join(tmp, "b"), "--classes", BOTH, "--categories", "base", "--train", "1")
    check(dropped(p.stdout)["kept"] == 5 and "11 user turns" in p.stdout, "base only: " + p.stdout)
    # the default categories leave miss_param out (its new turns answer a question)
    p = run("multi-turn", FIX, os.path.join(tmp, "d"), "--classes", BOTH, "--train", "1")
    check("from base,long_context: 15 user turns" in p.stdout and dropped(p.stdout)["kept"] == 5,
          "default categories: " + p.stdout)
    check(not bfcl_data.contains_word("open the temporary folder.", "temp") and
          bfcl_data.contains_word("open the 'temp' folder.", "temp") and
          bfcl_data.contains_word("add #carcare, please", "#carcare"), "whole words")

    # the byte budget: distractors only while they fit, called tools always
    small = os.path.join(tmp, "small")
    p = run("multi-turn", FIX, small, "--classes", BOTH, "--train", "1", "--max-tool-bytes", "400", *ALL)
    d = dropped(p.stdout)
    check(d["too_long"] == 4 and d["kept"] == 5, "budget 400: the cd+cat turn (439 bytes, 4 times) is too long: " + p.stdout)
    for x in lines(os.path.join(small, "all.jsonl")):
        size = sum(bfcl_data.tool_bytes(t) for t in x["tools"])
        got = [t["name"] for t in x["tools"]]
        check(size <= 400 and 1 <= len(got) < 8, "budget kept: %d bytes, %r" % (size, got))
        check(all(a["name"] in got for a in x["answers"]), "called tools always shown: %r" % got)

    # BFCL-style scoring of the multi-turn examples (the scorer's own function;
    # the command line is tested above)
    def score_mt(query, pred):
        return bfcl_data.calls_ok(pred, by_q[query]["bfcl_accept"])

    call = lambda name, **a: {"name": name, "arguments": a}
    tail = "Show the end of 'log.txt'."
    check(score_mt(tail, [call("tail", file_name="LOG.txt")]), "optional left out")
    check(score_mt(tail, [call("tail", file_name="log.txt", lines=10)]), "optional as its default")
    check(not score_mt(tail, [call("tail", file_name="log.txt", lines=5)]), "optional, another value")
    check(score_mt(TA, [call("cd", folder="reports"), call("cat", file_name="q3.txt")]), "two calls")
    check(not score_mt(TA, [call("cat", file_name="q3.txt")]), "a call missing")

    run("multi-turn", FIX, os.path.join(tmp, "x"), "--classes", "nosuch_api", ok=False)
    run("multi-turn", FIX, os.path.join(tmp, "x"), "--classes", BOTH, "--categories", "simple", ok=False)
    run("multi-turn", FIX, os.path.join(tmp, "x"), "--classes", BOTH, "--train", "6", ok=False)
    check(not os.path.exists(os.path.join(tmp, "x")), "nothing written on failure")
print("test_bfcl_data: ok")
