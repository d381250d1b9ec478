#!/usr/bin/python3
"""needle finetune end to end on a tiny checkpoint, plus its bad inputs.

Checks: training loss falls by at least half and the tuned model beats the
untrained one on held-out data; the adapter is the upstream pickle (keys,
shapes, float32, scale/base/rank); eval --lora and --grad-norms; NaN stops
the run keeping the last good adapter; Ctrl-C saves and --resume finishes;
bad inputs fail cleanly with no partial files.
"""
import glob
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
NEEDLE = os.environ.get("NEEDLE", os.path.join(SRC, "build", "needle"))
TOK = os.path.join(SRC, "models", "tokenizer.model")
DATA = os.path.join(SRC, "examples", "data.jsonl")
fails = 0


def check(cond, what, detail=""):
    global fails
    print(f"{'ok  ' if cond else 'FAIL'} {what}  {detail}")
    if not cond:
        fails += 1


def run(*args, **kw):
    return subprocess.run([NEEDLE, *args], capture_output=True, text=True, **kw)


def no_tmp_files(d):
    # temporaries are hidden (".NAME.tmp.PID"); older ones were "NAME.tmp.XXXXXX"
    return not (glob.glob(os.path.join(d, "*.tmp.*")) or glob.glob(os.path.join(d, ".*.tmp.*")))


