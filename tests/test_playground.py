#!/usr/bin/python3
"""`needle playground` over HTTP (stdlib client) on a tiny model built by
our own CLI: every route (/, /model, /complete, /reset, /load-model,
/finetune, /finetune/status, /download/NAME), a bad upload answering 400
while the loaded model keeps answering, path traversal refused, oversize
bodies refused (413), a second fine-tune while one runs refused (409), a
small fine-tune run to completion with progress in the status, the tuned
archive hot-loaded and downloadable, and a clean exit on SIGINT. Exit 77
(skip) only when the binary was built without libmicrohttpd."""
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from playground_util import NEEDLE, SRC, Playground, tiny_model, wait_until  # noqa: E402
from chat_server import ChatServer  # noqa: E402

KEY = "sk-playground-test-4b1d"
GEN_MODEL = "deepseek/deepseek-v4-flash"  # generate-data's default
GEN_TOOLS = [
    {"name": "get_weather", "description": "Current weather for a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}},
    {"name": "set_timer", "description": "Start a countdown timer",
     "parameters": {"type": "object", "properties": {
         "minutes": {"type": "integer", "minimum": 1, "maximum": 180}}, "required": ["minutes"]}},
]
GENERATED = [
    {"query": "Weather in Cork", "reasoning": "r",
     "answers": [{"name": "get_weather", "arguments": {"city": "Cork"}}]},
    {"query": "Timer for 9 minutes", "reasoning": "r",
     "answers": [{"name": "set_timer", "arguments": {"minutes": 9}}]},
    {"query": "Hi there", "reasoning": "r", "answers": []},
]

FAIL = []


def check(cond, msg):
    print(("ok:   " if cond else "FAIL: ") + msg)
    if not cond:
        FAIL.append(msg)


def raw(pg, data, timeout=30):
    """Send raw bytes, return the status line's code (0: no answer)."""
    s = socket.create_connection((pg.host, pg.port), timeout=timeout)
    got = b""
    try:
        try:
            s.sendall(data)
        except OSError:
            pass  # refused before the whole body was sent: the answer may be there
        while b"\r\n" not in got:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    finally:
        s.close()
    parts = got.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def main():
    tools = json.load(open(os.path.join(SRC, "examples", "tools.json")))
    names = {t["name"] for t in tools}
    examples = open(os.path.join(SRC, "examples", "data.jsonl")).read().splitlines()[:8]
    with tempfile.TemporaryDirectory() as tmp:
        base, cact = tiny_model(tmp)
        with ChatServer(KEY, GEN_MODEL, [("reply", json.dumps(GENERATED))]) as srv:
            # the chat service generate-data talks to; the key comes per request
            env = dict(os.environ, OPENROUTER_URL=srv.url)
            env.pop("OPENROUTER_API_KEY", None)
            pg = Playground(tmp, base, cact, env=env)
            try:
                run_hostile(pg, tools, examples, cact)
                run(pg, tools, names, examples, cact)
                run_generate(pg, srv)
                run_generate_echo(pg, srv)
            finally:
                rc = pg.stop()
            check(rc == 0, "SIGINT: clean exit 0 (got %r)" % rc)
            err = open(os.path.join(tmp, "playground.err")).read()
            check(KEY not in err, "the API key is not in the server's output")
        run_allow_origin(tmp, base, cact)
    if FAIL:
        print("%d check(s) failed" % len(FAIL))
        return 1
    print("playground: ok")
    return 0


def with_host(pg, method, path, host, body=None, headers=None, timeout=30):
    """A request whose Host header says `host` (None: no Host at all,
    HTTP/1.0 style); returns (status, parsed JSON or raw bytes)."""
    c = http.client.HTTPConnection(pg.host, pg.port, timeout=timeout)
    c.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    if host is not None:
        c.putheader("Host", host)
    data = b""
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = dict(headers or {})
    if body is not None and not isinstance(body, bytes):
        h.setdefault("Content-Type", "application/json")
    for k, v in h.items():
        c.putheader(k, v)
    c.putheader("Content-Length", str(len(data)))
    c.endheaders(data)
    r = c.getresponse()
    out = r.read()
    c.close()
    try:
        return r.status, json.loads(out)
    except ValueError:
        return r.status, out


def run_hostile(pg, tools, examples, cact):
    """What a hostile page or peer can do: issue 29 items 1-6."""
    port = pg.port
    # 1. DNS rebinding: a page at evil.example resolving to 127.0.0.1 sends
    #    its own name as Host; only this server's own names are answered
    for path in ("/model", "/finetune/status", "/", "/download/needle_tuned.cact"):
        status, body = with_host(pg, "GET", path, "evil.example:%d" % port)
        check(status == 403 and isinstance(body, dict) and "Host" in body.get("error", ""),
              "GET %s with a foreign Host -> 403 naming Host (%d %s)" % (path, status, str(body)[:120]))
    for host in ("127.0.0.1:%d" % port, "localhost:%d" % port, "LOCALHOST:%d" % port, "[::1]:%d" % port):
        status, body = with_host(pg, "GET", "/model", host)
        check(status == 200 and body.get("loaded") is True, "Host %s answered (%d)" % (host, status))
    for host in ("127.0.0.1:%d" % (port + 1), "127.0.0.1", "localhost.evil.example:%d" % port, None, ""):
        status, _ = with_host(pg, "GET", "/model", host)
        check(status == 403, "Host %r refused (%d)" % (host, status))
    status, _ = with_host(pg, "POST", "/reset", "evil.example:%d" % port, {})
    check(status == 403, "POST with a foreign Host -> 403 (%d)" % status)

    # 2. cross-origin POSTs: a foreign Origin, or a type a page can send
    #    without a CORS preflight, changes nothing
    huge = {"examples": "\n".join(examples), "epochs": 1000, "batch_size": 1}
    for origin in ("http://evil.example", "http://127.0.0.1:%d" % (port + 1), "null"):
        status, body = pg.json("POST", "/finetune", huge, {"Origin": origin})
        check(status == 403 and "Origin" in body.get("error", ""),
              "POST /finetune from Origin %s -> 403 (%d %s)" % (origin, status, body))
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        status, body = pg.json("POST", "/finetune", json.dumps(huge).encode(), {"Content-Type": ctype})
        check(status == 415 and "application/json" in body.get("error", ""),
              "POST /finetune as %s -> 415 (%d %s)" % (ctype, status, body))
    status, body = pg.json("POST", "/finetune", b"", {"Content-Type": ""})
    check(status == 415, "POST /finetune without a Content-Type -> 415 (%d)" % status)
    _, st = pg.json("GET", "/finetune/status")
    check(not st["running"] and not st["log"], "no fine-tune started by any of them: %s" % st["step"])
    blob = open(cact, "rb").read()
    status, body = pg.json("POST", "/load-model", blob, {"X-Filename": "evil.cact", "Content-Type": "text/plain"})
    check(status == 415, "POST /load-model as text/plain -> 415 (%d)" % status)
    status, body = pg.json("POST", "/load-model", blob, {"X-Filename": "evil.cact", "Origin": "http://evil.example"})
    check(status == 403, "POST /load-model from a foreign Origin -> 403 (%d)" % status)
    _, model = pg.json("GET", "/model")
    check(model.get("name") == "tiny.cact", "the model was not swapped: %s" % model.get("name"))
    status, _ = pg.json("POST", "/reset", b"", {"Content-Type": "text/plain"})
    check(status == 415, "POST /reset as text/plain -> 415 (%d)" % status)
    for origin in ("http://127.0.0.1:%d" % port, "http://localhost:%d" % port):
        status, env = pg.json("POST", "/complete", {"tools": tools, "query": "hi"}, {"Origin": origin})
        check(status == 200 and env.get("success") is True, "POST from the page's own origin %s -> 200 (%d)" % (origin, status))
    status, env = pg.json("POST", "/complete", {"tools": tools, "query": "hi"},
                          {"Content-Type": "Application/JSON; charset=utf-8"})
    check(status == 200, "application/json with parameters accepted (%d)" % status)

    # 5. a scalar "tools" is a 400 naming the field, not a 500
    for bad in (5, True, None, {"name": "x"}, "5", "{}"):
        status, body = pg.json("POST", "/complete", {"tools": bad, "query": "hi"})
        check(status == 400 and "tools" in body.get("error", ""),
              "tools %r -> 400 naming tools (%d %s)" % (bad, status, body.get("error")))

    # 6. schema warnings reach the response; a schema no value meets is refused
    def tool(prop):
        return [{"name": "pick_unit", "description": "choose",
                 "parameters": {"type": "object", "properties": {"unit": prop}, "required": ["unit"]}}]
    for what, prop in (("empty enum", {"type": "string", "enum": []}),
                       ("minLength > maxLength", {"type": "string", "minLength": 5, "maxLength": 2}),
                       ("minItems > maxItems", {"type": "array", "minItems": 3, "maxItems": 1}),
                       ("minimum > maximum", {"type": "integer", "minimum": 10, "maximum": 1})):
        status, body = pg.json("POST", "/complete", {"tools": tool(prop), "query": "pick a unit",
                                                     "tool_choice": "required"})
        err = body.get("error", "")
        check(status == 400 and body.get("success") is False and "pick_unit" in err
              and "unit" in err.split("pick_unit", 1)[1] and body.get("warnings"),
              "%s -> 400 naming the tool and path (%d %s)" % (what, status, err))
    status, env = pg.json("POST", "/complete", {
        "tools": tool({"type": "string", "format": "hostname"}), "query": "pick a unit"})
    warns = env.get("warnings") or []
    check(status == 200 and env.get("success") is True and any("format" in w and "pick_unit" in w for w in warns),
          "an ignored keyword is reported in warnings: %s" % warns)
    status, env = pg.json("POST", "/complete", {"tools": tools, "query": "hi"})
    check(status == 200 and "warnings" not in env, "no warnings key for clean schemas")

    # 4. a global budget for bodies being received: two held 60 MiB
    #    uploads fit, a third is refused at once; released when they end
    big = 60 << 20
    head = ("POST /load-model HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\n"
            "Content-Length: %d\r\n\r\n" % (pg.hostport, big)).encode()
    held = []
    try:
        for _ in range(2):
            s = socket.create_connection((pg.host, pg.port), timeout=10)
            s.sendall(head + b"\0" * (1 << 20))
            held.append(s)
        time.sleep(0.5)
        code = raw(pg, head + b"\0" * 1024, timeout=10)
        check(code == 503, "a third held 60 MiB upload -> 503 at once (%r)" % code)
        # a chunked body (no Content-Length) runs into the budget as it grows
        chunk = b"y" * (1 << 20)
        chunked = (b"POST /load-model HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\n"
                   b"Transfer-Encoding: chunked\r\n\r\n" % pg.hostport.encode())
        chunked += (b"%x\r\n%s\r\n" % (len(chunk), chunk)) * 12 + b"0\r\n\r\n"
        code = raw(pg, chunked, timeout=30)
        check(code == 503, "a chunked upload past the budget -> 503 (%r)" % code)
        status, _ = pg.json("GET", "/model")
        check(status == 200, "the server answers while uploads are held")
    finally:
        for s in held:
            s.close()
    ok = wait_until(lambda: pg.json("POST", "/load-model", blob, {"X-Filename": "tiny.cact"})[0] == 200, 10, 0.3)
    check(ok, "the budget is released when the held uploads end: an upload loads again")

    # 3. slow clients: many connections trickling their headers a byte at a
    #    time hold no thread, and are cut at the header deadline
    slow = []
    try:
        for _ in range(80):
            s = socket.create_connection((pg.host, pg.port), timeout=5)
            s.sendall(b"GET /model HTTP/1.1\r\nHost: %s\r\n" % pg.hostport.encode())
            slow.append(s)
        start = time.time()
        answered = None
        for i in range(8):  # trickle ~2 s before asking, keep trickling while asking
            for s in slow:
                try:
                    s.send(b"X")
                except OSError:
                    pass
            time.sleep(0.25)
        t0 = time.time()
        try:
            c = http.client.HTTPConnection(pg.host, pg.port, timeout=5)
            c.request("GET", "/model")
            r = c.getresponse()
            answered = r.status
            r.read()
            c.close()
        except OSError as e:
            answered = repr(e)
        took = time.time() - t0
        check(answered == 200 and took < 3,
              "GET /model answers within 3 s beside 80 trickling connections (%r in %.2f s)" % (answered, took))
        # keep trickling: the server cuts them at its 10 s header deadline
        cut = set()
        while time.time() - start < 16 and len(cut) < len(slow):
            for i, s in enumerate(slow):
                if i in cut:
                    continue
                try:
                    s.send(b"X")
                    s.setblocking(False)
                    try:
                        if s.recv(1) == b"":
                            cut.add(i)
                    except BlockingIOError:
                        pass
                    finally:
                        s.setblocking(True)
                except OSError:
                    cut.add(i)
            time.sleep(0.5)
        check(len(cut) == len(slow) and time.time() - start > 9,
              "trickled headers are cut at the deadline (%d/%d after %.1f s)" % (len(cut), len(slow), time.time() - start))
    finally:
        for s in slow:
            s.close()


def run_allow_origin(tmp, base, cact):
    """--allow-origin: the name a proxy serves the page under is answered,
    POSTs from it are taken, others still refused; a bad value exits 2."""
    p = subprocess.run([NEEDLE, "playground", "--weights", cact, "--port", "0",
                        "--allow-origin", "ftp://x.example"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "--allow-origin ftp://x.example" in p.stderr,
          "a bad --allow-origin exits 2 naming it (%d %s)" % (p.returncode, p.stderr.strip()[-200:]))
    sub = os.path.join(tmp, "allow")
    os.makedirs(sub, exist_ok=True)
    pg = Playground(sub, base, cact, "--allow-origin", "https://play.example.org",
                    "--allow-origin", "http://box.lan:8080/")
    try:
        for host in ("play.example.org", "box.lan:8080", pg.hostport):
            status, _ = with_host(pg, "GET", "/model", host)
            check(status == 200, "--allow-origin: Host %s answered (%d)" % (host, status))
        status, _ = with_host(pg, "GET", "/model", "play.example.org:8443")
        check(status == 403, "--allow-origin: another port of that name refused (%d)" % status)
        for origin, want in (("https://play.example.org", 200), ("http://box.lan:8080", 200),
                             ("http://play.example.org", 403), ("https://evil.example", 403)):
            status, _ = with_host(pg, "POST", "/reset", "play.example.org", {}, {"Origin": origin})
            check(status == want, "--allow-origin: POST from %s -> %d (%d)" % (origin, want, status))
    finally:
        rc = pg.stop()
    check(rc == 0, "--allow-origin server exits 0")


def run(pg, tools, names, examples, cact):
    # the page
    status, ctype, page = pg.request("GET", "/")
    check(status == 200 and ctype.startswith("text/html"), "GET / serves HTML (%d %s)" % (status, ctype))
    check(b'id="send"' in page and b"/complete" in page and b"/finetune/status" in page,
          "the page has the chat and wires the routes")
    check(b"http://" not in page.replace(b"http://%s" % pg.host.encode(), b"") and b"https://" not in page,
          "the page loads no external assets")

    status, model = pg.json("GET", "/model")
    check(status == 200 and model.get("name") == "tiny.cact" and model.get("loaded") is True,
          "GET /model names the loaded archive: %s" % model)

    # /complete: twice with the same tools (reset path), once with others
    for i in range(2):
        status, env = pg.json("POST", "/complete", {"tools": tools, "query": "What's the weather in Paris?"})
        check(status == 200 and env.get("success") is True and env.get("type") in ("call", "respond"),
              "POST /complete #%d answers an envelope (%d, type %s)" % (i + 1, status, env.get("type")))
        check(all(c["name"] in names for c in env.get("function_calls", [])),
              "calls name declared tools")
    status, env = pg.json("POST", "/complete", {"tools": json.dumps(tools[:1]), "query": "hi"})
    check(status == 200 and env.get("success") is True, "tools given as a JSON text (upstream form)")
    status, env = pg.json("POST", "/complete", {"tools": tools, "query": "hi", "tool_choice": "required"})
    check(status == 200 and env.get("type") == "call" and env.get("function_calls"),
          "tool_choice required -> a call (%s)" % env.get("function_calls"))
    status, env = pg.json("POST", "/complete", {"tools": tools, "query": "hi", "tool_choice": "any"})
    check(status == 400 and "tool_choice" in env.get("error", ""), "bad tool_choice -> 400")
    status, env = pg.json("POST", "/complete", {"tools": "[{", "query": "hi"})
    check(status == 400 and env.get("error"), "malformed tools JSON -> 400 (%d %s)" % (status, env.get("error")))
    status, _, body = pg.request("POST", "/complete", b"{not json", {"Content-Type": "application/json"})
    check(status == 400 and b"invalid JSON" in body, "malformed body -> 400 naming the problem (%d)" % status)
    status, body = pg.json("POST", "/reset")
    check(status == 200 and body == {"ok": True}, "POST /reset -> {ok: true}")

    # uploads: garbage and a truncated archive are refused, the model stays
    blob = open(cact, "rb").read()
    for what, data in (("garbage", b"not a cact at all"), ("truncated", blob[: len(blob) // 2])):
        status, body = pg.json("POST", "/load-model", data, {"X-Filename": what + ".cact"})
        check(status == 400 and "not loaded" in body.get("error", ""),
              "bad upload (%s) -> 400: %s" % (what, body.get("error")))
        status, model = pg.json("GET", "/model")
        check(model.get("name") == "tiny.cact", "the loaded model stays after a bad upload")
        status, env = pg.json("POST", "/complete", {"tools": tools, "query": "Set an alarm for 7am"})
        check(status == 200 and env.get("success") is True, "and still answers")
    status, body = pg.json("POST", "/load-model", blob, {"X-Filename": "../../up loaded.cact"})
    check(status == 200 and "/" not in body.get("name", "/"),
          "a good upload loads; a path in X-Filename is not used as a name (%s)" % body.get("name"))
    status, body = pg.json("POST", "/load-model", blob, {"X-Filename": "mine.cact"})
    check(status == 200 and body.get("name") == "mine.cact", "upload with a plain name: %s" % body)

    # downloads: only files the playground wrote
    for path in ("/download/../etc/passwd", "/download/..%2F..%2Fetc%2Fpasswd", "/download/.bashrc"):
        code = raw(pg, b"GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n"
                   % (path.encode(), pg.hostport.encode()))
        check(code in (400, 404), "path traversal %s refused (%d)" % (path, code))
    status, _, _ = pg.request("GET", "/download/needle_tuned.cact")
    check(status == 404, "a file not produced yet -> 404 (%d)" % status)
    status, _, _ = pg.request("GET", "/download/tiny.cact")
    check(status == 404, "a file the playground did not write -> 404 (%d)" % status)
    status, _, _ = pg.request("GET", "/nowhere")
    check(status == 404, "unknown route -> 404")

    # body limits: declared too large, and streamed (chunked) past the limit
    host = b"Host: %s\r\n" % pg.hostport.encode()
    code = raw(pg, b"POST /complete HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\n"
                   b"Content-Length: 2000000\r\n\r\n{")
    check(code == 413, "JSON body over 1 MB (Content-Length) -> 413 (%d)" % code)
    code = raw(pg, b"POST /load-model HTTP/1.1\r\n" + host + b"Content-Type: application/octet-stream\r\n"
                   b"Content-Length: 70000000\r\n\r\n")
    check(code == 413, ".cact upload over 64 MB -> 413 (%d)" % code)
    chunk = b"x" * 65536
    chunked = (b"POST /complete HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n")
    chunked += (b"%x\r\n%s\r\n" % (len(chunk), chunk)) * 20 + b"0\r\n\r\n"
    code = raw(pg, chunked)
    check(code == 413, "chunked JSON body past 1 MB -> 413 (%d)" % code)
    status, model = pg.json("GET", "/model")
    check(status == 200, "server still up after refused bodies")

    # fine-tune: bad requests first
    status, body = pg.json("POST", "/finetune", {"tools": tools})
    check(status == 400 and "examples" in body.get("error", ""), "no examples -> 400: %s" % body.get("error"))
    status, body = pg.json("POST", "/finetune", {"examples": examples[0] + "\nnot json\n"})
    check(status == 400 and "line 2" in body.get("error", ""), "bad JSONL -> 400 naming line 2: %s" % body.get("error"))
    status, body = pg.json("POST", "/finetune", {"examples": examples, "epochs": 0})
    check(status == 400 and "epochs" in body.get("error", ""), "epochs 0 -> 400: %s" % body.get("error"))

    req = {"examples": "\n".join(examples), "epochs": 3, "batch_size": 2, "max_len": 256, "lr": 0.01}
    status, body = pg.json("POST", "/finetune", req)
    check(status == 200 and body == {"ok": True}, "POST /finetune starts (%d %s)" % (status, body))
    status, body = pg.json("POST", "/finetune", req)
    check(status == 409, "a second fine-tune while one runs -> 409 (%d %s)" % (status, body))
    seen = []

    def finished():
        _, s = pg.json("GET", "/finetune/status")
        seen.append(s)
        return s if not s["running"] else None

    final = wait_until(finished, 600, 0.1)
    check(final is not None, "the fine-tune finishes")
    if not final:
        return
    print("status polls: %d; steps seen: %s" % (len(seen), sorted({s["step"] for s in seen})))
    check(any(s["running"] for s in seen), "status reported running while it ran")
    progress = [s["progress"]["done"] for s in seen if s["running"] and s["progress"]["total"]]
    check(progress == sorted(progress), "progress never goes back: %s" % progress[:20])
    check(final["step"] == "done" and final["error"] is None, "status: done (%s, %s)" % (final["step"], final["error"]))
    total = final["progress"]["total"]
    sched = [line.split()[1] for line in final["log"] if line.split()[:1] == ["schedule"]]
    check(total > 1 and sched == [str(total)] and final["progress"]["done"] == total,
          "progress reached %s/%s steps (the schedule line says %s)" % (final["progress"]["done"], total, sched))
    check(any("step" in line and "loss" in line for line in final["log"]), "the log holds the training lines")
    check(final["checkpoint"] == "needle_tuned.cact", "checkpoint named: %s" % final["checkpoint"])
    check(set(final["downloads"]) == {"needle_playground_data.jsonl", "needle_playground_lora.pkl",
                                      "needle_tuned.cact"}, "downloads listed: %s" % final["downloads"])
    status, model = pg.json("GET", "/model")
    check(model.get("name") == "needle_tuned.cact", "the tuned archive is hot-loaded: %s" % model)
    status, env = pg.json("POST", "/complete", {"tools": tools, "query": "What's the weather in Paris?"})
    check(status == 200 and env.get("success") is True, "the tuned model answers")
    status, ctype, data = pg.request("GET", "/download/needle_tuned.cact")
    on_disk = open(os.path.join(pg.workdir, "needle_tuned.cact"), "rb").read()
    check(status == 200 and data == on_disk and len(data) > 1000,
          "GET /download/needle_tuned.cact: %d bytes, identical to the built file" % len(data))
    status, _, data = pg.request("GET", "/download/needle_playground_data.jsonl")
    check(status == 200 and data.decode().splitlines() == examples, "the examples file round-trips")
    # a failed fine-tune reports its error and keeps the model
    status, body = pg.json("POST", "/finetune", {"examples": '{"query": 1}', "epochs": 1})
    check(status == 200, "a fine-tune on a bad example starts (%d)" % status)
    final = wait_until(lambda: (lambda s: s if not s["running"] else None)(pg.json("GET", "/finetune/status")[1]), 120)
    check(final and final["step"] == "failed" and final["error"], "it fails with an error: %s" % (final and final["error"]))
    status, model = pg.json("GET", "/model")
    check(model.get("name") == "needle_tuned.cact", "the model stays after a failed fine-tune")


def run_generate(pg, srv):
    """upstream's flow: tools + api_key + samples -> generate-data -> train -> build -> load"""
    status, body = pg.json("POST", "/finetune", {"tools": GEN_TOOLS, "api_key": KEY, "samples": 0})
    check(status == 400 and "samples" in body.get("error", ""), "samples 0 -> 400: %s" % body.get("error"))
    status, body = pg.json("POST", "/finetune", {"tools": [], "api_key": KEY})
    check(status == 400 and "tools" in body.get("error", ""), "no tools to generate for -> 400: %s" % body.get("error"))
    req = {"tools": GEN_TOOLS, "api_key": KEY, "samples": 3, "epochs": 1, "batch_size": 2, "max_len": 256}
    status, body = pg.json("POST", "/finetune", req)
    check(status == 200 and body == {"ok": True}, "POST /finetune with api_key + tools starts (%d %s)" % (status, body))
    seen = []

    def finished():
        _, s = pg.json("GET", "/finetune/status")
        seen.append(s)
        return s if not s["running"] else None

    final = wait_until(finished, 600, 0.1)
    check(final is not None and final["step"] == "done",
          "generate -> fine-tune -> build -> load: %s %s" % (final and final["step"], final and final["error"]))
    if not final:
        return
    print("steps seen: %s" % sorted({s["step"] for s in seen}))
    check(not srv.errors, "the chat service saw well-formed requests with the key: %s" % srv.errors[:3])
    check(any("kept" in line for line in final["log"]), "the log holds generate-data's summary")
    status, _, data = pg.request("GET", "/download/needle_playground_data.jsonl")
    rows = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
    check(status == 200 and sorted(r["query"] for r in rows) == sorted(g["query"] for g in GENERATED),
          "the generated examples were trained on: %s" % [r.get("query") for r in rows])
    status, model = pg.json("GET", "/model")
    check(model.get("name") == "needle_tuned.cact", "hot-loaded after generation")
    leaked = [s for s in seen if KEY in json.dumps(s)]
    check(not leaked, "the API key never shows in the status")
    for name in final["downloads"]:
        check(KEY.encode() not in pg.request("GET", "/download/" + name)[2], "key not in %s" % name)


def run_generate_echo(pg, srv):
    """A chat service that quotes the key in its 401 body, placed so that
    generate-data's 160-byte cut of that body falls inside the key: the job
    fails, and its log (generate-data's own lines) holds no 4-byte start of
    the key."""
    k = len(KEY)
    for pad in (160 - k + 1, 160 - k // 2, 156):
        with srv.lock:
            srv.script[:0] = [("echo", 401, pad, "{key} and more")]
        req = {"tools": GEN_TOOLS, "api_key": KEY, "samples": 1}
        status, body = pg.json("POST", "/finetune", req)
        check(status == 200, "a fine-tune against an echoing service starts (%d %s)" % (status, body))
        final = wait_until(lambda: (lambda s: s if not s["running"] else None)(pg.json("GET", "/finetune/status")[1]), 120)
        check(final and final["step"] == "failed", "it fails: %s" % (final and final["step"]))
        log = "\n".join(final["log"]) if final else ""
        check("HTTP 401" in log, "the log holds the 401 (pad %d)" % pad)
        leaked = [KEY[:n] for n in range(4, k + 1) if KEY[:n] in json.dumps(final)]
        check(not leaked, "no start of the key in the job status (pad %d): %s" % (pad, leaked[-1:]))


if __name__ == "__main__":
    sys.exit(main())
