#!/usr/bin/env python3
"""Berkeley Function-Calling Leaderboard (BFCL) data as Needle training JSONL,
and BFCL-style scoring of `needle eval-calls --predictions`.

BFCL (github.com/ShishirPatil/gorilla, berkeley-function-call-leaderboard,
Apache-2.0) is tool-calling data written outside this project: real
functions and queries by other authors, with every acceptable value of every
argument. We use it as the "tool set in another style than our generator's"
of issue 34: fine-tune on 200 examples, score on the rest.

  bfcl_data.py convert GORILLA_DIR OUT_DIR [--categories simple_python,...]
      [--train 200] [--seed 0]
    GORILLA_DIR: a checkout of the gorilla repository (or its
    bfcl_eval/data folder). Writes OUT_DIR/<category>.jsonl (every example)
    and, for the first category, OUT_DIR/train.jsonl and OUT_DIR/test.jsonl
    (a split fixed by --seed). Each line: query, tools (BFCL's schema types
    mapped to JSON Schema: dict->object, float->number, tuple->array, any->
    no type), answers (for each argument the first acceptable value; an
    argument that may be left out is left out) and bfcl_accept (BFCL's
    ground truth, for `score`). Examples whose ground truth we cannot
    express (no acceptable value, calls nested in values) are counted and
    skipped.

  bfcl_data.py score PREDICTIONS.jsonl DATA.jsonl
    PREDICTIONS from `needle eval-calls DATA --predictions`. A prediction
    is right when its calls match the ground truth's one to one: same
    names, every given argument known and among its acceptable values, no
    required argument missing. Strings compare as BFCL's checker does
    (case, spaces and ,./-_*^ ignored); numbers by value; 3 == 3.0.
    Prints tool-name and BFCL-accepted-argument rates; --json for a JSON
    object.

Python standard library only; no network.
"""
import argparse
import json
import os
import random
import re
import sys

DEFAULT_CATEGORIES = "simple_python,multiple,live_simple"
TYPE_MAP = {"dict": "object", "float": "number", "tuple": "array"}


def fail(msg):
    print("bfcl_data.py: " + msg, file=sys.stderr)
    sys.exit(1)


def data_dir(root):
    for cand in (root, os.path.join(root, "bfcl_eval", "data"),
                 os.path.join(root, "berkeley-function-call-leaderboard", "bfcl_eval", "data")):
        if os.path.isdir(os.path.join(cand, "possible_answer")):
            return cand
    fail("%s: no BFCL data folder (expected bfcl_eval/data/possible_answer inside)" % root)


def find_file(folder, category):
    """BFCL_v4_<category>.json (or an older version's name)."""
    names = sorted((n for n in os.listdir(folder)
                    if re.fullmatch(r"BFCL_v\d+_%s\.json" % re.escape(category), n)), reverse=True)
    if not names:
        fail("%s: no BFCL_v*_%s.json" % (folder, category))
    return os.path.join(folder, names[0])


