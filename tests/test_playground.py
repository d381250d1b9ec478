#!/usr/bin/python3
"""`needle playground` over HTTP (stdlib client) on a tiny model built by
our own CLI: every route (/, /model, /complete, /reset, /load-model,
/finetune, /finetune/status, /download/NAME), a bad upload answering 400
while the loaded model keeps answering, path traversal refused, oversize
bodies refused (413), a second fine-tune while one runs refused (409), a
small fine-tune run to completion with progress in the status, the tuned
archive hot-loaded and downloadable, and a clean exit on SIGINT. Exit 77
(skip) only when the binary was built without libmicrohttpd."""
import json
import os
import socket
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from playground_util import SRC, Playground, tiny_model, wait_until  # noqa: E402
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
    try:
        s.sendall(data)
        got = b""
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
                run(pg, tools, names, examples, cact)
                run_generate(pg, srv)
            finally:
                rc = pg.stop()
            check(rc == 0, "SIGINT: clean exit 0 (got %r)" % rc)
            err = open(os.path.join(tmp, "playground.err")).read()
            check(KEY not in err, "the API key is not in the server's output")
    if FAIL:
        print("%d check(s) failed" % len(FAIL))
        return 1
    print("playground: ok")
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
