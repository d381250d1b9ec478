"""needle generate-data / finetune --generate against a scripted local
chat-completions server (tests/chat_server.py): kept and dropped counts
exactly as scripted, Retry-After and backoff retries, concurrency bounded
by --workers, output that parses and renders, the same output for the same
script, and the API key nowhere in what needle prints or writes."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_server import ChatServer  # noqa: E402

NEEDLE = os.environ.get("NEEDLE", "build/needle")
KEY = "sk-or-test-Zq8X-secret-4242"
MODEL = "test/model-1"
TOOLS = [
    {"name": "get_weather", "description": "Current weather for a city",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string"},
         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
         "required": ["city"]}},
    {"name": "set_timer", "description": "Start a countdown timer",
     "parameters": {"type": "object", "properties": {
         "minutes": {"type": "integer", "minimum": 1, "maximum": 180}},
         "required": ["minutes"]}},
]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def ex(query, answers, reasoning="r"):
    return {"query": query, "reasoning": reasoning, "answers": answers}


def weather(city, unit=None):
    args = {"city": city}
    if unit:
        args["unit"] = unit
    return {"name": "get_weather", "arguments": args}


def timer(m):
    return {"name": "set_timer", "arguments": {"minutes": m}}


A = ex("Weather in Paris?", [weather("Paris")])
B = ex("Set a timer for 5 minutes and tell me the weather in Oslo in celsius",
       [timer(5), weather("Oslo", "celsius")])
C = ex("Tell me a joke", [])
D = ex("How warm is it in Rome, in fahrenheit?", [weather("Rome", "fahrenheit")])
# the same as A: case and surrounding space of the query aside
A_DUP = ex("  weather in PARIS?  ", [weather("Paris")], reasoning="other words")
BAD = [
    ex("Book a flight to Lima", [{"name": "book_flight", "arguments": {"to": "Lima"}}]),
    ex("Timer please", [{"name": "set_timer", "arguments": {}}]),          # required missing
    ex("Timer for 500 minutes", [timer(500)]),                              # over maximum
    ex("Weather in Nice in kelvin", [weather("Nice", "kelvin")]),          # not in enum
    ex("Weather in Bern", [{"name": "get_weather",
                            "arguments": {"city": "Bern", "wind": True}}]),  # undeclared
    "just a string",                                                        # not an object
]
L = ex("Start a 90 minute timer", [timer(90)])
M_BAD = ex("Weather in Kyiv", [weather("Kyiv")], reasoning=["not", "a", "string"])

SCRIPT = [
    ("reply", "Here you go:\n```json\n" + json.dumps([A, B, C], indent=2) + "\n```\nEnjoy!"),
    ("status", 429, {"Retry-After": "1"}, '{"error": {"message": "slow down"}}'),
    ("reply", json.dumps([D, A_DUP] + BAD)),
    ("raw", '{"choices": [{"message": {"content": "[]"'),       # malformed JSON body
    ("reply", 'Sure! [{"query": "Weather in Lyon", "answers": [{"name": '),  # broken array
    ("status", 500, {}, "oops"),
    ("reply", json.dumps([L, M_BAD])),
    ("status", 503, {}, "down"), ("status", 502, {}, "down"), ("status", 500, {}, "down"),
]
KEPT = [A, B, C, D, L]


def run(args, server, key=KEY, check_rc=0):
    env = dict(os.environ, OPENROUTER_API_KEY=key, OPENROUTER_URL=server.url)
    p = subprocess.run([NEEDLE] + args, env=env, capture_output=True, text=True, timeout=600)
    if "built without libcurl" in p.stderr:
        print("skipped: needle built without libcurl")
        sys.exit(0)
    if check_rc is not None and p.returncode != check_rc:
        print(p.stdout, p.stderr)
    check(check_rc is None or p.returncode == check_rc,
          "exit %d for %s" % (p.returncode, args))
    check(KEY not in p.stdout and KEY not in p.stderr, "the key appears in the output")
    return p


def summary(stdout):
    line = [x for x in stdout.splitlines() if x.strip().startswith("summary")]
    if not line:
        return {}
    words = line[0].split()[1:]
    out, name = {}, []
    for w in words:
        if w.isdigit():
            out[" ".join(name)] = int(w)
            name = []
        else:
            name.append(w)
    return out


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    check(KEY not in raw, "the key appears in " + path)
    return [json.loads(x) for x in raw.splitlines() if x.strip()]


def renders(path):
    p = subprocess.run([NEEDLE, "render", path], capture_output=True, text=True)
    return p.returncode == 0


def scripted_run(tmp, name, workers):
    out = os.path.join(tmp, name)
    with ChatServer(KEY, MODEL, SCRIPT) as srv:
        p = run(["generate-data", "--tools", os.path.join(tmp, "tools.json"), "--num-samples",
                 "30", "--batch-size", "5", "--workers", str(workers), "--model", MODEL,
                 "--max-retries", "2", "--retry-base", "0.05", "--output", out], srv)
        check(not srv.errors, "server saw bad requests: %s" % srv.errors[:3])
        check("Produce 5 varied examples" in srv.last_prompt and "set_timer" in srv.last_prompt,
              "the prompt names the batch size and the tools")
        times = srv.requests
    return p, out, times


def leaked(text, key=KEY):
    """The longest start of the key (4 bytes or more) found in text, or ""."""
    for k in range(len(key), 3, -1):
        if key[:k] in text:
            return key[:k]
    return ""


def gen_args(tmp, out, n, extra=()):
    return (["generate-data", "--tools", os.path.join(tmp, "tools.json"), "--num-samples",
             str(n), "--batch-size", "1", "--workers", "1", "--model", MODEL, "--max-retries",
             "0", "--output", out] + list(extra))


def test_redaction(tmp):
    """A server that quotes the key at every offset around where needle cuts
    what it prints (160 bytes of an HTTP error body, 200 of the service's
    error message): no piece of the key's start survives."""
    k = len(KEY)
    script = [("echo", 401, pad, "{key} and more") for pad in range(160 - k - 1, 161)]
    script += [("echo", 200, pad, "{key} and more") for pad in range(200 - k - 1, 201)]
    # the header as received, wherever it lands
    script += [("echo", 400, pad, "got Authorization: {auth}") for pad in (0, 100, 135, 180)]
    # a body that is not JSON: the parser's message quotes the text it stopped in
    script += [("raw", '{"choices": "' + "y" * pad + KEY + '\x01"}') for pad in (0, 100, 140)]
    out = os.path.join(tmp, "redact.jsonl")
    with ChatServer(KEY, MODEL, script) as srv:
        # 30 samples, batch 1: 117 requests at most, the script's first
        p = run(gen_args(tmp, out, 30), srv, check_rc=None)
        check(len(srv.requests) >= len(script), "every echo was asked for")
    text = p.stdout + p.stderr
    check(leaked(text) == "", "a piece of the key is printed: %r" % leaked(text))
    lines = text.splitlines()
    n401 = sum("HTTP 401" in x for x in lines)
    check(n401 == k + 2, "every 401 reported (%d of %d)" % (n401, k + 2))
    nerr = sum("answered an error: xxxx" in x for x in lines)
    check(nerr == k + 2, "every service error reported (%d of %d)" % (nerr, k + 2))
    # (past pad 135 the cut comes before the token)
    check(sum("Bearer ***" in x for x in lines) == 2, "the echoed header shows as Bearer ***")
    check(sum("not JSON" in x for x in lines) == 3, "the bodies that are not JSON reported")


