#!/usr/bin/python3
"""A small stand-in for the Hugging Face Hub's file endpoints on 127.0.0.1
(random port), for tests/test_download.py:

  GET /{org}/{repo}/resolve/{revision}/{path}
      small files: 200 with ETag (git blob sha1, as the Hub) and Content-Length;
      LFS files: 302 to /cdn/{sha256} with X-Linked-Size and X-Linked-Etag
      (the sha256), as the Hub redirects to its CDN;
      unknown: 404 with X-Error-Code: EntryNotFound.
  GET /api/models/{org}/{repo}/revision/{rev}: {"siblings": [{"rfilename"}]}.
  GET /cdn/{key}: the LFS bytes; Range "bytes=N-" answered with 206 (416
      past the end).

Files are registered with their behaviour: lfs, bad_sha (advertise a wrong
sha256, or a wrong git blob id outside LFS), drop_once (the first CDN transfer closes the connection halfway),
no_range (answer Range requests with a plain 200). Every request's path,
Range and Authorization header is logged.
"""
import hashlib
import http.server
import json
import threading


class Hub:
    def __init__(self):
        self.files = {}  # (repo, path) -> dict(data=, lfs=, bad_sha=, drop_once=, no_range=)
        self.log = []    # (method, path, range, authorization)
        self.lock = threading.Lock()
        self.server = None

    def add(self, repo, path, data, **flags):
        self.files[(repo, path)] = dict(data=data, **flags)

    def start(self):
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                with hub.lock:
                    hub.log.append(("GET", self.path, self.headers.get("Range"),
                                    self.headers.get("Authorization")))
                if self.path.startswith("/cdn/"):
                    return self.cdn(self.path[5:].split("?")[0])
                if self.path.startswith("/api/models/"):
                    # /api/models/{org}/{repo}/revision/{rev}: the file list
                    p = self.path.split("/")
                    repo = p[3] + "/" + p[4]
                    names = [path for (r, path) in hub.files if r == repo]
                    if not names:
                        return self.plain(404, b'{"error": "Repository not found"}', {})
                    body = json.dumps({"id": repo, "siblings": [{"rfilename": n}
                                                                for n in names]}).encode()
                    return self.plain(200, body, {"Content-Type": "application/json"})
                parts = self.path.split("/", 5)
                # ['', org, repo, 'resolve', rev, path]
                if len(parts) < 6 or parts[3] != "resolve":
                    return self.plain(404, b"not found", {"X-Error-Code": "RepoNotFound"})
                repo, path = parts[1] + "/" + parts[2], parts[5]
                f = hub.files.get((repo, path))
                if not f:
                    return self.plain(404, b"Entry not found", {"X-Error-Code": "EntryNotFound"})
                data = f["data"]
                if f.get("lfs"):
                    sha = hashlib.sha256(data).hexdigest()
                    key = "%s-%s" % (repo.replace("/", "_"), path.replace("/", "_"))
                    adv = ("0" * 64) if f.get("bad_sha") else sha
                    self.send_response(302)
                    self.send_header("Location", "/cdn/%s?sig=x" % key)
                    self.send_header("X-Linked-Size", str(len(data)))
                    self.send_header("X-Linked-Etag", '"%s"' % adv)
                    self.send_header("ETag", '"%s"' % adv)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                blob = b"blob %d\0" % len(data) + data
                etag = hashlib.sha1(blob).hexdigest()
                if f.get("bad_sha"):
                    etag = "1" * 40
                return self.body(f, data, {"ETag": '"%s"' % etag})

            def cdn(self, key):
                for (repo, path), f in hub.files.items():
                    if "%s-%s" % (repo.replace("/", "_"), path.replace("/", "_")) == key:
                        return self.body(f, f["data"], {})
                return self.plain(404, b"no such object", {})

            def body(self, f, data, extra):
                start = 0
                rng = self.headers.get("Range")
                if rng and not f.get("no_range"):
                    start = int(rng.split("=")[1].split("-")[0])
                    if start >= len(data):
                        return self.plain(416, b"range not satisfiable",
                                          {"Content-Range": "bytes */%d" % len(data)})
                    self.send_response(206)
                    self.send_header("Content-Range",
                                     "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
                else:
                    self.send_response(200)
                for k, v in extra.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                chunk = data[start:]
                if f.get("drop_once"):
                    f["drop_once"] = False
                    self.wfile.write(chunk[:len(chunk) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(chunk)

            def plain(self, code, msg, extra):
                self.send_response(code)
                for k, v in extra.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def stop(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()


if __name__ == "__main__":
    import sys
    import time
    h = Hub()
    h.add("org/repo", "hello.txt", b"hello\n")
    h.add("org/repo", "big.bin", bytes(range(256)) * 4096, lfs=True)
    print(h.start(), flush=True)
    try:
        time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 3600)
    finally:
        h.stop()
