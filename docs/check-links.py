#!/usr/bin/env python3
"""Check every relative link and #anchor of README.md and docs/*.md.

Usage: docs/check-links.py [FILE.md ...]   (default: README.md and docs/*.md)

A link is checked when it is neither absolute (scheme:) nor protocol-relative: its file or
directory must exist, and a #fragment must name a heading of the target Markdown file under
GitHub's rules (see anchor()). Links inside code spans and fenced code blocks are text, not
links, as GitHub renders them. Exits 1 and lists every broken link, 0 when all resolve.
Standard library only: `make test` runs it first, on machines that have nothing else.
"""

import os
import re
import sys
from urllib.parse import unquote

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
# Inline links and images: [text](target "title"); the text may hold `code` and brackets one
# level deep. Reference definitions: [label]: target.
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


def strip_code_spans(line):
    # A code span is a run of N backticks up to the next run of exactly N.
    out, i = [], 0
    while i < len(line):
        if line[i] == "`":
            n = len(line[i:]) - len(line[i:].lstrip("`"))
            close = re.compile(r"(?<!`)" + "`" * n + r"(?!`)").search(line, i + n)
            if close:
                out.append(" ")
                i = close.end()
                continue
            out.append(line[i : i + n])
            i += n
            continue
        out.append(line[i])
        i += 1
    return "".join(out)


def lines_outside_fences(text):
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        if m:
            fence = m.group(1)
            continue
        yield number, line


def anchor(heading):
    """GitHub's anchor of a heading's text: the rendered text (code spans keep their content,
    links keep their text, emphasis marks go), lowercased, every character that is not a
    letter, digit, space, '-' or '_' dropped, spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("`", "").lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


_anchors = {}


def anchors_of(path):
    if path not in _anchors:
        seen, found = {}, set()
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for _, line in lines_outside_fences(text):
            found.update(HTML_ID.findall(line))
            m = HEADING.match(line)
            if not m:
                continue
            base = anchor(m.group(2))
            # GitHub numbers repeated headings: x, x-1, x-2, ...
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        _anchors[path] = found
    return _anchors[path]


def links_of(text):
    for number, line in lines_outside_fences(text):
        m = REFDEF.match(line)
        if m:
            yield number, m.group(1)
            continue
        for m in INLINE.finditer(strip_code_spans(line)):
            yield number, m.group(1)


def check(md):
    broken = []
    with open(md, encoding="utf-8") as f:
        text = f.read()
    for number, target in links_of(text):
        if not target or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
            continue
        path, _, fragment = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(md), unquote(path))) if path else md
        where = f"{os.path.relpath(md, ROOT)}:{number}: ({target})"
        if not os.path.exists(dest):
            broken.append(f"{where} no such file {os.path.relpath(dest, ROOT)}")
        elif fragment and dest.endswith(".md"):
            if unquote(fragment).lower() not in anchors_of(dest):
                broken.append(f"{where} no heading #{fragment} in {os.path.relpath(dest, ROOT)}")
        elif fragment and os.path.isdir(dest):
            broken.append(f"{where} #{fragment} on a directory")
    return broken


def main(argv):
    files = argv or [os.path.join(ROOT, "README.md")] + sorted(
        os.path.join(ROOT, "docs", n) for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md")
    )
    broken = []
    count = 0
    for md in files:
        md = os.path.abspath(md)
        count += 1
        broken += check(md)
    for line in broken:
        print(line, file=sys.stderr)
    print(f"check-links: {count} files, {len(broken)} broken links")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
