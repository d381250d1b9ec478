#!/usr/bin/python3
"""tools/gen_toolcall_corpus.py: deterministic by seed, every line accepted
by `needle render`, every call valid against its tool's JSON schema (an
independent validator below), argument values grounded in the query,
held-out domains disjoint from the pretrain split, every schema feature the
grammar supports present, and bad options refused."""
import json
import os
import re
import subprocess
import sys
import tempfile

NEEDLE = os.environ.get("NEEDLE", "build/needle")
SRC = os.environ.get("NEEDLE_SRC", ".")
GEN = [sys.executable, os.path.join(SRC, "tools", "gen_toolcall_corpus.py")]
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL:", msg, file=sys.stderr)


def gen(*args, check=True):
    p = subprocess.run(GEN + list(args), capture_output=True)
    if check and p.returncode != 0:
        fail(f"generator {args} exited {p.returncode}: {p.stderr.decode()}")
    return p


# ---- an independent JSON-schema check of the features the grammar enforces ----

def validate(value, schema, path, feats, depth=0):
    t = schema.get("type")
    if "enum" in schema:
        feats.add("enum")
        if value not in schema["enum"]:
            return f"{path}: {value!r} not in enum {schema['enum']}"
    if t == "object":
        feats.add("object" if depth else "top-object")
        if not isinstance(value, dict):
            return f"{path}: not an object"
        props, req = schema.get("properties", {}), schema.get("required", [])
        for r in req:
            if r not in value:
                return f"{path}: required {r!r} missing"
        if any(k not in req for k in props):
            feats.add("optional")
        if req:
            feats.add("required")
        for k, v in value.items():
            if k not in props:
                return f"{path}: unknown property {k!r}"
            err = validate(v, props[k], f"{path}.{k}", feats, depth + 1)
            if err:
                return err
    elif t == "array":
        feats.add("array")
        if not isinstance(value, list):
            return f"{path}: not an array"
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", 1 << 30):
            return f"{path}: {len(value)} items outside [minItems, maxItems]"
        if schema.get("items", {}).get("type") == "object":
            feats.add("array-of-objects")
        for i, v in enumerate(value):
            err = validate(v, schema.get("items", {}), f"{path}[{i}]", feats, depth + 1)
            if err:
                return err
    elif t == "string":
        feats.add("string")
        if not isinstance(value, str):
            return f"{path}: not a string"
        if "maxLength" in schema:
            feats.add("maxLength")
            if len(value) > schema["maxLength"]:
                return f"{path}: longer than maxLength"
        if "pattern" in schema:
            feats.add("pattern")
            if not re.search(schema["pattern"], value):
                return f"{path}: {value!r} does not match {schema['pattern']}"
    elif t in ("integer", "number"):
        ok = isinstance(value, int) if t == "integer" else isinstance(value, (int, float))
        if not ok or isinstance(value, bool):
            return f"{path}: {value!r} is not {t}"
        if "minimum" in schema and "maximum" in schema:
            feats.add(t + "-bounds")
        if value < schema.get("minimum", value) or value > schema.get("maximum", value):
            return f"{path}: {value} outside [{schema.get('minimum')}, {schema.get('maximum')}]"
    elif t == "boolean":
        feats.add("boolean")
        if not isinstance(value, bool):
            return f"{path}: not a boolean"
    else:
        return f"{path}: schema type {t!r} unexpected"
    return None


SMALL = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
DECADES = {2: "twenty", 3: "thirty", 4: "forty", 5: "fifty", 6: "sixty", 7: "seventy",
           8: "eighty", 9: "ninety"}


