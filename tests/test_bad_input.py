#!/usr/bin/python3
"""Every row of the bad-input table in docs/bad-inputs.md, run.

Each case runs one `needle` command against a bad input and checks: the exit
code, a phrase of the message, and what is kept (inputs unchanged, no output,
no temporary file left). The table's rows and this file's cases must match
one to one: a row without a case (or a case without a row) fails the test.
"""
import glob
import hashlib
import os
import pickle
import re
import resource
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(HERE))
NEEDLE = os.environ.get("NEEDLE", os.path.join(SRC, "build", "needle"))
TOK = os.path.join(SRC, "models", "tokenizer.model")
DATA = os.path.join(SRC, "examples", "data.jsonl")
fails = 0
T = {}  # name -> path in the temp dir
FT = ["--tokenizer", TOK, "--batch-size", "8", "--max-len", "256", "--threads", "1"]


def check(cond, what, detail=""):
    global fails
    print(f"{'ok  ' if cond else 'FAIL'} {what}  {detail}")
    if not cond:
        fails += 1


def run(*args, **kw):
    return subprocess.run([NEEDLE, *map(str, args)], capture_output=True, text=True, **kw)


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def temps(d):
    return glob.glob(os.path.join(d, ".*.tmp.*")) + glob.glob(os.path.join(d, "*.tmp.*"))


def save_pickle(obj, path):
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def load_pickle(path):
    with open(path, "rb") as f:
        return pickle.load(f)


# ---- cases: id -> (command, exit code, phrase in stderr, check of what is kept) ----

def unchanged(*names):
    before = {n: digest(T[n]) for n in names}

    def kept():
        return all(digest(T[n]) == before[n] for n in names)
    return kept


def absent(*names):
    return lambda: not any(os.path.lexists(T[n]) for n in names)


def both(a, b):
    return lambda: a() and b()


def is_kind(path, test):
    return lambda: os.path.lexists(path) and test(os.lstat(path).st_mode)


def case_build_same(c):
    return ["build", T["c2"], "--tokenizer", TOK, "--out", T["c2"]], 1, \
        "is the same file as the checkpoint", unchanged("c2")


def case_build_same_adapter(c):
    return ["build", T["c"], "--tokenizer", TOK, "--lora", T["a2"], "--out", T["a2"]], 1, \
        "is the same file as the adapter", unchanged("a2")


def case_build_same_tokenizer(c):
    return ["build", T["c"], "--tokenizer", T["tokcopy"], "--out", T["tokcopy"]], 1, \
        "is the same file as the tokenizer", unchanged("tokcopy")


def case_build_link_to_input(c):
    return ["build", T["c2"], "--tokenizer", TOK, "--out", T["link_c2"]], 1, \
        "is the same file as the checkpoint", \
        both(unchanged("c2"), is_kind(T["link_c2"], stat.S_ISLNK))


def case_finetune_same_data(c):
    return ["finetune", T["d2"], "--checkpoint", T["c"], *FT, "--out", T["d2"]], 1, \
        "is the same file as the training data", unchanged("d2")


def case_finetune_same_checkpoint(c):
    return ["finetune", T["d"], "--checkpoint", T["c2"], *FT, "--out", T["c2"]], 1, \
        "is the same file as the base checkpoint", unchanged("c2")


def case_inspect_same(c):
    return ["inspect", T["m2"], "--dequant", "#0", "--out", T["m2"]], 1, \
        "is the same file as the archive", unchanged("m2")


def case_eval_logits_same(c):
    return ["eval", "--checkpoint", T["c2"], "--tokens", T["tokens"], "--logits", T["c2"]], 1, \
        "is the same file as the checkpoint", unchanged("c2")


def case_tokenize_blob_same(c):
    return ["tokenize", "--tokenizer", T["tokcopy"], "--export-blob", T["tokcopy"]], 1, \
        "is the same file as the tokenizer", unchanged("tokcopy")


def case_out_symlink(c):
    return ["build", T["c"], "--tokenizer", TOK, "--out", T["link_other"]], 1, \
        "is a symbolic link; refusing to replace it", \
        both(unchanged("other"), is_kind(T["link_other"], stat.S_ISLNK))


