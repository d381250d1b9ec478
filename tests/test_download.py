#!/usr/bin/python3
"""`needle download` and the automatic fetches against tests/hf_server.py (a
local stand-in for the Hub's resolve URLs; HF_ENDPOINT points at it):
small files, an LFS file behind a 302 to a CDN path, the token as a Bearer
header (never printed), a wrong sha256 (refused, nothing renamed into
place), a 404, a connection dropped mid-file (the next run resumes with a
Range request), a server that ignores Range, HF_HUB_OFFLINE, a revision
with a slash, and `build`/`run --checkpoint` fetching upstream's checkpoint
and tokenizer when they are missing.

Then a hostile server (run_hostile_cases): redirects to other protocols,
416 answers to a resume, a file changed between attempts (If-Range), a
server that stalls, control bytes and '..' in listed names and error pages,
a full disk and a size that cannot fit, a checksum claim changed after the
redirect, a listing over its size cap.
"""
import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "tests"))
import hf_server  # noqa: E402

NEEDLE = os.environ.get("NEEDLE") or os.path.join(SRC, "build", "needle")
TOK = os.path.join(SRC, "models", "tokenizer.model")
FAIL = []
TOKEN = "hf_test_secret_6d1f"


def check(cond, msg):
    print(("ok  " if cond else "FAIL") + " " + msg)
    if not cond:
        FAIL.append(msg)


def needle(endpoint, *args, cwd=None, env=None, timeout=300, preexec_fn=None):
    e = dict(os.environ)
    for k in ("HF_HUB_OFFLINE", "HF_TOKEN", "NEEDLE_TOKENIZER", "NEEDLE_HF_STALL_S", "http_proxy",
              "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy", "no_proxy",
              "NO_PROXY"):
        e.pop(k, None)
    e["HF_ENDPOINT"] = endpoint
    e.update(env or {})
    try:
        return subprocess.run([NEEDLE] + [str(a) for a in args], cwd=cwd, env=e,
                              capture_output=True, text=True, errors="surrogateescape",
                              timeout=timeout, preexec_fn=preexec_fn)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, -999, "", "(still running after %d s)" % timeout)


def main():
    hub = hf_server.Hub()
    small = b'{"model_type": "needle"}\n'
    big = hashlib.sha256(b"seed").digest() * 40000  # 1.28 MB
    hub.add("org/repo", "config.json", small)
    hub.add("org/repo", "weights/model.bin", big, lfs=True)
    hub.add("org/repo", "bad.bin", big[:5000], lfs=True, bad_sha=True)
    hub.add("org/repo", "drop.bin", big, lfs=True, drop_once=True)
    hub.add("org/repo", "norange.bin", big[:300000], no_range=True)
    ep = hub.start()
    tmp = tempfile.mkdtemp(prefix="needle_dl_")
    try:
        run_cases(hub, ep, tmp, small, big)
        run_hostile_cases(hub, ep, tmp, big)
    finally:
        hub.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if FAIL:
        print("%d failure(s)" % len(FAIL))
        sys.exit(1)
    print("all ok")


def read(path):
    with open(path, "rb") as f:
        return f.read()


