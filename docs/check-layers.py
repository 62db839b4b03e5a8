#!/usr/bin/env python3
"""The layers of src/ (docs/layout.md), checked over the code's own paths: every file sits in a
layer's folder, and names only the layers below its own. Comments and string literals are left
out; `use` lines and paths anywhere in code count, `crate::x`, `super::super::x` (resolved from
the file's module, inline `mod x { }` blocks included) and `crate::{x, y}` alike, and so does
any mention of the nginx bindings (`ngx::`, `nginx_sys::`) in a layer that must not have them.

Run by `make check-layers` (and so by `make test`), on src/ or the folder given; exits 1, naming file, line and path, when a
rule is broken. Python 3 standard library only.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The tree checked: src/, or the folder given as the argument.
SRC = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "src")

# What each layer may name besides itself: the rule of docs/layout.md.
MAY_USE = {
    "codec": set(),
    "decide": {"codec"},
    "metrics": {"decide", "codec"},
    "redis": {"metrics", "codec"},
    "glue": {"redis", "metrics", "decide", "codec"},
}
# Layers that must not know nginx.
PURE = {"codec", "decide", "metrics"}

STRING = re.compile(r'b?"(?:\\.|[^"\\])*"')
CHAR = re.compile(r"b?'(?:\\.|[^'\\])'")
INLINE_MOD = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*\{")
# A path from the crate root or up from the module: its prefix, then what it names first.
PATH = re.compile(r"(?<![\w:])(crate|(?:super::)*super)::(\{[^}]*\}|\w+|\*)")
NGX = re.compile(r"(?<![\w])(?:::)?(ngx|nginx_sys)::|\bextern\s+crate\s+(ngx|nginx_sys)\b")


def code_lines(text):
    """The file's lines with comments and string and char literals blanked, numbered from 1."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    for n, line in enumerate(text.split("\n"), 1):
        line = CHAR.sub("' '", line)
        line = STRING.sub('""', line)
        yield n, line.split("//", 1)[0]


def module_of(rel):
    """`redis/conn/read.rs` -> ["redis", "conn", "read"]; a `mod.rs` is its folder's module."""
    parts = rel[:-3].split("/")
    return parts[:-1] if parts[-1] == "mod" else parts


def firsts(named):
    """The first segment of each path a `{a, b::c}` group names (nested groups are rare enough
    to be taken by their first name)."""
    inner = named[1:-1] if named.startswith("{") else named
    return [p.strip().split("::")[0] for p in inner.split(",") if p.strip()]


def check(rel, text):
    layer = module_of(rel)[0]
    problems = []
    lines = list(code_lines(text))
    # The module each line is in, inline `mod x { }` blocks included.
    inline = []  # (name, brace depth where it opened)
    depth = 0
    modules = []
    for n, line in lines:
        if "#[path" in line.replace(" ", ""):
            problems.append((n, "#[path] pulls in a file from elsewhere: a file belongs to its folder"))
        if layer in PURE and NGX.search(line):
            problems.append((n, f"{layer}/ is pure Rust: it may not name the nginx bindings"))
        m = INLINE_MOD.match(line)
        if m:
            inline.append((m.group(1), depth))
        modules.append(module_of(rel) + [name for name, _ in inline])
        depth += line.count("{") - line.count("}")
        while inline and depth <= inline[-1][1]:
            inline.pop()
    # Paths on the whole text: a `crate::{...}` group may span lines.
    code = "\n".join(line for _, line in lines)
    for m in PATH.finditer(code):
        prefix, named = m.group(1), m.group(2)
        n = code.count("\n", 0, m.start()) + 1
        here = modules[n - 1]
        shown = " ".join(f"{prefix}::{named}".split())
        if prefix == "crate":
            tops = firsts(named)
        else:
            up = prefix.count("super")
            if up > len(here):
                problems.append((n, f"{shown} climbs above the crate root"))
                continue
            base = here[:-up]
            tops = [base[0]] if base else firsts(named)
        for top in tops:
            if top == layer:
                continue
            if top == "*" or top not in MAY_USE:
                problems.append((n, f"{shown} reaches the crate root, outside every layer"))
            elif top not in MAY_USE[layer]:
                problems.append((n, f"{shown}: {layer}/ may not use {top}/"))
    return sorted(problems)


def main():
    bad = 0
    files = 0
    for dirpath, _, names in os.walk(SRC):
        for name in sorted(names):
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, SRC).replace(os.sep, "/")
            files += 1
            if rel == "lib.rs":
                continue
            if module_of(rel)[0] not in MAY_USE or "/" not in rel:
                print(f"src/{rel}: not in a layer's folder ({', '.join(sorted(MAY_USE))})")
                bad += 1
                continue
            with open(path, encoding="utf-8") as f:
                for line, why in check(rel, f.read()):
                    print(f"src/{rel}:{line}: {why}")
                    bad += 1
    if bad:
        print(f"check-layers: {bad} problem(s); the layers and their rules are in docs/layout.md")
        return 1
    print(f"check-layers: {files} files, every import points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
