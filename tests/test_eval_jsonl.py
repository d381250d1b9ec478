#!/usr/bin/python3
"""`needle eval DATA.jsonl` against an independent reference: upstream's
rendering + python3-sentencepiece ids (tests/test_render.py's port), the
numpy model (tests/ref/san_ref.py) and upstream's loss_fn arithmetic
(sum of masked CE / masked positions), with and without a LoRA adapter
(W + scale * A @ B)."""
import importlib.util
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile

import numpy as np
import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
NEEDLE = os.environ.get("NEEDLE", os.path.join(SRC, "build", "needle"))
TOK = os.path.join(SRC, "models", "tokenizer.model")
sys.path.insert(0, os.path.join(HERE, "ref"))
import san_ref  # noqa: E402

spec = importlib.util.spec_from_file_location("render_ref", os.path.join(HERE, "test_render.py"))
render_ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(render_ref)
fails = 0


def check(cond, what, detail=""):
    global fails
    print(f"{'ok  ' if cond else 'FAIL'} {what}  {detail}")
    fails += not cond


def reference_losses(ckpt, rows, lora=None):
    m = san_ref.load(ckpt)
    if lora:
        for path, ab in lora["lora"].items():
            m.P[path] = m.P[path] + lora["scale"] * np.matmul(ab["A"].astype(np.float64),
                                                              ab["B"].astype(np.float64))
    per, tot_s, tot_n = [], 0.0, 0.0
    for r in rows:
        ids, mask = r["ids"], r["mask"]
        logits = san_ref.forward(m, ids)
        s = n = 0.0
        for t in range(len(ids) - 1):
            if mask[t + 1]:
                row = logits[t]
                mx = row.max()
                s += mx + math.log(np.exp(row - mx).sum()) - row[ids[t + 1]]
                n += 1
        per.append((s / n if n else 0.0, n))
        tot_s += s
        tot_n += n
    return per, tot_s / max(tot_n, 1.0)


def compare(name, out, per, mean):
    got = json.loads(out)
    ex = got["examples"]
    check(len(ex) == len(per) and all(int(e["tokens"]) == int(n) for e, (_, n) in zip(ex, per)),
          f"{name}: example count and masked positions", str([e["tokens"] for e in ex]))
    err = max(abs(e["loss"] - l) / max(abs(l), 1e-6) for e, (l, _) in zip(ex, per))
    check(err <= 1e-4, f"{name}: per-example losses vs reference", f"max rel err {err:.2e}")
    merr = abs(got["mean_loss"] - mean) / abs(mean)
    check(merr <= 1e-4, f"{name}: mean_loss (sum CE / masked) vs reference",
          f"{got['mean_loss']:.6f} vs {mean:.6f} ({merr:.2e})")


def main():
    tmp = tempfile.mkdtemp(prefix="needle-evj-")
    ck = os.path.join(tmp, "tiny.pkl")
    subprocess.run([sys.executable, os.path.join(HERE, "ref", "make_ckpt.py"), ck, "--preset",
                    "tiny", "--perturb", "--seed", "11"], check=True)
    data = os.path.join(tmp, "data.jsonl")
    with open(os.path.join(SRC, "examples", "data.jsonl")) as f:
        lines = f.readlines()[:5]
    lines.append(json.dumps({"query": "Weather in Z\u00fcrich? \U0001F324", "system": "Be brief.",
                             "reasoning": "use the tool", "tools": [{"name": "w"}],
                             "answers": [{"name": "w", "arguments": {"c": 1.5}}]}) + "\n")
    lines.append(json.dumps({"no_query": 1}) + "\n")  # skipped, as upstream
    with open(data, "w") as f:
        f.writelines(lines)
    sp = spm.SentencePieceProcessor(model_file=TOK)
    rows = render_ref.reference(data, sp, 256)
    per, mean = reference_losses(ck, rows)
    # every batching mode against the reference: shared prefixes (default),
    # packed at own lengths, upstream's padded batches
    for mode in ("shared", "packed", "padded"):
        r = subprocess.run([NEEDLE, "eval", data, "--checkpoint", ck, "--tokenizer", TOK,
                            "--max-len", "256", "--json", "--batch-size", "4",
                            "--batching", mode], capture_output=True, text=True)
        check(r.returncode == 0, f"eval JSONL --batching {mode} exits 0", r.stderr[-300:])
        if r.returncode == 0:
            compare(f"base ({mode})", r.stdout, per, mean)

    # a random adapter with B != 0 on every target
    rng = np.random.default_rng(5)
    m = san_ref.load(ck)
    lora = {"lora": {}, "scale": 0.75, "base": ck, "rank": 3}
    for p in ("q", "k", "v", "gate", "out"):
        path = f"stack/layers/block/self_attn/{p}_proj/kernel"
        L, i, o = m.P[path].shape
        lora["lora"][path] = {"A": rng.normal(0, 0.3, (L, i, 3)).astype(np.float32),
                              "B": rng.normal(0, 0.3, (L, 3, o)).astype(np.float32)}
    ad = os.path.join(tmp, "adapter.pkl")
    with open(ad, "wb") as f:
        pickle.dump(lora, f)
    per, mean = reference_losses(ck, rows, lora)
    r = subprocess.run([NEEDLE, "eval", data, "--checkpoint", ck, "--tokenizer", TOK,
                        "--max-len", "256", "--json", "--lora", ad],
                       capture_output=True, text=True)
    check(r.returncode == 0, "eval JSONL --lora exits 0", r.stderr[-300:])
    if r.returncode == 0:
        compare("with adapter", r.stdout, per, mean)

    # the gradient of the loss w.r.t. the adapter: shared-prefix and packed
    # batches against upstream's padded ones (every A and B norm)
    norms = {}
    for mode in ("padded", "packed", "shared"):
        r = subprocess.run([NEEDLE, "eval", data, "--checkpoint", ck, "--tokenizer", TOK,
                            "--max-len", "256", "--json", "--lora", ad, "--grad-norms",
                            "--batch-size", "3", "--batching", mode],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"eval --grad-norms --batching {mode} exits 0", r.stderr[-300:])
        if r.returncode == 0:
            norms[mode] = json.loads(r.stdout)["grad_norms"]
    if len(norms) == 3:
        def flat(g):
            out = {"global": g["global"]}
            for k, v in g.items():
                if k != "global":
                    out[k + " A"], out[k + " B"] = v["A"], v["B"]
            return out
        ref = flat(norms["padded"])
        for mode in ("packed", "shared"):
            got = flat(norms[mode])
            err = max(abs(got[k] - v) / max(abs(v), 1e-12) for k, v in ref.items())
            check(err <= 1e-4, f"grad norms: {mode} vs padded", f"max rel err {err:.2e}")

    # a tokenizer whose vocabulary differs from the checkpoint's is refused
    ck2 = os.path.join(tmp, "v512.pkl")
    subprocess.run([sys.executable, os.path.join(HERE, "ref", "make_ckpt.py"), ck2, "--preset",
                    "tiny", "--vocab", "512"], check=True)
    r = subprocess.run([NEEDLE, "eval", data, "--checkpoint", ck2, "--tokenizer", TOK],
                       capture_output=True, text=True)
    check(r.returncode != 0 and "8192" in r.stderr and "512" in r.stderr,
          "vocab mismatch refused", r.stderr.strip()[-160:])
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
