#!/usr/bin/env python3
"""The module's part of a request, from two callgrind lives of bench/instructions.py (--keep):
marginal per request = (LARGE - SMALL) / SPAN, taken from callgrind's call records rather than
from callgrind_annotate's rows (whose "inclusive" misses inlined code from other files and
double-counts recursion: bench/instructions.py's breakdown column).

usage: bench/callgrind_calls.py SMALL.out LARGE.out SPAN MODULE_SO_BASENAME [--top 25]
  e.g. bench/callgrind_calls.py $tmp/cg/lease.2000.0.out $tmp/cg/lease.6000.0.out 4000 \
           ngx_http_ratelimit_module.so

Prints, per request:
 - the module's entry points (calls from outside its object into it): calls, inclusive Ir;
 - the module's own part: self Ir of its functions + what they call outside it, nginx's phases
   of a resumed request (ngx_http_core_run_phases) excluded;
 - the module's functions: inclusive Ir (self + the recorded cost of calls to other
   functions), self Ir, calls;
 - what the module calls outside itself (libc, nginx): callee, calls, inclusive Ir, callers;
 - calls within the module into Rust's allocation, hashing and formatting.
"""
import os
import re
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from instructions import compressed_name  # noqa: E402


def parse(path, module_base):
    names = {}
    defined, guessed = {}, {}
    self_ir = defaultdict(int)
    edges = defaultdict(lambda: [0, 0])  # (caller, callee) -> [calls, inclusive Ir]
    ob = None
    cob = None
    fn = None
    cfn = None
    pending_call = None

    def name_of(kind, rest):
        return compressed_name(names, kind, rest)

    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                parts = line.split()
                ir = int(parts[1]) if len(parts) > 1 else 0
                if pending_call is not None:
                    e = edges[(fn, pending_call)]
                    e[0] += calls
                    e[1] += ir
                    pending_call = None
                else:
                    self_ir[fn] += ir
                continue
            if line.startswith("ob="):
                ob = name_of("ob", line[3:])
            elif line.startswith("cob="):
                cob = name_of("ob", line[4:])
            elif line.startswith("fn="):
                fn = name_of("fn", line[3:])
                defined[fn] = ob
                cob = None
            elif line.startswith("cfn="):
                cfn = name_of("fn", line[4:])
                guessed.setdefault(cfn, cob if cob is not None else ob)
            elif line.startswith("calls="):
                calls = int(line[6:].split()[0])
                pending_call = cfn
                cob = None
            elif line.startswith(("fl=", "fi=", "fe=")):
                name_of("fl", line[3:])
            elif line.startswith(("cfi=", "cfl=")):
                name_of("fl", line[4:])
    ob_of_fn = dict(guessed)
    ob_of_fn.update(defined)
    is_mod = {f: (o or "").endswith(module_base) for f, o in ob_of_fn.items()}
    return self_ir, edges, is_mod


