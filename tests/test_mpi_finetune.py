#!/usr/bin/python3
"""`mpirun -np 2 needle finetune`: data-parallel training over MPI (loaded
at run time, src/dist), on loopback, against one process.

  * LoRA: 2 ranks give the adapter one process gives (<= 1e-5 relative, the
    gradients summed in rank order); one `distributed  mpi  2 ranks` line,
    the step lines once (rank 0 alone prints);
  * --full: the same for the whole checkpoint;
  * resume: 2 ranks stopped (--stop-after) and resumed with --resume end
    where an uninterrupted 2-rank run ends;
  * ranks that disagree (another --seed on rank 1) fail at the start with
    an error naming rank 1, and write nothing;
  * a rank killed (SIGKILL) mid-run ends the job within 30 s, non-zero; the
    adapter on disk is a whole one (the last periodic save), no temp files;
  * SIGTERM to rank 1 alone stops every rank at one step; rank 0 saves and
    prints the resume command (with mpirun);
  * the same binary without a launcher runs as one process (no line).
Skipped (77) only when mpirun is not installed.
"""
import os
import re
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "ref"))
from harness import Checker, find_needle  # noqa: E402

DATA = os.path.join(SRC, "examples", "data.jsonl")
TOK = os.path.join(SRC, "models", "tokenizer.model")
BASE = os.path.join(SRC, "models", "needle-nano.pkl")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
# Under the sanitizers, Open MPI's own allocations outlive MPI_Finalize and its
# components are unloaded by then, so LeakSanitizer could not even name them
# for a suppression: leak checks stay on for the one-process runs only.
ENV_MPI = dict(ENV, ASAN_OPTIONS=(os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0")
               .lstrip(":"))
# loopback only: the ranks talk over lo (TCP) and to themselves
MPIRUN = ["mpirun", "--oversubscribe", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include",
          "lo", "--mca", "oob_tcp_if_include", "lo"]


def tensors(tree, path=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from tensors(v, path + "/" + str(k))
    elif isinstance(tree, np.ndarray) and tree.dtype.kind == "f":
        yield path, tree.astype(np.float64)


def rel_diff(a, b, key):
    """|a - b| / |a| over every float tensor under key (all of them together)."""
    with open(a, "rb") as f:
        ta = dict(tensors(pickle.load(f)[key]))
    with open(b, "rb") as f:
        tb = dict(tensors(pickle.load(f)[key]))
    if set(ta) != set(tb) or not ta:
        return float("inf")
    num = sum(float(np.sum((ta[k] - tb[k]) ** 2)) for k in ta)
    den = sum(float(np.sum(ta[k] ** 2)) for k in ta)
    return (num / den) ** 0.5 if den else float("inf")


def main():
    if shutil.which("mpirun") is None:
        print("SKIP: mpirun not installed (Debian: openmpi-bin libopenmpi-dev)")
        return 77
    check = Checker()
    needle = find_needle()
    if not check("needle binary found", needle is not None):
        return check.finish()
    tmp = tempfile.mkdtemp(prefix="needle_mpi_")
    common = [DATA, "--checkpoint", BASE, "--tokenizer", TOK, "--batch-size", "8", "--max-len",
              "192", "--threads", "1", "--seed", "1", "--lr", "1e-3", "--lora-rank", "8",
              "--lora-alpha", "16", "--epochs", "1"]

    def one(*args):
        print("  $ needle " + " ".join(args), flush=True)
        return subprocess.run([needle, *args], capture_output=True, text=True, timeout=600,
                              env=ENV)

    def two(*args, per_rank=None):
        cmd = MPIRUN + ["-np", "2", needle, *args]
        if per_rank:  # MPMD: rank 0 args, then rank 1 args
            cmd = MPIRUN + ["-np", "1", needle, *args, ":", "-np", "1", needle, *per_rank]
        print("  $ " + " ".join(cmd), flush=True)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV_MPI)

    # LoRA
    a1, a2 = os.path.join(tmp, "a1.pkl"), os.path.join(tmp, "a2.pkl")
    r1 = one("finetune", *common, "--out", a1)
    r2 = two("finetune", *common, "--out", a2)
    ok = check("LoRA: one process and 2 ranks finish", r1.returncode == 0 and r2.returncode == 0,
               r1.stderr[-300:] + r2.stderr[-600:] + r2.stdout[-300:])
    if ok:
        d = rel_diff(a1, a2, "lora")
        check("LoRA: 2 ranks == 1 process (<= 1e-5 relative)", d <= 1e-5, "%.3g" % d)
        check("one distributed line", r2.stdout.count("distributed  mpi  2 ranks") == 1,
              r2.stdout[:800])
        check("no distributed line without a launcher", "distributed" not in r1.stdout)
        steps1 = [ln for ln in r1.stdout.splitlines() if ln.strip().startswith("step")]
        steps2 = [ln for ln in r2.stdout.splitlines() if ln.strip().startswith("step")]
        check("the step lines once (rank 0), as many as one process prints",
              len(steps2) == len(steps1) > 0, "%d vs %d" % (len(steps2), len(steps1)))
        check("the communication share reported",
              "summing gradients over 2 ranks" in r2.stdout, r2.stdout[-400:])

    # padded batches: each rank computes only its share's rows (and sizes
    # its activations for them); rank 0 validates in share-sized pieces
    p1, p2 = os.path.join(tmp, "p1.pkl"), os.path.join(tmp, "p2.pkl")
    padded = common + ["--batching", "padded"]
    r1 = one("finetune", *padded, "--out", p1)
    r2 = two("finetune", *padded, "--out", p2)
    ok = check("padded: one process and 2 ranks finish", r1.returncode == 0 and
               r2.returncode == 0, r1.stderr[-300:] + r2.stderr[-600:])
    if ok:
        d = rel_diff(p1, p2, "lora")
        check("padded: 2 ranks == 1 process (<= 1e-5 relative)", d <= 1e-5, "%.3g" % d)
        v1 = re.findall(r"val (\d+\.\d+)", r1.stdout)
        v2 = re.findall(r"val (\d+\.\d+)", r2.stdout)
        check("padded: rank 0's validation loss == one process's", v1 and v1 == v2,
              "%s vs %s" % (v1, v2))
        m1 = re.search(r"(\d+) of (\d+) layers' activations kept", r1.stdout)
        m2 = re.search(r"(\d+) of (\d+) layers' activations kept", r2.stdout)
        check("padded: a rank's activations sized for its share (at most half the rows)",
              m1 and m2 and re.search(r"up to (\d+) rows", r2.stdout) and
              2 * int(re.search(r"up to (\d+) rows", r2.stdout).group(1)) <=
              int(re.search(r"up to (\d+) rows", r1.stdout).group(1)),
              r1.stdout[:1200] + r2.stdout[:1200])

    # --full
    f1, f2 = os.path.join(tmp, "f1.pkl"), os.path.join(tmp, "f2.pkl")
    full = common + ["--full", "--stop-after", "4"]
    r1 = one("finetune", *full, "--out", f1)
    r2 = two("finetune", *full, "--out", f2)
    ok = check("--full: stopped after 4 steps, both written",
               r1.returncode == 1 and r2.returncode == 1 and os.path.exists(f1) and
               os.path.exists(f2), r1.stderr[-300:] + r2.stderr[-600:])
    if ok:
        d = rel_diff(f1, f2, "params")
        check("--full: 2 ranks == 1 process (<= 1e-5 relative)", d <= 1e-5, "%.3g" % d)
        check("--full: rank 0 alone prints the resume command",
              r2.stderr.count("to continue: mpirun -np 2 needle finetune") == 1, r2.stderr[-600:])

    # resume: stop after 5 steps, resume, compare with the uninterrupted run
    ra = os.path.join(tmp, "ra.pkl")
    r = two("finetune", *common, "--stop-after", "5", "--out", ra)
    check("resume: the stopped 2-rank run exits 1 with the adapter so far",
          r.returncode == 1 and os.path.exists(ra) and "so far written" in r.stderr,
          r.stderr[-600:])
    r = two("finetune", *common, "--resume", ra, "--out", ra)
    ok = check("resume: the resumed 2-rank run finishes", r.returncode == 0,
               r.stderr[-600:] + r.stdout[-300:])
    if ok and os.path.exists(a2):
        d = rel_diff(a2, ra, "lora")
        check("resume: == the uninterrupted 2-rank run", d <= 1e-6, "%.3g" % d)
        d = rel_diff(a1, ra, "lora")
        check("resume: == one process (<= 1e-5)", d <= 1e-5, "%.3g" % d)

    # ranks that disagree
    bad = os.path.join(tmp, "bad.pkl")
    other = list(common)
    other[other.index("--seed") + 1] = "2"  # rank 1 alone: --seed 2
    r = two("finetune", *common, "--out", bad, per_rank=["finetune", *other, "--out", bad])
    check("a settings mismatch fails at the start, naming rank 1",
          r.returncode != 0 and "rank 1 of 2" in r.stderr and "settings" in r.stderr,
          r.stderr[-800:])
    check("the mismatch writes nothing", not os.path.exists(bad))

    def start_long(out):
        cmd = MPIRUN + ["-np", "2", needle, "finetune", *common[:-1], "30", "--save-every", "1",
                        "--out", out]
        print("  $ " + " ".join(cmd), flush=True)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=ENV_MPI)
        t_end = time.time() + 120
        while time.time() < t_end and p.poll() is None:
            time.sleep(0.5)
            if not os.path.exists(out):
                continue  # wait for the first periodic save: the run is under way
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    with open("/proc/%s/environ" % pid, "rb") as f:
                        env = f.read().split(b"\0")
                    with open("/proc/%s/cmdline" % pid, "rb") as f:
                        argv = f.read().split(b"\0")
                except OSError:
                    continue
                if b"OMPI_COMM_WORLD_RANK=1" in env and out.encode() in argv:
                    return p, int(pid)
        return p, None

    def finish(p):
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        return err

    def whole(path):
        try:
            with open(path, "rb") as f:
                return "lora" in pickle.load(f)
        except Exception as e:  # noqa: BLE001 - any failure to read is the failure
            print("  unreadable adapter:", e)
            return False

    # a killed rank
    kd = os.path.join(tmp, "kill")
    os.mkdir(kd)
    ka = os.path.join(kd, "a.pkl")
    p, victim = start_long(ka)
    if check("the rank to kill was found", victim is not None):
        t0 = time.time()
        os.kill(victim, signal.SIGKILL)
        finish(p)
        dt = time.time() - t0
        check("a killed rank ends the job within 30 s, non-zero",
              p.returncode not in (0, None) and dt <= 30, "rc %s after %.1f s" % (p.returncode, dt))
        check("the adapter on disk is a whole one", whole(ka))
        check("no temp files left", sorted(os.listdir(kd)) == ["a.pkl"], str(os.listdir(kd)))
    else:
        p.kill()
        p.communicate()

    # SIGTERM on rank 1 alone: every rank stops at one step, rank 0 saves
    sd = os.path.join(tmp, "term")
    os.mkdir(sd)
    sa = os.path.join(sd, "a.pkl")
    p, victim = start_long(sa)
    if check("the rank to stop was found", victim is not None):
        os.kill(victim, signal.SIGTERM)
        err = finish(p)
        check("SIGTERM on rank 1: the job stops, rank 0 saves and says how to resume",
              p.returncode == 1 and "stopped on another rank: interrupted at step" in err and
              "so far written to" in err and "to continue: mpirun -np 2 needle" in err,
              err[-800:])
        check("SIGTERM on rank 1: a whole adapter, no temp files",
              whole(sa) and sorted(os.listdir(sd)) == ["a.pkl"], str(os.listdir(sd)))
    else:
        p.kill()
        p.communicate()
    shutil.rmtree(tmp, ignore_errors=True)
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
