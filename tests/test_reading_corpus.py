#!/usr/bin/python3
"""tools/gen_reading_corpus.py on the committed real-API sample
(tests/data/openapi_sample, no network): the same seed gives the same bytes
and another seed other ones; every answer's arguments validate against its
tool's schema (python3-jsonschema, tests/schema_check.py); every line renders (`needle
render`, training's template) within 1024 tokens; every string and
number argument can be read back from the query (or the system turn's
facts): said verbatim, a number in digits, with thousands separators or in
English words, a date as ISO or "March 4, 2026"; held-out API providers
(recomputed here from the documented rule) and held-out synthetic domains
never occur in the train split, not even as distractors; the query styles
and value kinds the corpus promises occur; bad options are refused."""
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "tests"))
from schema_check import UNCHECKED, Checker  # noqa: E402

GEN = ["/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable,
       os.path.join(SRC, "tools", "gen_reading_corpus.py")]
SETS = os.path.join(SRC, "tests", "data", "openapi_sample", "sets.jsonl")
BUILD = os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build")
NEEDLE = os.environ.get("NEEDLE") or os.path.join(BUILD, "needle")
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL:", msg, file=sys.stderr)


def gen(*args, check=True):
    p = subprocess.run(GEN + list(args), capture_output=True)
    if check and p.returncode != 0:
        fail(f"generator {args} exited {p.returncode}: {p.stderr.decode()[-600:]}")
    return p


# ---- the documented split rule, written again here ----

def provider(api):
    head = api.split("/", 1)[0]
    return head[:-5] if head.endswith(".json") else head


def heldout(p):
    return p in ("calorieninjas.com", "opencagedata.com") or hashlib.sha256(p.encode()).digest()[0] < 26


# ---- reading a value back from the text ----

ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
        "fourteen fifteen sixteen seventeen eighteen nineteen").split()
TENS = {w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty "
                                           "ninety".split()) if w != "_"}
MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august",
          "september", "october", "november", "december"]


def word_numbers(text):
    """every number said in English words below 1000 ("one hundred and five", "forty-two")"""
    toks = re.findall(r"[a-z]+", text.lower().replace("-", " "))
    out = set()
    for i in range(len(toks)):
        total, cur, ok = 0, None, False
        for t in toks[i:i + 6]:
            if t in ONES:
                if cur is not None and cur % 10 == 0 and cur % 100 >= 20 and ONES.index(t) < 10:
                    cur += ONES.index(t)
                elif cur is None or (cur >= 100 and cur % 100 == 0):
                    cur = (cur or 0) + ONES.index(t)
                else:
                    break
            elif t in TENS and (cur is None or (cur >= 100 and cur % 100 == 0)):
                cur = (cur or 0) + TENS[t]
            elif t == "hundred" and cur is not None and cur < 10:
                cur *= 100
            elif t == "and" and cur is not None and cur >= 100:
                continue
            else:
                break
            ok = True
            out.add(total + cur)
        del ok
    return out


def digit_numbers(text):
    return {float(m.replace(",", "")) for m in re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)}


def recoverable(value, text):
    if isinstance(value, list):
        return all(recoverable(v, text) for v in value)
    if isinstance(value, dict):
        return all(recoverable(v, text) for v in value.values())
    if isinstance(value, bool):
        return True
    if isinstance(value, (int, float)):
        return float(value) in digit_numbers(text) or (
            isinstance(value, int) and value in word_numbers(text))
    if isinstance(value, str):
        if value in text:
            return True
        m = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)", value)
        if m:
            y, mo, d = int(m[1]), int(m[2]), int(m[3])
            low = text.lower()
            return (f"{MONTHS[mo - 1]} {d}, {y}" in low) or (f"{d} {MONTHS[mo - 1]} {y}" in low)
        return False
    return False


