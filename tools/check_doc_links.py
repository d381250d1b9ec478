#!/usr/bin/python3
"""Check the relative links of README.md and docs/*.md: every linked file
exists and every #anchor names a heading of its page (GitHub's heading
slugs). External (scheme://, mailto:) links are not fetched.

    tools/check_doc_links.py [ROOT]        exit 1 and list what does not resolve
"""
import os
import re
import sys

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def slug(text):
    s = text.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)  # drop punctuation (backticks, dots, parentheses...)
    return s.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, out, fence = {}, set(), False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.lstrip().startswith("```"):
                    fence = not fence
                    continue
                m = None if fence else HEADING.match(line)
                if m:
                    base = slug(m.group(2))
                    n = seen.get(base, 0)
                    seen[base] = n + 1
                    out.add(base if n == 0 else f"{base}-{n}")
        cache[path] = out
    return cache[path]


def links(path):
    fence = False
    with open(path, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                fence = not fence
                continue
            if fence:
                continue
            for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                yield no, m.group(1)


def main(argv):
    root = argv[0] if argv else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pages = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    pages += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    bad = 0
    for page in pages:
        for no, target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            file_part, _, frag = target.partition("#")
            dest = page if not file_part else os.path.normpath(
                os.path.join(os.path.dirname(page), file_part))
            where = f"{os.path.relpath(page, root)}:{no}: {target}"
            if not os.path.exists(dest):
                print(f"{where}: no such file", file=sys.stderr)
                bad += 1
            elif frag and dest.endswith(".md") and frag not in anchors(dest):
                print(f"{where}: no heading with anchor #{frag} in "
                      f"{os.path.relpath(dest, root)}", file=sys.stderr)
                bad += 1
    print(f"check_doc_links: {len(pages)} pages, {bad} broken link(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
