#!/usr/bin/python3
"""Property test of the grammar-constrained tool call: random tiny models,
many generated schemas covering every constraint kind (types, enum, const,
required, minimum/maximum and their exclusive forms, minLength/maxLength,
pattern, items/minItems/maxItems, nested objects, untyped values), hundreds
of queries with varied budgets: every successful envelope's function_calls
parse and validate against the declared schema; an unsuccessful one is
only ever the documented max_new_tokens case with no calls.
stdlib only (ctypes over libneedle.so)."""
import ctypes
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build")
NEEDLE = os.environ.get("NEEDLE") or os.path.join(BUILD, "needle")
FAIL = []

PATTERNS = [r"^[a-z]{2,5}$", r"^@[a-z0-9_]+$", r"^\d{3}-\d{4}$", r"^(red|green|blue)$",
            r"ab+c", r"^[A-Z][a-z]*$", r"^x?y+z*$", r"^[^aeiou\s]{1,6}$", r"\.com$",
            r"^(\+|-)?\d+(\.\d{1,2})?$", r"^[a-f0-9]{4}$", r"^.{3}$"]
WORDS = ["room", "on", "level", "to", "memo", "count", "tags", "kind", "when", "deep", "x",
         "caf\u00e9", "emoji\U0001F600", "q\"uote"]


def check(cond, msg):
    if not cond:
        FAIL.append(msg)
        if len(FAIL) < 20:
            print("FAIL:", msg)


def gen_schema(r, depth=0):
    k = r.choice(["str", "strlen", "pattern", "enum", "int", "num", "bool", "null", "const",
                  "arr", "obj", "any", "mixed_enum", "excl"] if depth < 2 else
                 ["str", "strlen", "pattern", "enum", "int", "num", "bool", "const"])
    if k == "str":
        return {"type": "string", "description": "free text"}
    if k == "strlen":
        lo = r.randint(0, 4)
        s = {"type": "string", "minLength": lo}
        if r.random() < 0.7:
            s["maxLength"] = lo + r.randint(0, 6)
        return s
    if k == "pattern":
        s = {"type": "string", "pattern": r.choice(PATTERNS)}
        if r.random() < 0.3:
            s["maxLength"] = 12
        return s
    if k == "enum":
        return {"type": "string", "enum": r.sample(["warm", "cold", "auto", "a", "ab", "d\u00e9j\u00e0",
                                                   "x\"y", "tab\there"], r.randint(1, 4))}
    if k == "mixed_enum":
        return {"enum": r.sample([1, 12, 2.5, -3, True, False, None, "1", [1, 2], {"k": "v"}],
                                 r.randint(1, 5))}
    if k == "const":
        return {"const": r.choice(["fixed", 42, -0.5, True, None, {"a": [1]}])}
    if k == "int":
        s = {"type": "integer"}
        if r.random() < 0.8:
            s["minimum"] = r.randint(-50, 50)
        if r.random() < 0.8:
            s["maximum"] = s.get("minimum", -50) + r.randint(0, 200)
        return s
    if k == "num":
        s = {"type": "number"}
        if r.random() < 0.8:
            s["minimum"] = round(r.uniform(-10, 10), 2)
        if r.random() < 0.8:
            s["maximum"] = s.get("minimum", -10) + round(r.uniform(0.01, 100), 2)
        return s
    if k == "excl":
        t = r.choice(["integer", "number"])
        lo = r.randint(-5, 5)
        return {"type": t, "exclusiveMinimum": lo, "exclusiveMaximum": lo + r.randint(2, 30)}
    if k == "bool":
        return {"type": "boolean"}
    if k == "null":
        return {"type": "null"}
    if k == "arr":
        s = {"type": "array", "items": gen_schema(r, depth + 1)}
        lo = r.randint(0, 2)
        if r.random() < 0.7:
            s["minItems"] = lo
        if r.random() < 0.7:
            s["maxItems"] = lo + r.randint(0, 3)
        return s
    if k == "obj":
        return gen_object(r, depth + 1)
    return {"description": "anything"}


def gen_object(r, depth=0):
    names = r.sample(WORDS, r.randint(0 if depth else 1, 5))
    props = {n: gen_schema(r, depth) for n in names}
    req = [n for n in names if r.random() < 0.5]
    s = {"type": "object", "properties": props}
    if req:
        s["required"] = req
    return s


def gen_tools(r):
    tools = []
    for i in range(r.randint(1, 3)):
        t = {"name": r.choice(["set", "set_lights", "send", "send_money", "f\u00fcr", "get"]) + str(i),
             "description": "tool %d" % i}
        if r.random() < 0.9:
            t["parameters"] = gen_object(r)
        tools.append(t)
    return tools


