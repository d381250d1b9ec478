#!/usr/bin/python3
"""Libraries loaded only by the commands that need them (issue 14, memory):

  * the needle program and libneedle.so do not link OpenBLAS, libmicrohttpd
    or libcurl (their start-up alone cost ~3.7 + ~3 + ~5 MB resident);
  * the quantised engine never loads OpenBLAS: `needle run` on a .cact
    answers with $NEEDLE_LIBBLAS pointing at a missing file;
  * a command that needs OpenBLAS and cannot load it fails with a clear
    message and writes nothing (finetune: no adapter); the same finetune
    with the library works;
  * `needle playground` without libmicrohttpd says so and exits 1.
"""
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("NEEDLE_BUILD", os.path.join(SRC, "build"))
NEEDLE = os.environ.get("NEEDLE") or os.path.join(BUILD, "needle")
TOK = os.path.join(SRC, "models", "tokenizer.model")
DATA = os.path.join(SRC, "examples", "data.jsonl")
FAIL = []
MISSING = "/nonexistent/libmissing.so.0"


def check(cond, msg):
    print(("ok  " if cond else "FAIL") + " " + msg)
    if not cond:
        FAIL.append(msg)


def run(*args, cwd=None, env=None):
    e = dict(os.environ)
    e["HF_HUB_OFFLINE"] = "1"
    e.update(env or {})
    return subprocess.run([NEEDLE] + [str(a) for a in args], cwd=cwd, env=e,
                          capture_output=True, text=True, timeout=600)


def needed(path):
    p = subprocess.run(["readelf", "-d", path], capture_output=True, text=True)
    return [l for l in p.stdout.splitlines() if "(NEEDED)" in l] if p.returncode == 0 else None


def main():
    for path in (os.path.join(BUILD, "needle"), os.path.join(BUILD, "libneedle.so")):
        if not os.path.exists(path):
            continue
        libs = needed(path)
        check(libs is not None and len(libs) > 0, "readelf lists %s's libraries" % path)
        bad = [l for l in libs or [] if any(n in l for n in ("openblas", "microhttpd", "curl"))]
        check(not bad, "%s does not link OpenBLAS, libmicrohttpd, libcurl %s"
              % (os.path.basename(path), bad))

    with tempfile.TemporaryDirectory() as tmp:
        ck = os.path.join(tmp, "base.pkl")
        p = run("init", ck, "--preset", "tiny", "--seed", "3")
        check(p.returncode == 0, "init tiny checkpoint " + p.stderr[-200:])
        cact = os.path.join(tmp, "m.cact")
        p = run("build", ck, "--out", cact, "--tokenizer", TOK, "--bits", "2",
                env={"NEEDLE_LIBBLAS": MISSING})
        check(p.returncode == 0 and os.path.exists(cact),
              "build (quantise) needs no BLAS " + p.stderr[-300:])
        tools = os.path.join(tmp, "tools.json")
        with open(tools, "w") as f:
            f.write('[{"name": "timer", "description": "set a timer", "parameters": '
                    '{"type": "object", "properties": {"minutes": {"type": "integer"}}}}]')
        p = run("run", "--weights", cact, "--tools", tools, "--max-new-tokens", "40",
                "set a timer for ten minutes", env={"NEEDLE_LIBBLAS": MISSING})
        check(p.returncode == 0 and '"success"' in p.stdout,
              "the quantised engine runs without OpenBLAS " + p.stderr[-300:])

        head = os.path.join(tmp, "head.jsonl")
        with open(DATA) as f, open(head, "w") as g:
            g.writelines(f.readlines()[:4])
        out = os.path.join(tmp, "adapter.pkl")
        args = ("finetune", head, "--checkpoint", ck, "--tokenizer", TOK, "--epochs", "1",
                "--batch-size", "2", "--out", out)
        p = run(*args, cwd=tmp, env={"NEEDLE_LIBBLAS": MISSING})
        check(p.returncode != 0 and "cannot load OpenBLAS" in p.stderr
              and MISSING in p.stderr, "finetune without OpenBLAS: clear error, exit %d (%s)"
              % (p.returncode, p.stderr.strip()[-200:]))
        left = [n for n in os.listdir(tmp) if n.startswith("adapter")]
        check(not left, "finetune without OpenBLAS writes nothing %s" % left)
        p = run(*args, cwd=tmp)
        check(p.returncode == 0 and os.path.exists(out), "finetune with OpenBLAS works "
              + p.stderr[-300:])
        check("OpenBLAS " in p.stdout + p.stderr, "its backend line names the OpenBLAS core")

        usage = run("playground", "--help").stdout + run("playground", "--help").stderr
        if "usage: needle playground" in usage:
            p = run("playground", "--weights", cact, "--port", "0", "--workdir", tmp,
                    env={"NEEDLE_LIBMHD": MISSING})
            check(p.returncode == 1 and "cannot load libmicrohttpd" in p.stderr,
                  "playground without libmicrohttpd: clear error, exit %d (%s)"
                  % (p.returncode, p.stderr.strip()[-200:]))
        else:
            print("skip playground (built without libmicrohttpd)")

    if FAIL:
        print("%d failure(s)" % len(FAIL))
        return 1
    print("all ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
