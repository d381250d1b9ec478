#!/usr/bin/python3
"""tools/house_stats.py (docs/house.md's table) counts what it says, on a
small git repository made here with known figures: lines per folder of
src/, function lengths (braces in strings, comments, preprocessor lines and
initialisers not mistaken for functions), files naming an op, getenv calls
outside the entry points, options compared by hand in src/cli/; two commits
side by side; a bad commit or --lib path is refused (exit 2)."""
import os
import re
import subprocess
import sys
import tempfile

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(SRC, "tools", "house_stats.py")
FAIL = []

X_C = r"""/* a comment with a brace { and a call f() { */
#include <stdlib.h>
#define OPEN {
static const int table[] = {1, 2, 3};
struct point { int x, y; };

static int seven(int a)
{
    const char *s = "}}} not a brace {";
    char c = '}';
    return a + (s[0] == c) + 7;
}

int long_one(void)
{
    int n = 0;
    for (int i = 0; i < 3; i++) {
        if (i) {
            n += i;
        }
    }
    n += getenv("NEEDLE_X") != NULL;
    return n + table[0] + foo_op_count;
}
"""
CLI_C = """int cli_main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--help"))
        return 0;
    return getenv("HOME") != NULL;
}
"""


def check(cond, msg):
    print(("ok  " if cond else "FAIL") + " " + msg)
    if not cond:
        FAIL.append(msg)


def git(repo, *args):
    subprocess.run(["git", "-C", repo, "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True)


def write(repo, path, text):
    os.makedirs(os.path.dirname(os.path.join(repo, path)), exist_ok=True)
    with open(os.path.join(repo, path), "w") as f:
        f.write(text)


def run(repo, *args):
    return subprocess.run([sys.executable, TOOL, *args], cwd=repo, capture_output=True,
                          text=True, timeout=120)


def row(out, label):
    for line in out.splitlines():
        if line.startswith("| " + label + " |"):
            return [c.strip() for c in line.strip().strip("|").split("|")][1:]
    return None


def main():
    with tempfile.TemporaryDirectory() as repo:
        git(repo, "init", "-q")
        write(repo, "src/a/x.c", X_C)
        write(repo, "src/b/y.h", "int y;\nint z;\n")
        write(repo, "src/cli/m.c", CLI_C)
        write(repo, "tests/t.c", "/* foo_op and foo_op again; not foo_opx */\n")
        write(repo, "tools/u.py", "print('foo_opx')\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "one")
        write(repo, "src/a/x.c", X_C.replace("foo_op_count", "0"))
        write(repo, "src/b/w.c", "void w(void)\n{\n}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "two")

        p = run(repo, "HEAD~1", "HEAD", "--op", "foo_op", "--op", "foo_op_count")
        check(p.returncode == 0, "runs on two commits " + p.stderr[-300:])
        out = p.stdout
        n_x = X_C.count("\n")
        check(row(out, "lines of C, src/a") == [str(n_x), str(n_x)], f"src/a lines {n_x}")
        check(row(out, "lines of C, src/b") == ["2", "5"], "src/b lines 2 -> 5")
        check(row(out, "lines of C, all of src/") == [str(n_x + 2 + 6), str(n_x + 5 + 6)],
              "all of src/")
        check(row(out, "functions in src/") == ["3", "4"], f"functions {row(out, 'functions in src/')}")
        check(row(out, "longest function (lines)") == ["11 `long_one`", "11 `long_one`"],
              f"longest {row(out, 'longest function (lines)')}")
        check(re.search(r"\| 6 \| `seven` \| src/a/x.c:7 \|", out) is not None,
              "seven: 6 lines from line 7 (strings and chars with braces skipped)")
        check(re.search(r"\| 3 \| `w` \| src/b/w.c:1 \|", out) is not None, "w: 3 lines")
        check(row(out, "files naming op `foo_op` (mentions)") == ["1 (2)", "1 (2)"],
              "foo_op: one file, two mentions (foo_opx and foo_op_count are other words)")
        check(row(out, "files naming op `foo_op_count` (mentions)") == ["1 (1)", "0 (0)"],
              "foo_op_count: gone in the second commit")
        check(row(out, "getenv calls in the library (src/ but src/cli/, core/tuning.c)") ==
              ["1", "1"], "one getenv outside src/cli")
        lab = 'options compared by hand in src/cli/ (`strcmp(x, "--...")`)'
        check(row(out, lab) == ["1", "1"], f"one option compared by hand {row(out, lab)}")
        check(row(out, "libneedle.so exported symbols (of them needle_*)") ==
              ["not measured", "not measured"], "no --lib: exports not measured")

        p = run(repo, "no-such-commit")
        check(p.returncode == 2 and "not a commit" in p.stderr, "a bad commit: exit 2")
        p = run(repo, "HEAD", "--lib", "HEAD=/no/such/lib.so")
        check(p.returncode == 2 and "no such file" in p.stderr, "a missing --lib: exit 2")
    print(f"{len(FAIL)} failed")
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
