#!/usr/bin/python3
"""Rewrite the generated part of docs/cli.md from the program's own help.

    tools/update_cli_doc.py [build/needle] [docs/cli.md]
    tools/update_cli_doc.py --check [build/needle] [docs/cli.md]

The part between the BEGIN/END markers is replaced by `needle --help` and
`needle CMD --help` for every command `needle --help` lists (plus the
sub-helps of `bench decode`, `bench finetune` and `run --checkpoint`).
--check writes nothing and exits 1 when the file is out of date.
"""
import os
import re
import subprocess
import sys

BEGIN = "<!-- BEGIN GENERATED: tools/update_cli_doc.py -->"
END = "<!-- END GENERATED -->"
EXTRA = {"bench": [["bench", "decode", "--help"], ["bench", "finetune", "--help"]],
         "run": [["run", "--checkpoint", "X.pkl", "--help"]]}


def helptext(needle, args):
    r = subprocess.run([needle] + args, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        sys.exit(f"update_cli_doc: `needle {' '.join(args)}` exited {r.returncode}")
    return (r.stdout + r.stderr).rstrip("\n")


def generate(needle):
    top = helptext(needle, ["--help"])
    cmds = re.findall(r"^  ([a-z][a-z-]+) +\S", top, re.M)
    if not cmds:
        sys.exit("update_cli_doc: no commands found in `needle --help`")
    out = ["## Every command's help", "",
           "Generated from the program (`tools/update_cli_doc.py`); do not edit by hand.",
           "", "```", "$ needle --help", top, "```", ""]
    for c in cmds:
        out += [f"### `needle {c}`", "", "```", helptext(needle, [c, "--help"]), "```", ""]
        for args in EXTRA.get(c, []):
            out += ["```", "$ needle " + " ".join(args), helptext(needle, args), "```", ""]
    return "\n".join(out)


def main(argv):
    check = "--check" in argv
    argv = [a for a in argv if a != "--check"]
    needle = argv[0] if argv else "build/needle"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = argv[1] if len(argv) > 1 else os.path.join(root, "docs", "cli.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        sys.exit(f"update_cli_doc: {path}: expected one {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    new = head + BEGIN + "\n" + generate(needle) + "\n" + END + tail
    if check:
        if new != text:
            print(f"update_cli_doc: {path} differs from the program's help; run "
                  f"tools/update_cli_doc.py {needle}", file=sys.stderr)
            return 1
        return 0
    if new != text:
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(new)
        os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