def same(a, b):
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) and type(a) is type(b)


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def validate(v, s, path):
    if not isinstance(s, dict):
        return
    if "const" in s:
        check(same(v, s["const"]), "%s: %r != const %r" % (path, v, s["const"]))
        return
    if "enum" in s:
        check(any(same(v, e) for e in s["enum"]), "%s: %r not in enum %r" % (path, v, s["enum"]))
        return
    t = s.get("type")
    if t == "object" or (t is None and "properties" in s):
        check(isinstance(v, dict), "%s: %r is not an object" % (path, v))
        if not isinstance(v, dict):
            return
        props = s.get("properties", {})
        for k, x in v.items():
            check(k in props, "%s: undeclared key %r" % (path, k))
            if k in props:
                validate(x, props[k], path + "." + k)
        for k in s.get("required", []):
            check(k in v, "%s: required %r missing in %r" % (path, k, v))
    elif t == "string":
        check(isinstance(v, str), "%s: %r is not a string" % (path, v))
        if not isinstance(v, str):
            return
        check(len(v) >= s.get("minLength", 0), "%s: %r shorter than %d" % (path, v,
                                                                           s.get("minLength", 0)))
        if "maxLength" in s:
            check(len(v) <= s["maxLength"], "%s: %r longer than %d" % (path, v, s["maxLength"]))
        if "pattern" in s:
            check(re.search(s["pattern"], v) is not None, "%s: %r !~ %s" % (path, v, s["pattern"]))
    elif t in ("integer", "number"):
        ok = (type(v) is int) if t == "integer" else is_num(v)
        check(ok, "%s: %r is not %s" % (path, v, t))
        if not ok:
            return
        if "minimum" in s:
            check(v >= s["minimum"], "%s: %r < %r" % (path, v, s["minimum"]))
        if "maximum" in s:
            check(v <= s["maximum"], "%s: %r > %r" % (path, v, s["maximum"]))
        if "exclusiveMinimum" in s:
            check(v > s["exclusiveMinimum"], "%s: %r <= %r" % (path, v, s["exclusiveMinimum"]))
        if "exclusiveMaximum" in s:
            check(v < s["exclusiveMaximum"], "%s: %r >= %r" % (path, v, s["exclusiveMaximum"]))
    elif t == "boolean":
        check(isinstance(v, bool), "%s: %r is not a boolean" % (path, v))
    elif t == "null":
        check(v is None, "%s: %r is not null" % (path, v))
    elif t == "array":
        check(isinstance(v, list), "%s: %r is not an array" % (path, v))
        if not isinstance(v, list):
            return
        check(len(v) >= s.get("minItems", 0), "%s: %d items < minItems" % (path, len(v)))
        if "maxItems" in s:
            check(len(v) <= s["maxItems"], "%s: %d items > maxItems" % (path, len(v)))
        for i, x in enumerate(v):
            validate(x, s.get("items"), "%s[%d]" % (path, i))


# Tool sets shaped like real catalogues: AWS-style allOf wrappers with
# required inside members, OpenAPI $ref / nullable, pydantic anyOf
# Optionals, typed maps, formats, a lookahead pattern (dropped with a
# warning, never read as a literal prefix). Every call the grammar lets
# through must validate; errs() below is a small validator for what these
# use (and jsonschema cross-checks when it is installed).
REAL_SETS = [
    [{"name": "tag_resource", "description": "AWS-style", "parameters": {"allOf": [
        {"type": "object", "properties": {
            "arn": {"type": "string", "pattern": "^arn:[a-z]+:[a-z0-9-]+$", "example": "arn:aws:s3"},
            "key": {"type": "string", "pattern": "^(?!aws:)[A-Za-z:]+$", "minLength": 1,
                    "maxLength": 8}}},
        {"required": ["arn", "key"]},
        {"properties": {"ttl": {"type": "integer", "minimum": 1, "maximum": 90,
                                "readOnly": False, "deprecated": True}}}]}}],
    [{"type": "function", "function": {"name": "book", "parameters": {
        "type": "object", "properties": {
            "where": {"$ref": "#/$defs/Place"},
            "day": {"type": "string", "format": "date"},
            "id": {"type": "string", "format": "uuid"},
            "note": {"type": ["string", "null"], "maxLength": 10},
            "seats": {"type": "integer", "nullable": True, "minimum": 1, "maximum": 4},
            "extra": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0},
                      "maxProperties": 2}},
        "required": ["where", "day"],
        "$defs": {"Place": {"type": "object", "properties": {
            "city": {"enum": ["paris", "rome"]},
            "near": {"anyOf": [{"$ref": "#/$defs/Place"}, {"type": "null"}]}},
            "required": ["city"], "additionalProperties": False}}}}}],
    [{"name": "set_mode", "parameters": {"type": "object", "properties": {
        "mode": {"oneOf": [{"const": "auto"}, {"type": "integer", "minimum": 0, "maximum": 9},
                           {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}]},
        "when": {"type": "string", "format": "date-time", "x-ui": "clock"}},
        "required": ["mode"], "discriminator": {"propertyName": "mode"}}},
     {"name": "ping", "parameters": {"type": "object", "properties": {}}}],
]
FORMATS = {
    "date": r"^\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|"
            r"02-(0[1-9]|1\d|2\d))$",
    "date-time": r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])[Tt]([01]\d|2[0-3]):[0-5]\d:"
                 r"[0-5]\d(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)$",
    "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
}


