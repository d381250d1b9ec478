#!/usr/bin/python3
"""`needle bench decode` on Needle 3 archives (tiny3, built without a
tokenizer: a bench needs none). The timing itself is not checked
(benchmarks stay out of the timed suite):

  * a v3 archive at 4 and 2 bits runs, quantised in place and --float, on 1
    and 2 threads, and reports prefill and decode tokens/s, peak RSS and the
    weight bytes a decoded token reads, without upstream's (Needle 2)
    ratios;
  * the bytes a token reads: fewer at 2 bits than at 4, less than the
    archive (the engram tables are read one row a token), and the float
    path reads more (float32 matrices);
  * a Needle 2 archive (tiny) still gets upstream's ratios;
  * --prompt + --gen over the model's context is a usage error (2) that
    names the context (it once printed 0: read after the model was freed).
"""
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "ref"))
from harness import Checker, find_needle, run  # noqa: E402

NUM = r"([0-9]+(?:\.[0-9]+)?)"


def bench(needle, check, cact, tag, *extra):
    r = run([needle, "bench", "decode", "--weights", cact, "--prompt", "12", "--gen", "4",
             "--iters", "1", *extra])
    if not check("%s: exits 0" % tag, r.returncode == 0, r.stderr[-300:]):
        return None
    out = r.stdout
    got = {}
    for key, pat in (("prefill", r"prefill 12 tokens: " + NUM + " tokens/s"),
                     ("decode", r"decode  4 tokens: " + NUM + " tokens/s"),
                     ("rss", r"peak RSS " + NUM + " MB"),
                     ("bytes", r"weights read per decoded token " + NUM + " MB")):
        m = re.search(pat, out)
        if check("%s: %s reported" % (tag, key), m is not None and float(m.group(1)) > 0,
                 out[-400:]):
            got[key] = float(m.group(1))
    got["out"] = out
    return got


def main():
    check = Checker()
    needle = find_needle()
    if not check("needle binary found", needle is not None):
        return check.finish()
    with tempfile.TemporaryDirectory() as tmp:
        pkl = os.path.join(tmp, "t3.pkl")
        r = run([needle, "init", pkl, "--preset", "tiny3"])
        check("init tiny3", r.returncode == 0, r.stderr[-300:])
        res = {}
        for bits in (4, 2):
            cact = os.path.join(tmp, "t3w%d.cact" % bits)
            r = run([needle, "build", pkl, "--bits", str(bits), "--no-tokenizer", "--out", cact])
            if not check("build tiny3 W%d without a tokenizer" % bits, r.returncode == 0,
                         r.stderr[-300:]):
                continue
            for th in (1, 2):
                g = bench(needle, check, cact, "W%d %d thread(s)" % (bits, th), "--threads",
                          str(th))
                if g:
                    res[(bits, th)] = g
                    check("W%d: names Needle 3, quantised in place" % bits,
                          "Needle 3," in g["out"] and "quantised in place" in g["out"], g["out"])
                    check("W%d: no upstream (Needle 2) ratio" % bits, "upstream" not in g["out"])
                    check("W%d: reads less than the archive a token" % bits,
                          g.get("bytes", 1e9) * 1e6 < os.path.getsize(cact),
                          "%r MB vs %d bytes" % (g.get("bytes"), os.path.getsize(cact)))
            if bits == 4:
                g = bench(needle, check, cact, "W4 --float", "--float")
                if g and (4, 1) in res:
                    check("--float reads more bytes a token than W4",
                          g.get("bytes", 0) > res[(4, 1)].get("bytes", 1e9),
                          "%r vs %r" % (g.get("bytes"), res[(4, 1)].get("bytes")))
                    check("--float names the float path", "float32 after dequant" in g["out"])
        if (4, 1) in res and (2, 1) in res:
            check("2 bits read fewer bytes a token than 4",
                  res[(2, 1)].get("bytes", 1e9) < res[(4, 1)].get("bytes", 0),
                  "%r vs %r" % (res[(2, 1)].get("bytes"), res[(4, 1)].get("bytes")))
        r = run([needle, "bench", "decode", "--weights", os.path.join(tmp, "t3w4.cact"),
                 "--prompt", "250", "--gen", "10"])
        check("prompt + gen past max_seq_len (256): usage error (2)", r.returncode == 2,
              r.stderr[-200:])
        check("the usage error names the model's max_seq_len (256)",
              "= 260 exceeds max_seq_len 256" in r.stderr, r.stderr[-200:])
        # Needle 2 keeps upstream's ratios
        pkl2, cact2 = os.path.join(tmp, "t2.pkl"), os.path.join(tmp, "t2.cact")
        r = run([needle, "init", pkl2, "--preset", "tiny"])
        r2 = run([needle, "build", pkl2, "--bits", "4", "--no-tokenizer", "--out", cact2])
        if check("tiny (Needle 2) archive built", r.returncode == 0 and r2.returncode == 0,
                 r2.stderr[-300:]):
            g = bench(needle, check, cact2, "Needle 2 tiny", "--threads", "1")
            if g:
                check("Needle 2: names it and gives upstream's ratios",
                      "Needle 2," in g["out"] and "upstream 4300: ratio" in g["out"], g["out"])
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
