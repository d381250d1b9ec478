#!/usr/bin/python3
"""`needle eval-calls` on a tiny random model (needle init --preset tiny +
needle build): the --json report parses and its counts add up, every
--predictions line carries verdicts that an independent Python version of
the rules (docs/evaluation.md) gives for the same expected/predicted pair,
the per-line verdicts sum to the report's counts, --limit and
--require-call act, the table shows the same counts, and bad data / bad
flags fail with messages naming file:line:field."""
import collections
import fractions
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(HERE))
BUILD = os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build")
NEEDLE = os.environ.get("NEEDLE") or os.path.join(BUILD, "needle")
TOK = os.path.join(SRC, "models", "tokenizer.model")
FAIL = []


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg)
    if not cond:
        FAIL.append(msg)


def needle(*args):
    return subprocess.run([NEEDLE] + [str(a) for a in args], capture_output=True, text=True)


def must(*args):
    p = needle(*args)
    if p.returncode:
        sys.exit("needle %s failed (%d): %s" % (" ".join(map(str, args[:2])), p.returncode,
                                                p.stderr))
    return p.stdout


# ---- the rules, written again independently ----

def norm(v):
    """A hashable canonical form: dict key order ignored, numbers by exact
    value (3 == 3.0), booleans apart from numbers."""
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, (int, float)):
        return ("num", fractions.Fraction(v))
    if isinstance(v, str):
        return ("str", v)
    if v is None:
        return ("null",)
    if isinstance(v, list):
        return ("list", tuple(norm(x) for x in v))
    return ("dict", frozenset((k, norm(x)) for k, x in v.items()))


def verdicts(expected, predicted):
    if predicted is None:
        return {"tool_name": False, "exact_args": False, "refusal": False}
    names = lambda calls: collections.Counter(c["name"] for c in calls)  # noqa: E731
    pairs = lambda calls: collections.Counter(  # noqa: E731
        (c["name"], norm(c.get("arguments", {}))) for c in calls)
    return {"tool_name": names(expected) == names(predicted),
            "exact_args": pairs(expected) == pairs(predicted),
            "refusal": predicted == []}


def plausibly_valid(tools, predicted):
    """Necessary conditions for `valid`: declared names, declared keys,
    required keys present."""
    by_name = {t["name"]: t.get("parameters", {}) for t in tools}
    for c in predicted:
        if c["name"] not in by_name:
            return False
        props = by_name[c["name"]].get("properties", {})
        args = c.get("arguments", {})
        if any(k not in props for k in args):
            return False
        if any(k not in args for k in by_name[c["name"]].get("required", [])):
            return False
    return True


def examples_of(path):
    out = []
    with open(path) as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            ex = json.loads(line)
            if "query" not in ex:
                continue
            ans = ex.get("answers", ex.get("function_calls", []))
            tools = ex.get("tools", [])
            out.append((no, json.loads(tools) if isinstance(tools, str) else tools,
                        json.loads(ans) if isinstance(ans, str) else ans))
    return out


def check_report(rep, preds, exs, where):
    """The report's counts against the data and the --predictions lines."""
    n_call = sum(1 for _, _, a in exs if a)
    a, c, z = rep["all"], rep["call"], rep["no_call"]
    check(a["examples"] == len(exs) and c["examples"] == n_call
          and z["examples"] == len(exs) - n_call,
          "%s: %d examples, %d expect calls (report %d/%d/%d)"
          % (where, len(exs), n_call, a["examples"], c["examples"], z["examples"]))
    for m in ("valid_json", "tool_name", "exact_args"):
        check(a[m]["count"] == c[m]["count"] + z[m]["count"], "%s: %s all = call + no_call"
              % (where, m))
        for g in (a, c, z):
            r = g[m]["rate"]
            check((r is None and g["examples"] == 0)
                  or abs(r - g[m]["count"] / g["examples"]) < 1e-5, "%s: %s rate" % (where, m))
    check(len(preds) == a["examples"], "%s: %d prediction lines" % (where, len(preds)))
    check([p["line"] for p in preds] == [no for no, _, _ in exs], where + ": line numbers")
    for m in ("valid", "tool_name", "exact_args"):
        key = "valid_json" if m == "valid" else m
        for g, want in ((c, True), (z, False)):
            got = sum(1 for p in preds if p[m] and p["expects_call"] == want)
            check(got == g[key]["count"], "%s: %s lines %d == report %d"
                  % (where, m, got, g[key]["count"]))
    check(sum(1 for p in preds if p["refusal"]) == z["refusal"]["count"], where + ": refusals")
    check(sum(1 for p in preds if p["false_refusal"]) == c["false_refusal"]["count"],
          where + ": false refusals")
    check(rep["engine_errors"] == sum(1 for p in preds if p["predicted"] is None),
          where + ": engine errors = null predictions")
    bad = 0
    for p, (no, tools, expected) in zip(preds, exs):
        v = verdicts(expected, p["predicted"])
        ok = (p["expected"] == expected and p["expects_call"] == bool(expected)
              and p["tool_name"] == v["tool_name"] and p["exact_args"] == v["exact_args"]
              and p["refusal"] == (v["refusal"] if not expected else None)
              and p["false_refusal"] == (v["refusal"] if expected else None)
              and (not p["valid"] or (p["predicted"] is not None
                                      and plausibly_valid(tools, p["predicted"])))
              and (p["valid"] == (p["error"] is None)))
        if not ok:
            bad += 1
            print("  line %d: %r" % (no, p))
    check(bad == 0, "%s: every line's verdicts follow the rules (%d lines)" % (where, len(preds)))
    return a


