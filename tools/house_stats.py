#!/usr/bin/python3
"""Figures of the source tree at a git commit, for issue 30's before/after table.

    tools/house_stats.py COMMIT [COMMIT ...] [--lib COMMIT=PATH ...] [--build] [--op NAME ...]

For each commit (read from git, whatever is checked out):
  * lines of C (.c and .h; CUDA .cu/.cuh counted apart) per folder of src/;
  * the 10 longest functions of src/ (lines from the line naming the
    function to its closing brace; a brace-matching scan over the source
    with comments, strings and preprocessor lines blanked);
  * the dynamic symbols libneedle.so exports (`nm -D --defined-only`, text,
    data and bss symbols): of the library given with --lib COMMIT=PATH, or
    built from the commit's own tree with --build (cmake, target
    needle_shared, in a temporary folder, -j$JOBS, default 2);
  * for each --op (default: three backend ops), the files of the tree (src/,
    tests/, tools/) that name it as a word, and how many times;
  * getenv() calls in the library's code (src/ but src/cli/ and
    src/core/tuning.c), and options the CLI compares by hand
    (strcmp(x, "--name") in src/cli/).
Several commits (up to 4) are printed side by side (before | after) as one
markdown table, then each one's list of longest functions.
"""
import os
import re
import subprocess
import sys
import tempfile

DEFAULT_OPS = ["gate_sigmoid_backward", "engram_taps", "lanes_mean"]
C_EXT = (".c", ".h")
CU_EXT = (".cu", ".cuh")


def git(*args, cwd=None, text=True):
    return subprocess.run(["git"] + list(args), cwd=cwd, check=True, capture_output=True,
                          text=text).stdout