def case_out_fifo(c):
    return ["build", T["c"], "--tokenizer", TOK, "--out", T["fifo"]], 1, \
        "is a FIFO (named pipe); refusing to replace it", is_kind(T["fifo"], stat.S_ISFIFO)


def case_out_char_device(c):
    dev = T["chardev"]
    return ["build", T["c"], "--tokenizer", TOK, "--out", dev], 1, \
        "is a character device; refusing to replace it", is_kind(dev, stat.S_ISCHR)


def case_out_directory(c):
    return ["build", T["c"], "--tokenizer", TOK, "--out", T["adir"]], 1, \
        "is a directory; refusing to replace it", is_kind(T["adir"], stat.S_ISDIR)


def case_finetune_out_unwritable(c):
    out = os.path.join(T["dir"], "no", "such", "dir", "a.pkl")
    return ["finetune", T["d"], "--checkpoint", T["c"], *FT, "--epochs", "50", "--out", out], 1, \
        "a.pkl: cannot create output: No such file or directory", \
        lambda: "step" not in c["stdout"] and "backend" not in c["stdout"]


def case_finetune_ckdir_unwritable(c):
    return ["finetune", T["d"], "--checkpoint", T["c"], *FT, "--checkpoint-dir",
            os.path.join(T["other"], "sub")], 1, \
        "cannot create the checkpoint directory: Not a directory", \
        lambda: "step" not in c["stdout"]


def case_eval_lora_unknown_target(c):
    return ["eval", T["d"], "--checkpoint", T["c"], "--tokenizer", TOK, "--max-len", "256",
            "--lora", T["unk"]], 1, \
        "adapter targets 'stack/layers/block/self_attn/bogus_proj/kernel', which is not a " \
        "LoRA target of this model", unchanged("unk")


def case_resume_unknown_target(c):
    return ["finetune", T["d"], "--checkpoint", T["c"], *FT, "--resume", T["unk"], "--out",
            T["unk"]], 1, \
        "adapter targets 'stack/layers/block/self_attn/bogus_proj/kernel'", unchanged("unk")


def case_max_len_no_targets(c):
    out = os.path.join(T["dir"], "nothing.pkl")
    T["nothing"] = out
    return ["finetune", T["d"], "--checkpoint", T["c"], "--tokenizer", TOK, "--batch-size", "8",
            "--max-len", "8", "--out", out], 1, \
        "no target tokens to train on: --max-len 8 cuts every training example", \
        absent("nothing")


def case_build_nan_weight(c):
    T["nan_cact"] = os.path.join(T["dir"], "nan.cact")
    return ["build", T["nan"], "--tokenizer", TOK, "--out", T["nan_cact"]], 1, \
        "tensor stack/final_norm/scale has a non-finite value (nan", absent("nan_cact")


def case_build_inf_weight(c):
    T["inf_cact"] = os.path.join(T["dir"], "inf.cact")
    return ["build", T["inf"], "--tokenizer", TOK, "--out", T["inf_cact"]], 1, \
        "has a non-finite value (inf", absent("inf_cact")


def case_build_adapter_nan_scale(c):
    T["o1"] = os.path.join(T["dir"], "o1.cact")
    return ["build", T["c"], "--tokenizer", TOK, "--lora", T["nanscale"], "--out", T["o1"]], 1, \
        "adapter 'scale' is nan", absent("o1")


def case_build_adapter_huge_scale(c):
    T["o2"] = os.path.join(T["dir"], "o2.cact")
    return ["build", T["c"], "--tokenizer", TOK, "--lora", T["hugescale"], "--out", T["o2"]], 1, \
        "adapter 'scale' is 1e+30", absent("o2")


def case_build_adapter_nan_a(c):
    T["o3"] = os.path.join(T["dir"], "o3.cact")
    return ["build", T["c"], "--tokenizer", TOK, "--lora", T["nanA"], "--out", T["o3"]], 1, \
        "adapter A stack/layers/block/self_attn/q_proj/kernel has a non-finite value", \
        absent("o3")


def case_eval_nan_loss(c):
    return ["eval", T["d"], "--checkpoint", T["nan"], "--tokenizer", TOK, "--max-len", "256"], \
        1, "the loss is not finite", lambda: "nan" in c["stdout"]


def case_eval_tokens_nan_loss(c):
    return ["eval", "--checkpoint", T["nan"], "--tokens", T["tokens"]], 1, \
        "the loss is not finite", lambda: "nan" in c["stdout"]


