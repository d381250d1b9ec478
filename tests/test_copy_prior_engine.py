#!/usr/bin/python3
"""The copy prior in the engine's decoder, through `needle run` with the
built-in base (src/engine/copy_prior.h; unit tests: test_copy_prior.c).

With every bonus at 100 the prior outweighs the model, so what it promises
holds whatever the weights say: every string value the calls write is a
span of the query (letters compared without case) and every number is a
number of the query, said in digits or in words ("twenty-one" -> 21).
Checks that property on queries whose calls the base makes; that a quoted
span is one value and a call's values copy different spans (two quoted
file names give the two names, not one twice; "40 and 50" gives 40 and
50, not 40 twice; "a=1, b=-3, c=2" gives each its own); that the
default prior turns the demo's kind of query into the right number, that
`NEEDLE_COPY_PRIOR=0` leaves the model's own picks, and that a bad value is
refused naming the variable. A cross build without a runnable needle or
without the archive: skipped (77).
"""
import json
import os
import re
import subprocess
import sys
import tempfile

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build")
NEEDLE = os.environ.get("NEEDLE") or os.path.join(BUILD, "needle")
NANO_CACT = os.path.join(BUILD, "needle-nano.cact")
FAIL = []

TOOLS = [
    {"name": "set_thermostat", "description": "Set the thermostat temperature",
     "parameters": {"type": "object",
                    "properties": {"temperature": {"type": "integer", "description": "degrees"}},
                    "required": ["temperature"]}},
    {"name": "send_email", "description": "Send an email",
     "parameters": {"type": "object",
                    "properties": {"to": {"type": "string"}, "subject": {"type": "string"},
                                   "body": {"type": "string"}},
                    "required": ["to", "subject", "body"]}},
]

DIFF_TOOLS = [
    {"name": "diff", "description": "Compare two files line by line",
     "parameters": {"type": "object",
                    "properties": {"file_name1": {"type": "string"},
                                   "file_name2": {"type": "string"}},
                    "required": ["file_name1", "file_name2"]}},
    {"name": "authenticate", "description": "Log in to the service",
     "parameters": {"type": "object",
                    "properties": {"username": {"type": "string"}, "password": {"type": "string"}},
                    "required": ["username", "password"]}},
]

NUMBER_TOOLS = [
    {"name": "math_gcd", "description": "Greatest common divisor of two integers",
     "parameters": {"type": "object",
                    "properties": {"num1": {"type": "integer"}, "num2": {"type": "integer"}},
                    "required": ["num1", "num2"]}},
    {"name": "solve_quadratic", "description": "Roots of a quadratic equation",
     "parameters": {"type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                   "c": {"type": "integer"}},
                    "required": ["a", "b", "c"]}},
]

# BFCL simple_python's queries; the base alone wrote num1 40, num2 40
NUMBERS = [
    "Calculate the greatest common divisor of two numbers: 40 and 50",
    "Solve a quadratic equation where a=2, b=6, and c=5",
    "gcd of 12 and 18",
]

# arguments the query names ("a=1"); with the name bonus off the base
# wrote a 2, c 1 for the first
NAMED = [
    "Find the roots of a quadratic equation with coefficients a=1, b=-3, c=2.",
    "Find the roots of a quadratic equation with coefficients c=2, a=1, b=-3.",
    "gcd with num2=12 and num1=18",
]

QUOTED = [
    "compare 'project_analysis.txt' with 'old_project_analysis.txt' please",
    "log me in with username 'bookworm_traveler' and password 'Tr@v3lB00ks2023'",
    'diff "notes v2.md" against "notes.md"',
]

QUERIES = [
    "set the thermostat to twenty-one degrees",
    "set it to 21 degrees",
    "set the thermostat to seventy two",
    "send an email to bob.smith@example.org with subject lunch and body see you at noon",
    "email ana@cactus.dev, subject budget, body the numbers are in",
]

WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen".split())}
WORDS.update({w: 20 + 10 * i for i, w in enumerate(
    "twenty thirty forty fifty sixty seventy eighty ninety".split())})


def check(cond, msg):
    if not cond:
        FAIL.append(msg)
        print("FAIL", msg)


