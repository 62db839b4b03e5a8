#!/usr/bin/env python3
"""What a script call's fixed cost is made of (issue 31): Redis instructions per call of the
decision script and of stand-ins that do part of its work, in calls of 1 and of 16 decisions.

For sliding_counter and sliding_log zones (one zone per decision, limit 100 per 60 s, clock=redis,
keys at random among 10,000, every decision admitted), the same EVALSHA arguments sent to:
  * return: `return 0`: reading the command, finding the script, KEYS and ARGV, the call;
  * reply: the reply of such decisions built and returned, nothing run;
  * time: the same after one `redis.call('TIME')`;
  * header: the same after the script's top-level code before its decisions' loop (its locals,
    helpers, the `S` table, the `k<m>` check) and the TIME it reads;
  * script: lua/decide.lua itself.
and, with --fcall, the same script as a Redis 7 function (`FUNCTION LOAD` of a library that
registers it, called by `FCALL`): its body unchanged, and with the header's helpers and constants
hoisted to the library's load (built once, not per call).

Per stand-in: instructions per call in calls of 1 and of 16, and the fixed cost per call
F = (16 x I(1) - I(16)) / 15 with the per-decision part D = (I(16) - I(1)) / 15.

With --annotate DIR the callgrind output of each run is kept there (for callgrind_annotate; use a
redis-server with symbols, $REDIS_SERVER).

Usage: bench/call-cost.py [--decisions 4800] [--only c,l] [--stands return,reply,...]
       [--fcall] [--annotate DIR] [--root DIR]
"""

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import callgrind as C  # noqa: E402
import memory as M  # noqa: E402

KEYS, LIMIT, WINDOW = 10_000, 100, 60_000
BATCHES = (1, 16)
ALGS = {"c": "sliding_counter", "l": "sliding_log"}

REPLY = """
if #KEYS == 1 then return { 1, 1, 99, 0 } end
local out = {}
for i = 1, #KEYS do out[i] = { 1, 1, 99, 0 } end
return out
"""


def command(alg, batch, verb="EVALSHA"):
    def cmd(sha):
        keys = ["rl:%s%d:__rand_int__" % (alg, i) for i in range(batch)]
        argv = []
        for _ in keys:
            argv += ["", alg, str(LIMIT), str(WINDOW), "1", "0"]
        return [verb, sha, str(batch)] + keys + argv
    return cmd


def split_script(text):
    """The script's top-level code before its decisions' loop, and the rest."""
    m = re.search(rb"^repeat\n", text, re.M)
    if not m:
        raise SystemExit("no top-level `repeat` in the script")
    return text[:m.start()], text[m.start():]


# The script's helpers that read no per-call state: hoisted out of the function body when a
# library loads (the rest of the header stays in the body).
HOISTABLE = ("ledger_of", "split_rid", "key_error", "muldiv", "packed_upto", "add_reserved",
             "period_bounds")


def library(script, hoist):
    """decide.lua as a Redis 7 function library. KEYS and ARGV become the function's parameters
    (the body's `local ARGV = ARGV` reads the parameter). With `hoist`, the constants and helpers
    before the `S` table become the library's upvalues, set on the first call (a library's
    load sees none of math, string, struct, redis.call) and kept for every later one."""
    body = script
    top = b""
    if hoist:
        head, rest = split_script(script)
        cut = head.index(b"local S1, S2, S3")
        init, head = head[:cut].decode(), head[cut:]
        # Globals of the same names as the upvalues: read through _G.
        init = init.replace("local ARGV, type = ARGV, type", "local type = _G.type")
        init = init.replace("math.min, tonumber, string.format", "math.min, _G.tonumber, string.format")
        # Declarations without a value (helpers built per call, in the loop) stay in the body.
        decls = re.findall(r"^local [\w, ]+\n", init, re.M)
        init = re.sub(r"^local [\w, ]+\n", "", init, flags=re.M)
        head = "".join(decls).encode() + head
        names = []
        for m in re.finditer(r"^local function (\w+)", init, re.M):
            names.append(m.group(1))
        init = re.sub(r"^local function (\w+)", r"\1 = function", init, flags=re.M)
        for m in re.finditer(r"^local ([\w, ]+?) =", init, re.M):
            names += [n.strip() for n in m.group(1).split(",")]
        init = re.sub(r"^local ([\w, ]+?) =", r"\1 =", init, flags=re.M)
        top = ("local ready, %s\n" % ", ".join(names)).encode()
        body = (b"local ARGV = ARGV\nif not ready then\n" + init.encode()
                + b"\nready = true\nend\n" + head + rest)
    return (b"#!lua name=rl\n" + top
            + b"\nredis.register_function('decide', function(KEYS, ARGV)\n" + body
            + b"\nend)\n")


def fcall_load(c, text):
    c.cmd("FUNCTION", "LOAD", "REPLACE", text)
    return "decide"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--decisions", type=int, default=4800)
    ap.add_argument("--only", default="c,l")
    ap.add_argument("--stands", default="return,reply,time,header,script")
    ap.add_argument("--fcall", action="store_true")
    ap.add_argument("--annotate", help="keep each run's callgrind output in this folder")
    ap.add_argument("--root", default=M.ROOT)
    a = ap.parse_args()
    M.install_signal_cleanup()
    script = M.script_text(a.root)
    head, _ = split_script(script)
    stands = {
        "return": (b"return 0", None),
        "reply": (REPLY.encode(), None),
        "time": (b"redis.call('TIME')\n" + REPLY.encode(), None),
        # The TIME read as the script's loop makes it (before eef80c1, a read_time() of the
        # header's, with the ms formatted: use that script's header then).
        "header": (head + (b"\nread_time()\n" if b"local function read_time" in head else
                           b"\nlocal t = call('TIME')\nlocal us = t[1] * 1000000 + t[2]\n")
                   + REPLY.encode(), None),
        "script": (script, None),
    }
    order = a.stands.split(",")
    if a.fcall:
        stands["fcall"] = (library(script, False), fcall_load)
        stands["fcall-hoisted"] = (library(script, True), fcall_load)
        order += ["fcall", "fcall-hoisted"]
    if a.annotate:
        os.makedirs(a.annotate, exist_ok=True)
    res = {}
    for alg in a.only.split(","):
        for name in order:
            text, load = stands[name]
            for b in BATCHES:
                keep = os.path.join(a.annotate, "%s.%s.%d.out" % (alg, name, b)) \
                    if a.annotate else None
                verb = "FCALL" if load else "EVALSHA"
                res[(alg, name, b)] = C.instructions_per_call(
                    text, command(alg, b, verb), a.decisions // b, KEYS, load=load, keep=keep)
                print("%s %-14s batch %2d %9.0f instructions/call" % (
                    alg, name, b, res[(alg, name, b)]), file=sys.stderr)
    print("| algorithm | stand-in | per call, calls of 1 | per call, calls of 16 | F per call "
          "| D per decision | F step from the previous row |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for alg in a.only.split(","):
        prev = None
        for name in order:
            i1, i16 = res[(alg, name, 1)], res[(alg, name, 16)]
            f, d = (16 * i1 - i16) / 15, (i16 - i1) / 15
            step = "" if prev is None or name.startswith("fcall") else "{:+,.0f}".format(f - prev)
            print("| %s | %s | {:,.0f} | {:,.0f} | {:,.0f} | {:,.0f} | %s |".format(
                i1, i16, f, d) % (ALGS[alg], name, step))
            if not name.startswith("fcall"):
                prev = f


if __name__ == "__main__":
    main()