def spelled(n):
    if n < 20:
        return SMALL[n]
    if n < 100:
        return DECADES[n // 10] + ("-" + SMALL[n % 10] if n % 10 else "")
    return SMALL[n // 100] + " hundred" + (" and " + spelled(n % 100) if n % 100 else "")


def grounded(value, query, path):
    """Strings verbatim, integers as digits or words, numbers as written."""
    if isinstance(value, bool):
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            err = grounded(v, query, f"{path}.{k}")
            if err:
                return err
        return None
    if isinstance(value, list):
        for i, v in enumerate(value):
            err = grounded(v, query, f"{path}[{i}]")
            if err:
                return err
        return None
    if isinstance(value, str):
        return None if value in query else f"{path}: {value!r} is not in the query"
    if isinstance(value, int):
        if re.search(rf"(?<![\d.]){value}(?!\d|\.\d)", query):
            return None
        if 0 <= value < 1000 and re.search(rf"\b{re.escape(spelled(value))}\b", query.lower()):
            return None
        return f"{path}: {value} said neither as digits nor as words"
    return None if repr(value) in query else f"{path}: {value!r} is not in the query"


def check_file(path, split_tools, other_tools, feats, stats):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for no, line in enumerate(lines, 1):
        ex = json.loads(line)
        where = f"{os.path.basename(path)}:{no}"
        if list(ex)[-4:] != ["query", "tools", "answers", "reasoning"]:
            fail(f"{where}: keys {list(ex)} (want [system,] query, tools, answers, reasoning)")
            continue
        if "system" in ex:
            stats["system"] += 1
        names = [t["name"] for t in ex["tools"]]
        if len(set(names)) != len(names):
            fail(f"{where}: a tool listed twice")
        for n in names:
            if n in other_tools or n not in split_tools:
                fail(f"{where}: tool {n} is not of this split")
        stats["tool_sets"].add(tuple(names))
        tools = {t["name"]: t for t in ex["tools"]}
        if not ex["answers"]:
            stats["nocall"] += 1
            # an out-of-scope request must not be served by a listed tool
            m = re.match(r"The user wants: (.*)\. No listed tool", ex["reasoning"])
            descs = [t["description"].lower() for t in ex["tools"]]
            if m and m.group(1) in descs:
                fail(f"{where}: no-call answer, yet a listed tool does {m.group(1)!r}")
        if len(ex["answers"]) > 1:
            stats["multi"] += 1
        if not ex["reasoning"]:
            fail(f"{where}: empty reasoning")
        for i, call in enumerate(ex["answers"]):
            if call.get("name") not in tools:
                fail(f"{where}: call {i} names {call.get('name')!r}, not a listed tool")
                continue
            if call["name"] not in ex["reasoning"]:
                fail(f"{where}: reasoning does not name {call['name']}")
            err = validate(call.get("arguments"), tools[call["name"]]["parameters"],
                           f"{where} {call['name']}.arguments", feats) or \
                grounded(call["arguments"], ex["query"], f"{where} {call['name']}")
            if err:
                fail(err)
            for arg, v in call["arguments"].items():
                if isinstance(v, int) and not isinstance(v, bool) and \
                        not re.search(rf"(?<![\d.]){v}(?!\d|\.\d)", ex["query"]):
                    stats["words"] += 1
    return len(lines)


def main():
    tmp = tempfile.mkdtemp(prefix="corpus-test-")
    a, b, c = (os.path.join(tmp, n) for n in ("a.jsonl", "b.jsonl", "c.jsonl"))
    p = gen("--num", "1500", "--seed", "7", "--output", a)
    gen("--num", "1500", "--seed", "7", "--output", b)
    gen("--num", "1500", "--seed", "8", "--output", c)
    with open(a, "rb") as fa, open(b, "rb") as fb, open(c, "rb") as fc:
        da, db, dc = fa.read(), fb.read(), fc.read()
    if da != db:
        fail("same seed, different bytes")
    if da == dc:
        fail("different seeds, same bytes")
    stdout = gen("--num", "1500", "--seed", "7").stdout
    if stdout != da:
        fail("stdout output differs from --output")
    m = re.search(r"corpus: (\d+) examples, split pretrain, (\d+) domains, (\d+) tools, "
                  r"([\d.]+)% multi-call, ([\d.]+)% no-call", p.stderr.decode())
    if not m or m.group(1) != "1500":
        fail(f"stats line missing or wrong: {p.stderr.decode()!r}")
    ho = os.path.join(tmp, "heldout.jsonl")
    gen("--num", "600", "--seed", "7", "--split", "heldout", "--output", ho)

    # domains: >= 50 of 1-8 tools, >= 6 held out, tool names unique across domains
    listing = gen("--list-domains").stdout.decode().splitlines()
    split_of, tools_of = {}, {}
    for row in listing:
        name, split, tools = row.split("\t")
        split_of[name], tools_of[name] = split, tools.split()
        if not 1 <= len(tools_of[name]) <= 8:
            fail(f"domain {name} has {len(tools_of[name])} tools")
    all_tools = [t for ts in tools_of.values() for t in ts]
    if len(set(all_tools)) != len(all_tools):
        fail("a tool name is used by two domains")
    held = {n for n, s in split_of.items() if s == "heldout"}
    if len(split_of) < 50 or len(held) < 6:
        fail(f"{len(split_of)} domains, {len(held)} held out (want >= 50 and >= 6)")
    pre_tools = {t for n in split_of if n not in held for t in tools_of[n]}
    held_tools = {t for n in held for t in tools_of[n]}

    # every line renders (our renderer, with the tokenizer: ids as training builds them)
    model = os.path.join(SRC, "models", "tokenizer.model")
    for path, n in ((a, 1500), (ho, 600)):
        r = subprocess.run([NEEDLE, "render", path, "--tokenizer", model], capture_output=True)
        summary = f"render: {n} examples from {n} lines (0 blank, 0 without \"query\" skipped, " \
                  f"0 invalid skipped)"
        if r.returncode != 0 or summary not in r.stderr.decode():
            fail(f"needle render {path}: rc {r.returncode}: {r.stderr.decode()[-400:]}")

    feats, stats = set(), {"nocall": 0, "multi": 0, "words": 0, "system": 0, "tool_sets": set()}
    n = check_file(a, pre_tools, held_tools, feats, stats)
    hstats = dict(stats, tool_sets=set())
    check_file(ho, held_tools, pre_tools, feats, hstats)
    want = {"string", "integer-bounds", "number-bounds", "boolean", "enum", "array", "object",
            "array-of-objects", "optional", "required", "pattern", "maxLength", "top-object"}
    if want - feats:
        fail(f"schema features never used: {sorted(want - feats)}")
    for key, lo, hi in (("multi", 0.1, 0.35), ("nocall", 0.05, 0.25), ("system", 0.02, 0.2)):
        if not lo <= stats[key] / n <= hi:
            fail(f"{key} share {stats[key] / n:.3f} outside [{lo}, {hi}]")
    if stats["words"] < 20:
        fail(f"only {stats['words']} integers said in words")
    used = {t for s in stats["tool_sets"] for t in s}
    if len(used) < 0.9 * len(pre_tools):
        fail(f"only {len(used)} of {len(pre_tools)} pretrain tools occur in 1500 examples")
    # distractors: some tool lists mix domains; shuffles: a domain comes in several orders
    dom_of = {t: d for d, ts in tools_of.items() for t in ts}
    mixed = sum(len({dom_of[t] for t in s}) > 1 for s in stats["tool_sets"])
    orders = {}
    for s in stats["tool_sets"]:
        if len({dom_of[t] for t in s}) == 1:
            orders.setdefault(dom_of[s[0]], set()).add(s)
    if mixed == 0:
        fail("no example has distractor tools")
    if not any(len(o) > 1 for o in orders.values()):
        fail("every domain's tools come in one order")

    # --alias-rate: the same examples with tools and parameters renamed consistently
    al = os.path.join(tmp, "alias.jsonl")
    pa = gen("--num", "1500", "--seed", "7", "--alias-rate", "0.5", "--output", al)
    if not re.search(r", (4[0-9]|5[0-9])\.\d% renamed", pa.stderr.decode()):
        fail(f"--alias-rate 0.5: stats line {pa.stderr.decode()!r}")
    r = subprocess.run([NEEDLE, "render", al, "--tokenizer", model], capture_output=True)
    if r.returncode != 0 or "1500 examples from 1500 lines" not in r.stderr.decode():
        fail(f"needle render {al}: rc {r.returncode}: {r.stderr.decode()[-400:]}")
    with open(al, encoding="utf-8") as f:
        renamed_lines = f.read().splitlines()
    renamed = 0
    for no, (plain, line) in enumerate(zip(da.decode().splitlines(), renamed_lines), 1):
        p0, p1 = json.loads(plain), json.loads(line)
        where = f"alias.jsonl:{no}"
        if p0 == p1:
            continue
        renamed += 1
        if p0["query"] != p1["query"] or len(p0["tools"]) != len(p1["tools"]):
            fail(f"{where}: renaming changed the query or the tool count")
            continue
        tmap, pmaps = {}, {}
        for t0, t1 in zip(p0["tools"], p1["tools"]):
            q0, q1 = t0["parameters"]["properties"], t1["parameters"]["properties"]
            if t0["description"] != t1["description"] or list(q0.values()) != list(q1.values()):
                fail(f"{where}: tool {t0['name']} -> {t1['name']} changed more than names")
            tmap[t0["name"]] = t1["name"]
            pmaps[t0["name"]] = dict(zip(q0, q1))
            req = [pmaps[t0["name"]][k] for k in t0["parameters"]["required"]]
            if req != t1["parameters"]["required"]:
                fail(f"{where}: required list of {t1['name']} not renamed with its properties")
        if len(set(tmap.values())) != len(tmap):
            fail(f"{where}: two tools renamed alike")
        want = [{"name": tmap[c["name"]],
                 "arguments": {pmaps[c["name"]][k]: v for k, v in c["arguments"].items()}}
                for c in p0["answers"]]
        if want != p1["answers"]:
            fail(f"{where}: answers {p1['answers']} != renamed {want}")
        for c0, c1 in zip(p0["answers"], p1["answers"]):
            if not re.search(rf"(^|; then ){re.escape(c1['name'])}(:|;|$)", p1["reasoning"]):
                fail(f"{where}: reasoning {p1['reasoning']!r} does not name {c1['name']}")
            for k0, k1 in pmaps[c0["name"]].items():
                if k0 != k1 and k0 in c0["arguments"] and \
                        not re.search(rf"(: |, |{{){re.escape(k1)} ", p1["reasoning"]):
                    fail(f"{where}: reasoning does not use parameter name {k1}")
    if not 600 <= renamed <= 900:
        fail(f"--alias-rate 0.5 renamed {renamed} of 1500 examples")

    # --domains restricts; bad options are refused with a clear message
    one = gen("--num", "50", "--domains", "weather,music").stdout.decode().splitlines()
    for line in one:
        for t in json.loads(line)["tools"]:
            if dom_of[t["name"]] not in ("weather", "music"):
                fail(f"--domains weather,music gave tool {t['name']}")
    for args, text in ((["--domains", "nope"], "unknown domain 'nope'"),
                       (["--domains", sorted(held)[0]], "not in the pretrain split"),
                       (["--num", "-1"], "--num must be >= 0"),
                       (["--alias-rate", "1.5"], "--alias-rate must be in [0, 1]")):
        r = gen(*args, check=False)
        if r.returncode == 0 or text not in r.stderr.decode():
            fail(f"{args}: rc {r.returncode}, stderr {r.stderr.decode()!r}")
    r = gen("--num", "5", "--output", os.path.join(tmp, "no", "such", "dir.jsonl"), check=False)
    if r.returncode == 0:
        fail("writing into a missing directory succeeded")
    leftovers = [f for f in os.listdir(tmp) if f.startswith(".corpus-")]
    if leftovers:
        fail(f"temporary files left behind: {leftovers}")

    print(f"corpus test: {n} pretrain + 600 held-out lines checked, features {sorted(feats)}, "
          f"{stats['multi']} multi-call, {stats['nocall']} no-call, {stats['words']} integers "
          f"in words, {mixed} tool lists with distractors; failures {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
