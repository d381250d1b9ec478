#!/usr/bin/python3
"""The program finds its own folder whatever argv[0] says (issue 34): run
through PATH from a fresh folder, through a symlink in another folder on
PATH, and with a made-up argv[0], `needle run` (the built-in
needle-nano.cact) and `needle build` with no checkpoint (the built-in
needle-nano.pkl, as `needle finetune` falls back to it) find the files
beside the real program, and say which. The old code took the folder from
dladdr, which gives argv[0] -- the bare "needle" through PATH -- so only
the install prefix was searched. stdlib only; nothing is downloaded
(HF_HUB_OFFLINE=1)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.realpath(os.environ.get("NEEDLE_BUILD") or os.path.join(SRC, "build"))
NEEDLE = os.path.realpath(os.environ.get("NEEDLE") or os.path.join(BUILD, "needle"))
DIR = os.path.dirname(NEEDLE)
FAIL = []

TOOLS = [{"name": "set_timer", "description": "Start a timer",
          "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}},
                         "required": ["minutes"]}}]


def check(cond, msg):
    if not cond:
        FAIL.append(msg)
        print("FAIL:", msg)


def env_with(path_dirs):
    env = {k: v for k, v in os.environ.items()
           if k not in ("NEEDLE_BASE_WEIGHTS", "NEEDLE_BASE_CHECKPOINT", "NEEDLE_TOKENIZER")}
    env["PATH"] = os.pathsep.join(path_dirs + ["/usr/bin", "/bin"])
    env["HF_HUB_OFFLINE"] = "1"
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"
    return env


def main():
    cact = os.path.join(DIR, "needle-nano.cact")
    pkl = os.path.join(DIR, "needle-nano.pkl")
    if not (os.path.exists(cact) and os.path.exists(pkl)):
        print("SKIP: no built-in base beside", NEEDLE)
        return 77
    tmp = tempfile.mkdtemp(prefix="needle_selfdir_")
    try:
        work = os.path.join(tmp, "fresh")
        bindir = os.path.join(tmp, "bin")
        os.makedirs(work)
        os.makedirs(bindir)
        os.symlink(NEEDLE, os.path.join(bindir, "needle"))
        with open(os.path.join(work, "tools.json"), "w") as f:
            json.dump(TOOLS, f)
        ways = {
            "through PATH": (["needle"], None, env_with([DIR])),
            "through a symlink on PATH": (["needle"], None, env_with([bindir])),
            "a made-up argv[0]": (["not-needle"], NEEDLE, env_with([])),
            "a relative argv[0]": (["./needle"], os.path.join(bindir, "needle"), env_with([])),
        }
        for way, (argv0, exe, env) in ways.items():
            r = subprocess.run(argv0 + ["run", "--tools", "tools.json", "--max-new-tokens", "48",
                                        "start a timer for 5 minutes"],
                               executable=exe, cwd=work, env=env, capture_output=True,
                               text=True, timeout=300)
            said = "weights   %s (the built-in base" % cact
            check(r.returncode == 0 and said in r.stderr,
                  "run %s: exit %d, no %r in %r" % (way, r.returncode, said, r.stderr[-600:]))
            if r.returncode == 0:
                env_ = json.loads(r.stdout.strip().splitlines()[-1])
                check("success" in env_, "run %s: envelope %r" % (way, r.stdout[-300:]))
            # `needle build` with no checkpoint: the nano base beside the
            # program (the fallback `needle finetune` uses too), built here
            out = os.path.join(work, "nano_%d.cact" % len(way))
            r = subprocess.run(argv0 + ["build", "--out", out], executable=exe, cwd=work,
                               env=env, capture_output=True, text=True, timeout=300)
            said = "%s  the built-in nano base" % pkl
            check(r.returncode == 0 and said in r.stdout and os.path.getsize(out) > 0,
                  "build %s: exit %d, no %r in %r %r" % (way, r.returncode, said,
                                                         r.stdout[-600:], r.stderr[-600:]))
            print("%s: ok" % way if not FAIL else "%s: checked" % way)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if FAIL:
        print("%d failure(s)" % len(FAIL))
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