def read_preds(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def main():
    tmp = tempfile.mkdtemp(prefix="needle_evalcalls_")
    ck, cact = os.path.join(tmp, "t.pkl"), os.path.join(tmp, "t.cact")
    must("init", ck, "--preset", "tiny", "--max-seq-len", "512", "--seed", "3")
    must("build", ck, "--tokenizer", TOK, "--out", cact)
    data = os.path.join(tmp, "data.jsonl")
    subprocess.run([sys.executable, os.path.join(SRC, "tools", "make_example_data.py"), data,
                    "24"], check=True)
    tools = examples_of(data)[0][1]
    with open(data, "a") as f:
        f.write("\n   \n")
        f.write(json.dumps({"note": "no query: skipped like training does"}) + "\n")
        f.write(json.dumps({"query": "Timer 5 min", "system": "Be brief.",
                            "tools": json.dumps(tools),
                            "answers": json.dumps([{"name": "set_timer",
                                                    "arguments": {"minutes": 5}}])}) + "\n")
        f.write(json.dumps({"query": "Hello there", "tools": tools[:1],
                            "function_calls": []}) + "\n")
    exs = examples_of(data)
    check(len(exs) == 26, "data: 26 examples")

    # plain run
    pred = os.path.join(tmp, "pred.jsonl")
    out = must("eval-calls", "--weights", cact, data, "--json", "--predictions", pred,
               "--threads", "2")
    rep = json.loads(out)
    check(rep["skipped_no_query"] == 1 and rep["skipped_bad"] == 0, "skip counts")
    check_report(rep, read_preds(pred), exs, "full")

    # the table shows the same counts
    table = must("eval-calls", "--weights", cact, data)
    rows = {}
    for line in table.splitlines():
        for label in ("valid JSON", "tool name", "exact args", "false refusal", "refusal"):
            if line.startswith(label) and label not in rows:
                rows[label] = [tok for tok in line[len(label):].split() if "/" in tok]
                break
    a = rep["all"]
    want = "%d/%d" % (a["exact_args"]["count"], a["examples"])
    check(rows.get("exact args", [None])[0] == want, "table exact args %r, json %s"
          % (rows.get("exact args"), want))
    want = "%d/%d" % (rep["no_call"]["refusal"]["count"], rep["no_call"]["examples"])
    check(rows.get("refusal") == [want], "table refusal %r, json %s" % (rows.get("refusal"), want))

    # --limit, --require-call
    pred2 = os.path.join(tmp, "pred2.jsonl")
    rep2 = json.loads(must("eval-calls", "--weights", cact, data, "--json", "--limit", "9",
                           "--require-call", "--predictions", pred2))
    check_report(rep2, read_preds(pred2), exs[:9], "limit 9, require-call")
    check(rep2["no_call"]["refusal"]["count"] == 0 and rep2["call"]["false_refusal"]["count"] == 0
          and rep2["engine_errors"] == 0, "--require-call: no refusals")
    check(rep2["all"]["valid_json"]["count"] == 9, "--require-call: all 9 answers valid")

    # bad data names file:line:field; --skip-bad counts it
    bad = os.path.join(tmp, "bad.jsonl")
    lines = open(data).read().splitlines()[:3]
    for k, (line, field) in enumerate([
            ('{"query": "x", "tools": [], "answers": [{"arguments": {}}]}', "answers"),
            ('{"query": "x", "tools": {"name": "f"}}', "tools"),
            ('{"query": 3}', "query"),
            ('{"query": "x", "tools": [], "answers": "[{"}', "answers"),
            ('{"query": "x",', "invalid JSON")]):
        with open(bad, "w") as f:
            f.write("\n".join(lines[:2] + [line] + lines[2:]) + "\n")
        p = needle("eval-calls", "--weights", cact, bad)
        check(p.returncode == 1 and "bad.jsonl:3" in p.stderr and field in p.stderr,
              "bad line %d: rc %d, %r" % (k, p.returncode, p.stderr.strip()))
        p = needle("eval-calls", "--weights", cact, bad, "--skip-bad", "--json")
        ok = p.returncode == 0 and json.loads(p.stdout)["skipped_bad"] == 1
        check(ok and json.loads(p.stdout)["all"]["examples"] == 3 and "skipped 1 bad line"
              in p.stderr, "--skip-bad %d: rc %d %r" % (k, p.returncode, p.stderr.strip()))

    # flags
    p = needle("eval-calls", "--help")
    check(p.returncode == 0 and "exact args" in p.stdout and "--predictions" in p.stdout, "--help")
    check(needle("eval-calls", data).returncode == 2, "no --weights: usage error")
    check(needle("eval-calls", "--weights", cact).returncode == 2, "no data: usage error")
    check(needle("eval-calls", "--weights", cact, data, "--limit", "0").returncode == 2,
          "--limit 0 refused")
    before = open(data).read()
    p = needle("eval-calls", "--weights", cact, data, "--predictions", data)
    check(p.returncode == 1 and open(data).read() == before, "--predictions DATA refused")
    p = needle("eval-calls", "--weights", os.path.join(tmp, "none.cact"), data)
    check(p.returncode == 1 and "none.cact" in p.stderr, "missing weights: %r" % p.stderr.strip())
    p = needle("eval-calls", "--weights", cact, os.path.join(tmp, "none.jsonl"))
    check(p.returncode == 1 and "none.jsonl" in p.stderr, "missing data: %r" % p.stderr.strip())

    print("test_eval_calls: %d failure(s)" % len(FAIL))
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
