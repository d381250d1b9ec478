#!/usr/bin/python3
"""`needle grammar`: compiling tools as `run` does, the warnings and
refusals it prints, and --sample's random call lists, which an independent
validator (python3-jsonschema, tests/schema_check.py) must accept for every
schema here. A deliberately mismatched check (the samples of one schema
validated against a stricter one) must find invalid calls, so the check
can fail."""
import json
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "tests"))
from schema_check import Checker  # noqa: E402

BUILD = os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build")
NEEDLE = os.environ.get("NEEDLE") or os.path.join(BUILD, "needle")
FAIL = []


def check(cond, msg):
    if not cond:
        FAIL.append(msg)
        print("FAIL:", msg)


def grammar(tools, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(tools if isinstance(tools, str) else json.dumps(tools))
        path = f.name
    try:
        r = subprocess.run([NEEDLE, "grammar", "--tools", path] + list(args),
                           capture_output=True, text=True, timeout=300)
    finally:
        os.unlink(path)
    return r


def tool(name, params):
    return {"name": name, "description": "test tool", "parameters": params}


OBJ = "object"
SETS = {
    "scalars": [tool("set", {"type": OBJ, "properties": {
        "room": {"type": "string", "enum": ["kitchen", "hall", "d\u00e9j\u00e0 vu", "q\"uote"]},
        "level": {"type": "integer", "minimum": -5, "maximum": 120},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1.5},
        "on": {"type": "boolean"}, "note": {"type": "string", "minLength": 2, "maxLength": 9},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
        "fixed": {"const": "v1"}, "nothing": {"type": "null"}},
        "required": ["room", "level"]})],
    "formats": [tool("book", {"type": OBJ, "properties": {
        "day": {"type": "string", "format": "date"},
        "at": {"type": "string", "format": "date-time"},
        "time": {"type": "string", "format": "time"},
        "id": {"type": "string", "format": "uuid"},
        "mail": {"type": "string", "format": "email"},
        "ip": {"type": "string", "format": "ipv4"},
        "link": {"type": "string", "format": "uri"}},
        "required": ["day", "at", "time", "id", "mail", "ip"]})],
    "openapi": [tool("put", {"type": OBJ, "properties": {
        "maybe": {"type": "string", "nullable": True, "maxLength": 4},
        "low": {"type": "number", "minimum": 2, "exclusiveMinimum": True, "maximum": 3},
        "either": {"type": ["integer", "string"]},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]},
                 "minItems": 1, "maxItems": 3},
        "labels": {"type": OBJ, "additionalProperties": {"type": "integer", "maximum": 9},
                   "maxProperties": 2}},
        "required": ["labels"]})],
    "composed": [tool("create", {
        "allOf": [{"$ref": "#/components/schemas/Base"},
                  {"type": OBJ, "properties": {"size": {"type": "integer", "minimum": 1}},
                   "required": ["size"]}],
        "components": {"schemas": {"Base": {
            "type": OBJ, "properties": {"name": {"type": "string", "maxLength": 6},
                                        "size": {"type": "integer", "maximum": 40},
                                        "kind": {"anyOf": [{"type": "integer"},
                                                           {"type": "string", "enum": ["x"]},
                                                           {"type": "null"}]}},
            "required": ["name"]}}}}),
        tool("noop", None),
        tool("tree", {"type": OBJ, "properties": {"node": {"$ref": "#/definitions/Node"}},
                      "definitions": {"Node": {"type": OBJ, "properties": {
                          "v": {"type": "integer"},
                          "kids": {"type": "array", "items": {"$ref": "#/definitions/Node"}}}}}})],
    # real APIs' patterns the NFA cannot hold as written: a long counted
    # repetition (the string's length fixes the count), anchors inside
    # groups (Azure); a date-time whose day fits its month and year
    "patterns": [tool("ids", {"type": OBJ, "properties": {
        "tgt": {"type": "string", "pattern": "^[a-zA-Z][a-zA-Z0-9-]{39,100}$"},
        "token": {"type": "string", "pattern": "^[a-zA-Z0-9/\\+\\=]{0,2048}$", "maxLength": 12},
        "arn": {"type": "string", "pattern": "^arn:aws:iam::\\d{12}:[a-z0-9]{1,300}$"},
        "set": {"type": "string", "maxLength": 80,
                "pattern": "(^[\\w]+$)|(^[\\w][\\w\\-]+[\\w]$)"},
        "one": {"type": "string", "pattern": "(^x[0-9]{2}$)"}},
        "required": ["tgt", "arn", "set", "one"]})],
    "many": [tool(f"t{i}", {"type": OBJ, "properties": {
        f"p{k}": {"type": "string", "enum": [f"e{j}" for j in range(k + 1)]} for k in range(5)},
        "required": ["p0"]}) for i in range(12)],
}
for ts in SETS.values():
    for t in ts:
        if t["parameters"] is None:
            del t["parameters"]