def resolve(root, ref):
    cur = root
    for tok in ref[2:].split("/"):
        cur = cur[tok.replace("~1", "/").replace("~0", "~")]
    return cur


def errs(v, s, root, refs=()):
    """the ways v breaks schema s (an empty list when it is valid); as the
    grammar documents, a recursive $ref is checked two levels deep, below
    only the kind of value"""
    out = []
    if "$ref" in s:
        if refs.count(s["$ref"]) >= 2:
            t = resolve(root, s["$ref"]).get("type")
            return [] if t != "object" or isinstance(v, dict) else ["%r is not an object" % (v,)]
        refs = refs + (s["$ref"],)
        out += errs(v, resolve(root, s["$ref"]), root, refs)
    for sub in s.get("allOf", []):
        out += errs(v, sub, root, refs)
    for k in ("anyOf", "oneOf"):
        if k in s and not any(not errs(v, sub, root, refs) for sub in s[k]):
            out.append("%r matches no %s branch" % (v, k))
    if "const" in s and not same(v, s["const"]):
        out.append("%r != const" % (v,))
    if "enum" in s and not any(same(v, e) for e in s["enum"]):
        out.append("%r not in enum" % (v,))
    t = s.get("type")
    if t is not None:
        ts = set(t if isinstance(t, list) else [t]) | ({"null"} if s.get("nullable") else set())
        kinds = {"object": isinstance(v, dict), "string": isinstance(v, str),
                 "integer": type(v) is int, "number": is_num(v), "boolean": isinstance(v, bool),
                 "null": v is None, "array": isinstance(v, list)}
        if not any(kinds[x] for x in ts):
            return out + ["%r is not %s" % (v, t)]
    if isinstance(v, dict):
        props = s.get("properties", {})
        for k in s.get("required", []):
            if k not in v:
                out.append("required %r missing" % k)
        for k, x in v.items():
            if k in props:
                out += errs(x, props[k], root, refs)
            elif isinstance(s.get("additionalProperties"), dict):
                out += errs(x, s["additionalProperties"], root, refs)
            elif s.get("additionalProperties") is False:
                out.append("extra key %r" % k)
        if len(v) > s.get("maxProperties", 1 << 30):
            out.append("too many keys")
    if isinstance(v, str):
        if len(v) < s.get("minLength", 0) or len(v) > s.get("maxLength", 1 << 30):
            out.append("%r: bad length" % v)
        pat = s.get("pattern")
        if pat and "(?!" not in pat and not re.search(pat, v):
            out.append("%r !~ %s" % (v, pat))
        if s.get("format") in FORMATS and not re.search(FORMATS[s["format"]], v):
            out.append("%r is not a %s" % (v, s["format"]))
    if is_num(v):
        if v < s.get("minimum", -1e300) or v > s.get("maximum", 1e300):
            out.append("%r out of bounds" % v)
    if isinstance(v, list):
        if len(v) > s.get("maxItems", 1 << 30):
            out.append("too many items")
        for x in v:
            out += errs(x, s.get("items", {}), root, refs)
    return out


