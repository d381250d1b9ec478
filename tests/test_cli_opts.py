#!/usr/bin/python3
"""The declarative option tables (src/cli/opts.h) agree with everything made
from them, and parsing through them is strict:

  * every option `needle CMD --help` lists (and the sub-forms `run
    --checkpoint X --help`, `bench finetune --help`) is offered by the bash
    completion (`needle --completion bash`, sourced into bash and asked as
    the shell asks it) and documented in the man page (`needle --man`);
    option values complete (enum words, files) as the table says;
  * the man page is valid roff to groff (no warnings) when groff is here;
  * the build wrote the same needle.1 and needle.bash (installed by make
    install; tests/install_check.sh checks they are installed);
  * bad values are refused with exit 2 and a message naming the option and
    the value; `--name=value` is the same as `--name value`.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("NEEDLE_BUILD", os.path.join(SRC, "build"))
NEEDLE = os.path.abspath(os.environ.get("NEEDLE") or os.path.join(BUILD, "needle"))
FAIL = []


def check(cond, msg):
    print(("ok  " if cond else "FAIL") + " " + msg)
    if not cond:
        FAIL.append(msg)


def needle(*args, cwd=None):
    return subprocess.run([NEEDLE] + list(args), capture_output=True, text=True, cwd=cwd,
                          timeout=120)


_HELP = {}


def help_options(args):
    if tuple(args) in _HELP:
        return _HELP[tuple(args)]
    _HELP[tuple(args)] = opts = _help_options(args)
    return opts


def _help_options(args):
    p = needle(*args, "--help")
    if p.returncode != 0:
        check(False, f"needle {' '.join(args)} --help exits 0")
        return set()
    return set(re.findall(r"^  (--[a-z0-9][a-z0-9-]*)", p.stdout, re.M))


def complete(script, words):
    """COMPREPLY of _needle for the command line `words` (last = current word)."""
    line = " ".join(f"'{w}'" for w in words)
    prog = (f"source '{script}'\nCOMP_WORDS=({line})\nCOMP_CWORD={len(words) - 1}\n"
            "_needle\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    p = subprocess.run(["bash", "--norc", "--noprofile", "-c", prog], capture_output=True,
                       text=True, timeout=60)
    if p.returncode != 0:
        check(False, f"completion of {words} runs: {p.stderr[-300:]}")
    return set(w for w in p.stdout.split("\n") if w)


def main():
    top = needle("--help").stdout
    cmds = re.findall(r"^  ([a-z][a-z-]+) +\S", top, re.M)
    check(len(cmds) >= 15, f"`needle --help` lists the commands ({len(cmds)})")
    man = needle("--man")
    check(man.returncode == 0 and man.stdout.startswith(".\\\"") and ".TH NEEDLE 1" in man.stdout,
          "needle --man writes a man page")
    comp = needle("--completion", "bash")
    check(comp.returncode == 0 and "complete -o filenames" in comp.stdout,
          "needle --completion bash writes a completion script")
    tmp = tempfile.mkdtemp(prefix="needle_cli_opts_")
    try:
        script = os.path.join(tmp, "needle.bash")
        with open(script, "w") as f:
            f.write(comp.stdout)
        for name, text in (("needle.1", man.stdout), ("needle.bash", comp.stdout)):
            built = os.path.join(BUILD, name)
            if os.path.exists(built):
                with open(built) as f:
                    check(f.read() == text, f"the build's {name} is the program's output")
        check(complete(script, ["needle", ""]) >= set(cmds),
              "the first word completes to every command")

        forms = [[c] for c in cmds] + [["run", "--checkpoint", "X.pkl"], ["bench", "decode"],
                                       ["bench", "finetune"]]
        total = 0
        for form in forms:
            opts = help_options(form)
            check(opts, f"needle {' '.join(form)} --help lists options")
            offered = complete(script, ["needle", form[0], "--"])
            missing = sorted(opts - offered)
            check(not missing, f"completion of `needle {form[0]} --` offers the {len(opts)} "
                               f"options of `{' '.join(form)} --help`" +
                  (f"; missing {missing}" if missing else ""))
            missing = sorted(o for o in opts if "\n.B " + o.replace("-", "\\-") not in man.stdout)
            check(not missing, f"the man page documents them" +
                  (f"; missing {missing}" if missing else ""))
            total += len(opts)
        check(total > 150, f"{total} options checked")
        # a converted command offers nothing its help does not list
        for c in ("finetune", "eval", "init", "convert"):
            extra = sorted(complete(script, ["needle", c, "--"]) - help_options([c]) - {"--help"})
            check(not extra, f"completion of `needle {c} --` offers only its options {extra}")
        # bench's forms share the word: the completion offers their union, nothing else
        union = set().union(*(help_options(f) for f in (["bench"], ["bench", "decode"],
                                                          ["bench", "finetune"])))
        got = complete(script, ["needle", "bench", "--"]) - {"--help"}
        check(got == union, f"completion of `needle bench --` is its forms' options "
                            f"{sorted(got ^ union)}")
        check(complete(script, ["needle", "bench", "train", "--preset", "ti"]) ==
              {"tiny", "tiny3", "tiny3b"}, "bench --preset ti completes the tiny presets")
        check(complete(script, ["needle", "bench", "train", "--precision", ""]) ==
              {"fp32", "tf32", "bf16"}, "bench --precision completes fp32 tf32 bf16")

        # values: enum words, files, nothing for numbers
        check(complete(script, ["needle", "finetune", "--batching", ""]) ==
              {"shared", "packed", "padded"}, "finetune --batching completes its three modes")
        check(complete(script, ["needle", "init", "x.pkl", "--preset", "ti"]) ==
              {"tiny", "tiny3", "tiny3b"}, "init --preset ti completes the tiny presets")
        check(complete(script, ["needle", "eval", "--threads", ""]) == set(),
              "eval --threads N completes nothing")
        open(os.path.join(tmp, "abc.jsonl"), "w").close()
        check(complete(script, ["needle", "finetune", "--loss-log", os.path.join(tmp, "ab")]) ==
              {os.path.join(tmp, "abc.jsonl")}, "finetune --loss-log completes a file")

        if shutil.which("groff"):
            p = subprocess.run(["groff", "-man", "-ww", "-z"], input=man.stdout,
                               capture_output=True, text=True, timeout=60)
            check(p.returncode == 0 and not p.stderr.strip(),
                  f"groff reads the man page without warnings {p.stderr[:300]!r}")
        else:
            print("skip groff: not installed")

        # bad values: exit 2, the option and the value named
        bad = [
            (["finetune", "d.jsonl", "--epochs", "abc"], ["--epochs", "'abc'", "integer"]),
            (["finetune", "d.jsonl", "--lr", "-1"], ["--lr", "'-1'", "> 0"]),
            (["finetune", "d.jsonl", "--val-split", "1"], ["--val-split", "[0, 1)"]),
            (["finetune", "d.jsonl", "--batching", "fast"],
             ["--batching", "'fast'", "shared, packed or padded"]),
            (["eval", "--threads", "0"], ["--threads", "'0'", "[1, 1024]"]),
            (["eval", "--threads", "2x"], ["--threads", "'2x'"]),
            (["init", "o.pkl", "--preset", "huge"], ["--preset", "'huge'", "needle2"]),
            (["convert", "a", "b", "--dtype", "int8"], ["--dtype", "'int8'", "float16"]),
            (["plot-loss", "l.jsonl", "--smooth", "1"], ["--smooth", "'1'"]),
            (["generate-data", "--timeout", "0"], ["--timeout", "'0'", "(0, 86400]"]),
            (["run", "--checkpoint", "x.pkl", "--max-len", "0"], ["--max-len", "'0'"]),
            (["finetune", "d.jsonl", "--epochs"], ["--epochs needs a value"]),
            (["tokenize", "--nope"], ["unknown option '--nope'"]),
            (["render", "d.jsonl", "--json=yes"], ["--json takes no value", "'yes'"]),
            (["grammar", "--sample=-1"], ["--sample", "'-1'"]),
            (["bench", "train", "--batch", "0"], ["--batch", "'0'", "[1, 4096]"]),
            (["bench", "forward", "--steps=x"], ["--steps", "'x'"]),
            (["bench", "train", "--qat-bits", "8"], ["--qat-bits", "'8'", "[2, 4]"]),
            (["bench", "train", "--quant=1"], ["--quant takes no value"]),
            (["bench", "forward", "train"], ["unexpected argument 'train'"]),
            (["bench", "decode", "--weights", "x.cact", "--chunk", "5000"],
             ["--chunk", "'5000'", "[1, 4096]"]),
            (["bench", "decode", "--float=yes"], ["--float takes no value"]),
            (["bench", "decode", "--nope", "1"], ["unknown option '--nope'"]),
        ]
        for args, words in bad:
            p = needle(*args, cwd=tmp)
            ok = p.returncode == 2 and all(w in p.stderr for w in words)
            check(ok, f"needle {' '.join(args)}: exit 2 naming {words}" +
                  ("" if ok else f" (exit {p.returncode}: {p.stderr[-300:]!r})"))

        # --name=value is --name value
        a, b = os.path.join(tmp, "a.pkl"), os.path.join(tmp, "b.pkl")
        pa = needle("init", a, "--preset=tiny", "--seed=7", "--engram-slots=32")
        pb = needle("init", b, "--preset", "tiny", "--seed", "7", "--engram-slots", "32")
        same = (pa.returncode == 0 and pb.returncode == 0 and
                open(a, "rb").read() == open(b, "rb").read())
        check(same, "init --preset=tiny --seed=7 writes what --preset tiny --seed 7 writes")
        # a shape override applies on top of the preset, wherever --preset is
        pc = needle("init", b, "--engram-slots", "32", "--seed", "7", "--preset", "tiny")
        check(pc.returncode == 0 and open(a, "rb").read() == open(b, "rb").read(),
              "init: --engram-slots before --preset still overrides the preset")
        # the resume command a stopped finetune prints drops --stop-after=N
        # as it drops --stop-after N (it would stop the resumed run at once)
        ck, data, ad = (os.path.join(tmp, n) for n in ("t.pkl", "d.jsonl", "ad.pkl"))
        with open(os.path.join(SRC, "examples", "data.jsonl")) as f, open(data, "w") as g:
            g.writelines(f.readlines()[:8])
        needle("init", ck, "--preset", "tiny", "--max-seq-len", "512")
        p = needle("finetune", data, "--checkpoint", ck, "--tokenizer",
                   os.path.join(SRC, "models", "tokenizer.model"), "--device=cpu", "--threads=1",
                   "--batch-size=2", "--max-len=512", "--epochs=1", "--out", ad, "--stop-after=1")
        resume = [l for l in p.stderr.splitlines() if "to continue:" in l]
        check(p.returncode == 1 and resume and "--stop-after" not in resume[0] and
              "--resume " + ad in resume[0] and "--device=cpu" in resume[0],
              f"finetune --stop-after=1: the resume command drops it {resume} {p.stderr[-200:]!r}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(FAIL)} failed")
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