def check_lines(lines, where):
    """schema validity and recoverability; returns counters of what was seen"""
    seen = {"multi": 0, "nocall": 0, "system_fact": 0, "lower": 0, "words": 0, "date_spoken": 0,
            "email": 0, "url": 0, "money": 0, "unit": 0, "time": 0, "preamble": 0, "question": 0,
            "calls": 0, "unchecked": 0}
    for n, line in enumerate(lines, 1):
        ex = json.loads(line)
        for k in ("query", "tools", "answers", "reasoning"):
            if k not in ex:
                fail(f"{where}:{n}: no {k!r}")
                return seen
        names = [t["name"] for t in ex["tools"]]
        if len(set(names)) != len(names):
            fail(f"{where}:{n}: a tool name twice: {names}")
        err = Checker(ex["tools"]).errors(json.dumps(ex["answers"]))
        if err.startswith(UNCHECKED):
            seen["unchecked"] += 1
        elif err:
            fail(f"{where}:{n}: {err}: {json.dumps(ex['answers'])[:300]}")
        q, sysmsg = ex["query"], ex.get("system", "")
        seen["multi"] += len(ex["answers"]) > 1
        seen["nocall"] += not ex["answers"]
        seen["lower"] += q == q.lower() and bool(ex["answers"])
        seen["question"] += q.rstrip().endswith("?") and bool(ex["answers"])
        seen["preamble"] += q.startswith(("I've been", "Quick context", "Before I forget",
                                          "Following up", "So I was", "Hey. Long day"))
        seen["money"] += bool(re.search(r"\$\d|€\d|\d (?:dollars|euros|USD|EUR)\b", q)) and \
            bool(ex["answers"])
        seen["unit"] += bool(re.search(r"\d (?:degrees|km|kg|miles|minutes|seconds|percent)\b", q))
        seen["date_spoken"] += bool(re.search(r"(January|March|May|July|October|December) \d", q))
        for c in ex["answers"]:
            seen["calls"] += 1
            for k, v in c["arguments"].items():
                if isinstance(v, str) and re.fullmatch(r"[^@\s]+@[^@\s]+\.\w+", v):
                    seen["email"] += 1
                if isinstance(v, str) and v.startswith("https://"):
                    seen["url"] += 1
                if isinstance(v, str) and re.fullmatch(r"\d\d:\d\d", v):
                    seen["time"] += 1
                if isinstance(v, int) and not isinstance(v, bool) and str(v) not in q \
                        and v in word_numbers(q):
                    seen["words"] += 1
                if recoverable(v, q):
                    continue
                if sysmsg and recoverable(v, sysmsg):
                    seen["system_fact"] += 1
                    continue
                fail(f"{where}:{n}: {c['name']}.{k} = {v!r} is not in the query {q!r}")
    return seen