def case_eval_adapter_nan_b(c):
    return ["eval", T["d"], "--checkpoint", T["c"], "--tokenizer", TOK, "--max-len", "256",
            "--lora", T["nanB"]], 1, \
        "adapter B stack/layers/block/self_attn/q_proj/kernel has a non-finite value", \
        unchanged("nanB")


def case_adapter_as_checkpoint(c):
    return ["eval", T["d"], "--checkpoint", T["a"], "--tokenizer", TOK], 1, \
        "this is a LoRA adapter, not a checkpoint; pass it with --lora", unchanged("a")


def case_run_missing_weights(c):
    missing = os.path.join(T["dir"], "missing.cact")
    return ["run", "--weights", missing, "--tools", T["tools"], "hi"], 1, \
        "missing.cact: cannot open: No such file or directory", \
        lambda: c["stderr"].count("missing.cact") == 1


def case_run_missing_tools(c):
    missing = os.path.join(T["dir"], "missing_tools.json")
    return ["run", "--weights", T["m"], "--tools", missing, "hi"], 1, \
        "missing_tools.json: cannot open: No such file or directory", \
        lambda: c["stderr"].count("missing_tools.json") == 1


def case_logits_write_fails(c):
    T["logits"] = os.path.join(T["dir"], "logits.bin")
    c["preexec"] = small_file_limit
    return ["eval", "--checkpoint", T["c"], "--tokens", T["tokens"], "--logits", T["logits"]], 1, \
        "logits.bin: write failed: File too large", \
        lambda: not os.path.exists(T["logits"]) and T["tokens"] not in c["stderr"]


def case_resume_other_settings(c):
    return ["finetune", T["d"], "--checkpoint", T["c"], *FT, "--epochs", "1", "--val-split", "0",
            "--seed", "5", "--resume", T["a2"], "--out", T["a2"]], 1, \
        "--seed 0 (adapter) vs 5 (this run)", unchanged("a2")


def case_resume_override(c):
    shutil.copy(T["a"], T["a3"])
    return ["finetune", T["d"], "--checkpoint", T["c"], *FT, "--epochs", "2", "--val-split", "0",
            "--seed", "5", "--resume", T["a3"], "--out", T["a3"], "--resume-override"], 0, \
        "", lambda: "--resume-override: continuing despite: --seed 0 (adapter) vs 5" in \
        c["stdout"] and load_pickle(T["a3"])["needle_c_state"]["seed"] == 5


def case_resume_no_record(c):
    return ["finetune", T["d"], "--checkpoint", T["c"], *FT, "--epochs", "1", "--val-split", "0",
            "--resume", T["norecord"], "--out", T["norecord_out"]], 0, \
        "", lambda: "records no run settings" in c["stdout"] and \
        os.path.exists(T["norecord_out"])


CASES = {
    "build-out-is-checkpoint": case_build_same,
    "build-out-is-adapter": case_build_same_adapter,
    "build-out-is-tokenizer": case_build_same_tokenizer,
    "build-out-links-to-input": case_build_link_to_input,
    "finetune-out-is-data": case_finetune_same_data,
    "finetune-out-is-checkpoint": case_finetune_same_checkpoint,
    "inspect-out-is-archive": case_inspect_same,
    "eval-logits-is-checkpoint": case_eval_logits_same,
    "tokenize-blob-is-tokenizer": case_tokenize_blob_same,
    "out-symlink": case_out_symlink,
    "out-fifo": case_out_fifo,
    "out-char-device": case_out_char_device,
    "out-directory": case_out_directory,
    "finetune-out-unwritable": case_finetune_out_unwritable,
    "finetune-checkpoint-dir-unwritable": case_finetune_ckdir_unwritable,
    "eval-lora-unknown-target": case_eval_lora_unknown_target,
    "resume-unknown-target": case_resume_unknown_target,
    "max-len-no-targets": case_max_len_no_targets,
    "build-nan-weight": case_build_nan_weight,
    "build-inf-weight": case_build_inf_weight,
    "build-adapter-nan-scale": case_build_adapter_nan_scale,
    "build-adapter-huge-scale": case_build_adapter_huge_scale,
    "build-adapter-nan-a": case_build_adapter_nan_a,
    "eval-nan-loss": case_eval_nan_loss,
    "eval-tokens-nan-loss": case_eval_tokens_nan_loss,
    "eval-adapter-nan-b": case_eval_adapter_nan_b,
    "adapter-as-checkpoint": case_adapter_as_checkpoint,
    "run-missing-weights": case_run_missing_weights,
    "run-missing-tools": case_run_missing_tools,
    "logits-write-fails": case_logits_write_fails,
    "resume-other-settings": case_resume_other_settings,
    "resume-override": case_resume_override,
    "resume-no-record": case_resume_no_record,
}