def test_nothing_kept(tmp):
    """No example kept: exit 1 saying why; the output file is left as it was."""
    out = os.path.join(tmp, "keep.jsonl")
    before = json.dumps(dict(A, tools=TOOLS)) + "\n"
    with open(out, "w") as f:
        f.write(before)
    listing = sorted(os.listdir(tmp))
    # 2 samples, batch 1: int(2.6) // 1 * 3 = 6 requests, every reply prose
    script = [("reply", "Sorry, I cannot produce examples for these tools.")] * 6
    with ChatServer(KEY, MODEL, script) as srv:
        p = run(gen_args(tmp, out, 2), srv, check_rc=1)
    check("6 replies, all unparsable" in p.stderr and "no [...] array" in p.stderr
          and "Sorry, I cannot" in p.stderr and out + " not written" in p.stderr,
          "all unparsable: said why: %r" % p.stderr[-400:])
    check("wrote" not in p.stdout, "no 'wrote' line: %r" % p.stdout)
    check(open(out).read() == before, "the existing output is left as it was")
    check(sorted(os.listdir(tmp)) == listing, "no temporary file is left behind")

    # the first unparsable reply's parse error is named
    script = [("reply", 'Here: [{"query": "Weather in Lyon", "answers": ]')] * 6
    with ChatServer(KEY, MODEL, script) as srv:
        p = run(gen_args(tmp, out, 2), srv, check_rc=1)
    check("all unparsable" in p.stderr and "reply 1: its [...] is not JSON (column" in p.stderr,
          "the parse error is named: %r" % p.stderr[-400:])
    check(open(out).read() == before, "the existing output is left as it was (2)")

    # every example invalid: exit 1, the first reason named
    script = [("reply", json.dumps(BAD))] * 6
    with ChatServer(KEY, MODEL, script) as srv:
        p = run(gen_args(tmp, out, 2), srv, check_rc=1)
    check("no examples: 6 replies, 0 unparsable, 36 examples invalid" in p.stderr
          and "first invalid example: element 1" in p.stderr,
          "all invalid: said why: %r" % p.stderr[-400:])
    check(open(out).read() == before, "the existing output is left as it was (3)")

    # a run stopped half-way (SIGINT, SIGTERM) leaves the output as it was
    for sig in (signal.SIGINT, signal.SIGTERM):
        script = [("reply", json.dumps([A]))] * 3
        with ChatServer(KEY, MODEL, script, delay=0.5) as srv:
            env = dict(os.environ, OPENROUTER_API_KEY=KEY, OPENROUTER_URL=srv.url)
            proc = subprocess.Popen([NEEDLE] + gen_args(tmp, out, 3), env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while len(srv.requests) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            proc.send_signal(sig)
            rc = proc.wait(timeout=30)
        check(rc != 0, "stopped by signal %d: exit %d" % (sig, rc))
        check(open(out).read() == before, "a stopped run leaves the output as it was")
        check(sorted(os.listdir(tmp)) == listing, "a stopped run leaves no file behind")

    # --augment with nothing new: no DATA.augmented.jsonl (not a copy of DATA)
    data = os.path.join(tmp, "nothing.jsonl")
    with open(data, "w") as f:
        f.write(before)
    script = [("status", 400, {}, '{"error": {"message": "no"}}')] + \
        [("reply", "I'd rather not.")] * 5
    with ChatServer(KEY, MODEL, script) as srv:
        p = run(["generate-data", "--augment", data, "--num-samples", "2", "--batch-size", "1",
                 "--workers", "1", "--model", MODEL, "--max-retries", "0"], srv, check_rc=1)
    check("5 replies, all unparsable" in p.stderr and "failed requests: HTTP 400" in p.stderr,
          "augment: said why: %r" % p.stderr[-400:])
    check(not os.path.exists(os.path.join(tmp, "nothing.augmented.jsonl")),
          "augment with nothing new writes no file")


def test_huge_reply(tmp):
    """A reply over 64 MiB is abandoned and named as such, with a
    Content-Length (refused before the body) and without (cut off while it
    streams); it is not asked for again."""
    limit = 64 << 20
    script = [("huge", limit + 1, True), ("huge", limit + 1, False)]
    out = os.path.join(tmp, "huge.jsonl")
    t0 = time.monotonic()
    with ChatServer(KEY, MODEL, script) as srv:
        # 1 sample, batch 1: 3 requests (the last one answered "[]")
        p = run(gen_args(tmp, out, 1, ["--max-retries", "2", "--retry-base", "0.01"]), srv,
                check_rc=1)
        check(len(srv.requests) == 3, "an over-limit reply is not retried (%d requests)"
              % len(srv.requests))
    print("huge replies: %.1f s" % (time.monotonic() - t0))
    over = [x for x in p.stderr.splitlines()
            if x.startswith("  failed ") and "over the 64 MiB limit" in x]
    check(len(over) == 2 and all("reply from " + srv.url in x for x in over),
          "both replies over the limit named: %r" % p.stderr[-600:])
    check("Failed writing" not in p.stderr, "no libcurl write-error wording")
    check(summary(p.stdout).get("failed requests") == 2, "2 failed: %s" % summary(p.stdout))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "tools.json"), "w") as f:
            json.dump(TOOLS, f)
        only = os.environ.get("GEN_TEST_ONLY")
        if only:
            globals()["test_" + only](tmp)
            print("%d failure(s)" % len(failures) if failures else "ok")
            sys.exit(1 if failures else 0)

        # 1. the scripted run, one request at a time
        p, out, times = scripted_run(tmp, "one.jsonl", 1)
        if os.environ.get("GEN_TEST_VERBOSE"):
            print(p.stdout, p.stderr)
        s = summary(p.stdout)
        want = {"requested": 30, "kept": 5, "dropped invalid": 7, "dropped duplicate": 1,
                "unparsable replies": 1, "failed requests": 2,
                "requests": 30 * 13 // 10 // 5 * 3}
        check(s == want, "summary %s, want %s" % (s, want))
        # every submission, plus the 429's retry, the 500's and the failed one's two
        check(len(times) == want["requests"] + 1 + 1 + 2,
              "HTTP requests %d, want %d" % (len(times), want["requests"] + 4))
        kinds = [k for _, k in times]
        i429 = kinds.index("status")
        gap = times[i429 + 1][0] - times[i429][0]
        check(0.95 <= gap < 3.0, "Retry-After: 1 was honoured (%.3f s)" % gap)
        # the 500 once: retried after --retry-base 0.05 s x (1 + jitter)
        i500 = kinds.index("status", i429 + 1)
        gap = times[i500 + 1][0] - times[i500][0]
        check(0.05 <= gap < 0.9, "backoff after a 500: %.3f s" % gap)
        rows = read_jsonl(out)
        check([r["query"] for r in rows] == [e["query"] for e in KEPT],
              "kept queries %s" % [r["query"] for r in rows])
        for r in rows:
            check(r["tools"] == TOOLS and set(r) <= {"query", "reasoning", "answers", "tools"},
                  "row fields %s" % sorted(r))
        check(rows[1]["answers"] == B["answers"], "answers kept as generated")
        check(renders(out), "needle render accepts the output")

        # 2. the same script gives the same file
        p2, out2, _ = scripted_run(tmp, "two.jsonl", 1)
        check(open(out, "rb").read() == open(out2, "rb").read(), "deterministic output")

        # 3. concurrency: --workers bounds the requests in flight
        script = [("reply", json.dumps([ex("Timer for %d minutes" % (i + 1), [timer(i + 1)])]))
                  for i in range(12)]
        with ChatServer(KEY, MODEL, script, delay=0.5) as srv:
            out3 = os.path.join(tmp, "par.jsonl")
            p = run(["generate-data", "--tools", os.path.join(tmp, "tools.json"),
                     "--num-samples", "12", "--batch-size", "1", "--workers", "4",
                     "--model", MODEL, "--output", out3], srv)
            check(srv.max_active == 4, "max requests in flight %d, want 4" % srv.max_active)
        rows = read_jsonl(out3)
        check(sorted(r["answers"][0]["arguments"]["minutes"] for r in rows)
              == list(range(1, 13)), "12 distinct examples from 12 parallel replies")
        check(summary(p.stdout).get("kept") == 12, "kept 12")

        # 4. a wrong key: the server's 401 echoes it, needle must not
        with ChatServer(KEY, MODEL, []) as srv:
            p = run(["generate-data", "--tools", os.path.join(tmp, "tools.json"),
                     "--num-samples", "2", "--batch-size", "2", "--workers", "1",
                     "--model", MODEL, "--output", os.path.join(tmp, "none.jsonl")], srv,
                    key=KEY + "-wrong", check_rc=1)
            check("401" in p.stderr and "***" in p.stderr, "401 reported, key redacted")
            check(KEY + "-wrong" not in p.stderr + p.stdout, "wrong key not printed")
            check(not os.path.exists(os.path.join(tmp, "none.jsonl")), "nothing written")

        # 4b. a server slower than --timeout: retried, then counted failed
        with ChatServer(KEY, MODEL, [], delay=1.5) as srv:
            p = run(["generate-data", "--tools", os.path.join(tmp, "tools.json"),
                     "--num-samples", "1", "--batch-size", "1", "--workers", "1",
                     "--model", MODEL, "--timeout", "0.3", "--max-retries", "1",
                     "--retry-base", "0.01", "--output", os.path.join(tmp, "slow.jsonl")], srv,
                    check_rc=1)
            # 1 sample, batch 1: int(1.3) // 1 * 3 = 3 requests, each tried twice
            check(len(srv.requests) == 6, "timed-out requests tried twice (%d)" % len(srv.requests))
            check(summary(p.stdout).get("failed requests") == 3, "3 failed requests")
            check("timeout" in p.stderr.lower() and "after 2 attempts" in p.stderr,
                  "the timeout is reported: %r" % p.stderr[-300:])
        # a file:// URL is refused, nothing is read
        env = dict(os.environ, OPENROUTER_API_KEY=KEY, OPENROUTER_URL="file:///etc/hostname")
        p = subprocess.run([NEEDLE, "generate-data", "--tools", os.path.join(tmp, "tools.json"),
                            "--max-retries", "0", "--num-samples", "1", "--output",
                            os.path.join(tmp, "file.jsonl")], env=env, capture_output=True,
                           text=True)
        check(p.returncode == 1 and "unsupported protocol" in p.stderr.lower(),
              "file:// refused: %r" % p.stderr[-300:])

        # 5. --augment: old lines first, then new ones for the tools they use
        data = os.path.join(tmp, "data.jsonl")
        old = [dict(A, tools=[TOOLS[0]]), dict(ex("Timer 3 min", [timer(3)]), tools=[TOOLS[1]])]
        with open(data, "w") as f:
            for o in old:
                f.write(json.dumps(o) + "\n")
        new = [ex("Weather in Graz", [weather("Graz")]), ex("Timer for 7 minutes", [timer(7)])]
        with ChatServer(KEY, MODEL, [("reply", json.dumps([A] + new))]) as srv:
            p = run(["generate-data", "--augment", data, "--num-samples", "2",
                     "--batch-size", "3", "--workers", "2", "--model", MODEL], srv)
        aug = os.path.join(tmp, "data.augmented.jsonl")
        rows = read_jsonl(aug)
        check(rows[:2] == old, "old examples first, unchanged")
        check([r["query"] for r in rows[2:]] == [e["query"] for e in new],
              "new examples: %s" % [r["query"] for r in rows[2:]])
        check(all(r["tools"] == TOOLS for r in rows[2:]), "tools collected from the data")
        check(summary(p.stdout).get("dropped duplicate") == 1, "a copy of an old one is dropped")

        # 6. finetune --generate on a tiny model
        tok = os.path.join(os.environ.get("NEEDLE_SRC", "."), "models", "tokenizer.model")
        base = os.path.join(tmp, "base.pkl")
        subprocess.run([NEEDLE, "init", base, "--preset", "tiny", "--max-seq-len", "256",
                        "--seed", "1"], check=True, capture_output=True)
        ft = os.path.join(tmp, "ft.jsonl")
        with open(ft, "w") as f:
            for o in old:
                f.write(json.dumps(o) + "\n")
        gen = [ex("Weather in Cork", [weather("Cork")]), ex("Timer for 9 minutes", [timer(9)]),
               ex("Hi there", [])]
        with ChatServer(KEY, "deepseek/deepseek-v4-flash", [("reply", json.dumps(gen))]) as srv:
            adapter = os.path.join(tmp, "adapter.pkl")
            p = run(["finetune", ft, "--generate", "3", "--checkpoint", base, "--tokenizer", tok,
                     "--batch-size", "2", "--max-len", "256", "--epochs", "1", "--val-split", "0",
                     "--out", adapter], srv)
            check(not srv.errors, "finetune's requests: %s" % srv.errors[:3])
        rows = read_jsonl(os.path.join(tmp, "ft.augmented.jsonl"))
        check(len(rows) == 5, "ft.augmented.jsonl has %d rows, want 5" % len(rows))
        check(os.path.getsize(adapter) > 0, "adapter written")
        check(KEY not in open(adapter, "rb").read().decode("latin-1"), "key not in the adapter")

        # 7. bad inputs: exit 1 and a message naming the file (and line)
        bad_line = os.path.join(tmp, "bad.jsonl")
        with open(bad_line, "w") as f:
            f.write(json.dumps(old[0]) + "\n" + '{"query": oops}\n')
        no_tools = os.path.join(tmp, "notools.jsonl")
        with open(no_tools, "w") as f:
            f.write('{"query": "q", "answers": []}\n')
        not_array = os.path.join(tmp, "obj.json")
        with open(not_array, "w") as f:
            f.write("{}")
        not_json = os.path.join(tmp, "broken.json")
        with open(not_json, "w") as f:
            f.write('[{"name": ')
        tools = os.path.join(tmp, "tools.json")
        cases = [
            (["--augment", bad_line], bad_line + ":2: column"),
            (["--augment", no_tools], "no tool schemas found"),
            (["--tools", not_array], not_array + ": expected a JSON array"),
            (["--tools", not_json], not_json + ": not JSON"),
            (["--tools", tools, "--output", tools], "refusing to overwrite an input"),
        ]
        with ChatServer(KEY, MODEL, []) as srv:
            for args, msg in cases:
                p = run(["generate-data"] + args, srv, check_rc=1)
                check(msg in p.stderr, "%s: %r not in %r" % (args, msg, p.stderr))
                check(not srv.requests, "%s: no request sent" % args)
            p = run(["generate-data", "--tools", tools], srv, key="", check_rc=1)
            check("set OPENROUTER_API_KEY" in p.stderr, "a missing key is named")
            p = run(["generate-data", "--tools", tools, "--num-samples", "0"], srv, check_rc=2)
        with open(tools) as f:
            check(json.load(f) == TOOLS, "the tools file is untouched")

        # 8-10. misbehaving servers
        test_redaction(tmp)
        test_nothing_kept(tmp)
        test_huge_reply(tmp)

    if failures:
        print("%d failure(s)" % len(failures))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