def main():
    tmp = tempfile.mkdtemp(prefix="needle-ft-")
    ck = os.path.join(tmp, "tiny.pkl")
    r = run("init", ck, "--preset", "tiny", "--seed", "1")
    check(r.returncode == 0, "init tiny", r.stderr.strip())
    # A random tiny base cannot show LoRA learning: its output embeddings are
    # frozen at std 0.02, so no adapter can lift a logit above ~1.3 (loss
    # floor ~ ln V - 1.3). So: pre-train the tiny base with --full on half the
    # examples (this is where "loss at least halves" is measured), then
    # LoRA-tune that base on the other half.
    with open(DATA) as f:
        lines = f.readlines()
    odd, even = os.path.join(tmp, "odd.jsonl"), os.path.join(tmp, "even.jsonl")
    with open(odd, "w") as f:
        f.writelines(lines[0::2])
    with open(even, "w") as f:
        f.writelines(lines[1::2])
    data = even
    tok = ["--tokenizer", TOK, "--batch-size", "8", "--max-len", "256"]

    def eval_loss(ckpt, path, *extra):
        r = run("eval", path, "--checkpoint", ckpt, "--tokenizer", TOK, "--max-len", "256",
                "--json", *extra)
        return json.loads(r.stdout)["mean_loss"] if r.returncode == 0 else float("nan")

    pre = os.path.join(tmp, "pretrained.pkl")
    r = run("finetune", odd, "--full", "--checkpoint", ck, *tok, "--epochs", "4", "--lr",
            "1e-2", "--out", pre)
    check(r.returncode == 0 and os.path.exists(pre), "finetune --full writes a checkpoint",
          r.stderr[-300:])
    l0, l1 = eval_loss(ck, odd), eval_loss(pre, odd)
    check(l1 <= 0.5 * l0, "full fine-tune: training-set loss at least halves",
          f"{l0:.4f} -> {l1:.4f}")
    with open(pre, "rb") as f:
        pc = pickle.load(f)
    check(pc["format_version"] == 2 and "mtp_block" in pc["params"],
          "the --full checkpoint keeps format_version 2 and the mtp_* tensors")

    ck = pre
    common = ["--checkpoint", ck, *tok]
    base_loss = eval_loss(ck, data)
    ad = os.path.join(tmp, "adapter.pkl")
    t0 = time.time()
    r = run("finetune", data, *common, "--epochs", "8", "--lr", "1e-2", "--out", ad,
            "--seed", "3")
    print(r.stdout)
    check(r.returncode == 0, "finetune exits 0", r.stderr[-500:])
    print(f"     ({time.time() - t0:.1f} s)")
    vals = [float(l.split("val")[1]) for l in r.stdout.splitlines()
            if l.strip().startswith("epoch")]
    for tag in ("backend", "data", "lora", "holdout", "schedule", "step", "epoch", "adapter",
                "next"):
        check(any(l.strip().startswith(tag) for l in r.stdout.splitlines()),
              f"progress line '{tag}'")
    tuned_loss = eval_loss(ck, data, "--lora", ad)
    check(tuned_loss < 0.9 * base_loss, "LoRA: training-set loss falls by over 10%",
          f"{base_loss:.4f} -> {tuned_loss:.4f}")
    check(len(vals) == 8 and vals[-1] < base_loss, "final val loss beats the base model",
          f"val {vals[-1] if vals else None} base {base_loss:.4f}")

    # the adapter as upstream reads it
    with open(ad, "rb") as f:
        a = pickle.load(f)
    names = ["stack/layers/block/self_attn/%s_proj/kernel" % p
             for p in ("q", "k", "v", "gate", "out")]
    check(sorted(a["lora"]) == sorted(names), "adapter keys", str(sorted(a["lora"])))
    shapes = {"q": (64, 64), "k": (64, 32), "v": (64, 32), "gate": (64, 64), "out": (64, 64)}
    ok = True
    for p, (i, o) in shapes.items():
        A = a["lora"]["stack/layers/block/self_attn/%s_proj/kernel" % p]["A"]
        B = a["lora"]["stack/layers/block/self_attn/%s_proj/kernel" % p]["B"]
        ok &= A.shape == (2, i, 16) and B.shape == (2, 16, o)
        ok &= A.dtype == np.float32 and B.dtype == np.float32
        ok &= bool(np.isfinite(A).all() and np.isfinite(B).all()) and np.abs(B).max() > 0
    check(ok, "adapter shapes (L,in,r)/(L,r,out), float32, trained B != 0")
    check(a["scale"] == 2.0 and a["rank"] == 16 and a["base"] == ck, "scale/rank/base",
          f"{a['scale']} {a['rank']} {a['base']}")

    # grad norms of a fresh adapter: B = 0 so every dA is exactly 0
    g = run("eval", data, "--checkpoint", ck, "--tokenizer", TOK, "--json", "--grad-norms",
            "--lora-rank", "4", "--seed", "5")
    gj = json.loads(g.stdout)["grad_norms"] if g.returncode == 0 else {}
    parts = [v for k, v in gj.items() if k != "global"]
    check(len(parts) == 5 and all(v["A"] == 0.0 and v["B"] > 0 for v in parts),
          "grad-norms fresh adapter: |dA| = 0, |dB| > 0", json.dumps(gj)[:200])
    glob_norm = np.sqrt(sum(v["A"] ** 2 + v["B"] ** 2 for v in parts)) if parts else -1
    check(parts and abs(glob_norm - gj["global"]) <= 1e-5 * gj["global"],
          "grad-norms global = L2 of the parts", f"{glob_norm} vs {gj.get('global')}")
    g2 = run("eval", data, "--checkpoint", ck, "--tokenizer", TOK, "--json", "--grad-norms",
             "--lora", ad)
    g2j = json.loads(g2.stdout)["grad_norms"] if g2.returncode == 0 else {}
    check(g2.returncode == 0 and all(v["A"] > 0 for k, v in g2j.items() if k != "global"),
          "grad-norms of a trained adapter: |dA| > 0")

    # NaN: a checkpoint with a non-finite weight stops at step 1, keeps the adapter
    with open(ck, "rb") as f:
        c = pickle.load(f)
    c["params"]["stack"]["final_norm"]["scale"][0] = np.nan
    bad = os.path.join(tmp, "nan.pkl")
    with open(bad, "wb") as f:
        pickle.dump(c, f)
    nan_ad = os.path.join(tmp, "nan_adapter.pkl")
    r = run("finetune", data, "--checkpoint", bad, *tok, "--epochs", "1", "--out", nan_ad)
    check(r.returncode != 0 and "not finite" in r.stderr, "NaN loss stops the run",
          r.stderr.strip()[-200:])
    if os.path.exists(nan_ad):
        with open(nan_ad, "rb") as f:
            na = pickle.load(f)
        fin = all(np.isfinite(v["A"]).all() and np.isfinite(v["B"]).all()
                  for v in na["lora"].values())
        check(fin, "the last good adapter is written and finite")
    else:
        check(False, "the last good adapter is written and finite", "missing")

    # Ctrl-C saves the adapter; --resume finishes the schedule
    ad2 = os.path.join(tmp, "interrupted.pkl")
    p = subprocess.Popen([NEEDLE, "finetune", data, *common, "--epochs", "6", "--out", ad2],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = ""
    while True:
        line = p.stdout.readline()
        out += line
        if line.strip().startswith("epoch") or not line:
            break
    p.send_signal(signal.SIGINT)
    o2, e2 = p.communicate(timeout=600)
    check(p.returncode != 0 and "--resume" in e2 and os.path.exists(ad2),
          "Ctrl-C writes the adapter and says how to resume", e2.strip()[-200:])
    r = run("finetune", data, *common, "--epochs", "6", "--out", ad2, "--resume", ad2)
    check(r.returncode == 0 and "resume" in r.stdout and "36/36" in r.stdout,
          "--resume continues to the end of the schedule", r.stdout[-300:] + r.stderr[-300:])

    # bad inputs: clear error, non-zero exit, no partial files
    cases = [
        ("missing checkpoint", ["finetune", data, "--checkpoint", os.path.join(tmp, "no.pkl"),
                                "--tokenizer", TOK], "Hugging Face"),
        ("missing tokenizer", ["finetune", data, "--checkpoint", ck, "--tokenizer",
                               os.path.join(tmp, "no.model")], "no.model"),
        ("missing data", ["finetune", os.path.join(tmp, "nodata.jsonl"), *common], "nodata"),
        ("empty data", ["finetune", os.path.join(tmp, "empty.jsonl"), *common], "empty"),
        ("batch larger than data", ["finetune", data, "--checkpoint", ck, "--tokenizer", TOK,
                                    "--batch-size", "500"], "batch size"),
        ("zero epochs", ["finetune", data, *common, "--epochs", "0"], "--epochs"),
        ("zero rank", ["finetune", data, *common, "--lora-rank", "0"], "--lora-rank"),
        ("negative lr", ["finetune", data, *common, "--lr", "-1"], "--lr"),
        ("unwritable output", ["finetune", data, *common, "--epochs", "1", "--out",
                               os.path.join(tmp, "no", "such", "dir", "a.pkl")], "a.pkl"),
    ]
    open(os.path.join(tmp, "empty.jsonl"), "w").close()
    for name, args, needle_in_msg in cases:
        r = run(*args, cwd=tmp)
        check(r.returncode != 0 and needle_in_msg in r.stderr and no_tmp_files(tmp),
              f"bad input: {name}", r.stderr.strip().splitlines()[-1][:160] if r.stderr else "")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
