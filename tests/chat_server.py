"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1 (a
random port) for the generate-data tests; no network is needed.

Each POST takes the next step of the script, in arrival order:
  ("reply", text)              200, choices[0].message.content = text
  ("status", code, headers, body)  that status, headers and raw body
  ("raw", body)                200 with this raw body (e.g. malformed JSON)
Misbehaving ones:
  ("echo", code, pad, fmt)     pad "x"s then fmt.format(key=the expected key,
                               auth=the Authorization header received): as
                               the raw body of status `code`, or for 200 as
                               {"error": {"message": ...}} -- a server that
                               quotes the secret at any offset
  ("huge", nbytes, sized)      200 whose body is nbytes long (a reply whose
                               content is "aaa..."), with a Content-Length
                               when `sized`, else read until the server
                               closes; written in 1 MiB pieces
Once the script is used up every request gets ("reply", "[]"). Every
request is checked (Authorization bearer key, JSON body with model and
system + user messages); problems are collected in .errors.
"""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ChatServer:
    def __init__(self, key, model, script, delay=0.0):
        self.key, self.model, self.script = key, model, list(script)
        self.delay = delay
        self.lock = threading.Lock()
        self.requests = []  # (time, step) per request
        self.errors = []
        self.active = self.max_active = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                with server.lock:
                    server.active += 1
                    server.max_active = max(server.max_active, server.active)
                    step = server.script.pop(0) if server.script else ("reply", "[]")
                    server.requests.append((time.monotonic(), step[0]))
                    server.check(self.headers, body)
                if server.delay:
                    time.sleep(server.delay)
                # no longer in flight once the answer starts: the client may
                # send its next request as soon as it has read this one
                with server.lock:
                    server.active -= 1
                if self.headers.get("Authorization") != "Bearer " + server.key:
                    # echo what came, so the test sees that needle hides it
                    step = ("status", 401, {}, "bad key: "
                            + str(self.headers.get("Authorization")))
                self.answer(step)

            def answer(self, step):
                if step[0] == "echo":
                    text = "x" * step[2] + step[3].format(
                        key=server.key, auth=str(self.headers.get("Authorization")))
                    if step[1] == 200:
                        text = json.dumps({"error": {"message": text}})
                    self.send(step[1], {"Content-Type": "application/json"}, text)
                elif step[0] == "huge":
                    self.send_huge(step[1], step[2])
                elif step[0] == "reply":
                    payload = json.dumps({"id": "x", "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": step[1]}}]})
                    self.send(200, {"Content-Type": "application/json"}, payload)
                elif step[0] == "raw":
                    self.send(200, {"Content-Type": "application/json"}, step[1])
                else:
                    self.send(step[1], step[2], step[3])

            def send_huge(self, nbytes, sized):
                head, tail = b'{"choices": [{"message": {"content": "', b'"}}]}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if sized:
                    self.send_header("Content-Length", str(nbytes))
                self.end_headers()
                piece = b"a" * (1 << 20)
                left = nbytes
                try:
                    self.wfile.write(head)
                    left -= len(head) + len(tail)
                    while left > 0:
                        n = min(left, len(piece))
                        self.wfile.write(piece[:n])
                        left -= n
                    self.wfile.write(tail)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # needle hangs up once the reply is over its limit
                self.close_connection = True

            def send(self, code, headers, text):
                data = text.encode("utf-8")
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # needle hangs up on requests it no longer needs

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d/api/v1/chat/completions" % self.httpd.server_port
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def check(self, headers, body):
        if headers.get("Content-Type") != "application/json":
            self.errors.append("Content-Type: %r" % headers.get("Content-Type"))
        try:
            req = json.loads(body)
        except ValueError as exc:
            self.errors.append("body is not JSON: %s" % exc)
            return
        if req.get("model") != self.model:
            self.errors.append("model %r" % req.get("model"))
        msgs = req.get("messages")
        if (not isinstance(msgs, list) or len(msgs) != 2 or msgs[0].get("role") != "system"
                or msgs[1].get("role") != "user"):
            self.errors.append("messages %r" % msgs)
        elif "JSON array" not in msgs[1]["content"] or '"answers"' not in msgs[1]["content"]:
            self.errors.append("user prompt lacks the reply format")
        self.last_prompt = msgs[1]["content"] if isinstance(msgs, list) and len(msgs) > 1 else ""

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
