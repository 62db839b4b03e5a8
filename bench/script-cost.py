#!/usr/bin/env python3
"""Redis instructions per decision of the decision script, per algorithm, lease and batch size.

For each algorithm (sliding_log, sliding_log_packed, sliding_counter, gcra, calendar quota,
balance, concurrency), plain and with `lease=` (a reserve zone that asks for nothing, as most of
lease=auto's decisions do, and one that asks for 8 units), in calls of 1, 4 and 16 decisions
of one zone each, clock=redis, every decision admitted (limit 100 per 60 s, keys at random
among 10,000): user-space instructions per decision of a fresh redis-server under callgrind
(bench/callgrind.py: repeatable on a busy machine, the kernel's share not counted), and the
commands the script ran per decision (INFO commandstats; TIME once per call).

Then where a decision's instructions go, for sliding_counter and sliding_log in calls of 16:
the same calls to stand-in scripts that do part of the work, the rest left out:
  * bare: no command, only the reply (what EVALSHA, its arguments and the reply cost);
  * commands: the commands the script runs for such a decision, with fixed arguments, and the
    reply (the floor for a script that must run them);
the script's own logic is the rest.

Writes bench/script-cost.md (and the figures as bench/script-cost.tsv, which --before reads
back to show a later script's ratios against them) and prints it. Python 3 standard library,
plus redis-server, redis-benchmark, valgrind and callgrind_control on the PATH; every server
on free loopback ports, stopped at exit. About 6 minutes.

Usage: bench/script-cost.py [--decisions 6000] [--before bench/script-cost-before.tsv]
       [--only c,g] [--root DIR] [--out bench/script-cost.md]
"""

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import callgrind as C  # noqa: E402
import memory as M  # noqa: E402

KEYS, LIMIT, WINDOW = 10_000, 100, 60_000
BATCHES = (1, 4, 16)
ALGS = [("l", "sliding_log"), ("p", "sliding_log_packed"), ("c", "sliding_counter"),
        ("g", "gcra"), ("q", "calendar quota (month)"), ("b", "balance"),
        ("n", "concurrency")]
# lease: None (a plain zone), or (want, lease_ms) of a reserve zone.
LEASES = [None, (0, 1000), (8, 1000)]


def zone_argv(alg, lease):
    field = alg if lease is None else "%s+%d:%d" % (alg, lease[0], lease[1])
    # "q": the window field is a month in UTC (lua/decide.lua); "b": burst is the balance of a
    # missing key, large enough that every decision is admitted; "n": the member, a request's
    # own.
    window = "14404" if alg == "q" else str(WINDOW)
    last = {"g": str(LIMIT), "b": "1000000000", "n": "m__rand_int__"}.get(alg, "0")
    return [field, str(LIMIT), window, "1", last]


def command(alg, lease, batch):
    def cmd(sha):
        keys = ["rl:%s%d:__rand_int__" % (alg, i) for i in range(batch)]
        argv = []
        for _ in keys:
            argv += [""] + zone_argv(alg, lease)
        return ["EVALSHA", sha, str(batch)] + keys + argv
    return cmd


def lease_name(lease):
    if lease is None:
        return "plain"
    return "lease, asks %d" % lease[0] if lease[0] else "lease, asks nothing"


# Stand-ins for the breakdown: the reply of a plain one-zone decision per key, and before it
# nothing (bare) or the commands the script runs for such an admitted decision.
REPLY = """
if #KEYS == 1 then return { 1, 1, 99, 0 } end
local out = {}
for i = 1, #KEYS do out[i] = { 1, 1, 99, 0 } end
return out
"""
STANDINS = {
    "c": """
local t = redis.call('TIME')
for i = 1, #KEYS do
  redis.call('GET', KEYS[i])
  redis.call('SET', KEYS[i], '123456789', 'PX', '100000')
end
""",
    "l": """
local t = redis.call('TIME')
for i = 1, #KEYS do
  redis.call('ZRANGE', KEYS[i], '0', '1', 'WITHSCORES')
  redis.call('ZADD', KEYS[i], 'NX', t[1], t[1] .. t[2] .. i)
  redis.call('PEXPIRE', KEYS[i], '60000')
end
""",
}