def tree_files(commit):
    """{path: bytes} of the commit's src/, tests/ and tools/ (text files)."""
    out = git("ls-tree", "-r", "-z", "--name-only", commit, "--", "src", "tests", "tools")
    paths = [p for p in out.split("\0") if p]
    files = {}
    # one `git cat-file --batch` for all blobs
    p = subprocess.Popen(["git", "cat-file", "--batch"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    for path in paths:
        p.stdin.write(f"{commit}:{path}\n".encode())
        p.stdin.flush()
        header = p.stdout.readline().split()
        if len(header) < 3 or header[1] != b"blob":
            continue
        size = int(header[2])
        data = p.stdout.read(size)
        p.stdout.read(1)
        if b"\0" not in data[:8192]:
            files[path] = data
    p.stdin.close()
    p.wait()
    return files


def lines_per_folder(files):
    c, cu = {}, {}
    for path, data in files.items():
        if not path.startswith("src/"):
            continue
        parts = path.split("/")
        folder = "src/" + parts[1] if len(parts) > 2 else "src (top)"
        n = data.count(b"\n")
        if path.endswith(C_EXT):
            c[folder] = c.get(folder, 0) + n
        elif path.endswith(CU_EXT):
            cu[folder] = cu.get(folder, 0) + n
    return c, cu


def blank_non_code(text):
    """Comments, string and character literals and preprocessor lines as
    spaces (newlines kept), so that braces and parentheses are code only."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True
    while i < n:
        ch = text[i]
        if line_start and ch in " \t":
            i += 1
            continue
        if line_start and ch == "#":  # a preprocessor line, with continuations
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out[i] = " "
                    i += 2
                    continue
                out[i] = " "
                i += 1
            continue
        line_start = False
        if ch == "\n":
            line_start = True
            i += 1
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                out[i] = " "
                i += 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        elif ch in "\"'":
            j = i + 1
            while j < n and text[j] != ch and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            for k in range(i, min(j + 1, n)):
                if out[k] != "\n":
                    out[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(out)


IDENT = re.compile(r"[A-Za-z_]\w*$")


def functions(path, data):
    """(lines, name, path:line) of each function defined in a C file: a '{' at
    brace depth 0 right after a ')' whose '(' follows an identifier."""
    text = blank_non_code(data.decode("utf-8", "replace"))
    found = []
    depth = 0
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "{":
            if depth == 0:
                j = i - 1
                while j >= 0 and text[j].isspace():
                    j -= 1
                if j >= 0 and text[j] == ")":
                    # the matching '('
                    d, k = 0, j
                    while k >= 0:
                        if text[k] == ")":
                            d += 1
                        elif text[k] == "(":
                            d -= 1
                            if d == 0:
                                break
                        k -= 1
                    m = IDENT.search(text[:k].rstrip()) if k > 0 else None
                    if m and m.group(0) not in ("if", "while", "for", "switch", "return",
                                                "sizeof"):
                        start = text.count("\n", 0, m.start()) + 1
                        # the closing brace
                        d, e = 0, i
                        while e < n:
                            if text[e] == "{":
                                d += 1
                            elif text[e] == "}":
                                d -= 1
                                if d == 0:
                                    break
                            e += 1
                        end = text.count("\n", 0, e) + 1
                        found.append((end - start + 1, m.group(0), f"{path}:{start}"))
                        i = e + 1
                        continue
            depth += 1
        elif ch == "}":
            depth = max(0, depth - 1)
        i += 1
    return found


def longest_functions(files, k=10):
    allf = []
    for path, data in files.items():
        if path.startswith("src/") and path.endswith((".c", ".cu")):
            allf += functions(path, data)
    allf.sort(key=lambda f: (-f[0], f[2]))
    over = sum(1 for f in allf if f[0] > 150)
    return allf[:k], over, len(allf)


def op_sites(files, op):
    word = re.compile(rb"\b" + re.escape(op.encode()) + rb"\b")
    nfiles = nmentions = 0
    for data in files.values():
        c = len(word.findall(data))
        if c:
            nfiles += 1
            nmentions += c
    return nfiles, nmentions


GETENV = re.compile(rb"\b(?:secure_)?getenv\s*\(")
OPT_STRCMP = re.compile(rb'strcmp\s*\([^;()]*?,\s*"--[a-z]')


def code_counts(files):
    """getenv calls in the library's code (src/ but the CLI and
    core/tuning.c, the entry points' reader) and options compared by hand
    in the CLI (strcmp(x, "--name"))."""
    genv = opts = 0
    for path, data in files.items():
        if not path.startswith("src/") or not path.endswith(C_EXT + CU_EXT):
            continue
        code = re.sub(rb"/\*.*?\*/", b"", data, flags=re.S)
        code = re.sub(rb"//[^\n]*", b"", code)
        if not path.startswith(("src/cli/", "src/core/tuning.c")):
            genv += len(GETENV.findall(code))
        if path.startswith("src/cli/"):
            opts += len(OPT_STRCMP.findall(code))
    return genv, opts


def build_lib(commit):
    tmp = tempfile.mkdtemp(prefix="house_stats_")
    src = os.path.join(tmp, "src")
    os.makedirs(src)
    archive = subprocess.run(["git", "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
    bld = os.path.join(tmp, "build")
    subprocess.run(["cmake", "-S", src, "-B", bld, "-DCMAKE_BUILD_TYPE=Release"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", bld, "-j", os.environ.get("JOBS", "2"), "--target",
                    "needle_shared"], check=True, stdout=subprocess.DEVNULL)
    return os.path.join(bld, "libneedle.so")


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True, capture_output=True,
                         text=True).stdout
    syms = [l.split()[-1] for l in out.splitlines() if len(l.split()) >= 3 and
            l.split()[1] in "TDBRVWtdbr"]
    syms = [s for s in syms if not s.startswith("_")]
    return len(syms), sum(1 for s in syms if s.startswith("needle_"))


def stats(commit, lib, ops):
    files = tree_files(commit)
    c, cu = lines_per_folder(files)
    top, over, nfun = longest_functions(files)
    return {"commit": git("rev-parse", "--short", commit).strip(),
            "date": git("log", "-1", "--format=%cd", "--date=short", commit).strip(),
            "c": c, "cu": cu, "top": top, "over150": over, "nfun": nfun,
            "lib": exported(lib) if lib else None,
            "ops": {op: op_sites(files, op) for op in ops}, "code": code_counts(files)}


def print_table(ss):
    head = " | ".join(f"{s['commit']} ({s['date']})" for s in ss)
    print(f"| figure | {head} |")
    print("|---|" + "---:|" * len(ss))
    folders = sorted(set().union(*(s["c"].keys() for s in ss)))
    for f in folders:
        print(f"| lines of C, {f} | " + " | ".join(str(s["c"].get(f, 0)) for s in ss) + " |")
    print("| lines of C, all of src/ | " + " | ".join(str(sum(s["c"].values())) for s in ss)
          + " |")
    cuf = sorted(set().union(*(s["cu"].keys() for s in ss)))
    for f in cuf:
        print(f"| lines of CUDA, {f} | " + " | ".join(str(s["cu"].get(f, 0)) for s in ss)
              + " |")
    print("| functions in src/ | " + " | ".join(str(s["nfun"]) for s in ss) + " |")
    print("| functions over 150 lines | " + " | ".join(str(s["over150"]) for s in ss) + " |")
    print("| longest function (lines) | " +
          " | ".join(f"{s['top'][0][0]} `{s['top'][0][1]}`" if s["top"] else "-" for s in ss)
          + " |")
    print("| libneedle.so exported symbols (of them needle_*) | " +
          " | ".join(f"{s['lib'][0]} ({s['lib'][1]})" if s["lib"] else "not measured"
                     for s in ss) + " |")
    print("| getenv calls in the library (src/ but src/cli/, core/tuning.c) | " +
          " | ".join(str(s["code"][0]) for s in ss) + " |")
    print("| options compared by hand in src/cli/ (`strcmp(x, \"--...\")`) | " +
          " | ".join(str(s["code"][1]) for s in ss) + " |")
    for op in ss[0]["ops"]:
        print(f"| files naming op `{op}` (mentions) | " +
              " | ".join("%d (%d)" % s["ops"][op] for s in ss) + " |")
    for s in ss:
        print(f"\n10 longest functions at {s['commit']}:\n")
        print("| lines | function | where |\n|---:|---|---|")
        for lines, name, where in s["top"]:
            print(f"| {lines} | `{name}` | {where} |")


def main(argv):
    commits, libs, ops, build = [], {}, [], False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        if a == "--build":
            build = True
        elif a in ("--lib", "--op") and i + 1 < len(argv):
            i += 1
            if a == "--op":
                ops.append(argv[i])
            else:
                c, sep, path = argv[i].partition("=")
                if not sep or not path:
                    print(f"house_stats: --lib expects COMMIT=PATH, got '{argv[i]}'",
                          file=sys.stderr)
                    return 2
                libs[c] = path
        elif a.startswith("-"):
            print(f"house_stats: unknown option '{a}'", file=sys.stderr)
            return 2
        else:
            commits.append(a)
        i += 1
    if not 1 <= len(commits) <= 4:
        print("usage: tools/house_stats.py COMMIT [COMMIT ...] [--lib COMMIT=PATH] [--build] "
              "[--op NAME]", file=sys.stderr)
        return 2
    ss = []
    for c in commits:
        try:
            git("rev-parse", "--verify", "--quiet", c + "^{commit}")
        except subprocess.CalledProcessError:
            print(f"house_stats: '{c}' is not a commit", file=sys.stderr)
            return 2
        lib = libs.get(c)
        if lib is None and build:
            lib = build_lib(c)
        if lib is not None and not os.path.exists(lib):
            print(f"house_stats: --lib {c}={lib}: no such file", file=sys.stderr)
            return 2
        ss.append(stats(c, lib, ops or DEFAULT_OPS))
    print_table(ss)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
