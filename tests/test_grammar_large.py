#!/usr/bin/python3
"""Enums and objects beyond the old 64-entry grammar limits (issue 33): a
tool with a 250-value ISO 4217-style currency enum (USD, USDC and USDT:
one value a prefix of others), an integer enum whose values are prefixes
of each other, and an object with 150 properties compile; `needle grammar
--sample` call lists validate with python3-jsonschema; a tiny model answers
through the grammar over the ABI (ctypes) and its calls validate too; an
object with more than 320 properties compiles with a warning naming the
tool and path (its keys in declaration order) and its samples validate."""
import ctypes
import json
import os
import random
import re
import string
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


# ISO 4217 codes (a real list's head) padded with other three-letter codes
# to 250, plus the stablecoins whose codes extend USD
ISO = ("AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BRL "
       "BSD BTN BWP BYN BZD CAD CDF CHF CLP CNY COP CRC CUP CVE CZK DJF DKK DOP DZD EGP "
       "ERN ETB EUR FJD FKP GBP GEL GHS GIP GMD GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR "
       "IQD IRR ISK JMD JOD JPY KES KGS KHR KMF KPW KRW KWD KYD KZT LAK LBP LKR LRD LSL "
       "LYD MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MYR MZN NAD NGN NIO NOK NPR "
       "NZD OMR PAB PEN PGK PHP PKR PLN PYG QAR RON RSD RUB RWF SAR SBD SCR SDG SEK SGD "
       "SHP SLE SOS SRD SSP STN SVC SYP SZL THB TJS TMT TND TOP TRY TTD TWD TZS UAH UGX "
       "USD UYU UZS VES VND VUV WST XAF XCD XOF XPF YER ZAR ZMW ZWL").split()
CODES = list(ISO) + ["USDC", "USDT"]
for a in string.ascii_uppercase:
    for b in "QXZJW":
        c = "X" + a + b
        if len(CODES) < 250 and c not in CODES:
            CODES.append(c)
assert len(CODES) == 250 and len(set(CODES)) == 250, len(CODES)

PROPS = {}
for i in range(150):
    k = i % 4
    PROPS["field_%03d" % i] = ({"type": "integer", "minimum": 0, "maximum": 9} if k == 0 else
                               {"type": "string", "maxLength": 4} if k == 1 else
                               {"type": "boolean"} if k == 2 else
                               {"enum": ["lo", "mid", "hi"]})


def tool(name, params):
    return {"name": name, "description": name.replace("_", " "), "parameters": params}


TOOLS = [
    tool("convert", {"type": "object", "properties": {
        "currency": {"type": "string", "enum": CODES},
        "level": {"enum": [100, 1, 12, 10]},
        "amount": {"type": "number", "minimum": 0, "maximum": 1000}},
        "required": ["currency", "level"]}),
    tool("pay", {"type": "object", "properties": {
        "coin": {"type": "string", "enum": ["USDC", "USD", "USDT"]}}, "required": ["coin"]}),
    tool("profile", {"type": "object", "properties": PROPS,
                     "required": ["field_000", "field_149", "field_075"]}),
]