def samples(tools, n, seed, *extra):
    r = grammar(tools, "--sample", str(n), "--seed", str(seed), *extra)
    check(r.returncode == 0, f"sample exit {r.returncode}: {r.stderr[-500:]}")
    lines = r.stdout.split("\n")[:-1]
    check(len(lines) == n, f"{len(lines)} sample lines, expected {n}")
    return lines, r.stderr


def main():
    if not os.path.exists(NEEDLE):
        print("no needle binary at", NEEDLE)
        return 1
    total = 0
    for name, tools in SETS.items():
        lines, err = samples(tools, 300, 7)
        check("grammar: %d tools" % len(tools) in err, f"{name}: summary line missing: {err}")
        check(name == "composed" or "needle: warning" not in err, f"{name}: warnings: {err}")
        ch = Checker(tools)
        bad = [(ln, ch.errors(ln)) for ln in lines if ch.errors(ln)]
        check(not bad, f"{name}: {len(bad)} invalid samples, e.g. {bad[:2]}")
        calls = [c for ln in lines for c in json.loads(ln)]
        names = {c["name"] for c in calls}
        check(names == {t["name"] for t in tools},
              f"{name}: samples call {sorted(names)}, not every declared tool")
        check(sum(1 for ln in lines if ln == "[]") < len(lines) // 4,
              f"{name}: mostly empty call lists")
        total += len(lines)
    print(f"{total} sampled call lists validated")

    # seeded: the same seed repeats, another differs
    a, _ = samples(SETS["scalars"], 20, 3)
    b, _ = samples(SETS["scalars"], 20, 3)
    c, _ = samples(SETS["scalars"], 20, 4)
    check(a == b, "the same seed gave different samples")
    check(a != c, "different seeds gave the same samples")

    # --require-call: never []
    lines, _ = samples(SETS["scalars"], 100, 1, "--require-call")
    check("[]" not in lines, "--require-call sampled an empty list")

    # the check can fail: samples of level <= 120 against level <= 10
    strict = json.loads(json.dumps(SETS["scalars"]))
    strict[0]["parameters"]["properties"]["level"]["maximum"] = 10
    strict[0]["parameters"]["properties"]["code"]["pattern"] = "^[A-M]{2}-\\d{3}$"
    lines, _ = samples(SETS["scalars"], 200, 7)
    bad = [ln for ln in lines if Checker(strict).errors(ln)]
    check(len(bad) > 10, f"a mismatched schema check found only {len(bad)} invalid samples")

    # what is not enforced is named by tool and JSON path; refusals exit 1
    r = grammar([tool("tag", {"type": OBJ, "properties": {
        "key": {"type": "string", "pattern": "^(?!aws:).*$"},
        "n": {"type": "integer", "multipleOf": 5, "example": 10, "readOnly": False}}})])
    check(r.returncode == 0, f"warnings only: exit {r.returncode}")
    check("needle: warning: tag.parameters.key: pattern ignored" in r.stderr
          and "lookahead" in r.stderr, f"lookahead warning missing: {r.stderr}")
    check("tag.parameters.n: " in r.stderr and "multipleOf" in r.stderr,
          f"multipleOf warning missing: {r.stderr}")
    check("example" not in r.stderr and "readOnly" not in r.stderr,
          f"annotations are not quiet: {r.stderr}")
    check("grammar: 1 tools, 2 warnings" in r.stderr, f"summary: {r.stderr}")
    # a pattern too large for the NFA even so: its long counted repetitions
    # are cut (a subset of the strings, with a warning), never dropped
    arn = [tool("arn", {"type": OBJ, "properties": {"a": {
        "type": "string", "pattern": "^(arn:[a-z-]+:[a-z\\d-]+:\\d{12}:p\\/[a-zA-Z0-9_.-]{1,255}\\/[0-9]+)$"}},
        "required": ["a"]})]
    lines, err = samples(arn, 200, 4, "--require-call")
    check("arn.parameters.a: pattern's counted repetitions over 32 cut to 32" in err,
          f"narrowed pattern warning: {err}")
    bad = [ln for ln in lines if Checker(arn).errors(ln)]
    check(not bad, f"narrowed pattern: invalid samples {bad[:2]}")

    # the dropped lookahead is not read as the literal prefix "?!aws:"
    lines, _ = samples([tool("tag", {"type": OBJ, "properties": {
        "key": {"type": "string", "pattern": "^(?!aws:).*$"}}, "required": ["key"]})], 50, 2,
        "--require-call")
    keys = [c["arguments"]["key"] for ln in lines for c in json.loads(ln)]
    check(keys and not all(k.startswith("?!aws:") for k in keys),
          f"lookahead read as a literal: {keys[:5]}")
    # a catalogue beyond one grammar (64 tools): every tool checked, as a
    # session with retrieval does; no samples from it
    cat = [tool(f"op{i}", {"type": OBJ, "properties": {"n": {"type": "integer"}}})
           for i in range(200)]
    cat[150]["parameters"]["properties"]["n"]["multipleOf"] = 2
    r = grammar(cat)
    check(r.returncode == 0 and "200 tools checked" in r.stderr
          and "op150.parameters.n: " in r.stderr, f"200 tools: {r.returncode} {r.stderr}")
    r = grammar(cat, "--sample", "1")
    check(r.returncode == 1 and "at most 64 tools" in r.stderr, f"200 tools --sample: {r.stderr}")
    cat[170] = {"description": "no name"}
    r = grammar(cat)
    check(r.returncode == 1 and "tools[170]" in r.stderr, f"200 tools, one nameless: {r.stderr}")
    cat[170] = dict(cat[3])
    r = grammar(cat)
    check(r.returncode == 1 and "op3" in r.stderr and "twice" in r.stderr,
          f"200 tools, a name twice: {r.stderr}")
    r = grammar([{"description": "no name"}])
    check(r.returncode == 1 and "tools[0] has no \"name\"" in r.stderr,
          f"nameless tool: {r.returncode} {r.stderr}")
    r = grammar("[{\"name\": ")
    check(r.returncode == 1 and "tools JSON" in r.stderr, f"bad JSON: {r.returncode} {r.stderr}")
    r = grammar([], "--sample", "x")
    check(r.returncode == 2, f"bad --sample: exit {r.returncode}")
    r = subprocess.run([NEEDLE, "grammar"], capture_output=True, text=True)
    check(r.returncode == 2 and "--tools" in r.stderr, "missing --tools")
    r = subprocess.run([NEEDLE, "grammar", "--help"], capture_output=True, text=True)
    check(r.returncode == 0 and "--sample" in r.stdout, "--help")

    if FAIL:
        print(f"{len(FAIL)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