def main():
    small, large, span, module_base = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    top = 25
    if "--top" in sys.argv:
        top = int(sys.argv[sys.argv.index("--top") + 1])
    s_self, s_edges, s_mod = parse(small, module_base)
    l_self, l_edges, l_mod = parse(large, module_base)
    is_mod = dict(s_mod)
    is_mod.update(l_mod)
    d_self = {k: (l_self.get(k, 0) - s_self.get(k, 0)) / span for k in set(l_self) | set(s_self)}
    d_edges = {}
    for k in set(l_edges) | set(s_edges):
        a, b = l_edges.get(k, [0, 0]), s_edges.get(k, [0, 0])
        d_edges[k] = ((a[0] - b[0]) / span, (a[1] - b[1]) / span)

    incl = defaultdict(float)
    for f, v in d_self.items():
        incl[f] += v
    for (a, b), (n, ir) in d_edges.items():
        if a != b:
            incl[a] += ir

    def short(fn):
        fn = re.sub(r"::h[0-9a-f]{16}$", "", fn or "")
        fn = fn.replace("ngx_http_ratelimit::", "")
        return fn if len(fn) <= 100 else fn[:97] + "..."

    print("## entry points (outside -> module)")
    print("| calls/request | inclusive Ir/request | caller -> module function |")
    print("|---:|---:|---|")
    entries = defaultdict(lambda: [0.0, 0.0])
    tot = 0.0
    for (a, b), (n, ir) in d_edges.items():
        if is_mod.get(b) and not is_mod.get(a):
            entries[(a, b)][0] += n
            entries[(a, b)][1] += ir
            tot += ir
    for (a, b), (n, ir) in sorted(entries.items(), key=lambda x: -x[1][1]):
        if abs(ir) >= 3 or abs(n) >= 0.01:
            print(f"| {n:.3f} | {ir:,.0f} | `{a}` -> `{short(b)}` |")
    print(f"\nmodule total (inclusive of its entries, nested resumes included): {tot:,.0f} Ir/request")
    own = sum(v for f, v in d_self.items() if is_mod.get(f))
    RESUMED = ("ngx_http_core_run_phases", "ngx_http_run_posted_requests")
    outside = sum(ir for (a, b), (n, ir) in d_edges.items()
                  if is_mod.get(a) and not is_mod.get(b) and b not in RESUMED)
    print(f"module's own part: self Ir of its functions {own:,.0f} + what they call outside "
          f"(resumed phases excluded) {outside:,.0f} = {own + outside:,.0f} Ir/request\n")

    print(f"## module functions, top {top} by inclusive Ir/request")
    print("| inclusive | self | calls/request | function |")
    print("|---:|---:|---:|---|")
    calls_in = defaultdict(float)
    for (a, b), (n, ir) in d_edges.items():
        if a != b:
            calls_in[b] += n
    mods = [(incl[f], d_self.get(f, 0), f) for f in incl if is_mod.get(f) and abs(incl[f]) >= 1]
    for i, s, f in sorted(mods, reverse=True)[:top]:
        print(f"| {i:,.0f} | {s:,.0f} | {calls_in[f]:.2f} | `{short(f)}` |")

    print("\n## what the module calls outside itself")
    print("| calls/request | inclusive Ir/request | callee | (callers) |")
    print("|---:|---:|---|---|")
    outs = defaultdict(lambda: [0.0, 0.0, defaultdict(float)])
    for (a, b), (n, ir) in d_edges.items():
        if is_mod.get(a) and not is_mod.get(b):
            o = outs[b]
            o[0] += n
            o[1] += ir
            o[2][a] += n
    for b, (n, ir, callers) in sorted(outs.items(), key=lambda x: -x[1][1]):
        if abs(ir) < 3 and abs(n) < 0.01:
            continue
        cs = sorted(callers.items(), key=lambda x: -x[1])[:3]
        cs = ", ".join(f"{short(c).split('::')[-1] if '::' in short(c) else short(c)} {v:.2f}" for c, v in cs if v >= 0.01)
        print(f"| {n:.2f} | {ir:,.0f} | `{b}` | {cs} |")

    print("\n## module functions calling into Rust's fmt / hashing / alloc (edges within the module)")
    print("| calls/request | inclusive Ir/request | caller -> callee |")
    print("|---:|---:|---|")
    pat = re.compile(r"core::fmt|sip::|hash_one|BuildHasher|alloc::raw_vec|__rust_alloc|__rust_dealloc|__rdl|drop_in_place|<alloc::vec|RawVec|Hasher")
    rows = []
    for (a, b), (n, ir) in d_edges.items():
        if is_mod.get(a) and is_mod.get(b) and pat.search(b or "") and not pat.search(a or "") and (abs(ir) >= 5):
            rows.append((ir, n, a, b))
    for ir, n, a, b in sorted(rows, reverse=True)[:40]:
        print(f"| {n:.2f} | {ir:,.0f} | `{short(a)}` -> `{short(b)}` |")


if __name__ == "__main__":
    main()