def grammar(tools, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(tools, f)
        path = f.name
    try:
        return subprocess.run([NEEDLE, "grammar", "--tools", path] + list(args),
                              capture_output=True, text=True, timeout=600)
    finally:
        os.unlink(path)


def cli():
    r = grammar(TOOLS, "--sample", "400", "--seed", "11", "--require-call")
    check(r.returncode == 0, "sample: exit %d: %s" % (r.returncode, r.stderr[-500:]))
    m = re.search(r"grammar: 3 tools, 0 warnings, compiled in ([0-9.]+) ms", r.stderr)
    check(m is not None, "summary line: %r" % r.stderr)
    if m:
        print("test_grammar_large: compile time %s ms (250-value enum, 150 properties)" % m[1])
    lines = r.stdout.split("\n")[:-1]
    check(len(lines) == 400, "%d sample lines" % len(lines))
    ch = Checker(TOOLS)
    bad = [(ln, ch.errors(ln)) for ln in lines if ch.errors(ln)]
    check(not bad, "%d invalid samples, e.g. %r" % (len(bad), bad[:2]))
    calls = [c for ln in lines if not ch.errors(ln) for c in json.loads(ln)]
    coins = {c["arguments"]["coin"] for c in calls if c["name"] == "pay"}
    check(coins == {"USD", "USDC", "USDT"}, "pay samples only: %r" % coins)
    levels = {c["arguments"]["level"] for c in calls if c["name"] == "convert"}
    check(levels == {1, 10, 12, 100}, "level samples: %r" % levels)
    cur = {c["arguments"]["currency"] for c in calls if c["name"] == "convert"}
    check(len(cur) >= 20, "only %d distinct currencies sampled" % len(cur))
    keys = set()
    for c in calls:
        if c["name"] == "profile":
            keys |= set(c["arguments"])
    check(len(keys) >= 100, "only %d of 150 properties sampled" % len(keys))
    print("test_grammar_large: %d sampled calls valid; %d currencies, %d profile keys seen"
          % (len(calls), len(cur), len(keys)))
    # the check can fail: samples against a schema without USDC
    strict = json.loads(json.dumps(TOOLS))
    strict[1]["parameters"]["properties"]["coin"]["enum"] = ["USD", "USDT"]
    check(any(Checker(strict).errors(ln) for ln in lines), "a narrower enum found no sample invalid")

    # past the frame's 320 written-key bits: keys in declaration order, with
    # a warning naming the tool and the path; the samples still validate
    big = [tool("wide", {"type": "object", "properties": {
        "inner": {"type": "object", "required": ["k7", "k390"],
                  "properties": {"k%d" % i: {"type": "integer", "maximum": i}
                                 for i in range(400)}}}, "required": ["inner"]})]
    lines, r = [], grammar(big, "--sample", "100", "--seed", "3", "--require-call")
    check(r.returncode == 0 and "needle: warning: wide.parameters.inner: 400 properties: more "
          "than 320, so the keys are admitted in declaration order only" in r.stderr,
          "400 properties: exit %d %r" % (r.returncode, r.stderr))
    lines = r.stdout.split("\n")[:-1]
    bad = [ln for ln in lines if Checker(big).errors(ln)]
    check(len(lines) == 100 and not bad, "400 properties: %d lines, invalid %r"
          % (len(lines), bad[:1]))
    order = [list(c["arguments"]["inner"]) for ln in lines for c in json.loads(ln)]
    check(all(o == sorted(o, key=lambda k: int(k[1:])) for o in order)
          and max((len(o) for o in order), default=0) > 5, "400 properties: keys not in order %r" % order[:2])


def engine():
    import jsonschema
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
    lib.needle_thread_error.restype = ctypes.c_char_p
    lib.needle_model_free.argtypes = [vp]
    tmp = tempfile.mkdtemp(prefix="needle_gram_large_")
    ck, cact = os.path.join(tmp, "m.pkl"), os.path.join(tmp, "m.cact")
    for args in (["init", ck, "--preset", "tiny", "--max-seq-len", "8192", "--seed", "5"],
                 ["build", ck, "--tokenizer", os.path.join(SRC, "models", "tokenizer.model"),
                  "--out", cact]):
        p = subprocess.run([NEEDLE] + args, capture_output=True)
        if p.returncode:
            raise SystemExit(p.stderr.decode())
    m = lib.needle_model_load(cact.encode())
    check(bool(m), "load: %r" % lib.needle_thread_error())
    if not m:
        return
    by_name = {t["name"]: t["parameters"] for t in TOOLS}
    buf = ctypes.create_string_buffer(1 << 20)
    calls = 0
    for sub in ([TOOLS[0]], [TOOLS[1]], [TOOLS[2]], TOOLS):
        s = lib.needle_session_new(m, b"", json.dumps(sub).encode())
        check(bool(s), "session over %s: %r" % ([t["name"] for t in sub],
                                                lib.needle_thread_error()))
        if not s:
            continue
        lib.needle_session_require_call(s, 1)
        r = random.Random(len(sub))
        for q in range(4):
            query = r.choice(["convert 20 to USDC", "pay in usd", "fill my profile", "hello"])
            rc = lib.needle_session_complete(s, query.encode(), 300, buf, len(buf))
            env = json.loads(buf.value.decode("utf-8"))
            if rc < 0 or not env["success"]:
                check(env.get("error_code") == "max_new_tokens", "%s: %r" % (query, env))
            for c in env.get("function_calls") or []:
                calls += 1
                try:
                    jsonschema.validate(c["arguments"], by_name[c["name"]])
                except (KeyError, jsonschema.ValidationError) as e:
                    check(False, "engine call %s: %s" % (json.dumps(c)[:300], e))
            lib.needle_session_reset(s)
        lib.needle_session_free(s)
    lib.needle_model_free(m)
    check(calls >= 4, "the engine made only %d calls" % calls)
    print("test_grammar_large: %d engine calls validated" % calls)


def main():
    if not os.path.exists(NEEDLE):
        print("no needle binary at", NEEDLE)
        return 1
    cli()
    engine()
    if FAIL:
        print("%d failure(s)" % len(FAIL))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
