#!/usr/bin/python3
"""`needle render --json` vs a Python model of upstream finetune.py
(render_example, _encode, fit_max_len) built on stdlib json and
python3-sentencepiece, plus bad-input handling."""
import json
import os
import subprocess
import sys
import tempfile

import sentencepiece as spm

NEEDLE = os.environ.get("NEEDLE", "build/needle")
SRC = os.environ.get("NEEDLE_SRC", ".")
MODEL = os.path.join(SRC, "models", "tokenizer.model")
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL:", msg, file=sys.stderr)


# ---- the reference: upstream's rendering rules (docs/formats.md §3.2-§3.3) ----

def render(ex):
    tools = ex.get("tools", [])
    tools_s = tools if isinstance(tools, str) else json.dumps(tools, separators=(",", ":"))
    answers = ex.get("answers", ex.get("function_calls", []))
    answers_s = answers if isinstance(answers, str) else json.dumps(answers, separators=(",", ":"))
    system = ex.get("system", "")
    prompt = ("<|im_start|>system\n" + system + "<|im_end|>\n" if system else "")
    prompt += ("<|im_start|>user\n<tools>" + tools_s + "</tools>\n" + ex["query"]
               + "<|im_end|>\n<|im_start|>assistant\n")
    target = ("<think>" + ex.get("reasoning", "") + "</think>\n<tool_call>" + answers_s
              + "</tool_call><|im_end|>")
    return prompt, target


def render3(ex):
    """Needle 3 (3.x finetune.py render_example): system/reasoning via
    (x or "").strip(), <think> only for non-empty reasoning, with newlines
    inside, JSON without ensure_ascii."""
    def js(v):
        return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"),
                                                       ensure_ascii=False)
    tools_s = js(ex.get("tools", []))
    answers_s = js(ex.get("answers", ex.get("function_calls", [])))
    reasoning = (ex.get("reasoning") or "").strip()
    system = (ex.get("system") or "").strip()
    prompt = ("<|im_start|>system\n" + system + "<|im_end|>\n" if system else "")
    prompt += ("<|im_start|>user\n<tools>" + tools_s + "</tools>\n" + ex["query"]
               + "<|im_end|>\n<|im_start|>assistant\n")
    think = "<think>\n" + reasoning + "\n</think>\n" if reasoning else ""
    target = think + "<tool_call>" + answers_s + "</tool_call><|im_end|>"
    return prompt, target


def reference(path, sp, cap, gen=2):
    examples = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            ex = json.loads(line)
            if "query" not in ex:
                continue
            examples.append((i, ex))
    encs = []
    for i, ex in examples:
        p, t = render3(ex) if gen == 3 else render(ex)
        pi, ti = sp.encode(p), sp.encode(t)
        encs.append((i, p, t, pi, ti))
    longest = max([len(pi) + len(ti) + 2 for _, _, _, pi, ti in encs] or [0])
    bucket = 128
    while bucket < min(longest, cap):
        bucket *= 2
    max_len = min(bucket, cap)
    out = []
    for i, p, t, pi, ti in encs:
        ids = [2] + pi + ti + [1]
        mask = [0] * (1 + len(pi)) + [1] * (len(ti) + 1)
        ids, mask = ids[:max_len], mask[:max_len]
        pad = max_len - len(ids)
        out.append({"line": i, "prompt": p, "target": t, "ids": ids + [0] * pad,
                    "mask": mask + [0] * pad})
    return out