def numbers_in(text):
    """Numbers the text says, in digits or as one or two number words
    (enough for the queries above)."""
    found = {int(m) for m in re.findall(r"\d+", text)}
    words = re.findall(r"[a-z]+", text.lower())
    for i, w in enumerate(words):
        if w in WORDS:
            found.add(WORDS[w])
            if WORDS[w] >= 20 and i + 1 < len(words) and words[i + 1] in WORDS \
                    and 0 < WORDS[words[i + 1]] < 10:
                found.add(WORDS[w] + WORDS[words[i + 1]])
    return found


def run(tools_path, query, prior):
    env = dict(os.environ)
    env.pop("NEEDLE_COPY_PRIOR", None)
    if prior is not None:
        env["NEEDLE_COPY_PRIOR"] = prior
    return subprocess.run([NEEDLE, "run", "--weights", NANO_CACT, "--tools", tools_path, query],
                          capture_output=True, text=True, env=env, timeout=120)


def calls(tools_path, query, prior):
    r = run(tools_path, query, prior)
    check(r.returncode == 0, f"needle run {query!r} ({prior}): exit {r.returncode}: {r.stderr}")
    if r.returncode != 0:
        return []
    return json.loads(r.stdout)["function_calls"] or []


def main():
    if not os.access(NEEDLE, os.X_OK) or not os.path.exists(NANO_CACT):
        print("skip: no runnable needle or no built-in base archive")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        tools_path = os.path.join(tmp, "tools.json")
        with open(tools_path, "w") as f:
            json.dump(TOOLS, f)

        # the prior at full strength: values are the query's, whatever the weights
        values = 0
        for q in QUERIES:
            for c in calls(tools_path, q, "100,100,100"):
                for k, v in c["arguments"].items():
                    values += 1
                    if isinstance(v, str):
                        check(v.lower() in q.lower(), f"{q!r}: {k}={v!r} is no span of the query")
                    elif isinstance(v, (int, float)) and not isinstance(v, bool):
                        check(v in numbers_in(q), f"{q!r}: {k}={v!r} is no number of the query")
        check(values >= 5, f"only {values} argument values written: the property says little")

        # the defaults: the number said in words, as a number
        got = calls(tools_path, "set the thermostat to twenty-one degrees", None)
        check(got == [{"name": "set_thermostat", "arguments": {"temperature": 21}}],
              f"default prior: {got}")
        # off: the model's own picks (the built-in base writes another number)
        off = calls(tools_path, "set the thermostat to twenty-one degrees", "0")
        print("prior off:", json.dumps(off))
        check(off != got, "NEEDLE_COPY_PRIOR=0 gives what the prior gives: is it off?")

        # quoted spans: whole, and each once in a call (every bonus at 100)
        diff_path = os.path.join(tmp, "diff.json")
        with open(diff_path, "w") as f:
            json.dump(DIFF_TOOLS, f)
        for q in QUOTED:
            spans = re.findall(r"'([^']+)'|\"([^\"]+)\"", q)
            spans = {a or b for a, b in spans}
            got = calls(diff_path, q, "100,100,100,100")
            check(len(got) >= 1, f"{q!r}: no call")
            for c in got:
                vals = list(c["arguments"].values())
                check(len(vals) == 2 and all(v in spans for v in vals),
                      f"{q!r}: values {vals} are not the quoted spans {sorted(spans)}")
                check(len(set(vals)) == len(vals), f"{q!r}: one span twice in a call: {vals}")

        # numbers: each of a call's values a different number of the query
        num_path = os.path.join(tmp, "numbers.json")
        with open(num_path, "w") as f:
            json.dump(NUMBER_TOOLS, f)
        for q in NUMBERS:
            got = calls(num_path, q, "100,100,100")
            check(len(got) >= 1, f"{q!r}: no call")
            for c in got:
                vals = list(c["arguments"].values())
                check(all(v in numbers_in(q) for v in vals), f"{q!r}: {vals} not the query's")
                check(len(set(vals)) == len(vals), f"{q!r}: one number twice in a call: {vals}")

        for q in NAMED:
            want = {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", q)}
            got = calls(num_path, q, "100,100,100,100,100")
            check([c["arguments"] for c in got] == [want], f"{q!r}: {got}, want {want}")

        r = run(tools_path, "set it to 21 degrees", "4,20")
        check(r.returncode != 0 and "NEEDLE_COPY_PRIOR='4,20'" in r.stdout + r.stderr,
              f"a bad NEEDLE_COPY_PRIOR is refused naming it: exit {r.returncode}, "
              f"{(r.stdout + r.stderr)[:300]}")
    print("test_copy_prior_engine:", "FAIL" if FAIL else "ok")
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
