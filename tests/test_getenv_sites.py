#!/usr/bin/python3
"""The library reads its tuning switches from the environment only at the
entry points (issue 30): src/core/tuning.c is the one reader of the NEEDLE_*
switches, called by the program's main() (src/cli/) and the C ABI's model
load and session open; everything else reads the struct they install
(core/tuning.h).

Fails when a getenv()/secure_getenv() call appears in src/ outside src/cli/
and src/core/tuning.c, unless it is one of the listed reads of another
program's convention (or a plugin's own switch), each with its reason; a
listed read that is gone fails too, so the list stays true. Also: every
variable tuning.c reads is documented in docs/cli.md.
"""
import os
import re
import sys

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (file, the getenv argument as written): why it is not a tuning switch
ALLOWED = {
    ("src/net/hf_download.c", '"HF_ENDPOINT"'): "Hugging Face client convention",
    ("src/net/hf_download.c", '"HF_HUB_OFFLINE"'): "Hugging Face client convention",
    ("src/net/hf_download.c", '"HF_TOKEN"'): "Hugging Face client convention (a credential)",
    ("src/dist/dist.c", "vars[i]"): "the MPI launcher's world size (OMPI_COMM_WORLD_SIZE ...)",
    ("src/core/threadpool.c", '"OMP_NUM_THREADS"'): "OpenMP's convention",
    ("src/core/dlib.c", "spec->env"): "the optional-library override (NEEDLE_LIBBLAS, "
                                      "NEEDLE_LIBCURL, NEEDLE_LIBMHD): a generic loader mechanism",
    ("src/engine/base.c", "env_name"): "the built-in base's location, read by the public "
                                       "needle_default_weights_path (a C ABI entry) itself",
    ("src/engine/base.c", '"NEEDLE_BASE_WEIGHTS"'): "as above (the message when it is unset)",
    ("src/backend/vulkan/vk_runtime.c", "VK_FILTER_ENV"): "the Vulkan loader's driver filter "
                                                          "(VK_LOADER_DRIVERS_DISABLE), kept as "
                                                          "the user set it",
    ("src/backend/cuda/cuda_backend.cu", "vars[i]"): "the MPI launcher's local rank",
}
ENTRY = ("src/cli/", "src/core/tuning.c")
EXTS = (".c", ".h", ".cu", ".cuh", ".cpp", ".cc", ".m")
CALL = re.compile(r"\b(?:secure_)?getenv\s*\(")


def strip_comments(text):
    """Comments and string literals blanked except the literal inside getenv()."""
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def sites(root):
    found = []
    for dirpath, _, names in os.walk(os.path.join(root, "src")):
        for n in sorted(names):
            if not n.endswith(EXTS):
                continue
            path = os.path.join(dirpath, n)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            with open(path, encoding="utf-8", errors="replace") as f:
                text = strip_comments(f.read())
            for m in CALL.finditer(text):
                depth, i = 1, m.end()
                while i < len(text) and depth:
                    depth += {"(": 1, ")": -1}.get(text[i], 0)
                    i += 1
                arg = " ".join(text[m.end():i - 1].split())
                line = text.count("\n", 0, m.start()) + 1
                found.append((rel, arg, line))
    return found


def main():
    fails = []
    found = sites(SRC)
    seen = set()
    for rel, arg, line in found:
        if rel.startswith(ENTRY):
            continue
        seen.add((rel, arg))
        if (rel, arg) not in ALLOWED:
            fails.append(f"{rel}:{line}: getenv({arg}) outside the entry points: read it in "
                         "src/core/tuning.c (a field of nd_tuning) and use nd_tuning_get()")
    for key, why in ALLOWED.items():
        if key not in seen:
            fails.append(f"{key[0]}: the listed getenv({key[1]}) is gone ({why}): drop it from "
                         "tests/test_getenv_sites.py")
    n_entry = sum(1 for r, _, _ in found if r.startswith(ENTRY))
    tuning = os.path.join(SRC, "src", "core", "tuning.c")
    with open(tuning) as f:
        tvars = sorted(set(re.findall(r'"(NEEDLE_[A-Z0-9_]+)"', f.read())))
    if len(tvars) < 10:
        fails.append(f"src/core/tuning.c reads only {len(tvars)} switches")
    with open(os.path.join(SRC, "docs", "cli.md")) as f:
        doc = f.read()
    for v in tvars:
        if v not in doc:
            fails.append(f"{v} (src/core/tuning.c) is not documented in docs/cli.md")
    for msg in fails:
        print("FAIL " + msg)
    print(f"{len(found)} getenv calls in src/: {n_entry} at the entry points, "
          f"{len(seen)} listed conventions; {len(tvars)} switches in core/tuning.c; "
          f"{len(fails)} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
