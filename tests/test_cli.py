#!/usr/bin/python3
"""CLI behaviour an upstream user meets (issue 16):

  * bare `needle` prints the help and exits 0;
  * `build` without a tokenizer fails (no archive written) unless
    --no-tokenizer; `build --upload` is a clear "not supported" (exit 2);
    `build --help` documents --bits 3 as ours;
  * `finetune` creates --checkpoint-dir only when it writes the adapter there;
  * `run --checkpoint X.pkl --query TEXT`: upstream's plain greedy
    continuation, deterministic, and each token is the argmax of our float
    forward (`needle eval --tokens --logits`) over the prompt so far.
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NEEDLE = os.environ.get("NEEDLE") or os.path.join(SRC, "build", "needle")
TOK = os.path.join(SRC, "models", "tokenizer.model")
DATA = os.path.join(SRC, "examples", "data.jsonl")
FAIL = []


def check(cond, msg):
    print(("ok  " if cond else "FAIL") + " " + msg)
    if not cond:
        FAIL.append(msg)


def run(*args, cwd=None, env=None):
    e = dict(os.environ)
    e.pop("NEEDLE_TOKENIZER", None)
    e["HF_HUB_OFFLINE"] = "1"  # the automatic fetches must not reach the network here
    e.update(env or {})
    return subprocess.run([NEEDLE] + [str(a) for a in args], cwd=cwd, env=e,
                          capture_output=True, text=True)


def rough_edges(tmp):
    p = run()
    check(p.returncode == 0 and "usage: needle" in p.stdout, "bare needle: help on stdout, exit 0")
    p = run("fetch")
    check(p.returncode == 2 and "make install" in p.stderr and "NEEDLE_LIB_PATH" in p.stderr,
          "fetch (upstream's prebuilt engine): says what to use instead, exit 2")

    ck = os.path.join(tmp, "t.pkl")
    p = run("init", ck, "--preset", "tiny")
    check(p.returncode == 0, "init tiny")

    p = run("build", ck, "--out", "x.cact", cwd=tmp)
    check(p.returncode == 1 and "no tokenizer found" in p.stderr and "--no-tokenizer" in p.stderr,
          "build without a tokenizer fails and names --no-tokenizer (rc %d)" % p.returncode)
    check(not os.path.exists(os.path.join(tmp, "x.cact")), "no archive after the refusal")
    p = run("build", ck, "--out", "x.cact", "--no-tokenizer", cwd=tmp)
    check(p.returncode == 0 and os.path.exists(os.path.join(tmp, "x.cact")),
          "--no-tokenizer builds anyway")
    p = run("build", ck, "--out", "y.cact", "--tokenizer", TOK, cwd=tmp)
    check(p.returncode == 0, "build with --tokenizer")
    p = run("build", ck, "--no-tokenizer", "--tokenizer", TOK, cwd=tmp)
    check(p.returncode == 2, "--no-tokenizer with --tokenizer is a usage error")

    p = run("build", ck, "--upload", cwd=tmp)
    check(p.returncode == 2 and "not supported" in p.stderr and "huggingface-cli" in p.stderr
          and "needs a value" not in p.stderr, "build --upload: not supported, exit 2")
    p = run("build", "--help")
    check(p.returncode == 0 and "--bits" in p.stdout and "ours" in p.stdout
          and "--no-tokenizer" in p.stdout, "build --help: --bits 3 is ours, --no-tokenizer")

    # finetune: a run that fails before writing leaves no directory ...
    p = run("finetune", "missing.jsonl", "--checkpoint", ck, "--tokenizer", TOK, cwd=tmp)
    check(p.returncode != 0 and not os.path.exists(os.path.join(tmp, "checkpoints")),
          "failed finetune creates no checkpoints/")
    p = run("finetune", DATA, "--checkpoint", "nothere.pkl", "--tokenizer", TOK,
            "--checkpoint-dir", "cd1", cwd=tmp)
    check(p.returncode != 0 and not os.path.exists(os.path.join(tmp, "cd1")),
          "finetune with a missing base creates no --checkpoint-dir")
    head = os.path.join(tmp, "d.jsonl")
    with open(DATA) as f, open(head, "w") as g:
        g.writelines(f.readlines()[:12])
    # ... --out elsewhere never creates it ...
    p = run("finetune", head, "--checkpoint", ck, "--tokenizer", TOK, "--epochs", "1",
            "--batch-size", "4", "--checkpoint-dir", "cd2", "--out", "a.pkl", cwd=tmp)
    check(p.returncode == 0 and os.path.exists(os.path.join(tmp, "a.pkl"))
          and not os.path.exists(os.path.join(tmp, "cd2")), "--out elsewhere: no --checkpoint-dir")
    # ... and the default output creates it when the adapter is written
    with open(os.path.join(tmp, "afile"), "w") as f:
        f.write("x")
    p = run("finetune", head, "--checkpoint", ck, "--tokenizer", TOK, "--epochs", "1",
            "--batch-size", "4", "--checkpoint-dir", "afile/sub", cwd=tmp)
    check(p.returncode == 1 and "Not a directory" in p.stderr and "step" not in p.stdout,
          "a --checkpoint-dir below a file is refused before training")
    p = run("finetune", head, "--checkpoint", ck, "--tokenizer", TOK, "--epochs", "1",
            "--batch-size", "4", "--checkpoint-dir", "cd3/sub", cwd=tmp)
    check(p.returncode == 0 and os.path.exists(os.path.join(tmp, "cd3", "sub", "needle_lora.pkl")),
          "parents made too, as os.makedirs (rc %d)" % p.returncode)
    p = run("finetune", head, "--checkpoint", ck, "--tokenizer", TOK, "--epochs", "1",
            "--batch-size", "4", "--checkpoint-dir", "cd4", cwd=tmp)
    check(p.returncode == 0 and os.path.exists(os.path.join(tmp, "cd4", "needle_lora.pkl")),
          "default output: --checkpoint-dir created with the adapter (rc %d %s)"
          % (p.returncode, p.stderr[-300:]))


def greedy_by_eval(tmp, ck, prompt, steps):
    """Greedy decode with `needle eval --tokens --logits`: one forward per
    step over the whole prefix, argmax of the last row (first on ties)."""
    import numpy as np
    p = subprocess.run([NEEDLE, "tokenize", "--tokenizer", TOK], input=prompt + "\n",
                       capture_output=True, text=True)
    ids = [2] + [int(x) for x in p.stdout.split()]  # BOS = 2
    n_prompt = len(ids)
    tf, lf = os.path.join(tmp, "seq.txt"), os.path.join(tmp, "logits.bin")
    for _ in range(steps):
        with open(tf, "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
        p = run("eval", "--checkpoint", ck, "--tokens", tf, "--logits", lf, "--device", "cpu")
        if p.returncode != 0:
            raise SystemExit("eval failed: " + p.stderr)
        logits = np.fromfile(lf, dtype="<f4").reshape(len(ids), -1)
        nxt = int(np.argmax(logits[-1]))
        if nxt == 1:  # EOS
            break
        ids.append(nxt)
    gen = ids[n_prompt:]
    p = subprocess.run([NEEDLE, "tokenize", "--tokenizer", TOK, "--decode"],
                       input=" ".join(map(str, gen)) + "\n", capture_output=True, text=True)
    return gen, p.stdout.rstrip("\n")


def run_checkpoint(tmp):
    # seed 2: a random tiny model whose greedy path is not one repeated token
    ck = os.path.join(tmp, "r.pkl")
    run("init", ck, "--preset", "tiny", "--seed", "2")
    q = "What's the weather in Paris?"
    a = run("run", "--checkpoint", ck, "--query", q, "--max-len", "10", "--tokenizer", TOK)
    b = run("run", "--checkpoint", ck, "--query", q, "--max-len", "10", "--tokenizer", TOK,
            "--seed", "7", "--no-constrained", "--tools", "[]")
    check(a.returncode == 0, "run --checkpoint exits 0 (%s)" % a.stderr[-300:])
    check(a.stdout == b.stdout, "deterministic (and --seed/--tools/--no-constrained accepted)")
    lines = a.stdout.split("\n")
    check(lines[0] == 'prompt: "What\'s the weather in Paris?"', "prompt line is Python's repr: "
          + lines[0])
    gen, want = greedy_by_eval(tmp, ck, q, 10)
    got = a.stdout[len(lines[0]) + 1:]
    check(got.endswith("\n"), "continuation ends with a newline")
    check(len(set(gen)) > 1, "the reference produced varied tokens %s" % gen)
    check(got[:-1] == want, "continuation = greedy argmax of eval's logits: %r vs %r"
          % (got[:-1], want))
    # a different model (seed) gives a different continuation: the check can fail
    ck2 = os.path.join(tmp, "t.pkl")
    c = run("run", "--checkpoint", ck2, "--query", q, "--max-len", "10", "--tokenizer", TOK)
    check(c.returncode == 0 and c.stdout != a.stdout, "another seed's model continues otherwise")
    d = run("run", "--checkpoint", ck, "--tokenizer", TOK, "--max-len", "3")
    check(d.stdout.startswith("prompt: 'The most surprising thing about'\n"), "default prompt")
    e = run("run", "--checkpoint", ck, "--tokenizer", TOK, "stray")
    check(e.returncode == 2 and "--query" in e.stderr, "a bare query with --checkpoint: usage")
    e = run("run", "--checkpoint", os.path.join(tmp, "none.pkl"), "--tokenizer", TOK)
    check(e.returncode == 1 and "none.pkl" in e.stderr, "missing checkpoint named")


def main():
    tmp = tempfile.mkdtemp(prefix="needle_cli_")
    try:
        rough_edges(tmp)
        run_checkpoint(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if FAIL:
        print("%d failure(s)" % len(FAIL))
        sys.exit(1)
    print("all ok")


if __name__ == "__main__":
    main()
