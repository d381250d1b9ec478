#!/usr/bin/python3
"""The playground page in a real browser: headless Chromium (Debian
`chromium`) driven over the DevTools protocol with a minimal stdlib
websocket client. Loads the page, declares a tool through the form, sends
a query, waits for the call envelope to render and checks it against the
same query asked over HTTP; the screenshot is kept in the build directory
(test_output/playground_browser.png). Then uploads a bad and a good .cact
through the file input, and runs fine-tune -> build -> hot-load from the
page (test_output/playground_browser_finetune.png). Fails when the envelope
does not render. Exit 77 (skip) only when chromium is not installed."""
import base64
import http.server
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from playground_util import BUILD, SKIP, SRC, Playground, tiny_model, wait_until  # noqa: E402

TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                   "required": ["location"]},
}
QUERY = "What's the weather in Paris?"


class WebSocket:
    """RFC 6455 client, just enough for DevTools: masked text frames out,
    (possibly fragmented) text frames in."""

    def __init__(self, url):
        rest = url.split("://", 1)[1]
        hostport, path = rest.split("/", 1)
        host, port = hostport.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(("GET /%s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n" % (path, hostport, key)).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise RuntimeError("websocket: closed during handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError("websocket handshake refused: %r" % head)

    def _exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise RuntimeError("websocket: connection closed")
            buf += chunk
        return buf

    def send(self, text):
        data = text.encode()
        n = len(data)
        head = bytes([0x81])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def recv(self):
        message = b""
        while True:
            b0, b1 = self._exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            payload = self._exact(n)
            opcode = b0 & 0x0F
            if opcode == 0x8:
                raise RuntimeError("websocket: closed by the browser")
            if opcode in (0x9, 0xA):  # ping/pong: not used by DevTools
                continue
            message += payload
            if b0 & 0x80:
                return message.decode()


class DevTools:
    def __init__(self, ws_url):
        self.ws = WebSocket(ws_url)
        self.next_id = 0
        self.exceptions = []

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("method") == "Runtime.exceptionThrown":
                self.exceptions.append(msg["params"]["exceptionDetails"])
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError("%s: %s" % (method, msg["error"]))
                return msg["result"]

    def js(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError("page script failed: %s" % r["exceptionDetails"])
        return r["result"].get("value")


def save_screenshot(dt, path, check):
    png = base64.b64decode(dt.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"])
    with open(path + ".tmp", "wb") as f:
        f.write(png)
    os.replace(path + ".tmp", path)
    check(png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000,
          "screenshot kept: %s (%d bytes)" % (path, len(png)))


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def stop_chromium(proc):
    """SIGTERM the browser's process group, SIGKILL what is left: its helpers
    (renderer, crashpad) can outlive the main process and still write to the
    profile while the temporary directory is being removed (seen in CI:
    'Directory not empty: Default')."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
        # helpers reparented away from us: wait until the group is gone (a
        # zombie nobody reaps keeps it "alive" but writes nothing)
        wait_until(lambda: not group_alive(proc.pid), wait)
    if proc.poll() is None:
        proc.wait()


def start_chromium(exe, tmp):
    profile = os.path.join(tmp, "chrome-profile")
    args = [exe, "--headless=new", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
            "--disable-dev-shm-usage", "--disable-extensions", "--user-data-dir=" + profile,
            "--remote-debugging-port=0", "--window-size=1280,900",
            # a stand-in for DNS (rebinding): evil.test is this machine
            "--host-resolver-rules=MAP evil.test 127.0.0.1", "about:blank"]
    if os.geteuid() == 0:
        args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    log = open(os.path.join(tmp, "chromium.log"), "w")
    # its own process group: stop_chromium ends its helpers too
    proc = subprocess.Popen(args, stdout=log, stderr=log, start_new_session=True)
    port_file = os.path.join(profile, "DevToolsActivePort")
    if not wait_until(lambda: os.path.exists(port_file) and open(port_file).read().count("\n") >= 1, 60):
        stop_chromium(proc)
        raise SystemExit("chromium did not open its DevTools port; see " + log.name)
    port = int(open(port_file).read().split()[0])
    targets = json.load(urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port, timeout=30))
    page = [t for t in targets if t.get("type") == "page"][0]
    return proc, page["webSocketDebuggerUrl"]


ATTACK_PAGE = """<!doctype html><html><body><script>
window.results = [];
(async () => {
  const pg = "%(pg)s";
  const body = JSON.stringify({examples: %(examples)s, epochs: 1000, batch_size: 1});
  const archive = await (await fetch("/evil.cact")).blob();
  const tries = [
    // simple requests: sent without a CORS preflight
    () => fetch(pg + "/finetune", {method: "POST", mode: "no-cors",
                                   headers: {"Content-Type": "text/plain"}, body}),
    () => fetch(pg + "/finetune", {method: "POST", mode: "no-cors", body: new Blob([body])}),
    () => fetch(pg + "/load-model", {method: "POST", mode: "no-cors", body: archive}),
    () => fetch(pg + "/load-model", {method: "POST", mode: "no-cors",
                                     headers: {"Content-Type": "text/plain"}, body: archive}),
    // JSON: needs a preflight the playground never grants
    () => fetch(pg + "/finetune", {method: "POST", headers: {"Content-Type": "application/json"}, body}),
  ];
  for (const t of tries) {
    try { const r = await t(); window.results.push("sent " + r.type); }
    catch (e) { window.results.push("blocked " + e); }
  }
  window.done = true;
})();
</script></body></html>"""


class AttackSite:
    """The other origin: serves the attack page and the archive it uploads."""

    def __init__(self, page, archive):
        files = {"/attack.html": (page.encode(), "text/html"), "/evil.cact": (archive, "application/octet-stream")}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body, ctype = files.get(self.path, (b"not found", "text/plain"))
                self.send_response(200 if self.path in files else 404)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def hostile_checks(dt, pg, cact, check):
    examples = open(os.path.join(SRC, "examples", "data.jsonl")).read().splitlines()[:4]
    page = ATTACK_PAGE % {"pg": pg.url, "examples": json.dumps("\n".join(examples))}
    site = AttackSite(page, open(cact, "rb").read())
    try:
        dt.call("Page.navigate", url="http://evil.test:%d/attack.html" % site.port)
        done = wait_until(lambda: dt.js("window.done === true"), 60)
        results = dt.js("window.results")
        print("attack page fetches:", results)
        check(done and len(results) == 5, "the attack page ran its cross-origin POSTs: %s" % results)
        time.sleep(1)
        _, st = pg.json("GET", "/finetune/status")
        check(not st["running"] and not st["log"] and not st["step"],
              "no fine-tune was started from the other origin (%s, %d log lines)" % (st["step"], len(st["log"])))
        _, model = pg.json("GET", "/model")
        check(model.get("name") == "tiny.cact", "the model was not swapped from the other origin: %s" % model.get("name"))
    finally:
        site.close()
    # DNS rebinding: the browser thinks evil.test:PORT is the attacker's
    # own origin and may read it; the playground must not answer it
    dt.call("Page.navigate", url="http://evil.test:%d/finetune/status" % pg.port)
    text = wait_until(lambda: dt.js("document.readyState === 'complete' && document.body && document.body.textContent"), 30)
    check(text and "Host" in text and "running" not in text,
          "a rebinding name gets a refusal, not the status: %r" % (text or "")[:160])


def main():
    exe = shutil.which("chromium")
    if not exe:
        print("SKIP: chromium is not installed (Debian package `chromium`; tools/deps.sh --test)")
        return SKIP
    out_dir = os.path.join(BUILD, "test_output")
    os.makedirs(out_dir, exist_ok=True)
    shot = os.path.join(out_dir, "playground_browser.png")
    for old in (shot, os.path.join(out_dir, "playground_browser_finetune.png")):
        if os.path.exists(old):
            os.unlink(old)  # never pass on a stale screenshot
    fails = []

    def check(cond, msg):
        print(("ok:   " if cond else "FAIL: ") + msg)
        if not cond:
            fails.append(msg)

    with tempfile.TemporaryDirectory() as tmp:
        base, cact = tiny_model(tmp)
        pg = Playground(tmp, base, cact)
        browser = None
        try:
            browser, ws_url = start_chromium(exe, tmp)
            dt = DevTools(ws_url)
            dt.call("Runtime.enable")
            dt.call("Page.enable")
            hostile_checks(dt, pg, cact, check)
            dt.call("Page.navigate", url=pg.url + "/")
            model = wait_until(lambda: (lambda t: t if t and t != "…" else None)(
                dt.js("document.readyState === 'complete' && "
                      "document.getElementById('model-name').textContent")), 30)
            check(model == "tiny.cact", "page loaded, header names the model (%r)" % model)

            # declare the tool through the form
            dt.js("""(() => {
                document.getElementById('tool-name').value = %s;
                document.getElementById('tool-desc').value = %s;
                document.getElementById('tool-params').value = %s;
                document.getElementById('add-tool').click();
            })()""" % (json.dumps(TOOL["name"]), json.dumps(TOOL["description"]),
                       json.dumps(json.dumps(TOOL["parameters"]))))
            listed = dt.js("document.getElementById('tool-list').textContent")
            declared = json.loads(dt.js("document.getElementById('tools-json').value"))
            check(TOOL["name"] in (listed or "") and declared == [TOOL],
                  "tool declared through the form: %s" % declared)

            # ask, and wait for the envelope to render
            dt.js("""(() => {
                document.getElementById('query').value = %s;
                document.getElementById('require-call').checked = true;
                document.getElementById('send').click();
            })()""" % json.dumps(QUERY))
            text = wait_until(lambda: dt.js(
                "(e => e && e.textContent)(document.querySelector('#chat .assistant pre.envelope'))"), 60)
            check(bool(text), "the envelope rendered in the chat")
            if text:
                env = json.loads(text)
                print("rendered envelope:", json.dumps(env)[:300])
                check(env.get("success") is True and env.get("type") == "call",
                      "rendered envelope: success, a call (tool_choice required): %s" % env.get("type"))
                check(env.get("function_calls")
                      and all(c["name"] == TOOL["name"] for c in env["function_calls"]),
                      "the call names the declared tool")
                calls = dt.js("[...document.querySelectorAll('#chat .assistant .call')].length")
                check(calls == len(env.get("function_calls", [])) and calls > 0,
                      "one rendered call line per function call (%s)" % calls)
                user = dt.js("document.querySelector('#chat .user').textContent")
                check(user == QUERY, "the query shows in the chat")
                # the same question over HTTP: the page showed the server's answer
                _, direct = pg.json("POST", "/complete", {"tools": [TOOL], "query": QUERY,
                                                           "tool_choice": "required"})
                for key in ("type", "function_calls", "reasoning", "success"):
                    check(env.get(key) == direct.get(key), "rendered %s matches the server's" % key)
            save_screenshot(dt, shot, check)

            # upload through the file input: a bad file is refused on the page
            bad = os.path.join(tmp, "bad.cact")
            with open(bad, "wb") as f:
                f.write(b"not an archive")
            for path, want in ((bad, "not loaded"), (cact, "loaded tiny.cact")):
                root = dt.call("DOM.getDocument")["root"]["nodeId"]
                node = dt.call("DOM.querySelector", nodeId=root, selector="#cact-file")["nodeId"]
                dt.call("DOM.setFileInputFiles", files=[path], nodeId=node)
                dt.js("document.getElementById('upload-status').textContent = ''")
                dt.js("document.getElementById('upload').click()")
                status = wait_until(lambda: dt.js("document.getElementById('upload-status').textContent"
                                                  ".replace(/^loading.*/, '')"), 30)
                check(status and want in status, "upload %s on the page: %r" % (os.path.basename(path), status))

            # fine-tune -> build -> hot-load from the page, with progress
            examples = open(os.path.join(SRC, "examples", "data.jsonl")).read().splitlines()[:6]
            dt.js("""(() => {
                document.getElementById('ft-examples').value = %s;
                document.getElementById('ft-epochs').value = '2';
                document.getElementById('ft-batch').value = '2';
                document.getElementById('ft-lr').value = '0.01';
                document.getElementById('ft-start').click();
            })()""" % json.dumps("\n".join(examples)))
            done = wait_until(lambda: (lambda t: t if "done" in t or "failed" in t else None)(
                dt.js("document.getElementById('ft-step').textContent") or ""), 300, 0.5)
            check(done == "step: done", "the page shows the fine-tune finishing: %r" % done)
            prog = dt.js("[document.getElementById('ft-progress').value, document.getElementById('ft-progress').max]")
            check(prog and prog[0] == prog[1] and prog[1] > 1, "progress bar full: %s" % prog)
            name = wait_until(lambda: (lambda t: t if t == "needle_tuned.cact" else None)(
                dt.js("document.getElementById('model-name').textContent")), 10)
            check(name == "needle_tuned.cact", "header names the hot-loaded archive: %r" % name)
            links = dt.js("[...document.querySelectorAll('#ft-downloads a')].map(a => a.textContent)")
            check(links and "needle_tuned.cact" in links, "download links: %s" % links)
            check(not dt.exceptions, "no uncaught page exceptions (%d)" % len(dt.exceptions))
            save_screenshot(dt, os.path.join(out_dir, "playground_browser_finetune.png"), check)
        finally:
            if browser:
                stop_chromium(browser)
            rc = pg.stop()
        check(rc == 0, "playground exits 0 on SIGINT")
    if fails:
        print("%d check(s) failed" % len(fails))
        return 1
    print("playground browser: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