def article_command(sha):
    """The article's script (the Lua block of bench/compare.sh), one decision per call, as the
    block sends it: limit, window, now in ms, a unique member."""
    return ["EVALSHA", sha, "1", "rl:a:__rand_int__", str(LIMIT), str(WINDOW),
            str(int(time.time() * 1000)), "m__rand_int__"]


def commands_per_decision(batch):
    """After a run: the commands the script ran per decision (the warm-up's too: a ratio)."""
    out = {}

    def check(c, sha):
        calls = {}
        for k, v in c.info("commandstats").items():
            calls[k[len("cmdstat_"):]] = int(dict(f.split("=", 1) for f in v.split(","))["calls"])
        inner = sum(n for name, n in calls.items()
                    if name not in ("evalsha", "info", "script", "ping", "config"))
        out["cmds"] = inner / (calls["evalsha"] * batch)
    return out, check


def admitted(alg, lease, batch, out):
    """A check after the run: a decision on a fresh key is admitted (the arguments are good),
    with the commands per decision noted in `out`."""
    counts, count_check = commands_per_decision(batch)

    def check(c, sha):
        count_check(c, sha)
        c.sock.sendall(M.encode(["EVALSHA", sha, "1", "rl:probe"] + [""]
                                + [a.replace("__rand_int__", "probe")
                                   for a in zone_argv(alg, lease)]))
        r = c.read()
        if isinstance(r, M.RedisError) or r[0] != 1:
            raise SystemExit("%s %s: not admitted: %r" % (alg, lease_name(lease), r))
        out.update(counts)
    return check


def redis_version():
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    return out.split("v=", 1)[1].split()[0]


