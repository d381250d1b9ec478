#!/usr/bin/python3
"""Our JSON re-serialisation vs Python's json.dumps over tricky values.

Drives the test_pyjson executable in file mode: each line of a file is
parsed and re-serialised; the result must equal
json.dumps(json.loads(line), separators=(",", ":")) (and the default
separators with "default"), and lines Python rejects must be rejected."""
import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile

BUILD = os.environ.get("NEEDLE_BUILD", "build")
DRIVER = os.path.join(BUILD, "test_pyjson")

CASES = [
    '{"name":"get_weather","arguments":{"city":"London","unit":"celsius"}}',
    '[1.5, 10.0, 1e-05, 1e16, -0.0, 0.1, 1, 3, 1E5, 1e+2, 2.50, 0.000123, 123456.789e3]',
    '[12345678901234567890123456789, -98765432109876543210, 9007199254740993, -0]',
    '[9007199254740993.0, 1.7976931348623157e308, 5e-324, 2.2250738585072014e-308, 1e400]',
    '[0.1, 0.2, 0.30000000000000004, 1e22, 1e21, 1e-7, 123e-20, 4.35, 100.0, 1e15, 1e17]',
    '[NaN, Infinity, -Infinity, -1e400]',
    '{"b":1,"a":2,"b":3,"c":{"x":1,"x":[1,2],"y":null}}',
    '{"z":0,"y":1,"x":2,"":3,"Z":4}',
    '"caf\u00e9 \\u00fc \\ud83d\\ude00 \\ud800 lone \\udc00 low \\u20ac \\uFFFF"',
    '"quotes \\" and backslashes \\\\ and slash \\/ /"',
    '"controls \\b\\f\\n\\r\\t \\u0000 \\u0001 \\u001f \\u007f"',
    '{"nested":[[[[{"deep":[true,false,null,{"k":"v"}]}]]]],"empty":[{},[],""]}',
    '  {"spaces" :  [ 1 , 2 ]  }  ',
    '[]', '{}', '""', 'null', 'true', '0', '-1', '1.0', '"x"',
]
BAD = ['', '[1,]', '{"a" 1}', '01', '1.', '.5', '+1', '[1] 2', "{'a':1}", '{"a":1,}',
       '"bad \\x escape"', '"\\u12"', 'nul', '[', '{"a":', 'tru', '-', '1e', '--1',
       '"unterminated', '{1:2}']


def rand_value(r, depth=0):
    k = r.randrange(9 if depth < 4 else 6)
    if k == 0:
        return r.choice([None, True, False])
    if k == 1:
        return r.randint(-10**r.randint(1, 30), 10**r.randint(1, 30))
    if k == 2:
        return struct.unpack("<d", struct.pack("<Q", r.getrandbits(64)))[0]
    if k == 3:
        return r.choice([0.5, 1e-5, 1e16, 123.456, -0.0, 1/3, 2**0.5, 1e300, 7e-310])
    if k == 4 or k == 5:
        chars = [chr(r.choice([r.randrange(0x20), r.randrange(0x20, 0x7f),
                               r.randrange(0x80, 0x800), r.randrange(0x800, 0xd800),
                               r.randrange(0xe000, 0x10000), r.randrange(0x10000, 0x110000)]))
                 for _ in range(r.randrange(12))]
        return "".join(chars)
    if k == 6:
        return [rand_value(r, depth + 1) for _ in range(r.randrange(5))]
    return {rand_value(r, 9) if r.random() < 0.5 else f"k{r.randrange(5)}":
            rand_value(r, depth + 1) for _ in range(r.randrange(5))}


def main():
    r = random.Random(7)
    lines = list(CASES)
    for _ in range(400):
        v = rand_value(r)
        if isinstance(v, float) and math.isnan(v):
            continue
        # ensure_ascii=False exercises raw UTF-8 input; keys must be strings.
        s = json.dumps(v, ensure_ascii=r.random() < 0.5)
        lines.append(s)
    lines += BAD
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "in.jsonl")
        with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
            for line in lines:
                f.write(line + "\n")
        for mode, seps in (("compact", (",", ":")), ("default", (", ", ": "))):
            out = subprocess.run([DRIVER, path, mode], capture_output=True, check=True).stdout
            got = out.decode("utf-8").split("\n")[:-1]
            if len(got) != len(lines):
                print(f"FAIL: {len(got)} outputs for {len(lines)} lines", file=sys.stderr)
                sys.exit(1)
            for line, g in zip(lines, got):
                try:
                    want = json.dumps(json.loads(line), separators=seps)
                except ValueError:
                    want = "ERROR"
                if g != want:
                    failures += 1
                    if failures < 10:
                        print(f"FAIL ({mode}): {line[:120]!r}\n  python: {want[:200]}\n"
                              f"  ours:   {g[:200]}", file=sys.stderr)
    if failures:
        print(f"{failures} mismatches", file=sys.stderr)
        sys.exit(1)
    print(f"pyjson: {len(lines)} values x 2 separator styles match json.dumps")


if __name__ == "__main__":
    main()
