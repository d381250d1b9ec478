#!/usr/bin/python3
"""bench/alternate_decode.sh, the script behind performance.md's
alternated engine tables, on a tiny Needle 2 archive (the timings
themselves are not checked):

  * every round runs every binary on every archive, in that order, one
    line each, and the summary's min / median / max per binary and
    archive are those of its round lines (recomputed here);
  * -p / -g / -t reach `needle bench decode`;
  * a bench that fails stops the script (exit 1) with the bench's error;
  * no `--`, a binary that cannot run or an archive that cannot be read is
    a usage error (exit 2).
"""
import os
import re
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "ref"))
from harness import SRC, Checker, find_needle, run  # noqa: E402

SCRIPT = os.path.join(SRC, "bench", "alternate_decode.sh")
ROUND = re.compile(r"^round (\d+)  (\S+)  (\S+)  prefill ([0-9.]+)  decode ([0-9.]+)  "
                   r"peak RSS ([0-9.]+) MB$")
SUMMARY = re.compile(r"^(\S+)  (\S+)  (\d+) / (\d+) / (\d+)  (\d+) / (\d+) / (\d+)$")


def summary_of(values):
    """min, median, max as the script prints them (%.0f)"""
    return [round(min(values)), round(statistics.median(values)), round(max(values))]


def main():
    check = Checker()
    needle = find_needle()
    if not check("needle binary found", needle is not None):
        return check.finish()
    with tempfile.TemporaryDirectory() as tmp:
        pkl, cact = os.path.join(tmp, "t.pkl"), os.path.join(tmp, "t4.cact")
        r = run([needle, "init", pkl, "--preset", "tiny"])
        r2 = run([needle, "build", pkl, "--bits", "4", "--no-tokenizer", "--out", cact])
        if not check("tiny archive built", r.returncode == 0 and r2.returncode == 0,
                     r.stderr[-300:] + r2.stderr[-300:]):
            return check.finish()
        # two names for the binary: the script keys its summary by path
        bins = [os.path.join(tmp, "a"), os.path.join(tmp, "b")]
        for b in bins:
            os.symlink(needle, b)
        r = run(["bash", SCRIPT, "-r", "3", "-t", "1", "-p", "16", "-g", "8"] + bins +
                ["--", cact])
        if not check("3 rounds of two binaries: exits 0", r.returncode == 0, r.stderr[-500:]):
            return check.finish()
        lines = r.stdout.splitlines()
        rounds = [m.groups() for m in map(ROUND.match, lines) if m]
        order = [(int(g[0]), g[1], g[2]) for g in rounds]
        check("one line a round and binary, in alternation",
              order == [(k, b, cact) for k in (1, 2, 3) for b in bins], "%r" % order)
        sums = {(m.group(1), m.group(2)): [int(x) for x in m.groups()[2:]]
                for m in map(SUMMARY.match, lines) if m}
        check("one summary line a binary", sorted(sums) == sorted((b, cact) for b in bins),
              "%r" % sorted(sums))
        for b in bins:
            pre = [float(g[3]) for g in rounds if g[1] == b]
            dec = [float(g[4]) for g in rounds if g[1] == b]
            want = summary_of(pre) + summary_of(dec)
            got = sums.get((b, cact))
            # %.0f of a median of two halves may round the other way: 1 apart at most
            check("%s: min / median / max are its rounds'" % os.path.basename(b),
                  got is not None and all(abs(x - y) <= 1 for x, y in zip(got, want)),
                  "printed %r, rounds give %r" % (got, want))
            check("%s: every figure positive" % os.path.basename(b),
                  all(v > 0 for v in pre + dec))

        # a bench that fails (past the tiny model's 128-token context)
        r = run(["bash", SCRIPT, "-r", "1", "-p", "120", "-g", "20", bins[0], "--", cact])
        check("a failing bench: exit 1", r.returncode == 1, "rc %d" % r.returncode)
        check("a failing bench: its error shown", "exceeds max_seq_len 128" in r.stderr,
              r.stderr[-300:])

        for tag, args in (("no --", [bins[0], cact]),
                          ("a binary that is not there", [os.path.join(tmp, "nope"), "--", cact]),
                          ("an archive that is not there",
                           [bins[0], "--", os.path.join(tmp, "nope.cact")])):
            r = run(["bash", SCRIPT, "-r", "1"] + args)
            check("%s: usage error (2)" % tag, r.returncode == 2, "rc %d" % r.returncode)
            check("%s: says what is wrong" % tag, "alternate_decode.sh:" in r.stderr,
                  r.stderr[-300:])
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