def read_lines(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                fail("%s:%d: not JSON (%s)" % (path, lineno, e))
    return out


def to_json_schema(node):
    """BFCL's parameter schema (Python type names) as JSON Schema."""
    if isinstance(node, list):
        return [to_json_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, val in node.items():
        if key == "type" and isinstance(val, str):
            if val == "any":
                continue  # any JSON value
            out[key] = TYPE_MAP.get(val, val)
        elif key in ("properties",) and isinstance(val, dict):
            out[key] = {k: to_json_schema(v) for k, v in val.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = to_json_schema(val)
        elif key == "default":
            continue  # BFCL's defaults are Python values (None, tuples): not needed here
        else:
            out[key] = val
    if out.get("type") == "array" and "items" not in out:
        out["items"] = {}
    return out


def to_tool(fn):
    params = to_json_schema(fn.get("parameters") or {"type": "object", "properties": {}})
    params.setdefault("type", "object")
    params.setdefault("properties", {})
    return {"name": fn["name"], "description": fn.get("description", ""), "parameters": params}


def first_value(accept):
    """The answer we train on: the first acceptable value that is a value
    (BFCL writes "" for 'may be left out'). None: leave it out."""
    for v in accept:
        if v != "" and v is not None:
            return v, True
    return None, False


def to_answers(ground_truth):
    calls = []
    for call in ground_truth:
        if not isinstance(call, dict) or len(call) != 1:
            return None
        (name, args), = call.items()
        if not isinstance(args, dict):
            return None
        out = {}
        for arg, accept in args.items():
            if not isinstance(accept, list) or not accept:
                return None
            val, present = first_value(accept)
            if present:
                out[arg] = val
            elif "" not in accept:
                return None
        calls.append({"name": name, "arguments": out})
    return calls


def query_of(question):
    """BFCL's question: a list of turns, each a list of messages. Single-turn
    data only: the user's text (a system message becomes `system`)."""
    if not isinstance(question, list) or len(question) != 1 or not isinstance(question[0], list):
        return None, None
    user, system = [], []
    for msg in question[0]:
        role, text = msg.get("role"), msg.get("content")
        if not isinstance(text, str):
            return None, None
        (system if role == "system" else user).append(text)
    if len(user) != 1:
        return None, None
    return user[0], ("\n".join(system) if system else None)


def convert_category(folder, category):
    questions = read_lines(find_file(folder, category))
    answers = {a["id"]: a["ground_truth"] for a in read_lines(find_file(os.path.join(folder, "possible_answer"), category))}
    out, skipped = [], 0
    for q in questions:
        query, system = query_of(q.get("question"))
        gt = answers.get(q.get("id"))
        calls = to_answers(gt) if gt is not None else None
        if query is None or calls is None:
            skipped += 1
            continue
        ex = {"query": query, "tools": [to_tool(f) for f in q["function"]], "answers": calls,
              "bfcl_id": q["id"], "bfcl_accept": gt}
        if system:
            ex["system"] = system
        out.append(ex)
    return out, skipped


def write_jsonl(path, rows):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def cmd_convert(args):
    folder = data_dir(args.gorilla)
    os.makedirs(args.out, exist_ok=True)
    cats = [c for c in args.categories.split(",") if c]
    if not cats:
        fail("--categories: empty")
    for i, cat in enumerate(cats):
        rows, skipped = convert_category(folder, cat)
        write_jsonl(os.path.join(args.out, cat + ".jsonl"), rows)
        print("%s: %d examples (%d skipped: ground truth we cannot express)" % (cat, len(rows), skipped))
        if i == 0:
            if args.train >= len(rows):
                fail("--train %d: %s has only %d examples" % (args.train, cat, len(rows)))
            order = list(range(len(rows)))
            random.Random(args.seed).shuffle(order)
            train = [rows[j] for j in sorted(order[:args.train])]
            test = [rows[j] for j in sorted(order[args.train:])]
            write_jsonl(os.path.join(args.out, "train.jsonl"), train)
            write_jsonl(os.path.join(args.out, "test.jsonl"), test)
            print("%s split: train.jsonl %d, test.jsonl %d (seed %d)" % (cat, len(train), len(test), args.seed))


def norm_str(s):
    return re.sub(r"[ ,./\-_*^]", "", s).lower()


def value_ok(pred, accept):
    for a in accept:
        if a == "":
            continue
        if isinstance(a, bool) or isinstance(pred, bool):
            if a is pred:
                return True
        elif isinstance(a, (int, float)) and isinstance(pred, (int, float)):
            if float(a) == float(pred):
                return True
        elif isinstance(a, str) and isinstance(pred, str):
            if norm_str(a) == norm_str(pred):
                return True
        elif isinstance(a, list) and isinstance(pred, list):
            if len(a) == len(pred) and all(value_ok(p, [x]) for p, x in zip(pred, a)):
                return True
        elif a == pred:
            return True
    return False


def call_ok(pred, truth):
    (name, args), = truth.items()
    if pred.get("name") != name:
        return False
    given = pred.get("arguments") or {}
    if not isinstance(given, dict):
        return False
    for arg, val in given.items():
        if arg not in args or not value_ok(val, args[arg]):
            return False
    return all(arg in given for arg, acc in args.items() if "" not in acc)


def calls_ok(pred, truth):
    """One to one, any order (BFCL's parallel categories allow any order)."""
    if len(pred) != len(truth):
        return False
    left = list(truth)
    for p in pred:
        for i, t in enumerate(left):
            if call_ok(p, t):
                del left[i]
                break
        else:
            return False
    return True


def cmd_score(args):
    preds = read_lines(args.predictions)
    data = read_lines(args.data)
    n = names = accepted = 0
    for p in preds:
        line = p.get("line")
        if not isinstance(line, int) or not 1 <= line <= len(data):
            fail("%s: prediction line %r is not a line of %s" % (args.predictions, line, args.data))
        ex = data[line - 1]
        truth = ex.get("bfcl_accept")
        if truth is None:
            fail("%s:%d: no bfcl_accept (not written by `bfcl_data.py convert`)" % (args.data, line))
        n += 1
        got = p.get("predicted")
        if not isinstance(got, list):
            continue
        if sorted(c.get("name", "") for c in got if isinstance(c, dict)) == \
                sorted(next(iter(t)) for t in truth):
            names += 1
        if all(isinstance(c, dict) for c in got) and calls_ok(got, truth):
            accepted += 1
    if n == 0:
        fail("%s: no predictions" % args.predictions)
    res = {"examples": n, "tool_name": names / n, "bfcl_args": accepted / n}
    if args.json:
        print(json.dumps(res))
    else:
        print("examples %d  tool name %.1f%%  arguments accepted by BFCL's rules %.1f%%"
              % (n, 100 * res["tool_name"], 100 * res["bfcl_args"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="BFCL files -> Needle JSONL")
    c.add_argument("gorilla")
    c.add_argument("out")
    c.add_argument("--categories", default=DEFAULT_CATEGORIES)
    c.add_argument("--train", type=int, default=200)
    c.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("score", help="BFCL-style scoring of eval-calls predictions")
    s.add_argument("predictions")
    s.add_argument("data")
    s.add_argument("--json", action="store_true")
    args = ap.parse_args()
    (cmd_convert if args.cmd == "convert" else cmd_score)(args)


if __name__ == "__main__":
    main()
