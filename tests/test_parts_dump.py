#!/usr/bin/python3
"""Every intermediate of one C forward pass against the numpy reference.

Writes perturbed checkpoints (every parameter random, so no term hides
behind a zero or identity init), runs `test_san_parts --dump` (the C
library's own pieces, layer by layer) and checks each dumped tensor with
tests/ref/parts_check.py (max|c - ref| / max|ref| <= 1e-4, indices exact).
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("NEEDLE_BUILD", os.path.join(HERE, "..", "build"))
DUMPER = os.path.join(BUILD, "test_san_parts")
PY = sys.executable

CASES = [
    ("tiny", ["--preset", "tiny"], "5 6 7 5 6 7 8 9 10 11 5 6 7 0 8191 3 3 3"),
    ("mid", ["--vocab", "512", "--d-model", "96", "--attn-dim", "128", "--heads", "4",
             "--kv-heads", "2", "--layers", "5", "--engram-layers", "1,3",
             "--engram-orders", "2,3", "--engram-slots", "97", "--lanes", "4",
             "--max-seq-len", "128"],
     " ".join(str((i * 37) % 500) for i in range(45))),
    ("shared-site", ["--vocab", "300", "--d-model", "64", "--heads", "4", "--kv-heads", "4",
                     "--layers", "3", "--engram-layers", "1,1", "--engram-slots", "31",
                     "--lanes", "3", "--max-seq-len", "64"],
     " ".join(str((i * 7) % 13) for i in range(30))),
]


def main():
    if not os.path.exists(DUMPER):
        print(f"FAIL: {DUMPER} not built")
        return 1
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, args, toks in CASES:
            ck = os.path.join(tmp, name + ".pkl")
            tk = os.path.join(tmp, name + ".txt")
            dump = os.path.join(tmp, name + ".dump")
            subprocess.run([PY, os.path.join(HERE, "ref", "make_ckpt.py"), ck, "--perturb",
                            "--seed", "3"] + args, check=True)
            with open(tk, "w") as f:
                f.write(toks + "\n")
            r = subprocess.run([DUMPER, "--dump", ck, tk, dump])
            if r.returncode != 0:
                print(f"FAIL {name}: dumper exited {r.returncode}")
                bad += 1
                continue
            r = subprocess.run([PY, os.path.join(HERE, "ref", "parts_check.py"), dump])
            print(f"{'ok  ' if r.returncode == 0 else 'FAIL'} {name}")
            bad += r.returncode != 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
