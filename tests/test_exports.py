#!/usr/bin/python3
"""What libneedle exports and links (issue 30, step 5):

  * every function declared in include/needle.h is marked NEEDLE_API;
  * the dynamic symbols libneedle.so defines are exactly those functions
    (the library is built with -fvisibility=hidden): an extra one is an
    internal leaking out, a missing one a public function callers cannot
    reach;
  * neither libneedle.so nor libneedle.a uses jansson (the program's JSON
    library; the library has its own parser, src/text/pyjson.c): no NEEDED
    entry, no undefined json_* symbol in the archive, no -ljansson in
    needle.pc, no jansson.h included by a library source.

Usage: test_exports.py [BUILD_DIR]  (default $NEEDLE_BUILD, else build/);
$NM and $READELF name the tools (CMake passes its own: cross builds).
Exit 77 (skipped) off ELF platforms or without nm/readelf.
"""
import os
import re
import shutil
import subprocess
import sys

SRC = os.environ.get("NEEDLE_SRC", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = (sys.argv[1] if len(sys.argv) > 1
         else os.environ.get("NEEDLE_BUILD", os.path.join(SRC, "build")))
HEADER = os.path.join(SRC, "include", "needle.h")
# the library's sources (NEEDLE_LIB_SOURCES in CMakeLists.txt)
LIB_DIRS = ("core", "io", "text", "model", "backend", "backend/cpu", "train", "engine", "eval",
            "gen")
# defined by the linker in every shared object, not by our code
LINKER_SYMBOLS = {"_init", "_fini", "_edata", "_end", "__bss_start"}
NM = os.environ.get("NM") or "nm"
READELF = os.environ.get("READELF") or "readelf"
FAIL = []


def check(cond, msg):
    print(("ok  " if cond else "FAIL") + " " + msg)
    if not cond:
        FAIL.append(msg)


def tool(*args):
    p = subprocess.run(list(args), capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("FAIL %s: exit %d: %s" % (" ".join(args), p.returncode, p.stderr.strip()))
    return p.stdout


def header_functions(path):
    """(marked, unmarked): names of the functions needle.h declares with and
    without NEEDLE_API in front."""
    text = open(path).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    # preprocessor lines, continuations included
    text = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", " ", text, flags=re.M)
    text = text.replace('extern "C" {', " ").replace("}", " ")
    marked, unmarked = [], []
    for decl in text.split(";"):
        decl = " ".join(decl.split())
        if "(" not in decl or decl.startswith("typedef"):
            continue
        m = re.match(r"(.*?)\b([A-Za-z_]\w*)\s*\(", decl)
        if not m:
            continue
        (marked if re.match(r"NEEDLE_API\b", decl) else unmarked).append(m.group(2))
    return marked, unmarked


def exported(lib):
    """Names of the dynamic symbols lib defines."""
    names = set()
    for line in tool(NM, "-D", "--defined-only", lib).splitlines():
        parts = line.split()
        if len(parts) >= 3:
            names.add(parts[2].split("@")[0])
    return names - LINKER_SYMBOLS


def main():
    if not sys.platform.startswith(("linux", "freebsd")):
        print("skip: libneedle.so is an ELF library only here (%s)" % sys.platform)
        return 77
    if not (shutil.which(NM) and shutil.which(READELF)):
        print("skip: %s/%s (binutils) not found" % (NM, READELF))
        return 77
    marked, unmarked = header_functions(HEADER)
    check(len(marked) > 0, "include/needle.h declares %d NEEDLE_API functions" % len(marked))
    check(not unmarked, "every function in include/needle.h is NEEDLE_API %s" % unmarked)
    check(len(set(marked)) == len(marked), "no function declared twice")

    so = os.path.join(BUILD, "libneedle.so")
    check(os.path.exists(so), "built: " + so)
    if os.path.exists(so):
        have = exported(so)
        want = set(marked) | set(unmarked)
        extra, missing = sorted(have - want), sorted(want - have)
        print("libneedle.so exports %d symbols; include/needle.h declares %d"
              % (len(have), len(want)))
        check(not extra, "no symbol beyond the public API (%d extra%s)"
              % (len(extra), ": " + " ".join(extra[:20]) + (" ..." if len(extra) > 20 else "")
                 if extra else ""))
        check(not missing, "every public function exported (%d missing%s)"
              % (len(missing), ": " + " ".join(missing) if missing else ""))
        dyn = tool(READELF, "-d", so)
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
        print("NEEDED: " + " ".join(needed))
        check(needed and not [n for n in needed if "jansson" in n],
              "libneedle.so does not link jansson")

    ar = os.path.join(BUILD, "libneedle.a")
    check(os.path.exists(ar), "built: " + ar)
    if os.path.exists(ar):
        undef = set()
        for line in tool(NM, "-u", ar).splitlines():
            parts = line.split()
            if parts and parts[-1].startswith("json_"):
                undef.add(parts[-1])
        check(not undef, "libneedle.a calls no jansson function %s" % sorted(undef))

    pc = os.path.join(BUILD, "needle.pc")
    check(os.path.exists(pc), "configured: " + pc)
    if os.path.exists(pc):
        libs = [l for l in open(pc) if l.startswith("Libs")]
        check(libs and not [l for l in libs if "jansson" in l],
              "needle.pc names no jansson: %s" % " | ".join(l.strip() for l in libs))

    includers = []
    for d in LIB_DIRS:
        full = os.path.join(SRC, "src", d)
        for name in sorted(os.listdir(full)):
            if name.endswith((".c", ".h")):
                with open(os.path.join(full, name), errors="replace") as f:
                    if re.search(r"#\s*include\s*[<\"]jansson\.h[>\"]", f.read()):
                        includers.append("src/%s/%s" % (d, name))
    check(not includers, "no library source includes jansson.h %s" % includers)

    if FAIL:
        print("%d failure(s)" % len(FAIL))
        return 1
    print("all ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
