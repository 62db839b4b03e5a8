#!/usr/bin/env python3
"""Run `nginx -t` on every nginx configuration shown in README.md and docs/*.md.

Usage: docs/check-configs.py [-v] [FILE.md ...]   (default: README.md and docs/*.md)
       NGINX=build/nginx MODULE=build/ngx_http_ratelimit_module.so (the defaults)

An operator pastes what the pages show, so what claims to be a configuration must pass as
pasted. A ```nginx block claims it when its top level (the lines that start at column 0) is
- a whole nginx.conf (an `http {` block): checked as written, `events {}` included;
- the inside of `http {}` (`ratelimit_redis`, `ratelimit_zone`, `map`, `upstream`, `server {`,
  ...): checked inside `events {} http { ... }`.
Blocks whose top level is a location's content (`location`, `ratelimit`, ...) or a lone main
directive (`load_module`) are fragments of a configuration shown elsewhere, and are not run.
The module path is the one thing replaced: every `load_module` line loads MODULE, and a
configuration without one gets it. A block preceded by `<!-- check-configs: skip (why) -->`
is not run (a managed service's host name that does not resolve here, a module this nginx does
not have). Blocks run in parallel; exits 1 and prints nginx's words for each that fails.
"""

import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*(\S*)")
SKIP = re.compile(r"^<!--\s*check-configs:\s*skip\b")
LOAD = re.compile(r"^\s*load_module\s+[^;]*;", re.M)
# Directives that are a location's (or a server's) content, never http{}'s.
FRAGMENT = {"location", "ratelimit", "ratelimit_admin", "ratelimit_metrics", "listen",
            "proxy_pass", "return", "try_files", "auth_request", "error_page"}
MAIN_ONLY = {"load_module", "worker_processes", "events", "user", "pid", "env"}


def blocks(path):
    """(first line number, text, skipped) of each ```nginx block of a Markdown file."""
    out, lines = [], open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2), i + 1
        i += 1
        while i < len(lines) and not lines[i].lstrip().startswith(fence):
            i += 1
        if lang == "nginx":
            skipped = start >= 2 and bool(SKIP.match(lines[start - 2]))
            out.append((start + 1, "\n".join(lines[start:i]), skipped))
        i += 1
    return out


def top_level(text):
    words = set()
    for line in text.split("\n"):
        if line[:1] not in ("", " ", "\t", "#", "}"):
            words.add(re.split(r"[\s{;]", line, maxsplit=1)[0])
    return words


def configuration(text, module):
    """The nginx.conf to test for a block, or None for a fragment."""
    words = top_level(text)
    load = f"load_module {module};"
    if "http" in words:
        conf = LOAD.sub(load, text) if LOAD.search(text) else f"{load}\n{text}"
        return conf
    if not words or words & (FRAGMENT | MAIN_ONLY):
        return None
    return f"{load}\nevents {{}}\nhttp {{\n{text}\n}}\n"


def nginx_t(nginx, conf):
    with tempfile.TemporaryDirectory(prefix="check-configs.") as prefix:
        os.mkdir(os.path.join(prefix, "logs"))
        path = os.path.join(prefix, "nginx.conf")
        with open(path, "w", encoding="utf-8") as f:
            f.write(conf)
        r = subprocess.run([nginx, "-t", "-q", "-e", "stderr", "-p", prefix + "/", "-c", path],
                           capture_output=True, text=True, timeout=60)
        return r.returncode, (r.stdout + r.stderr).strip()


def main(argv):
    verbose = "-v" in argv
    files = [a for a in argv if a != "-v"] or (
        [os.path.join(ROOT, "README.md")]
        + sorted(os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                 if f.endswith(".md")))
    nginx = os.environ.get("NGINX", os.path.join(ROOT, "build", "nginx"))
    module = os.path.abspath(os.environ.get(
        "MODULE", os.path.join(ROOT, "build", "ngx_http_ratelimit_module.so")))
    for need in (nginx, module):
        if not os.path.exists(need):
            print(f"check-configs: {need} is missing: run make build first", file=sys.stderr)
            return 2
    jobs = []
    for path in files:
        rel = os.path.relpath(path, ROOT)
        for line, text, skipped in blocks(path):
            conf = None if skipped else configuration(text, module)
            if conf is None:
                if verbose:
                    print(f"  {rel}:{line}: {'skipped' if skipped else 'a fragment'}, not run")
                continue
            jobs.append((rel, line, conf))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(lambda j: nginx_t(nginx, j[2]), jobs))
    failed = 0
    for (rel, line, _), (rc, out) in zip(jobs, results):
        if rc != 0:
            failed += 1
            print(f"{rel}:{line}: nginx -t fails on this configuration as pasted:\n  "
                  + out.replace(module, "MODULE").replace("\n", "\n  "))
        elif verbose:
            print(f"  {rel}:{line}: passes nginx -t")
    print(f"check-configs: {len(jobs) - failed} of {len(jobs)} configurations pass nginx -t"
          + (f", {failed} fail" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
