#!/usr/bin/python3
"""The documentation stays true to the tree: every relative link and
anchor in README.md and docs/ resolves, and docs/cli.md's reference part is
the program's own --help output (tools/update_cli_doc.py rewrites it)."""
import os
import subprocess
import sys

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("NEEDLE_BUILD", os.path.join(SRC, "build"))
NEEDLE = os.environ.get("NEEDLE") or os.path.join(BUILD, "needle")

failed = 0
for cmd in ([sys.executable, os.path.join(SRC, "tools/check_doc_links.py")],
            [sys.executable, os.path.join(SRC, "tools/update_cli_doc.py"), "--check", NEEDLE,
             os.path.join(SRC, "docs/cli.md")]):
    r = subprocess.run(cmd, cwd=SRC, capture_output=True, text=True, timeout=300)
    name = os.path.basename(cmd[1])
    if r.returncode != 0:
        failed += 1
        print(f"FAIL {name} (exit {r.returncode}):\n{r.stdout}{r.stderr}")
        if name == "update_cli_doc.py":
            print("  (run: tools/update_cli_doc.py build/needle)")
    else:
        print(f"ok   {name}")
print(f"{2 - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