def run_cases(hub, ep, tmp, small, big):
    d = os.path.join(tmp, "dl")
    p = needle(ep, "download", "--help")
    check(p.returncode == 0 and "HF_ENDPOINT" in p.stdout, "download --help")
    if "built without libcurl" in needle(ep, "download", "org/repo/config.json", "--dir", d).stderr:
        print("SKIP: this needle was built without libcurl")
        sys.exit(77)

    # libcurl is loaded only when a download needs it: the program does not
    # link it, and a missing library is a clear error that leaves no file
    ldd = subprocess.run(["ldd", NEEDLE], capture_output=True, text=True)
    check(ldd.returncode == 0 and "libcurl" not in ldd.stdout,
          "needle does not link libcurl (loaded on demand)")
    d0 = os.path.join(tmp, "nocurl")
    p = needle(ep, "download", "org/repo/config.json", "--dir", d0,
               env={"NEEDLE_LIBCURL": "/nonexistent/libcurl.so.4"})
    check(p.returncode != 0 and "cannot load libcurl" in p.stderr
          and not os.path.exists(os.path.join(d0, "config.json.part"))
          and not os.path.exists(os.path.join(d0, "config.json")),
          "missing libcurl: clear error, nothing written (%s)" % p.stderr.strip()[-200:])

    # small file, straight 200
    p = needle(ep, "download", "org/repo/config.json", "--dir", d)
    check(p.returncode == 0 and read(os.path.join(d, "config.json")) == small
          and "git blob id ok" in p.stderr, "small file downloaded, git blob ETag checked (%s)"
          % p.stderr.strip()[-200:])

    # LFS file: 302 to the CDN, size + sha256 checked, token as Bearer
    n0 = len(hub.log)
    p = needle(ep, "download", "org/repo/weights/model.bin", "--dir", d, env={"HF_TOKEN": TOKEN})
    dest = os.path.join(d, "weights", "model.bin")
    check(p.returncode == 0 and os.path.exists(dest) and read(dest) == big,
          "LFS file through the redirect (%s)" % p.stderr.strip()[-300:])
    check("sha256 ok" in p.stderr, "sha256 verified: " + p.stderr.strip().splitlines()[-1])
    paths = [r[1] for r in hub.log[n0:]]
    check(paths[:1] == ["/org/repo/resolve/main/weights/model.bin"]
          and any(x.startswith("/cdn/") for x in paths), "resolve URL, then the CDN: %s" % paths)
    check(hub.log[n0][3] == "Bearer " + TOKEN, "HF_TOKEN sent as the Bearer header")
    check(TOKEN not in p.stdout + p.stderr, "the token is never printed")
    check(not os.path.exists(dest + ".part"), "no .part left")
    check(any("fetch" in ln and "%" in ln for ln in p.stderr.splitlines()),
          "progress lines on a non-tty stderr")

    # wrong checksum: refused, nothing renamed into place
    p = needle(ep, "download", "org/repo/bad.bin", "--dir", d)
    check(p.returncode == 1 and "sha256" in p.stderr and "discarded" in p.stderr,
          "wrong sha256 refused: " + p.stderr.strip()[-200:])
    check(not os.path.exists(os.path.join(d, "bad.bin")) and
          not os.path.exists(os.path.join(d, "bad.bin.part")), "bad file neither renamed nor kept")

    # outside LFS the ETag is the git blob id: checked too
    hub.add("org/repo", "badetag.json", small, bad_sha=True)
    p = needle(ep, "download", "org/repo/badetag.json", "--dir", d)
    check(p.returncode == 1 and "git blob id" in p.stderr
          and not os.path.exists(os.path.join(d, "badetag.json")),
          "wrong git blob ETag refused: " + p.stderr.strip()[-160:])

    # 404
    p = needle(ep, "download", "org/repo/nope.bin", "--dir", d)
    check(p.returncode == 1 and "HTTP 404" in p.stderr and "/org/repo/resolve/main/nope.bin"
          in p.stderr, "404: clear error naming the URL: " + p.stderr.strip())
    check(not os.path.exists(os.path.join(d, "nope.bin.part")), "no .part after a 404")
    p = needle(ep, "download", "org/repo/sub/dir/nope.bin", "--dir", d)
    check(p.returncode == 1 and not os.path.exists(os.path.join(d, "sub")),
          "directories made for a 404 are taken back")

    # dropped connection: .part kept, the next run resumes with a Range
    p = needle(ep, "download", "org/repo/drop.bin", "--dir", d)
    part = os.path.join(d, "drop.bin.part")
    half = os.path.getsize(part) if os.path.exists(part) else -1
    check(p.returncode == 1 and 0 < half < len(big) and "resume" in p.stderr,
          "dropped mid-file: %d of %d bytes kept, says resume (%s)"
          % (half, len(big), p.stderr.strip()[-200:]))
    check(not os.path.exists(os.path.join(d, "drop.bin")), "no partial file renamed into place")
    n0 = len(hub.log)
    p = needle(ep, "download", "org/repo/drop.bin", "--dir", d)
    check(p.returncode == 0 and read(os.path.join(d, "drop.bin")) == big,
          "second run completes the file (%s)" % p.stderr.strip()[-200:])
    ranges = [r[2] for r in hub.log[n0:] if r[1].startswith("/cdn/")]
    check(ranges == ["bytes=%d-" % half], "resumed with Range %s" % ranges)
    if_ranges = [r[4] for r in hub.log[n0:] if r[1].startswith("/cdn/")]
    check(len(if_ranges) == 1 and (if_ranges[0] or "").startswith('"cdn-'),
          "the resume sent the CDN's ETag as If-Range: %s" % if_ranges)
    check(not os.path.exists(part + ".validator"), "the .part's validator file is gone")

    # a server that ignores Range (200): the .part starts over
    with open(os.path.join(d, "norange.bin.part"), "wb") as f:
        f.write(b"garbage" * 10)
    p = needle(ep, "download", "org/repo/norange.bin", "--dir", d)
    check(p.returncode == 0 and read(os.path.join(d, "norange.bin")) == big[:300000],
          "a 200 to a Range request restarts the file")

    # offline: no request, says what to fetch from where and where to put it
    n0 = len(hub.log)
    p = needle(ep, "download", "org/repo/config.json", "--dir", os.path.join(tmp, "off"),
               env={"HF_HUB_OFFLINE": "1"})
    check(p.returncode == 1 and "HF_HUB_OFFLINE" in p.stderr and "org/repo" in p.stderr
          and os.path.join(tmp, "off", "config.json") in p.stderr and len(hub.log) == n0,
          "HF_HUB_OFFLINE refuses without a request: " + p.stderr.strip())

    # revision with a slash is one URL segment
    n0 = len(hub.log)
    p = needle(ep, "download", "org/repo/config.json", "--dir", os.path.join(tmp, "rev"),
               "--revision", "refs/pr/1")
    check(p.returncode == 0 and hub.log[n0][1] == "/org/repo/resolve/refs%2Fpr%2F1/config.json",
          "revision quoted: %s" % hub.log[n0][1])

    # ORG/REPO alone: its one .cact (listed through the API), else name one
    hub.add("org/one", "model.cact", big[:1000], lfs=True)
    hub.add("org/one", "README.md", b"# one\n")
    p = needle(ep, "download", "org/one", "--dir", os.path.join(tmp, "one"))
    check(p.returncode == 0 and read(os.path.join(tmp, "one", "model.cact")) == big[:1000],
          "ORG/REPO: its one .cact (%s)" % p.stderr.strip()[-200:])
    p = needle(ep, "download", "org/repo", "--dir", os.path.join(tmp, "one"))
    check(p.returncode == 1 and "holds 0 .cact files" in p.stderr,
          "ORG/REPO without a .cact: " + p.stderr.strip())

    # upstream's engine folders: say what to use instead
    p = needle(ep, "download", "linux-x86_64")
    check(p.returncode == 2 and "make install" in p.stderr, "platform folder: points to make install")

    # automatic fetches: build / run --checkpoint with upstream's names
    work = os.path.join(tmp, "work")
    os.mkdir(work)
    ck = os.path.join(tmp, "tiny.pkl")
    needle(ep, "init", ck, "--preset", "tiny", "--seed", "2")
    hub.add("Cactus-Compute/needle2", "checkpoints/needle2.pkl", read(ck), lfs=True)
    hub.add("Cactus-Compute/needle2", "tokenizer/tokenizer.model", read(TOK), lfs=True)
    p = needle(ep, "build", "checkpoints/needle2.pkl", "--out", "n.cact", cwd=work,
               env={"HF_HUB_OFFLINE": "1"})
    check(p.returncode == 1 and "HF_HUB_OFFLINE" in p.stderr
          and not os.path.exists(os.path.join(work, "checkpoints")),
          "build offline: clear error, nothing created: " + p.stderr.strip()[-300:])
    p = needle(ep, "build", "checkpoints/needle2.pkl", "--out", "n.cact", cwd=work)
    check(p.returncode == 0 and os.path.exists(os.path.join(work, "n.cact"))
          and read(os.path.join(work, "checkpoints", "needle2.pkl")) == read(ck)
          and read(os.path.join(work, "checkpoints", "tokenizer.model")) == read(TOK),
          "build fetched checkpoints/needle2.pkl and the tokenizer (%s)" % p.stderr.strip()[-300:])
    # a copy already in ./checkpoints/ is used as hf_hub_download(local_dir=".") would
    p = needle(ep, "run", "--checkpoint", "needle2.pkl", "--query", "hi", "--max-len", "3",
               cwd=work, env={"HF_HUB_OFFLINE": "1"})
    check(p.returncode == 0 and p.stdout.startswith("prompt: 'hi'"),
          "run --checkpoint needle2.pkl finds ./checkpoints/needle2.pkl offline")
    os.rename(os.path.join(work, "checkpoints"), os.path.join(work, "old"))
    os.rename(os.path.join(work, "old", "tokenizer.model"), os.path.join(work, "tokenizer.model"))
    p = needle(ep, "run", "--checkpoint", "needle2.pkl", "--query", "hi", "--max-len", "3",
               cwd=work, env={"HF_HUB_OFFLINE": "1"})
    check(p.returncode == 1 and "HF_HUB_OFFLINE" in p.stderr and "checkpoints/needle2.pkl"
          in p.stderr, "run --checkpoint offline, nothing local: clear error")
    p = needle(ep, "run", "--checkpoint", "needle2.pkl", "--query", "hi", "--max-len", "3",
               cwd=work)
    check(p.returncode == 0 and "\nprompt: 'hi'" in p.stdout
          and os.path.exists(os.path.join(work, "checkpoints", "needle2.pkl")),
          "run --checkpoint needle2.pkl fetched checkpoints/needle2.pkl (%s)"
          % p.stderr.strip()[-300:])


