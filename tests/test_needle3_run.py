#!/usr/bin/python3
"""`needle run --checkpoint X.safetensors` on Needle 3 checkpoints (issue 32):
3.x's run.py, a greedy plain continuation of [BOS=2] + the prompt, stopping
at EOS=1, run by the engine's incremental forward (KV cache, sliding-window
ring, conv-tap state, CLA, engram seeds and banks, out_vocab head).

  * every continued token is the argmax of tools/ref_needle3.py's
    independent numpy forward over the prompt so far, for random tiny3 and
    tiny3b checkpoints, over more tokens than the sliding windows;
  * --tools FILE renders 3.x's chat template around the query (the
    `prompt:` line is its repr) and the continuation follows the rendered
    prompt; an empty tools list leaves the bare query;
  * a tiny3b model never produces an id at or past out_vocab;
  * a v3 pickle checkpoint (`needle init --preset tiny3`) runs too, each
    token the argmax of `needle eval --logits` (the trainer's float
    forward) over the prefix.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "ref"))
sys.path.insert(0, os.path.join(SRC, "tools"))
from harness import Checker, find_needle, run  # noqa: E402
import make_needle3_fixture as fixture  # noqa: E402
import ref_needle3  # noqa: E402

TOK = os.path.join(SRC, "models", "tokenizer.model")


def make_checkpoint(path, preset, **overrides):
    """A random 3.x checkpoint (tools/make_needle3_fixture.py) with the
    attention and MLP outputs scaled up, so that the blocks, not the tied
    embedding of the last token, decide the next token (a random tiny model
    otherwise repeats one token)."""
    cfg = fixture.config_for(preset, vocab_size=8192, max_seq_len=160, **overrides)
    params = fixture.random_params(cfg, np.random.default_rng(3))
    params["stack/layers/block/attn_gate"] *= 150
    params["stack/layers/block/hadamard_mlp/d4"] *= 150
    fixture.write_safetensors(path, params, fixture.checkpoint_metadata(cfg, 7, {"seed": 3}))


def tokenize(needle, text):
    p = subprocess.run([needle, "tokenize", "--tokenizer", TOK, "--whole"], input=text,
                       capture_output=True, text=True)
    if p.returncode:
        raise SystemExit("tokenize failed: " + p.stderr)
    return [int(x) for x in p.stdout.split()]


def decode(needle, ids):
    p = subprocess.run([needle, "tokenize", "--tokenizer", TOK, "--decode"],
                       input=" ".join(map(str, ids)) + "\n", capture_output=True, text=True)
    return p.stdout[:-1] if p.stdout.endswith("\n") else p.stdout


def ref_greedy(path, ids, steps):
    """3.x's generate() with the numpy reference: argmax of the last row of
    a full forward over the prefix, EOS (1) stops. Also the smallest top-2
    margin seen (a near tie would make the comparison meaningless)."""
    params, cfg, _ = ref_needle3.load_checkpoint(path)
    model = ref_needle3.Model(params, cfg, True, False)
    ids, gen, margin = list(ids), [], float("inf")
    for _ in range(steps):
        last = np.asarray(model.forward(ids))[-1]
        top = np.sort(last)[-2:]
        margin = min(margin, float(top[1] - top[0]))
        nxt = int(np.argmax(last))
        if nxt == 1:
            break
        gen.append(nxt)
        ids.append(nxt)
    return gen, margin


def greedy_by_eval(needle, tmp, ck, ids, steps):
    """3.x's generate() with `needle eval --tokens --logits` (one full float
    forward per step, argmax of the last row)."""
    ids, gen = list(ids), []
    tf, lf = os.path.join(tmp, "seq.txt"), os.path.join(tmp, "logits.bin")
    for _ in range(steps):
        with open(tf, "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
        p = run([needle, "eval", "--checkpoint", ck, "--tokens", tf, "--logits", lf,
                 "--device", "cpu"])
        if p.returncode:
            raise SystemExit("eval failed: " + p.stderr)
        nxt = int(np.argmax(np.fromfile(lf, dtype="<f4").reshape(len(ids), -1)[-1]))
        if nxt == 1:
            break
        gen.append(nxt)
        ids.append(nxt)
    return gen


def main():
    check = Checker()
    needle = find_needle()
    if not check("needle binary found", needle is not None):
        return check.finish()
    tmp = tempfile.mkdtemp(prefix="needle3_run_")
    query = "What's the weather in Paris?"
    tools = [{"name": "get_weather", "description": "Weather for a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    tools_file = os.path.join(tmp, "tools.json")
    with open(tools_file, "w") as f:
        json.dump(tools, f)
    empty_file = os.path.join(tmp, "empty.json")
    with open(empty_file, "w") as f:
        f.write("[]")
    for preset, extra in (("tiny3", {}), ("tiny3b", {"out_vocab": 8000})):
        path = os.path.join(tmp, preset + ".safetensors")
        make_checkpoint(path, preset, **extra)
        steps = 40
        r = run([needle, "run", "--checkpoint", path, "--query", query, "--max-len", str(steps),
                 "--tokenizer", TOK])
        if not check(preset + ": run exits 0", r.returncode == 0, r.stderr[-300:]):
            continue
        head, _, got = r.stdout.partition("\n")
        check(preset + ": prompt line", head == 'prompt: "What\'s the weather in Paris?"', head)
        ids = [2] + tokenize(needle, query)
        gen, margin = ref_greedy(path, ids, steps)
        want = decode(needle, gen)
        check(preset + ": the reference continues with varied tokens", len(set(gen)) > 2,
              str(gen[:12]))
        check(preset + ": no near tie in the reference", margin > 1e-4, "margin %g" % margin)
        check(preset + ": continuation = the reference's greedy argmax", got == want + "\n",
              "%r vs %r" % (got[:80], want[:80]))
        if preset == "tiny3b":
            check(preset + ": no id past out_vocab", all(t < 8000 for t in gen))

        # --tools FILE: 3.x's chat template around the query
        r = run([needle, "run", "--checkpoint", path, "--query", query, "--max-len", "16",
                 "--tokenizer", TOK, "--tools", tools_file])
        if not check(preset + ": run --tools exits 0", r.returncode == 0, r.stderr[-300:]):
            continue
        rendered = ("<|im_start|>user\n<tools>" + json.dumps(tools, separators=(",", ":"),
                                                             ensure_ascii=False)
                    + "</tools>\n" + query + "<|im_end|>\n<|im_start|>assistant\n")
        head, _, got = r.stdout.partition("\n")
        check(preset + ": --tools prompt line is the rendered prompt's repr",
              head == "prompt: " + repr(rendered), head[:120])
        gen, _ = ref_greedy(path, [2] + tokenize(needle, rendered), 16)
        check(preset + ": --tools continuation = the reference's", got == decode(needle, gen)
              + "\n", "%r" % got[:80])
        r = run([needle, "run", "--checkpoint", path, "--query", query, "--max-len", "4",
                 "--tokenizer", TOK, "--tools", empty_file])
        check(preset + ": an empty tools list keeps the bare query",
              r.returncode == 0 and r.stdout.startswith('prompt: "What\'s the weather'),
              r.stdout[:60])
    pk = os.path.join(tmp, "init3.pkl")
    r = run([needle, "init", pk, "--preset", "tiny3", "--seed", "4"])
    if check("init --preset tiny3 (pickle)", r.returncode == 0, r.stderr[-300:]):
        r = run([needle, "run", "--checkpoint", pk, "--query", query, "--max-len", "6",
                 "--tokenizer", TOK])
        head, _, got = r.stdout.partition("\n")
        gen = greedy_by_eval(needle, tmp, pk, [2] + tokenize(needle, query), 6)
        check("pickle: continuation = eval's greedy argmax",
              r.returncode == 0 and got == decode(needle, gen) + "\n",
              "%r vs %r %s" % (got[:60], decode(needle, gen)[:60], r.stderr[-200:]))
    r = run([needle, "run", "--checkpoint", os.path.join(tmp, "tiny3.safetensors"), "--query",
             query, "--tokenizer", TOK, "--tools", os.path.join(tmp, "none.json")])
    check("a missing tools file is named", r.returncode == 1 and "none.json" in r.stderr,
          r.stderr[-200:])
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
