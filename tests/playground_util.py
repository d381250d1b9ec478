"""Shared by tests/test_playground.py and tests/test_playground_browser.py:
a tiny model built with our own CLI, a `needle playground` on a free
loopback port, and small HTTP helpers (stdlib only)."""
import http.client
import json
import os
import signal
import subprocess
import sys
import time

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build")
NEEDLE = os.environ.get("NEEDLE") or os.path.join(BUILD, "needle")
TOKENIZER = os.path.join(SRC, "models", "tokenizer.model")
SKIP = 77


def sh(*args):
    p = subprocess.run([NEEDLE] + [str(a) for a in args], capture_output=True)
    if p.returncode:
        raise SystemExit("needle %s: %s" % (args, p.stderr.decode()))


def tiny_model(tmp):
    """`needle init --preset tiny` + `needle build` with the repo tokenizer."""
    base = os.path.join(tmp, "base.pkl")
    cact = os.path.join(tmp, "tiny.cact")
    sh("init", base, "--preset", "tiny", "--max-seq-len", "256", "--seed", "3")
    sh("build", base, "--tokenizer", TOKENIZER, "--out", cact)
    return base, cact


class Playground:
    """`needle playground` on port 0 (the kernel picks a free one); the
    port is read from its "ready" line."""

    def __init__(self, tmp, base, cact, *extra, env=None):
        self.workdir = os.path.join(tmp, "work")
        os.makedirs(self.workdir, exist_ok=True)
        self.err = open(os.path.join(tmp, "playground.err"), "w+")
        self.proc = subprocess.Popen(
            [NEEDLE, "playground", "--weights", cact, "--port", "0", "--base", base,
             "--tokenizer", TOKENIZER, "--workdir", self.workdir, "--max-new-tokens", "24"]
            + list(extra), stdout=subprocess.PIPE, stderr=self.err, text=True, env=env)
        line = self.proc.stdout.readline()
        if "ready: http://" not in line:
            self.proc.wait(timeout=10)
            self.err.seek(0)
            why = self.err.read()
            if "no playground" in why:
                print("SKIP: this needle was built without libmicrohttpd:", why.strip())
                sys.exit(SKIP)
            raise SystemExit("playground did not start: %r %s" % (line, why))
        hostport = line.split("http://", 1)[1].split()[0]
        self.host, port = hostport.rsplit(":", 1)
        self.port = int(port)
        self.url = "http://%s:%d" % (self.host, self.port)
        self.hostport = "%s:%d" % (self.host, self.port)  # what its Host header must say

    def request(self, method, path, body=None, headers=None, timeout=120):
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        h = dict(headers or {})
        if body is not None and not isinstance(body, (bytes, bytearray)):
            body = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        if method == "POST" and not any(k.lower() == "content-type" for k in h):
            # the server takes POSTs only with these types (cross-site
            # pages cannot send them without a CORS preflight)
            h["Content-Type"] = "application/octet-stream" if body else "application/json"
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, r.getheader("Content-Type") or "", data

    def json(self, method, path, body=None, headers=None):
        status, _, data = self.request(method, path, body, headers)
        return status, json.loads(data)

    def stop(self, timeout=20):
        """SIGINT, as Ctrl-C; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode


def wait_until(fn, timeout, step=0.2):
    end = time.time() + timeout
    while time.time() < end:
        v = fn()
        if v:
            return v
        time.sleep(step)
    return None