TOOLS = [{"name": "get_weather", "description": "Weather for a city \u2014 \u00b0C/\u00b0F",
          "parameters": {"type": "object", "properties": {
              "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1},
              "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
              "required": ["city"]}},
         {"name": "send_money", "parameters": {"amount": {"type": "number"}}}]


def examples():
    rows = [
        {"query": "What's the weather in Z\u00fcrich for 3 days?", "tools": TOOLS,
         "answers": [{"name": "get_weather", "arguments": {"city": "Z\u00fcrich", "days": 3}}]},
        {"query": "Send 10 euros", "tools": TOOLS, "reasoning": "Amount is 10.0 EUR.",
         "answers": [{"name": "send_money", "arguments": {"amount": 10.0}}]},
        {"query": "tiny amounts", "tools": TOOLS,
         "function_calls": [{"name": "send_money", "arguments": {"amount": 1e-05}}]},
        {"query": "big", "tools": "[raw tools string, kept verbatim \u00fc]",
         "answers": [{"name": "x", "arguments": {"n": 123456789012345678901234567890,
                                                 "f": 1e16, "z": -0.0, "q": "\"quoted\\\""}}]},
        {"query": "emoji \U0001F600 and CJK \u65e5\u672c", "tools": [],
         "answers": [{"name": "say", "arguments": {"text": "\U0001F600\u65e5\t\n\x01"}}]},
        {"query": "with system", "system": "You are terse.\nVery.", "tools": TOOLS,
         "answers": []},
        {"query": "falsy system", "system": None, "answers": "[]"},
        {"query": "  spaces  inside   query  ", "reasoning": "multi\nline\nreasoning"},
        {"query": "stripped", "system": " \u3000 sys \t\n", "reasoning": "\n  why \u00a0",
         "answers": [{"name": "say", "arguments": {"text": "\u00e9\u2028\x7f"}}]},
        {"query": "blank reasoning", "system": " ", "reasoning": " \n\t "},
        {"query": "dup keys", "answers": [{"name": "a", "arguments": {"k": 1}}]},
        {"no_query": True},
        {"query": "long " * 400, "tools": TOOLS},
    ]
    lines = [json.dumps(r, ensure_ascii=(i % 2 == 0)) for i, r in enumerate(rows)]
    lines.insert(3, "")
    lines.insert(5, "   \t ")
    lines[9] = '{"query":"dup keys","answers":[{"name":"a","arguments":{"k":1,"k":2}}],"query":"dup!"}'
    return "\n".join(lines) + "\n"


def run(args, **kw):
    return subprocess.run([NEEDLE] + args, capture_output=True, **kw)


def check_parity(tmp):
    sp = spm.SentencePieceProcessor(model_file=MODEL)
    path = os.path.join(tmp, "data.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.write(examples())
    # \r\n line endings must not change anything.
    crlf = os.path.join(tmp, "crlf.jsonl")
    with open(crlf, "wb") as f:
        f.write(examples().replace("\n", "\r\n").encode())
    for data, cap, gen in [(d, c, g) for d in (path, crlf) for c in (1024, 256, 100)
                           for g in (2, 3)]:
        if True:
            gen_args = ["--generation", "3"] if gen == 3 else []
            r = run(["render", data, "--tokenizer", MODEL, "--json", "--max-len", str(cap)]
                    + gen_args)
            if r.returncode:
                fail(f"render {data} exited {r.returncode}: {r.stderr.decode()}")
                continue
            got = [json.loads(l) for l in r.stdout.decode().splitlines()]
            want = reference(path, sp, cap, gen)
            if len(got) != len(want):
                fail(f"{len(got)} examples vs {len(want)} expected")
            for g, w in zip(got, want):
                for k in ("line", "prompt", "target", "ids", "mask"):
                    if g[k] != w[k]:
                        fail(f"v{gen} cap {cap} line {w['line']} {k}:\n  ours: {str(g[k])[:300]}\n"
                             f"  want: {str(w[k])[:300]}")
            if cap == 100 and b"truncated" not in r.stderr:
                fail("no truncation count reported")
    print(f"render parity: OK ({len(want)} examples, generations 2 and 3)")


def expect_error(tmp, name, content, needle_in_msg, extra=()):
    path = os.path.join(tmp, name)
    with open(path, "wb") as f:
        f.write(content)
    r = run(["render", path, "--tokenizer", MODEL] + list(extra))
    err = r.stderr.decode(errors="replace")
    if r.returncode == 0 or r.returncode >= 128 or r.returncode < 0:
        fail(f"{name}: exit code {r.returncode}, stderr {err[:300]}")
    elif needle_in_msg not in err:
        fail(f"{name}: expected {needle_in_msg!r} in: {err[:300]}")
    return r


def check_bad(tmp):
    good = b'{"query":"ok"}\n'
    expect_error(tmp, "invalid.jsonl", good + b'{"query": "x",}\n', "invalid.jsonl:2: invalid JSON")
    expect_error(tmp, "notobj.jsonl", good * 2 + b'["query"]\n', "notobj.jsonl:3:")
    expect_error(tmp, "qtype.jsonl", b'{"query": 5}\n', "qtype.jsonl:1: query must be a string")
    expect_error(tmp, "ttype.jsonl", b'{"query": "a", "tools": 7}\n', "tools must be")
    expect_error(tmp, "rtype.jsonl", b'{"query": "a", "reasoning": null}\n',
                 "reasoning must be a string")
    # Needle 3: (reasoning or "") accepts null, not a truthy non-string
    r = run(["render", os.path.join(tmp, "rtype.jsonl"), "--generation", "3"])
    if r.returncode != 0:
        fail(f"v3 null reasoning: rc {r.returncode} {r.stderr[:300]!r}")
    expect_error(tmp, "rtype3.jsonl", b'{"query": "a", "reasoning": {"x": 1}}\n',
                 "rtype3.jsonl:1: reasoning must be a string", ["--generation", "3"])
    expect_error(tmp, "sur3.jsonl", b'{"query": "a", "answers": ["\\udfff"]}\n',
                 "sur3.jsonl:1: answers contains a lone surrogate", ["--generation", "3"])
    for bad_gen in ("1", "4", "two"):
        r = run(["render", os.path.join(tmp, "rtype.jsonl"), "--generation", bad_gen])
        if r.returncode != 2 or b"--generation" not in r.stderr:
            fail(f"--generation {bad_gen}: rc {r.returncode} {r.stderr[:300]!r}")
    expect_error(tmp, "stype.jsonl", b'{"query": "a", "system": ["x"]}\n',
                 "system must be a string")
    expect_error(tmp, "utf8.jsonl", good + b'{"query": "caf\xe9"}\n', "utf8.jsonl:2:")
    expect_error(tmp, "surrogate.jsonl", b'{"query": "\\ud800"}\n', "lone surrogate")
    expect_error(tmp, "trunc.jsonl", b'{"query": "abc', "trunc.jsonl:1:")
    expect_error(tmp, "empty.jsonl", b"", "empty.jsonl: no examples")
    expect_error(tmp, "blank.jsonl", b"\n  \n{\"x\":1}\n", "no examples")
    r = run(["render", os.path.join(tmp, "missing.jsonl")])
    if r.returncode != 1 or b"cannot open" not in r.stderr:
        fail(f"missing file: {r.returncode} {r.stderr!r}")
    # A 100 MB line: refused with its line number, no crash, bounded memory.
    big = os.path.join(tmp, "big.jsonl")
    with open(big, "wb") as f:
        f.write(good)
        f.write(b'{"query": "' + b"a" * (100 << 20) + b'"}\n')
        f.write(good)
    r = run(["render", big, "--tokenizer", MODEL])
    if r.returncode != 1 or b"big.jsonl:2: line is longer than" not in r.stderr:
        fail(f"100 MB line: rc {r.returncode}, {r.stderr[:300]!r}")
    # --skip-bad counts instead of failing and keeps the good lines.
    mixed = good + b'{"query": 1}\n' + b"nonsense\n" + b'{"query":"caf\xe9"}\n' + good
    path = os.path.join(tmp, "mixed.jsonl")
    open(path, "wb").write(mixed)
    r = run(["render", path, "--tokenizer", MODEL, "--skip-bad", "--json"])
    if r.returncode != 0 or len(r.stdout.splitlines()) != 2 or b"3 invalid skipped" not in r.stderr:
        fail(f"--skip-bad: rc {r.returncode}, {r.stderr!r}")
    r = run(["render", big, "--tokenizer", MODEL, "--skip-bad", "--json"])
    if r.returncode != 0 or len(r.stdout.splitlines()) != 2:
        fail(f"--skip-bad over the 100 MB line: rc {r.returncode}, {r.stderr[:300]!r}")
    print("render bad inputs: OK")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        check_parity(tmp)
        check_bad(tmp)
    if failures:
        print(f"{failures} failure(s)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