class Listener:
    """A TCP socket on 127.0.0.1 that counts connections: hold=True keeps
    them open without a word (a silent server), else closes them at once."""

    def __init__(self, hold):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.count = 0
        self.held = []
        self.hold = hold
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.done.is_set():
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.count += 1
            if self.hold:
                self.held.append(c)
            else:
                c.close()

    def close(self):
        self.done.set()
        self.thread.join(5)
        for c in self.held:
            c.close()
        self.sock.close()


def no_raw_controls(text):
    """no C0 control but newline and tab, no DEL, no C1 control, no byte
    that is not UTF-8 (decoded as a surrogate)"""
    return not any((ord(ch) < 0x20 and ch not in "\n\t") or 0x7f <= ord(ch) <= 0x9f
                   or 0xdc80 <= ord(ch) <= 0xdcff for ch in text)


def run_hostile_cases(hub, ep, tmp, big):
    d = os.path.join(tmp, "hostile")
    os.mkdir(d)

    # 7: a redirect to another protocol is refused, not attempted
    lis = Listener(hold=False)
    try:
        ftp = "ftp://127.0.0.1:%d/x" % lis.port
        hub.add("org/repo", "ftp.bin", b"x", redirect=ftp)
        hub.listings["org/ftplist"] = ("redirect", ftp)
        p = needle(ep, "download", "org/repo/ftp.bin", "--dir", d, timeout=60)
        check(p.returncode == 1 and ftp in p.stderr and "refused" in p.stderr
              and "only http and https" in p.stderr,
              "redirect to ftp:// refused with a clear message: " + p.stderr.strip()[-300:])
        check(not os.path.exists(os.path.join(d, "ftp.bin.part")), "no .part after the refusal")
        p = needle(ep, "download", "org/ftplist", "--dir", d, timeout=60)
        check(p.returncode == 1 and ftp in p.stderr and "refused" in p.stderr,
              "listing redirected to ftp:// refused: " + p.stderr.strip()[-300:])
        time.sleep(0.5)
        check(lis.count == 0, "the ftp:// address was never connected to (%d)" % lis.count)
    finally:
        lis.close()

    # 8: a 416 to a resume: the .part is checked against the stated size
    data416 = hashlib.sha256(b"416").digest() * 6250  # 200,000 bytes, outside LFS
    hub.add("org/repo", "r416.bin", data416, drop_at=120000)
    p = needle(ep, "download", "org/repo/r416.bin", "--dir", d)
    part = os.path.join(d, "r416.bin.part")
    check(p.returncode == 1 and os.path.getsize(part) == 120000, "416 case: 120,000 bytes kept")
    hub.files[("org/repo", "r416.bin")]["always_416"] = True
    n0 = len(hub.log)
    p = needle(ep, "download", "org/repo/r416.bin", "--dir", d)
    dest = os.path.join(d, "r416.bin")
    got = read(dest) if os.path.exists(dest) else b""
    check(p.returncode == 0 and got == data416,
          "a 416 to the resume of a 120,000-byte fragment starts over: %d of %d bytes installed "
          "(%s)" % (len(got), len(data416), p.stderr.strip()[-200:]))
    ranges = [r[2] for r in hub.log[n0:]]
    check(ranges == ["bytes=120000-", None], "416: the Range request, then the whole file: %s"
          % ranges)
    # ... and a .part that is already whole is taken after its sha256 check
    whole = big[:400000]
    hub.add("org/repo", "whole.bin", whole, lfs=True, drop_once=True)
    needle(ep, "download", "org/repo/whole.bin", "--dir", d)
    with open(os.path.join(d, "whole.bin.part"), "wb") as f:
        f.write(whole)
    n0 = len(hub.log)
    p = needle(ep, "download", "org/repo/whole.bin", "--dir", d)
    cdn = [r[2] for r in hub.log[n0:] if r[1].startswith("/cdn/")]
    check(p.returncode == 0 and read(os.path.join(d, "whole.bin")) == whole
          and "sha256 ok" in p.stderr and cdn == ["bytes=400000-"],
          "416 for a whole .part: installed after the sha256 check, nothing fetched again (%s)"
          % cdn)

    # 9: a resume sends If-Range; a file changed on the server starts over
    v1 = hashlib.sha256(b"v1").digest() * 10000
    v2 = hashlib.sha256(b"v2").digest() * 10000
    for name, flags in (("chg.bin", {}), ("chg_ignored.bin", {"ignore_if_range": True})):
        hub.add("org/repo", name, v1, opaque_etag=True, drop_once=True)
        p = needle(ep, "download", "org/repo/" + name, "--dir", d)
        check(p.returncode == 1 and os.path.exists(os.path.join(d, name + ".part")),
              "%s: first attempt dropped" % name)
        hub.add("org/repo", name, v2, opaque_etag=True, version=2, **flags)
        n0 = len(hub.log)
        p = needle(ep, "download", "org/repo/" + name, "--dir", d)
        got = read(os.path.join(d, name)) if os.path.exists(os.path.join(d, name)) else b""
        spliced = got[:len(v1) // 2] == v1[:len(v1) // 2]
        check(p.returncode == 0 and got == v2,
              "%s changed on the server between attempts: the new file, not a splice "
              "(exit %d, %s)" % (name, p.returncode,
                                 "spliced" if spliced else p.stderr.strip()[-200:]))
        check(hub.log[n0][4] == '"v1"', "%s: If-Range sent with the old ETag: %s"
              % (name, hub.log[n0][4]))
    # no validator: no resume at all
    nv = big[:300000]
    hub.add("org/repo", "noval.bin", nv, no_validator=True, drop_once=True)
    needle(ep, "download", "org/repo/noval.bin", "--dir", d)
    n0 = len(hub.log)
    p = needle(ep, "download", "org/repo/noval.bin", "--dir", d)
    check(p.returncode == 0 and read(os.path.join(d, "noval.bin")) == nv
          and [r[2] for r in hub.log[n0:]] == [None] and "starting over" in p.stderr,
          "no ETag or Last-Modified: no resume, the file starts over (%s)"
          % [r[2] for r in hub.log[n0:]])
    # Last-Modified as the validator
    lm = "Wed, 21 Oct 2015 07:28:00 GMT"
    hub.add("org/repo", "lm.bin", nv, lastmod=lm, drop_once=True)
    needle(ep, "download", "org/repo/lm.bin", "--dir", d)
    n0 = len(hub.log)
    p = needle(ep, "download", "org/repo/lm.bin", "--dir", d)
    check(p.returncode == 0 and read(os.path.join(d, "lm.bin")) == nv
          and hub.log[n0][4] == lm and hub.log[n0][2] is not None,
          "Last-Modified resumes with If-Range: %s" % (hub.log[n0][2:],))

    # 10: stalls end in bounded time, the listing included
    lis = Listener(hold=True)
    try:
        t0 = time.time()
        p = needle("http://127.0.0.1:%d" % lis.port, "download", "org/repo", "--dir", d,
                   env={"NEEDLE_HF_STALL_S": "2"}, timeout=40)
        dt = time.time() - t0
        check(p.returncode == 1 and "stalled" in p.stderr and dt < 30,
              "a listing server that never answers: exit %d after %.1f s (%s)"
              % (p.returncode, dt, p.stderr.strip()[-200:]))
        check(lis.count == 1, "one connection to the silent server (%d)" % lis.count)
    finally:
        lis.close()
    # a listing that trickles in just fast enough: the total limit (2 x 2 s)
    hub.listings["evil/trickle"] = ("trickle",)
    t0 = time.time()
    p = needle(ep, "download", "evil/trickle", "--dir", d, env={"NEEDLE_HF_STALL_S": "2"},
               timeout=40)
    dt = time.time() - t0
    check(p.returncode == 1 and "did not finish its answer within 4 s" in p.stderr and dt < 20,
          "a listing that trickles: exit %d after %.1f s (%s)"
          % (p.returncode, dt, p.stderr.strip()[-200:]))
    hub.add("org/repo", "stall.bin", big[:200000], stall=50000)
    t0 = time.time()
    p = needle(ep, "download", "org/repo/stall.bin", "--dir", d, env={"NEEDLE_HF_STALL_S": "2"},
               timeout=40)
    dt = time.time() - t0
    check(p.returncode == 1 and "stalled" in p.stderr and "resume" in p.stderr and dt < 30
          and os.path.getsize(os.path.join(d, "stall.bin.part")) == 50000,
          "a file transfer that stalls: exit %d after %.1f s, .part kept (%s)"
          % (p.returncode, dt, p.stderr.strip()[-200:]))
    p = needle(ep, "download", "org/repo/config.json", "--dir", d,
               env={"NEEDLE_HF_STALL_S": "soon"})
    check(p.returncode == 1 and "NEEDLE_HF_STALL_S=soon" in p.stderr,
          "a bad NEEDLE_HF_STALL_S is named: " + p.stderr.strip())

    # 11/12: unsafe names in the listing are the server's fault, escaped
    bad_names = [
        ("esc", "model\x1b[2J\x1b]0;owned\x07.cact", "\\x1b[2J\\x1b]0;owned\\x07.cact"),
        ("c1", "model\u009b31m.cact", "model\\xc2\\x9b31m.cact"),
        ("dotdot", "../../escaped.cact", "../../escaped.cact"),
        ("dotdot2", "a/../../escaped.cact", "a/../../escaped.cact"),
        ("backslash", "..\\..\\escaped.cact", "..\\\\..\\\\escaped.cact"),
        ("absolute", os.path.join(tmp, "abs.cact"), os.path.join(tmp, "abs.cact")),
        ("bidi", "txt\u202eTCAC.cact", "txt\\xe2\\x80\\xaeTCAC.cact"),
    ]
    for repo, name, shown in bad_names:
        hub.listings["evil/" + repo] = json.dumps(
            {"siblings": [{"rfilename": name}, {"rfilename": "README.md"}]}).encode()
        hub.add("evil/" + repo, name, b"payload", lfs=True)
        work = os.path.join(tmp, "evil_" + repo)
        os.makedirs(os.path.join(work, "sub"))
        n0 = len(hub.log)
        p = needle(ep, "download", "evil/" + repo, "--dir", "sub", cwd=work)
        check(p.returncode == 1 and "unsafe file name" in p.stderr and shown in p.stderr
              and "--help" not in p.stderr and no_raw_controls(p.stderr),
              "listed name %r refused as the server's, escaped (exit %d): %s"
              % (name, p.returncode, ascii(p.stderr.strip()[-240:])))
        check(len(hub.log) == n0 + 1 and os.listdir(os.path.join(work, "sub")) == []
              and sorted(os.listdir(work)) == ["sub"] and not os.path.exists(
                  os.path.join(tmp, "abs.cact")),
              "%s: nothing fetched, nothing written" % repo)
    # the user's own '..' stays a usage error; '..' inside a name is no segment
    p = needle(ep, "download", "org/repo/../x.bin", "--dir", d)
    check(p.returncode == 2 and "'..'" in p.stderr, "the user's '..' is a usage error")
    hub.add("org/repo", "a..b.bin", b"dots\n")
    p = needle(ep, "download", "org/repo/a..b.bin", "--dir", d)
    check(p.returncode == 0 and read(os.path.join(d, "a..b.bin")) == b"dots\n",
          "a name with '..' inside a segment downloads")
    # error pages and listing errors reach the terminal escaped
    hub.add("org/repo", "err.bin", b"", error_body=b"oops \x1b]0;pwned\x07\x1b[2J\x9b end")
    p = needle(ep, "download", "org/repo/err.bin", "--dir", d)
    check(p.returncode == 1 and "HTTP 500" in p.stderr
          and "oops \\x1b]0;pwned\\x07\\x1b[2J\\x9b end" in p.stderr
          and no_raw_controls(p.stderr), "an error page is quoted escaped: %s"
          % ascii(p.stderr.strip()[-200:]))
    hub.listings["evil/gone"] = ("status", 404, b"\x1b[31mRepository \x1b[0mnot found")
    p = needle(ep, "download", "evil/gone", "--dir", d)
    check(p.returncode == 1 and "HTTP 404" in p.stderr and "\\x1b[31mRepository" in p.stderr
          and no_raw_controls(p.stderr), "a listing's error page is quoted escaped: %s"
          % ascii(p.stderr.strip()[-200:]))

    # 13: a write error names the file and the reason (RLIMIT_FSIZE: EFBIG)
    hub.add("org/repo", "fsize.bin", big[:300000])

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100000, 100000))

    p = needle(ep, "download", "org/repo/fsize.bin", "--dir", d, preexec_fn=small_files)
    check(p.returncode == 1 and "writing %s" % os.path.join(d, "fsize.bin.part") in p.stderr
          and "File too large" in p.stderr,
          "a failed write says what and why: " + p.stderr.strip()[-200:])
    # a stated size beyond the free space is refused before a byte is written
    for name, lfs in (("huge.bin", False), ("huge_lfs.bin", True)):
        hub.add("org/repo", name, b"z" * 100000, lfs=lfs, size_claim=10 ** 18)
        p = needle(ep, "download", "org/repo/" + name, "--dir", d)
        check(p.returncode == 1 and "refused" in p.stderr and "free" in p.stderr
              and "1.0 EB" in p.stderr and not os.path.exists(os.path.join(d, name + ".part")),
              "1 EB stated (%s): refused up front, naming the free space: %s"
              % ("LFS" if lfs else "plain", p.stderr.strip()[-240:]))
    # more bytes than stated: cut off and discarded
    hub.add("org/repo", "long.bin", big[:200000], lfs=True, size_claim=1000)
    p = needle(ep, "download", "org/repo/long.bin", "--dir", d)
    check(p.returncode == 1 and "more than the 1000 bytes it states" in p.stderr
          and not os.path.exists(os.path.join(d, "long.bin"))
          and not os.path.exists(os.path.join(d, "long.bin.part")),
          "more bytes than stated: discarded: " + p.stderr.strip()[-200:])

    # 14: the checksum is the one the request resolved with, not the CDN's
    claim = big[:50000]
    hub.add("org/repo", "claim.bin", claim, lfs=True, bad_sha=True, cdn_claim=True)
    p = needle(ep, "download", "org/repo/claim.bin", "--dir", d)
    check(p.returncode == 1 and "sha256" in p.stderr and "0" * 64 in p.stderr
          and not os.path.exists(os.path.join(d, "claim.bin")),
          "the CDN cannot replace the resolve answer's sha256: " + p.stderr.strip()[-200:])
    hub.add("org/repo", "claim2.bin", claim, lfs=True, cdn_claim="f" * 64)
    p = needle(ep, "download", "org/repo/claim2.bin", "--dir", d)
    check(p.returncode == 0 and read(os.path.join(d, "claim2.bin")) == claim
          and "sha256 ok" in p.stderr, "a later claim is ignored: " + p.stderr.strip()[-200:])

    # 17: a listing over the cap says so
    hub.listings["evil/huge"] = ("huge", (64 << 20) + 4096)
    p = needle(ep, "download", "evil/huge", "--dir", d)
    check(p.returncode == 1 and "over the 64 MiB limit" in p.stderr,
          "listing over the cap: " + p.stderr.strip()[-200:])


if __name__ == "__main__":
    main()
