#!/usr/bin/python3
"""`needle download` and the automatic fetches against tests/hf_server.py (a
local stand-in for the Hub's resolve URLs; HF_ENDPOINT points at it):
small files, an LFS file behind a 302 to a CDN path, the token as a Bearer
header (never printed), a wrong sha256 (refused, nothing renamed into
place), a 404, a connection dropped mid-file (the next run resumes with a
Range request), a server that ignores Range, HF_HUB_OFFLINE, a revision
with a slash, and `build`/`run --checkpoint` fetching upstream's checkpoint
and tokenizer when they are missing.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

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


def needle(endpoint, *args, cwd=None, env=None):
    e = dict(os.environ)
    for k in ("HF_HUB_OFFLINE", "HF_TOKEN", "NEEDLE_TOKENIZER", "http_proxy", "https_proxy",
              "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        e.pop(k, None)
    e["HF_ENDPOINT"] = endpoint
    e.update(env or {})
    return subprocess.run([NEEDLE] + [str(a) for a in args], cwd=cwd, env=e, capture_output=True,
                          text=True)


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


if __name__ == "__main__":
    main()