def real_sets(lib, models, buf):
    # Debian's python3-jsonschema (tools/deps.sh --test installs it): an
    # independent validator of every sampled call
    import jsonschema
    r = random.Random(99)
    queries = ["tag the bucket", "book paris tomorrow for 2", "set mode auto", "ping", "hello"]
    calls = 0
    for si, tools in enumerate(REAL_SETS):
        for m in models:
            s = lib.needle_session_new(m, b"", json.dumps(tools).encode())
            check(bool(s), "real set %d: %r" % (si, lib.needle_thread_error()))
            if not s:
                continue
            w = lib.needle_session_warnings(s).decode()
            # only the lookahead pattern is reported; annotations are quiet
            if si == 0:
                check("tag_resource.parameters.key: pattern ignored" in w and "lookahead" in w
                      and w.count("\n") == 0, "real set 0 warnings: %r" % w)
            elif si == 1:
                check(w == "book.parameters.where.near.near: recursive $ref '#/$defs/Place' is "
                      "enforced two levels deep; below, any object is allowed",
                      "real set 1 warnings: %r" % w)
            else:
                check(w == "", "real set %d warnings: %r" % (si, w))
            lib.needle_session_require_call(s, 1)
            by_name = {(t.get("function") or t)["name"]: (t.get("function") or t) for t in tools}
            for qi in range(8):
                rc = lib.needle_session_complete(s, r.choice(queries).encode(),
                                                 r.choice([64, 128, 200]), buf, len(buf))
                env = json.loads(buf.value.decode("utf-8"))
                if rc < 0 and env["error_code"] == "limit":
                    lib.needle_session_reset(s)
                    continue
                if rc < 0 or not env["success"]:
                    check(env["error_code"] == "max_new_tokens", "real set %d: %r" % (si, env))
                    continue
                for call in env["function_calls"]:
                    calls += 1
                    t = by_name.get(call["name"])
                    check(t is not None, "real set %d: undeclared %r" % (si, call))
                    if t is None:
                        continue
                    sch = t["parameters"]
                    e = errs(call["arguments"], sch, sch)
                    check(not e, "real set %d: %s: %s" % (si, json.dumps(call), e))
                    if si != 1:
                        # (set 1 recurses past the documented depth;
                        # formats are annotations to jsonschema by
                        # default, errs() checks them.) The lookahead the
                        # grammar cannot enforce is all it may let through.
                        try:
                            jsonschema.validate(call["arguments"], sch)
                        except jsonschema.ValidationError as ex:
                            check(si == 0 and "aws:" in str(ex.validator_value),
                                  "real set %d: jsonschema: %s" % (si, ex.message))
                lib.needle_session_reset(s)
            lib.needle_session_free(s)
    check(calls >= 20, "real sets: only %d calls" % calls)
    print("test_grammar: real-catalogue sets: %d calls validated" % calls)


def limit_messages(lib, model, buf):
    """the too-small-budget error says which limit it is"""
    tools = json.dumps([{"name": "ping", "parameters": {"type": "object", "properties": {}}}])
    s = lib.needle_session_new(model, b"", tools.encode())
    rc = lib.needle_session_complete(s, b"ping", 3, buf, len(buf))
    err = lib.needle_session_error(s).decode()
    check(rc < 0 and "max_new_tokens 3 is too small" in err, "budget 3: rc %d %r" % (rc, err))
    lib.needle_session_free(s)
    # a system prompt that leaves only a few tokens of max_seq_len
    max_len = lib.needle_model_max_seq_len(model)
    lo, hi, left, s = 0, 2 * max_len, None, None
    while lo + 1 < hi:  # bisect the prompt's length
        n = (lo + hi) // 2
        s = lib.needle_session_new(model, (" x" * n).encode(), tools.encode())
        left = max_len - lib.needle_session_context_tokens(s) - 16 if s else -1
        if 1 <= left <= 6:
            break
        if s:
            lib.needle_session_free(s)
            s = None
        if left < 1:
            hi = n
        else:
            lo = n
    check(s is not None, "no system prompt leaves 1..6 tokens (last %r)" % left)
    if s:
        rc = lib.needle_session_complete(s, b"ping", 200, buf, len(buf))
        err = lib.needle_session_error(s).decode()
        check(rc < 0 and ("only %d tokens left in the context" % left) in err
              and "max_new_tokens 200" not in err, "context full: rc %d %r" % (rc, err))
        lib.needle_session_free(s)