def main():
    # recoverability checker sanity (the test must be able to fail)
    assert recoverable(42, "send forty-two boxes") and not recoverable(42, "send four boxes")
    assert recoverable(105, "one hundred and five") and recoverable(1250, "1,250 units")
    assert recoverable("2026-03-04", "on March 4, 2026") and not recoverable("2026-03-05", "March 4, 2026")
    assert recoverable(14.5, "$14.50") and not recoverable("Paris", "paris")
    assert recoverable(["a b", {"x": 3}], "a b and three") and not recoverable(["a", "zz"], "a b")

    with tempfile.TemporaryDirectory() as tmp:
        a, b, c = (os.path.join(tmp, x) for x in ("a.jsonl", "b.jsonl", "c.jsonl"))
        man = os.path.join(tmp, "m.jsonl")
        gen("--num", "1500", "--seed", "7", "--output", a, "--manifest", man)
        gen("--num", "1500", "--seed", "7", "--output", b)
        gen("--num", "1500", "--seed", "8", "--output", c)
        A, B, C = (open(x, "rb").read() for x in (a, b, c))
        if A != B:
            fail("the same seed gave different bytes")
        if A == C:
            fail("seeds 7 and 8 gave the same corpus")
        lines = A.decode().splitlines()
        if len(lines) != 1500:
            fail(f"{len(lines)} lines, want 1500")
        seen = check_lines(lines, "train")
        print("train:", json.dumps(seen))
        n = len(lines)
        for k, lo in (("multi", 0.1 * n), ("nocall", 0.06 * n), ("system_fact", 1), ("lower", 0.05 * n),
                      ("words", 20), ("date_spoken", 5), ("email", 5), ("url", 10), ("money", 1),
                      ("unit", 3), ("time", 1), ("preamble", 0.05 * n), ("question", 0.1 * n)):
            if seen[k] < lo:
                fail(f"train: only {seen[k]} of {k!r} (want >= {lo:g})")
        if seen["unchecked"] > 0.01 * seen["calls"]:
            fail(f"{seen['unchecked']} call lists the validator could not check")

        # every line renders (training's template and tokenizer) within 1024 tokens, uncut
        r = subprocess.run([NEEDLE, "render", a, "--tokenizer",
                            os.path.join(SRC, "models", "tokenizer.model"), "--json"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"needle render: rc {r.returncode}: {r.stderr[-400:]}")
        else:
            rendered = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
            cut = [x["line"] for x in rendered if x["truncated"]]
            if len(rendered) != n or cut:
                fail(f"render: {len(rendered)} examples, cut at 1024 tokens: lines {cut[:10]}")

        # held-out providers: not in the manifest of the train split, and no
        # held-out tool (its description) among the train split's tools
        sets = [json.loads(x) for x in open(SETS, encoding="utf-8") if x.strip()]
        held = {provider(s["api"]) for s in sets if heldout(provider(s["api"]))}
        train_descs = {t.get("description", "")[:60] for s in sets if not heldout(provider(s["api"]))
                       for t in s["tools"]}
        held_descs = {t.get("description", "")[:60] for s in sets if heldout(provider(s["api"]))
                      for t in s["tools"]} - train_descs - {""}
        held_descs = {d for d in held_descs if len(d) >= 20}
        if not held or not held_descs:
            fail("the sample has no held-out provider to check")
        mans = [json.loads(x)["providers"] for x in open(man)]
        if len(mans) != n:
            fail("manifest: one line per example expected")
        bad = {p for ps in mans for p in ps} & held
        if bad:
            fail(f"held-out providers in the train split: {sorted(bad)}")
        leaked = set()
        for line in lines:
            for t in json.loads(line)["tools"]:
                for d in held_descs:
                    if d in t.get("description", "") or t.get("description", "")[:40] in d[:40] \
                            and len(t.get("description", "")) >= 40:
                        leaked.add(d)
        if leaked:
            fail(f"held-out tools in the train split: {sorted(leaked)[:3]}")
        sys.path.insert(0, os.path.join(SRC, "tools"))
        from corpus_domains import DOMAINS, HELDOUT  # noqa: E402
        synth_held = {t["name"] for d, ts in DOMAINS if d in HELDOUT for t in ts} - \
            {t["name"] for d, ts in DOMAINS if d not in HELDOUT for t in ts}
        if not synth_held:
            fail("no held-out synthetic tool to look for")
        for line in lines:
            for t in json.loads(line)["tools"]:
                if t["name"] in synth_held:
                    fail(f"held-out synthetic tool {t['name']} in the train split")
                    break

        # the held-out split: only held-out providers (and synthetic held-out domains)
        h, hm = os.path.join(tmp, "h.jsonl"), os.path.join(tmp, "hm.jsonl")
        gen("--num", "300", "--seed", "2", "--split", "heldout", "--output", h, "--manifest", hm)
        hl = open(h).read().splitlines()
        check_lines(hl, "heldout")
        provs = {p for x in open(hm) for p in json.loads(x)["providers"]} - {"synthetic"}
        if not provs or not provs <= held:
            fail(f"heldout split providers {sorted(provs - held)} are not held out")

        # made-up values (--novel-rate): still valid and copied from the query, and
        # mostly values no list of the generator holds (the default corpus has none)
        nv = os.path.join(tmp, "nv.jsonl")
        gen("--num", "600", "--seed", "7", "--novel-rate", "0.8", "--output", nv)
        nl = open(nv).read().splitlines()
        check_lines(nl, "train, --novel-rate 0.8")

        def string_values(lines_):
            out = set()
            for line in lines_:
                for call in json.loads(line)["answers"]:
                    out.update(v for v in call["arguments"].values() if isinstance(v, str))
            return out
        plain = string_values(lines)
        novel = string_values(nl) - plain
        if len(novel) < 0.5 * len(string_values(nl)):
            fail(f"--novel-rate 0.8: only {len(novel)} of {len(string_values(nl))} string values "
                 "are new")
        gen("--num", "1500", "--seed", "7", "--novel-rate", "0", "--output", b)
        if open(b, "rb").read() != A:
            fail("--novel-rate 0 must give the default corpus, byte for byte")

        # integers in words (--words-rate): still valid, most small integers said
        # in words; the default rate gives the default corpus
        from corpus_params import int_words  # noqa: E402

        def words_share(lines_):
            said = total = 0
            for line in lines_:
                ex = json.loads(line)
                for call in ex["answers"]:
                    for v in call["arguments"].values():
                        if isinstance(v, int) and not isinstance(v, bool) and 20 < v < 1000:
                            total += 1
                            said += int_words(v) in ex["query"].lower()
            return said / max(total, 1), total
        wv = os.path.join(tmp, "wv.jsonl")
        gen("--num", "600", "--seed", "7", "--words-rate", "0.9", "--output", wv)
        wl = open(wv).read().splitlines()
        check_lines(wl, "train, --words-rate 0.9")
        (share, total), (share0, _) = words_share(wl), words_share(lines)
        if total < 20 or share < 0.6 or share0 > 0.45:
            fail(f"--words-rate 0.9: {share:.2f} of {total} integers in words "
                 f"(default corpus {share0:.2f})")
        gen("--num", "1500", "--seed", "7", "--words-rate", "0.35", "--output", b)
        if open(b, "rb").read() != A:
            fail("--words-rate 0.35 must give the default corpus, byte for byte")

        # bad options and inputs
        for bad_args, what in ((["--num", "-1"], "--num"), (["--multi-rate", "2"], "--multi-rate"),
                               (["--novel-rate", "1.5"], "--novel-rate"),
                               (["--words-rate", "-0.1"], "--words-rate"),
                               (["--sets", os.path.join(tmp, "none.jsonl")], "no such file")):
            p = gen(*bad_args, check=False)
            if p.returncode == 0 or what not in p.stderr.decode():
                fail(f"{bad_args}: rc {p.returncode}, stderr {p.stderr.decode()[-200:]!r}")
        broken = os.path.join(tmp, "broken.jsonl")
        with open(broken, "w") as f:
            f.write(open(SETS).readline() + "{not json\n")
        p = gen("--sets", broken, "--num", "3", check=False)
        if p.returncode == 0 or "broken.jsonl:2" not in p.stderr.decode():
            fail(f"a broken sets line: rc {p.returncode}, {p.stderr.decode()[-200:]!r}")
        out = os.path.join(tmp, "nodir", "x.jsonl")
        p = gen("--num", "3", "--output", out, check=False)
        if p.returncode == 0 or os.path.exists(out):
            fail("an output in a missing folder must fail and write nothing")

    print("test_reading_corpus:", "FAILED" if failures else "ok", f"({failures} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
