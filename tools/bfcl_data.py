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

  bfcl_data.py multi-turn GORILLA_DIR OUT_DIR --classes gorilla_file_system[,...]
      [--categories base,long_context] [--max-tool-bytes 2000] [--max-tools 5]
      [--train 200] [--test N] [--seed 0]
    BFCL's multi-turn categories use a few fixed API classes
    (multi_turn_func_doc/<class>.json) with user turns written by people.
    The classes named form one tool set; every user turn becomes one
    single-turn example: query = the turn's user text, answers = the turn's
    ground-truth calls in order (a positional argument takes the name of
    the parameter at its place in the function document), bfcl_accept =
    those values (an optional parameter left out may also be given as its
    documented default). A turn is left out when the model could not know
    its arguments from the turn alone (DROP_RULES, each counted): no call,
    a call of a function outside the set, a call we cannot read, a string
    value (not a schema enum value) the text does not contain as a whole
    word or phrase (ignoring case and runs of spaces: "temp" is not in
    "temporary"), a number the text does not give in digits or words.
    Booleans and enum values are choices, not copied text. Then
    de-duplicated by query text (the first kept: categories in the order
    given), split train/test by --seed. miss_param is not in the default
    categories: the turns it adds answer the model's question for a
    missing parameter ("The stock is TSLA."), so their tool comes from the
    turn before. An example's tools: the called ones plus other tools of
    the set, in a seeded order, while their compact JSON stays within
    --max-tool-bytes (the base's max_len is 1024 tokens; a class's whole
    document is 1000-3700 tokens) and there are at most --max-tools (5,
    the engine's retrieval pick), listed in the set's
    order. Writes OUT_DIR/all.jsonl, train.jsonl, test.jsonl, stats.json.

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
import ast
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
    # the irrelevance categories have no answer file: no listed function
    # serves the request, so the right answer is no call
    no_call = category.endswith("irrelevance")
    answers = {} if no_call else {a["id"]: a["ground_truth"] for a in
                                  read_lines(find_file(os.path.join(folder, "possible_answer"), category))}
    out, skipped = [], 0
    for q in questions:
        query, system = query_of(q.get("question"))
        gt = [] if no_call else answers.get(q.get("id"))
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


# --- multi-turn: BFCL's fixed API classes as a single-turn tool set ----------

# BFCL's multi-turn entries name classes (involved_classes); their function
# documents are multi_turn_func_doc/<stem>.json. We take the stems.
MULTI_TURN_CLASSES = ("gorilla_file_system", "math_api", "message_api", "posting_api",
                      "ticket_api", "trading_bot", "travel_booking", "vehicle_control")
# miss_param is left out by default: the turns it adds (the ones kept by
# the rules) answer the model's question for a missing parameter ("The stock
# is TSLA.", "That word is goal."), so their tool comes from the turn before.
MULTI_TURN_CATEGORIES = "base,long_context"
# Why a turn is left out, in the order the rules are applied (a turn counts
# under the first rule it breaks).
DROP_RULES = (
    ("no_call", "the turn's ground truth has no call (or the turn has no user text)"),
    ("other_tools", "a call names a function outside the tool set"),
    ("unparsed", "a call we cannot read (not name(args) of literals, a positional "
                 "argument past the parameter list, an unknown parameter)"),
    ("string_not_in_text", "a string value (not one of the schema's enum values) "
                           "that the turn's text does not contain as a whole word or "
                           "phrase (case and runs of spaces ignored)"),
    ("number_not_in_text", "a number the turn's text does not give in digits "
                           "(commas allowed) or in words"),
    ("too_long", "the called tools alone are over --max-tool-bytes"),
)

UNITS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
WORD_VALUE = dict({w: i for i, w in enumerate(UNITS)}, **{w: 20 + 10 * i for i, w in enumerate(TENS)})
SCALES = {"hundred": 100, "thousand": 1000, "million": 10 ** 6, "billion": 10 ** 9}


def numbers_in_text(text):
    """Every number the text writes: in digits ("1,500", "3.75", "-2") and in
    words ("two hundred and ninety-six", "forty two", "a dozen" not)."""
    found = set()
    for m in re.finditer(r"\d[\d,]*(?:\.\d+)?", text):
        try:
            found.add(float(m.group(0).replace(",", "")))
        except ValueError:
            pass
    # words; any other character but a hyphen or a space ends a number
    words = re.findall(r"[a-z]+|[^a-z\s-]", text.lower())
    total = cur = None
    prev = ""

    def flush():
        if total is not None or cur is not None:
            found.add(float((total or 0) + (cur or 0)))

    for w in words + [""]:
        if w in WORD_VALUE:
            v = WORD_VALUE[w]
            if cur is None:
                cur = v
            elif cur % 100 == 0 or (cur % 10 == 0 and cur % 100 >= 20 and v < 10):
                cur += v  # "two hundred" + "ninety", "ninety" + "six"
            else:
                flush()  # "twelve seven": two numbers
                total, cur = None, v
        elif w in SCALES and (cur is not None or total is not None):
            if w == "hundred":
                cur = (cur or 1) * 100
            else:
                total = (total or 0) + (cur or 1) * SCALES[w]
                cur = None
        elif w == "and" and prev in SCALES:
            pass  # "two hundred and ninety-six"
        else:
            flush()
            total = cur = None
        prev = w
    return found


def norm_text(s):
    return re.sub(r"\s+", " ", s).strip().lower()


def contains_word(text, value):
    """value in text, not inside a longer word: "temp" is not in "temporary",
    "QUAS" not in "Quasar" (both already lower case, spaces collapsed)."""
    if not value:
        return True
    pat = r"(?<![a-z0-9])" + re.escape(value) + r"(?![a-z0-9])"
    return re.search(pat, text) is not None


def parse_call(src, fn_params):
    """One ground-truth call string, e.g. "mv(source='a', destination='b')"
    or "sort('final_report.pdf')", as (name, {param: value}). Positional
    arguments take the parameter names in the function document's order.
    None when it is not a call of a known function with literal arguments."""
    try:
        node = ast.parse(src.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return None
    name = node.func.id
    if name not in fn_params:
        return name, None
    order = fn_params[name]
    args = {}
    try:
        for i, a in enumerate(node.args):
            if i >= len(order):
                return name, None
            args[order[i]] = ast.literal_eval(a)
        for kw in node.keywords:
            if kw.arg is None or kw.arg not in order or kw.arg in args:
                return name, None
            args[kw.arg] = ast.literal_eval(kw.value)
    except (ValueError, SyntaxError, TypeError):
        return name, None
    return name, {p: args[p] for p in order if p in args}


def _values(val, schema):
    """(value, schema) leaves of a JSON value: strings and numbers to check."""
    if isinstance(val, list):
        items = schema.get("items", {}) if isinstance(schema, dict) else {}
        for v in val:
            yield from _values(v, items)
    elif isinstance(val, dict):
        props = schema.get("properties", {}) if isinstance(schema, dict) else {}
        for k, v in val.items():
            yield from _values(v, props.get(k, {}))
    else:
        yield val, schema if isinstance(schema, dict) else {}


def turn_drop_reason(text, calls, tools):
    """The first DROP_RULES key the turn breaks, or None to keep it."""
    ltext = norm_text(text)
    nums = None
    for name, args in calls:
        props = tools[name]["parameters"].get("properties", {})
        for arg, val in args.items():
            for leaf, schema in _values(val, props.get(arg, {})):
                if isinstance(leaf, str):
                    if leaf in (schema.get("enum") or []):
                        continue  # chosen from the schema, like a boolean
                    if not contains_word(ltext, norm_text(leaf)):
                        return "string_not_in_text"
    for name, args in calls:
        props = tools[name]["parameters"].get("properties", {})
        for arg, val in args.items():
            for leaf, _ in _values(val, props.get(arg, {})):
                if isinstance(leaf, (int, float)) and not isinstance(leaf, bool):
                    if nums is None:
                        nums = numbers_in_text(text)
                    if float(abs(leaf)) not in nums:
                        return "number_not_in_text"
    return None


def read_func_docs(folder, stems):
    docs, order = {}, []
    for stem in stems:
        if stem not in MULTI_TURN_CLASSES:
            fail("--classes: unknown class %r (one of %s)" % (stem, ", ".join(MULTI_TURN_CLASSES)))
        path = os.path.join(folder, "multi_turn_func_doc", stem + ".json")
        if not os.path.isfile(path):
            fail("%s: missing" % path)
        for fn in read_lines(path):
            if fn["name"] in docs:
                fail("%s: function %s also in another class of the set" % (path, fn["name"]))
            docs[fn["name"]] = fn
            order.append(fn["name"])
    return docs, order


def accept_of(name, args, doc):
    """bfcl_accept for one call: the ground truth's value of each given
    argument; an optional parameter it leaves out may be left out or given
    as the document's default."""
    out = {arg: [val] for arg, val in args.items()}
    params = doc.get("parameters") or {}
    required = set(params.get("required") or [])
    for p, sch in (params.get("properties") or {}).items():
        if p in out or p in required:
            continue
        acc = [""]
        if isinstance(sch, dict) and "default" in sch and sch["default"] != "None":
            acc.append(sch["default"])
        out[p] = acc
    return {name: out}


def tool_bytes(tool):
    return len(json.dumps(tool, separators=(",", ":")))


def pick_tools(called, order, tools, budget, max_tools, rng):
    """The called tools, then distractors of the same set in a seeded order
    while the tools' compact JSON stays within budget and there are at most
    max_tools; in the set's order."""
    chosen = set(called)
    size = sum(tool_bytes(tools[n]) for n in chosen)
    others = [n for n in order if n not in chosen]
    rng.shuffle(others)
    for n in others:
        b = tool_bytes(tools[n])
        if size + b <= budget and len(chosen) < max_tools:
            chosen.add(n)
            size += b
    return [tools[n] for n in order if n in chosen]


def multi_turn_examples(folder, stems, categories, budget, max_tools, seed):
    docs, order = read_func_docs(folder, stems)
    tools = {n: to_tool(docs[n]) for n in order}
    fn_params = {n: list(((docs[n].get("parameters") or {}).get("properties") or {}).keys()) for n in order}
    counts = {k: 0 for k, _ in DROP_RULES}
    turns = kept = dups = 0
    rows, seen = [], set()
    rng = random.Random(seed)
    for cat in categories:
        qpath = find_file(folder, "multi_turn_" + cat)
        apath = find_file(os.path.join(folder, "possible_answer"), "multi_turn_" + cat)
        answers = {a["id"]: a["ground_truth"] for a in read_lines(apath)}
        for q in read_lines(qpath):
            gt = answers.get(q.get("id"))
            if gt is None:
                fail("%s: %s has no ground truth in %s" % (qpath, q.get("id"), apath))
            if len(gt) != len(q["question"]):
                fail("%s: %s: %d turns, %d ground-truth turns" % (qpath, q["id"], len(q["question"]), len(gt)))
            for k, (msgs, truth) in enumerate(zip(q["question"], gt)):
                text = "\n".join(m.get("content", "") for m in msgs if m.get("role") == "user")
                if not any(m.get("role") == "user" for m in msgs):
                    continue  # not a user turn (miss_func's added function)
                turns += 1
                reason = None
                calls = []
                if not truth or not text.strip():
                    reason = "no_call"
                else:
                    for src in truth:
                        parsed = parse_call(src, fn_params)
                        if parsed is None:
                            reason = reason or "unparsed"
                        elif parsed[0] not in tools:
                            reason = "other_tools"
                            break
                        elif parsed[1] is None:
                            reason = reason or "unparsed"
                        else:
                            calls.append(parsed)
                if reason is None:
                    reason = turn_drop_reason(text, calls, tools)
                called = []
                for n, _ in calls:
                    if n not in called:
                        called.append(n)
                if reason is None and sum(tool_bytes(tools[n]) for n in called) > budget:
                    reason = "too_long"
                if reason:
                    counts[reason] += 1
                    continue
                key = norm_text(text)
                if key in seen:
                    dups += 1
                    continue
                seen.add(key)
                kept += 1
                rows.append({"query": text,
                             "tools": pick_tools(called, order, tools, budget, max_tools, rng),
                             "answers": [{"name": n, "arguments": a} for n, a in calls],
                             "bfcl_id": "%s:turn%d" % (q["id"], k),
                             "bfcl_accept": [accept_of(n, a, docs[n]) for n, a in calls]})
    return rows, {"turns": turns, "dropped": counts, "duplicates": dups, "kept": kept}


def cmd_multi_turn(args):
    folder = data_dir(args.gorilla)
    stems = [c for c in args.classes.split(",") if c]
    cats = [c for c in args.categories.split(",") if c]
    if not stems or not cats:
        fail("--classes and --categories must name at least one")
    for c in cats:
        if c not in ("base", "long_context", "miss_param", "miss_func"):
            fail("--categories: unknown multi-turn category %r" % c)
    rows, stats = multi_turn_examples(folder, stems, cats, args.max_tool_bytes, args.max_tools, args.seed)
    print("%s from %s: %d user turns" % ("+".join(stems), ",".join(cats), stats["turns"]))
    for key, why in DROP_RULES:
        print("  dropped %4d  %s: %s" % (stats["dropped"][key], key, why))
    print("  dropped %4d  duplicate: the same query text as a kept turn" % stats["duplicates"])
    print("  kept    %4d" % stats["kept"])
    if args.train >= len(rows):
        fail("--train %d: only %d examples kept" % (args.train, len(rows)))
    order = list(range(len(rows)))
    random.Random(args.seed).shuffle(order)
    train = [rows[j] for j in sorted(order[:args.train])]
    rest = order[args.train:]
    if args.test:
        rest = rest[:args.test]
    test = [rows[j] for j in sorted(rest)]
    os.makedirs(args.out, exist_ok=True)
    write_jsonl(os.path.join(args.out, "all.jsonl"), rows)
    write_jsonl(os.path.join(args.out, "train.jsonl"), train)
    write_jsonl(os.path.join(args.out, "test.jsonl"), test)
    with open(os.path.join(args.out, "stats.json"), "w") as f:
        json.dump(dict(stats, classes=stems, categories=cats, train=len(train), test=len(test),
                       seed=args.seed, max_tool_bytes=args.max_tool_bytes, max_tools=args.max_tools), f, indent=1)
    print("split: train.jsonl %d, test.jsonl %d (seed %d)" % (len(train), len(test), args.seed))


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
    m = sub.add_parser("multi-turn", help="BFCL multi-turn API classes -> single-turn Needle JSONL")
    m.add_argument("gorilla")
    m.add_argument("out")
    m.add_argument("--classes", required=True,
                   help="comma-separated multi_turn_func_doc stems, one tool set: " + ",".join(MULTI_TURN_CLASSES))
    m.add_argument("--categories", default=MULTI_TURN_CATEGORIES)
    m.add_argument("--max-tool-bytes", type=int, default=2000,
                   help="compact JSON bytes of an example's tools (default 2000: under max_len 1024 tokens)")
    m.add_argument("--max-tools", type=int, default=5,
                   help="distractors stop at this many tools; the called ones are always shown (default 5: "
                        "needle's retrieval pick, so a model with a retrieval head sees them all)")
    m.add_argument("--train", type=int, default=200)
    m.add_argument("--test", type=int, default=0, help="test examples at most (default all the rest)")
    m.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    {"convert": cmd_convert, "score": cmd_score, "multi-turn": cmd_multi_turn}[args.cmd](args)


if __name__ == "__main__":
    main()
