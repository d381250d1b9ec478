#!/usr/bin/python3
"""A small stand-in for the Hugging Face Hub's file endpoints on 127.0.0.1
(random port), for tests/test_download.py:

  GET /{org}/{repo}/resolve/{revision}/{path}
      small files: 200 with ETag (git blob sha1, as the Hub) and Content-Length;
      LFS files: 302 to /cdn/{key} with X-Linked-Size and X-Linked-Etag
      (the sha256), as the Hub redirects to its CDN;
      unknown: 404 with X-Error-Code: EntryNotFound.
  GET /api/models/{org}/{repo}/revision/{rev}: {"siblings": [{"rfilename"}]},
      or what hub.listings[repo] says (raw bytes, ("huge", n): n bytes of
      JSON padding, ("trickle",): 2.5 KB/s that never ends, ("status", code,
      body), ("redirect", url)).
  GET /cdn/{key}: the LFS bytes (ETag "cdn-..."); Range "bytes=N-" answered
      with 206 (416 past the end), If-Range honoured.

Files are registered with their behaviour (flags):
  lfs            behind a 302 to the CDN
  bad_sha        advertise a wrong sha256 (a wrong git blob id outside LFS)
  drop_once      the first body transfer closes the connection halfway
  drop_at=N      ... after N bytes instead
  no_range       answer Range requests with a plain 200
  always_416     answer every Range request with 416 "bytes */SIZE"
  opaque_etag    ETag "v{version}" (no checksum) instead of the blob id
  version=N      for opaque_etag (a changed file: add it again, version 2)
  no_validator   neither ETag nor Last-Modified on the body's response
  lastmod=DATE   Last-Modified DATE instead of an ETag
  ignore_if_range  serve the Range even when If-Range does not match
  stall=N        send the headers and N bytes, then hold the connection
  size_claim=N   state N as the size (Content-Length, X-Linked-Size for LFS)
  cdn_claim=SHA  the CDN's answer claims X-Linked-Etag/ETag SHA (True: the
                 real sha256)
  redirect=URL   the resolve URL answers 302 to URL
  error_body=B   the resolve URL answers 500 with body B
Every request's method, path, Range, Authorization and If-Range header is
logged (hub.log).
"""
import hashlib
import http.server
import json
import threading


class Hub:
    def __init__(self):
        self.files = {}  # (repo, path) -> dict(data=, flags...)
        self.listings = {}  # repo -> override of the listing answer
        self.log = []    # (method, path, range, authorization, if-range)
        self.lock = threading.Lock()
        self.server = None
        self.release = threading.Event()  # ends stalls

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
                                    self.headers.get("Authorization"),
                                    self.headers.get("If-Range")))
                try:
                    self.route()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client hung up (a refused download)

            def route(self):
                if self.path.startswith("/cdn/"):
                    return self.cdn(self.path[5:].split("?")[0])
                if self.path.startswith("/api/models/"):
                    # /api/models/{org}/{repo}/revision/{rev}: the file list
                    p = self.path.split("/")
                    repo = p[3] + "/" + p[4]
                    if repo in hub.listings:
                        return self.listing(hub.listings[repo])
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
                if f.get("redirect"):
                    return self.plain(302, b"", {"Location": f["redirect"]})
                if f.get("error_body") is not None:
                    return self.plain(500, f["error_body"], {})
                data = f["data"]
                if f.get("lfs"):
                    sha = hashlib.sha256(data).hexdigest()
                    adv = ("0" * 64) if f.get("bad_sha") else sha
                    self.send_response(302)
                    self.send_header("Location", "/cdn/%s?sig=x" % key_of(repo, path))
                    self.send_header("X-Linked-Size", str(f.get("size_claim", len(data))))
                    self.send_header("X-Linked-Etag", '"%s"' % adv)
                    self.send_header("ETag", '"%s"' % adv)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                blob = b"blob %d\0" % len(data) + data
                etag = hashlib.sha1(blob).hexdigest()
                if f.get("bad_sha"):
                    etag = "1" * 40
                return self.body(f, data, self.validators(f, '"%s"' % etag))

            def validators(self, f, etag):
                if f.get("no_validator"):
                    return {}
                if f.get("lastmod"):
                    return {"Last-Modified": f["lastmod"]}
                if f.get("opaque_etag"):
                    return {"ETag": '"v%d"' % f.get("version", 1)}
                return {"ETag": etag}

            def listing(self, how):
                if isinstance(how, bytes):
                    return self.plain(200, how, {"Content-Type": "application/json"})
                if how[0] == "status":
                    return self.plain(how[1], how[2], {})
                if how[0] == "redirect":
                    return self.plain(302, b"", {"Location": how[1]})
                if how[0] == "trickle":  # 256 bytes every 0.1 s, never done
                    self.send_response(200)
                    self.send_header("Content-Length", str(1 << 30))
                    self.end_headers()
                    self.wfile.write(b'{"siblings": [], "pad": "')
                    for _ in range(300):  # 30 s at most
                        if hub.release.wait(0.1):
                            return
                        self.wfile.write(b" " * 256)
                        self.wfile.flush()
                    return
                if how[0] == "huge":  # '{"siblings": [], "pad": "   ...   "}'
                    head, tail = b'{"siblings": [], "pad": "', b'"}'
                    n = how[1]
                    self.send_response(200)
                    self.send_header("Content-Length", str(n))
                    self.end_headers()
                    self.wfile.write(head)
                    left = n - len(head) - len(tail)
                    chunk = b" " * (1 << 20)
                    while left > 0:
                        k = min(left, len(chunk))
                        self.wfile.write(chunk[:k])
                        left -= k
                    self.wfile.write(tail)

            def cdn(self, key):
                for (repo, path), f in hub.files.items():
                    if key_of(repo, path) == key:
                        extra = self.validators(
                            f, '"cdn-%s"' % hashlib.sha256(f["data"]).hexdigest()[:20])
                        claim = f.get("cdn_claim")
                        if claim:
                            sha = hashlib.sha256(f["data"]).hexdigest() if claim is True else claim
                            extra["X-Linked-Etag"] = '"%s"' % sha
                            extra["ETag"] = '"%s"' % sha
                        return self.body(f, f["data"], extra)
                return self.plain(404, b"no such object", {})

            def body(self, f, data, extra):
                start = 0
                rng = self.headers.get("Range")
                if_range = self.headers.get("If-Range")
                current = extra.get("ETag") or extra.get("Last-Modified")
                if rng and if_range is not None and if_range != current \
                        and not f.get("ignore_if_range"):
                    rng = None  # changed since: the whole file (RFC 9110 13.1.5)
                if rng and f.get("always_416"):
                    return self.plain(416, b"range not satisfiable",
                                      {"Content-Range": "bytes */%d" % len(data)})
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
                size = f.get("size_claim", len(data)) if not f.get("lfs") else len(data)
                self.send_header("Content-Length", str(size - start))
                self.end_headers()
                chunk = data[start:]
                if f.get("stall") is not None:
                    self.wfile.write(chunk[:f["stall"]])
                    self.wfile.flush()
                    hub.release.wait(60)
                    self.close_connection = True
                    return
                if f.get("drop_once") or f.get("drop_at"):
                    cut = f.pop("drop_at", None) or len(chunk) // 2
                    f["drop_once"] = False
                    self.wfile.write(chunk[:cut])
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
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def stop(self):
        self.release.set()
        if self.server:
            self.server.shutdown()
            self.server.server_close()


def key_of(repo, path):
    return "%s-%s" % (repo.replace("/", "_"), path.replace("/", "_"))


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