def main():
    lib = ctypes.CDLL(os.path.join(BUILD, "libneedle.so"))
    vp = ctypes.c_void_p
    lib.needle_model_load.argtypes = [ctypes.c_char_p]
    lib.needle_model_load.restype = vp
    lib.needle_session_new.argtypes = [vp, ctypes.c_char_p, ctypes.c_char_p]
    lib.needle_session_new.restype = vp
    lib.needle_session_complete.argtypes = [vp, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                                            ctypes.c_int]
    lib.needle_session_reset.argtypes = [vp]
    lib.needle_session_free.argtypes = [vp]
    lib.needle_session_require_call.argtypes = [vp, ctypes.c_int]
    lib.needle_session_error.argtypes = [vp]
    lib.needle_session_error.restype = ctypes.c_char_p
    lib.needle_thread_error.restype = ctypes.c_char_p
    lib.needle_session_warnings.argtypes = [vp]
    lib.needle_session_warnings.restype = ctypes.c_char_p
    lib.needle_session_context_tokens.argtypes = [vp]
    lib.needle_model_max_seq_len.argtypes = [vp]
    lib.needle_model_free.argtypes = [vp]

    tmp = tempfile.mkdtemp(prefix="needle_gram_")
    models = []
    for seed in (1, 2, 3):
        ck, cact = os.path.join(tmp, "m%d.pkl" % seed), os.path.join(tmp, "m%d.cact" % seed)
        for args in (["init", ck, "--preset", "tiny", "--max-seq-len", "1024", "--seed", str(seed)],
                     ["build", ck, "--tokenizer", os.path.join(SRC, "models", "tokenizer.model"),
                      "--out", cact]):
            p = subprocess.run([NEEDLE] + args, capture_output=True)
            if p.returncode:
                raise SystemExit(p.stderr.decode())
        m = lib.needle_model_load(cact.encode())
        if not m:
            raise SystemExit("load: %s" % lib.needle_thread_error())
        models.append(m)

    r = random.Random(1234)
    queries = ["dim the living room to 30", "send 20 dollars to @bob", "hello there",
               "set it to blue, deep 3", "r\u00e9sum\u00e9 please \U0001F600", "what's 12.5 + 3",
               "tag these as a, b and c", ""]
    buf = ctypes.create_string_buffer(1 << 20)
    n_queries = n_calls = n_ok = n_exhausted = 0
    kinds_seen = set()
    t0 = time.time()
    n_sets = int(os.environ.get("NEEDLE_GRAMMAR_SETS", "100"))
    for it in range(n_sets):
        tools = gen_tools(r)
        m = models[it % len(models)]
        s = lib.needle_session_new(m, b"", json.dumps(tools).encode())
        check(bool(s), "session for %s: %r" % (json.dumps(tools), lib.needle_thread_error()))
        if not s:
            continue
        lib.needle_session_require_call(s, 1 if it % 3 else 0)
        by_name = {t["name"]: t for t in tools}
        for qi in range(5):
            q = r.choice(queries)
            budget = r.choice([32, 64, 128, 200])
            rc = lib.needle_session_complete(s, q.encode(), budget, buf, len(buf))
            n_queries += 1
            try:
                env = json.loads(buf.value.decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                check(False, "envelope does not parse (%s): %r" % (e, buf.value[:300]))
                continue
            where = "set %d query %d (budget %d)" % (it, qi, budget)
            if rc < 0 and env["error_code"] == "limit":
                lib.needle_session_reset(s)  # the conversation filled max_seq_len
                continue
            if rc < 0 or not env["success"]:
                check(rc > 0 and env["error_code"] == "max_new_tokens" and env["function_calls"] == [],
                      "%s: unexpected failure rc %d %r" % (where, rc, env))
                n_exhausted += 1
            else:
                n_ok += 1
                check(env["type"] == ("call" if env["function_calls"] else "respond"), where)
                c = env["confidence"]
                check(c is None or 0 < c <= 1, where + ": confidence %r" % c)
                for call in env["function_calls"]:
                    n_calls += 1
                    check(set(call) == {"name", "arguments"}, where + ": call keys %r" % call)
                    t = by_name.get(call.get("name"))
                    check(t is not None, "%s: undeclared tool %r" % (where, call.get("name")))
                    if t is None:
                        continue
                    sch = t.get("parameters", {"type": "object", "properties": {}})
                    validate(call["arguments"], sch, where + ":" + t["name"])
                    for k, sv in sch.get("properties", {}).items():
                        if k in call["arguments"]:
                            kinds_seen.add(json.dumps(sorted(sv.keys())))
            if r.random() < 0.5:
                lib.needle_session_reset(s)
        lib.needle_session_free(s)
    real_sets(lib, models, buf)
    limit_messages(lib, models[0], buf)
    for m in models:
        lib.needle_model_free(m)
    dt = time.time() - t0
    print("test_grammar: %d queries over %d tool sets in %.1f s: %d answered (%d calls), "
          "%d out of budget; %d schema shapes exercised"
          % (n_queries, n_sets, dt, n_ok, n_calls, n_exhausted, len(kinds_seen)))
    check(n_calls >= n_queries // 3, "too few calls to mean anything: %d" % n_calls)
    check(n_exhausted <= n_queries // 10, "too many budget failures: %d" % n_exhausted)
    if FAIL:
        print("test_grammar: %d failures" % len(FAIL))
        return 1
    print("test_grammar: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