def read_tsv(path):
    """The figures of a script-cost.tsv, and the commit its header names."""
    rows, rev = {}, "?"
    with open(path) as f:
        for line in f:
            if line.startswith("# bench/script-cost.py "):
                rev = line[len("# bench/script-cost.py "):].split(":")[0]
            if line.startswith("#") or not line.strip():
                continue
            alg, lease, batch, instr, cmds = line.rstrip("\n").split("\t")
            rows[(alg, lease, int(batch))] = (float(instr), float(cmds))
    return rows, rev


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--decisions", type=int, default=6000,
                    help="decisions per variant under callgrind")
    ap.add_argument("--out", default=os.path.join(M.ROOT, "bench", "script-cost.md"))
    ap.add_argument("--before", help="a script-cost.tsv of an earlier script: ratios against it")
    ap.add_argument("--only", help="algorithm letters to measure, e.g. c,g (no breakdown)")
    ap.add_argument("--root", default=M.ROOT,
                    help="the checkout whose lua/ script is measured (the report names its commit)")
    a = ap.parse_args()
    script = M.script_text(a.root)
    only = set(a.only.split(",")) if a.only else None
    M.install_signal_cleanup()
    before, before_rev = read_tsv(a.before) if a.before else ({}, None)

    results = {}
    for alg, _ in ALGS:
        if only and alg not in only:
            continue
        for lease in LEASES:
            # Concurrency zones take no reservations.
            if alg == "n" and lease is not None:
                continue
            for batch in BATCHES:
                extra = {}
                instr = C.instructions_per_call(
                    script, command(alg, lease, batch), a.decisions // batch, KEYS,
                    check=admitted(alg, lease, batch, extra)) / batch
                results[(alg, lease_name(lease), batch)] = (instr, extra["cmds"])
                print("%s %-20s batch %2d %8.0f instructions/decision %.2f commands" % (
                    alg, lease_name(lease), batch, instr, extra["cmds"]), file=sys.stderr)

    breakdown = {}
    article = None
    if not only:
        counts, count_check = commands_per_decision(1)
        article = (C.instructions_per_call(M.ARTICLE_SCRIPT.encode(), article_command,
                                           a.decisions, KEYS, check=count_check), counts)
        print("article's script %8.0f instructions/decision" % article[0], file=sys.stderr)
        batch = 16
        for alg, body in STANDINS.items():
            for name, text in (("bare", REPLY), ("commands", body + REPLY)):
                breakdown[(alg, name)] = C.instructions_per_call(
                    text.encode(), command(alg, None, batch), a.decisions // batch, KEYS) / batch
                print("%s %-8s batch %d %8.0f instructions/decision" % (
                    alg, name, batch, breakdown[(alg, name)]), file=sys.stderr)

    tsv = os.path.splitext(a.out)[0] + ".tsv"
    with open(tsv, "w") as f:
        f.write("# bench/script-cost.py %s: algorithm, lease, batch, instructions per decision,"
                " commands per decision\n" % M.git_rev(a.root))
        for (alg, lease, batch), (instr, cmds) in results.items():
            f.write("%s\t%s\t%d\t%.0f\t%.2f\n" % (alg, lease, batch, instr, cmds))

    names = dict(ALGS)
    lines = [
        "# Redis instructions per decision, per algorithm",
        "",
        "`bench/script-cost.py` (%s; Redis %s under callgrind; %d decisions per variant after a"
        " warm-up; redis-benchmark, 1 connection, %d calls deep; %d keys at random; one zone per"
        " decision, limit %d per %d s, clock=redis, every decision admitted). User-space"
        " instructions of redis-server per decision: reading the call, the script with the"
        " commands it runs, the reply; the kernel's share (reads, writes) is not counted."
        % (M.git_rev(a.root), redis_version(), a.decisions, C.DEPTH, KEYS, LIMIT, WINDOW // 1000),
        "",
    ]
    head = "| algorithm | zone | " + " | ".join(
        "batch %d" % b for b in BATCHES) + " | commands per decision (batch 16) |"
    if before:
        head += " vs %s, " % before_rev + ", ".join("batch %d" % b for b in BATCHES) + " |"
    lines += [head, "| --- | --- |" + " ---: |" * (len(BATCHES) + 1 + (1 if before else 0))]
    for alg, _ in ALGS:
        for lease in LEASES:
            keyname = lease_name(lease)
            if (alg, keyname, BATCHES[0]) not in results:
                continue
            row = [results[(alg, keyname, b)] for b in BATCHES]
            line = "| %s | %s | %s | %.2f |" % (
                names[alg], keyname, " | ".join("{:,.0f}".format(r[0]) for r in row), row[-1][1])
            if before:
                line += " %s |" % ", ".join(
                    "%.2f×" % (results[(alg, keyname, b)][0] / before[(alg, keyname, b)][0])
                    if (alg, keyname, b) in before else "–" for b in BATCHES)
            lines.append(line)
    if article:
        lines += [
            "",
            "The article's script (the Lua block's in `make bench-compare`: `ZREMRANGEBYSCORE`,"
            " `ZCARD`, `ZADD`, `PEXPIRE` per decision, one decision per call), the same way:"
            " **{:,.0f}** instructions per decision ({:.2f} commands); sliding_log in calls of 16"
            " takes {:.2f}× that.".format(
                article[0], article[1]["cmds"],
                results[("l", "plain", 16)][0] / article[0] if ("l", "plain", 16) in results
                else float("nan")),
        ]
    if breakdown:
        lines += [
            "",
            "## Where a decision's instructions go (calls of 16, plain zone)",
            "",
            "| algorithm | the call and reply alone | + the commands the script runs | the script"
            " | the script's own logic |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for alg in STANDINS:
            full = results.get((alg, "plain", 16), (float("nan"),))[0]
            bare, cmds = breakdown[(alg, "bare")], breakdown[(alg, "commands")]
            lines.append("| {} | {:,.0f} | {:,.0f} | {:,.0f} | {:,.0f} ({:.0%}) |".format(
                names[alg], bare, cmds, full, full - cmds, (full - cmds) / full))
        lines += [
            "",
            "The call and reply alone: a stand-in script that returns each decision's reply and"
            " runs nothing. The commands: the same plus the commands the script runs for such a"
            " decision (sliding_counter: `TIME` once per call, `GET`, `SET ... PX`;"
            " sliding_log: `TIME`, `ZRANGE` of the two oldest, `ZADD NX`, `PEXPIRE`), with"
            " fixed arguments. The logic is the rest: reading and"
            " checking the arguments, the arithmetic, formatting numbers for the commands.",
        ]
    C.write_report(a.out, lines)


if __name__ == "__main__":
    main()