# rows run by signal_cases / periodic_save_failure below
EXTRA = {"sigterm", "sighup", "periodic-save-fails"}


def small_file_limit():
    # a regular file that cannot grow past 4 KiB: writes fail with EFBIG
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def setup(tmp):
    T["dir"] = tmp

    def p(name):
        T[name] = os.path.join(tmp, name)
        return T[name]
    r = run("init", p("c"), "--preset", "tiny", "--seed", "1")
    assert r.returncode == 0, r.stderr
    for n in ("c2",):
        shutil.copy(T["c"], p(n))
    with open(DATA) as f:
        lines = f.readlines()[:24]
    for n in ("d", "d2"):
        with open(p(n), "w") as f:
            f.writelines(lines)
    r = run("finetune", T["d"], "--checkpoint", T["c"], *FT, "--epochs", "1", "--val-split", "0",
            "--out", p("a"))
    assert r.returncode == 0, r.stderr
    shutil.copy(T["a"], p("a2"))
    p("a3")
    shutil.copy(TOK, p("tokcopy"))
    r = run("build", T["c"], "--tokenizer", TOK, "--out", p("m"))
    assert r.returncode == 0, r.stderr
    shutil.copy(T["m"], p("m2"))
    with open(p("tokens"), "w") as f:
        f.write("1 5 9 200 31 7 8 9\n2 3 4 5 6 7 8 9 10 11 12\n")
    with open(p("tools"), "w") as f:
        f.write('[{"name": "f", "description": "d", "parameters": {"type": "object", '
                '"properties": {}}}]')
    with open(p("other"), "w") as f:
        f.write("another file\n")
    os.symlink(T["c2"], p("link_c2"))
    os.symlink(T["other"], p("link_other"))
    os.mkfifo(p("fifo"))
    # a character device: as root our own copy of /dev/null's (1, 3), so a
    # regression can never replace the system's (as a pre-fix build did)
    T["chardev"] = "/dev/null"
    if os.geteuid() == 0:
        try:
            os.mknod(p("null"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            T["chardev"] = T["null"]
        except OSError:
            pass
    os.mkdir(p("adir"))
    # adapters: unknown target, NaN/huge scale, NaN in A / B, no run record
    a = load_pickle(T["a"])
    q = "stack/layers/block/self_attn/q_proj/kernel"
    bad = dict(a, lora=dict(a["lora"]))
    bad["lora"]["stack/layers/block/self_attn/bogus_proj/kernel"] = a["lora"][q]
    save_pickle(bad, p("unk"))
    save_pickle(dict(a, scale=float("nan")), p("nanscale"))
    save_pickle(dict(a, scale=1e30), p("hugescale"))
    for which in ("A", "B"):
        b = dict(a, lora=dict(a["lora"]))
        g = dict(b["lora"][q])
        g[which] = g[which].copy()
        g[which][0, 0, 0] = np.nan
        b["lora"][q] = g
        save_pickle(b, p("nan" + which))
    save_pickle({k: v for k, v in a.items() if k != "needle_c_state"}, p("norecord"))
    p("norecord_out")
    # checkpoints with NaN / Inf weights
    c = load_pickle(T["c"])
    c["params"]["stack"]["final_norm"]["scale"][0] = np.nan
    save_pickle(c, p("nan"))
    c = load_pickle(T["c"])
    emb = c["params"]["stack"]["embed"]["embedding"] if "embed" in c["params"]["stack"] else None
    if emb is None:  # any float array will do
        def first(t):
            for v in t.values():
                if isinstance(v, dict):
                    r = first(v)
                    if r is not None:
                        return r
                elif isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size:
                    return v
        emb = first(c["params"])
    emb.flat[3] = np.inf
    save_pickle(c, p("inf"))


def table_rows():
    with open(os.path.join(SRC, "docs", "bad-inputs.md")) as f:
        text = f.read()
    if "## Bad inputs" not in text:
        return {}
    sec = text.split("## Bad inputs", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in sec.splitlines():
        m = re.match(r"\|\s*`([a-z0-9-]+)`\s*\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = [x.strip() for x in m.group(2).split("|")]
    return rows


def signal_cases(tmp):
    """SIGTERM / SIGHUP stop like Ctrl-C: adapter written, resume command
    printed, exit non-zero; the printed command finishes the run and prints
    no bogus loss for the epochs done before the resume."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        name = signal.Signals(sig).name
        out = os.path.join(tmp, f"sig_{name}.pkl")
        p = subprocess.Popen([NEEDLE, "finetune", T["d"], "--checkpoint", T["c"], *FT,
                              "--epochs", "4", "--out", out],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while True:
            line = p.stdout.readline()
            if line.strip().startswith("epoch") or not line:
                break
        p.send_signal(sig)
        so, se = p.communicate(timeout=300)
        m = re.search(r"to continue: (needle finetune .*)", se)
        check(p.returncode == 1 and os.path.exists(out) and m is not None and name in se,
              f"{name}: adapter written, resume command printed, exit 1", se.strip()[-300:])
        if not m:
            continue
        argv = shlex.split(m.group(1))
        r = subprocess.run([NEEDLE] + argv[1:], capture_output=True, text=True)
        check(r.returncode == 0 and "12/12" in r.stdout and "loss 0.0000" not in r.stdout
              and "epoch     1/4  done before the resume" in r.stdout,
              f"{name}: the printed command resumes; skipped epochs print no loss",
              (r.stdout + r.stderr)[-400:])


def periodic_save_failure(tmp):
    """A failing --save-every save warns and training goes on: the output is
    swapped for a symbolic link (refused) after the first save, then put
    back once the warning is seen; the final save succeeds."""
    out = os.path.join(tmp, "periodic.pkl")
    p = subprocess.Popen([NEEDLE, "finetune", T["d"], "--checkpoint", T["c"], *FT,
                          "--epochs", "30", "--save-every", "1", "--out", out],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines, swapped, warned = [], False, False
    while True:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if not swapped and line.strip().startswith("step") and os.path.exists(out):
            # swap atomically: a save may rename a new file into place meanwhile
            link = out + ".link"
            os.symlink(T["other"], link)
            os.replace(link, out)
            swapped = True
        if swapped and not warned and "periodic save" in line:
            warned = True
            os.unlink(out)
    p.wait(timeout=300)
    text = "".join(lines)
    ok = p.returncode == 0 and warned and "90/90" in text and os.path.isfile(out) \
        and not os.path.islink(out) and digest(T["other"]) == T["other_digest"]
    check(ok, "a failing periodic save warns and the run goes on to a good final save",
          text[-300:] + p.stderr.read()[-300:])
    if ok:
        load_pickle(out)


def main():
    tmp = tempfile.mkdtemp(prefix="needle-bad-")
    setup(tmp)
    T["other_digest"] = digest(T["other"])
    rows = table_rows()
    mine = {k for k, v in rows.items() if v and "test_bad_input" in v[-1]}
    want = set(CASES) | EXTRA
    check(mine == want, "docs/bad-inputs.md rows <-> cases",
          f"rows only: {sorted(mine - want)} cases only: {sorted(want - mine)}")
    for cid, fn in CASES.items():
        ctx = {"stdout": "", "stderr": ""}
        args, code, phrase, kept = fn(ctx)
        r = subprocess.run([NEEDLE, *map(str, args)], capture_output=True, text=True,
                           cwd=tmp, preexec_fn=ctx.get("preexec"), timeout=600)
        ctx["stdout"], ctx["stderr"] = r.stdout, r.stderr
        last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        check(r.returncode == code and phrase in r.stderr and kept() and not temps(tmp),
              f"{cid}: exit {r.returncode}", last[:300])
        if cid in rows and rows[cid][2] != str(code):
            check(False, f"{cid}: docs/bad-inputs.md says exit {rows[cid][2]}")
    signal_cases(tmp)
    periodic_save_failure(tmp)
    check(not temps(tmp), "no temporary file left anywhere", str(temps(tmp)))
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
