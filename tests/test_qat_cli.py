#!/usr/bin/python3
"""needle finetune --qat end to end on a tiny checkpoint.

Checks: --qat --bits 2 trains and records qat/qat_scheme in the adapter's
needle_c_state (other keys as upstream's); `needle build` notes an archive
built at other bits than the fine-tune used, and stays quiet otherwise;
`needle eval --qat` gives the quantised weights' loss; --resume
keeps --qat working (the optimiser count continues) and refuses a changed
--qat setting or width; --full --qat trains; bad --bits are refused.
"""
import os
import pickle
import subprocess
import sys
import tempfile

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


def run(*args):
    return subprocess.run([NEEDLE, *args], capture_output=True, text=True)


def state(path):
    with open(path, "rb") as f:
        ad = pickle.load(f)
    return ad, ad.get("needle_c_state", {})


def eval_loss(ck, *extra):
    import json
    r = run("eval", DATA, "--checkpoint", ck, "--tokenizer", TOK, "--max-len", "256",
            "--json", *extra)
    if r.returncode != 0:
        print(r.stderr)
        return float("nan")
    return json.loads(r.stdout)["mean_loss"]


def main():
    tmp = tempfile.mkdtemp(prefix="needle-qat-")
    ck = os.path.join(tmp, "tiny.pkl")
    r = run("init", ck, "--preset", "tiny", "--seed", "1")
    check(r.returncode == 0, "init tiny", r.stderr.strip())
    ft = ["finetune", DATA, "--checkpoint", ck, "--tokenizer", TOK, "--batch-size", "8",
          "--max-len", "256", "--epochs", "1"]
    a1 = os.path.join(tmp, "a1.pkl")
    r = run(*ft, "--qat", "--bits", "2", "--out", a1)
    check(r.returncode == 0 and "W2 quantise-dequantise" in r.stdout, "finetune --qat --bits 2",
          (r.stdout + r.stderr).strip()[-300:])
    ad, st = state(a1)
    check(set(ad) == {"lora", "scale", "base", "rank", "needle_c_state"},
          "adapter keys as upstream's plus needle_c_state", str(sorted(ad)))
    check(st.get("qat") == 1 and st.get("qat_scheme") == "W2", "adapter records qat W2",
          f"{st.get('qat')} {st.get('qat_scheme')}")
    check("--bits 2" in r.stdout, "the suggested build command keeps --bits 2")

    # build: a note for other bits, none for the same
    r4 = run("build", ck, "--lora", a1, "--bits", "4", "--out", os.path.join(tmp, "x4.cact"),
             "--tokenizer", TOK)
    r2 = run("build", ck, "--lora", a1, "--bits", "2", "--out", os.path.join(tmp, "x2.cact"),
             "--tokenizer", TOK)
    check(r4.returncode == 0 and "--qat at W2 but this archive is W4" in r4.stderr,
          "build at W4 notes the W2 --qat adapter", r4.stderr.strip()[-200:])
    check(r2.returncode == 0 and "note" not in r2.stderr, "build at W2: no note",
          r2.stderr.strip()[-200:])

    # eval --qat: the archive's weights give another loss than the float ones
    lf = eval_loss(ck, "--lora", a1)
    l2 = eval_loss(ck, "--lora", a1, "--qat", "--bits", "2")
    l4 = eval_loss(ck, "--lora", a1, "--qat", "--bits", "4")
    check(lf == lf and l2 == l2 and l4 == l4 and len({lf, l2, l4}) == 3,
          "eval --qat: the 2-bit and 4-bit weights each give another loss",
          f"float {lf:.5f} W4 {l4:.5f} W2 {l2:.5f}")

    # resume keeps --qat; the optimiser count goes on
    a2 = os.path.join(tmp, "a2.pkl")
    r = run(*ft[:-1], "2", "--qat", "--bits", "2", "--resume", a1, "--out", a2,
            "--resume-override")
    _, st2 = state(a2) if os.path.exists(a2) else ({}, {})
    check(r.returncode == 0 and "W2 quantise-dequantise" in r.stdout and st2.get("qat") == 1
          and st2.get("count") == 2 * st.get("count", -1),
          "--qat --resume continues", f"count {st.get('count')} -> {st2.get('count')} "
          + (r.stdout + r.stderr).strip()[-300:])
    bad_resume = [
        ("other --bits", ["--qat", "--bits", "4"], "--qat scheme W2 (adapter) vs W4"),
        ("without --qat", [], "--qat (1 = on) 1 (adapter) vs 0"),
    ]
    for what, extra, msg in bad_resume:
        out = os.path.join(tmp, "a3.pkl")
        r = run(*ft, *extra, "--resume", a1, "--out", out)
        check(r.returncode != 0 and msg in r.stderr and not os.path.exists(out),
              f"resume {what} refused", r.stderr.strip()[-300:])

    # --full --qat
    full = os.path.join(tmp, "full.pkl")
    r = run(*ft, "--full", "--qat", "--bits", "2", "--out", full)
    check(r.returncode == 0 and os.path.exists(full), "--full --qat trains",
          (r.stdout + r.stderr).strip()[-300:])

    for args, what in [(["--qat", "--bits", "5"], "--bits 5"), (["--qat", "--bits", "x"],
                                                                  "--bits x"),
                       (["--bits", "2"], "--bits without --qat")]:
        out = os.path.join(tmp, "bad.pkl")
        r = run(*ft, *args, "--out", out)
        check(r.returncode == 2 and "--bits" in r.stderr and not os.path.exists(out),
              f"finetune {what} refused", r.stderr.strip()[-200:])
    r = run("eval", DATA, "--checkpoint", ck, "--tokenizer", TOK, "--qat", "--bits", "1")
    check(r.returncode == 2 and "--bits" in r.stderr, "eval --bits 1 refused")
    print(f"{fails} failure(s)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
