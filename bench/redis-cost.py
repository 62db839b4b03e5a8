#!/usr/bin/env python3
"""Redis CPU per rate-limit decision, the script alone: no nginx, no wrk.

Starts its own redis-server on a free 127.0.0.1 port (stopped by pid at exit) and drives it with
redis-benchmark (one connection, pipelined 32 calls deep, keys drawn at random among 10,000) for
each variant: the article's script, the old module script (t/ref/decide-v1.lua, one decision
per call) and the current one (lua/decide.lua, as src/decide/script/mod.rs assembles it) per algorithm,
clock and batch size. The scenario is the issue's: limit 100 per 60 s, every decision admitted.
Then the sorted-set log against the packed log (sliding_log_packed) at limits 10, 100, 1,000
and 10,000, keys already holding entries (each admission rewrites the packed string, so its
cost grows with what the key holds), and the packed log's memory per key.

Each run: FLUSHALL, a warm-up of 20,000 decisions (so keys hold a few entries, as in steady
traffic), CONFIG RESETSTAT, then the measured decisions. Per decision it reports
  * Redis CPU: the used_cpu_user + used_cpu_sys delta of INFO cpu (parsing, networking and
    the script: what a production Redis pays);
  * script time: EVALSHA's usec_per_call from INFO commandstats, per decision;
  * commands: the calls of every other command (what the scripts run) per decision.
Variants run in a new random order each round; the table has each variant's median over the
rounds and the spread (min-max).

Writes bench/redis-cost.md and prints it. Python 3 standard library, plus redis-server and
redis-benchmark on the PATH.

Usage: bench/redis-cost.py [--rounds 5] [--decisions 50000] [--out bench/redis-cost.md]
"""

import argparse
import os
import random
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memory as M  # noqa: E402

KEYS = 10_000
LIMIT, WINDOW = 100, 60_000
DEPTH = 32
WARMUP = 20_000

with open(os.path.join(M.ROOT, "t", "ref", "decide-v1.lua"), "rb") as f:
    OLD_SCRIPT = f.read()

ALGS = {"l": "sliding_log", "p": "sliding_log_packed", "c": "sliding_counter", "g": "gcra",
        "q": "calendar quota (month)", "b": "balance"}


class Variant:
    def __init__(self, name, script, batch, args_of, limit=LIMIT, keys=KEYS, prefill=0,
                 alg=None):
        self.name, self.script, self.batch, self.args_of = name, script, batch, args_of
        # By limit: `keys` keys, each holding `prefill` entries of `alg` before the run.
        self.limit, self.keys, self.prefill, self.alg = limit, keys, prefill, alg

    def key(self):
        return self.name + "/%d/%d" % (self.batch, self.limit)

    def command(self, sha, now):
        """One call's arguments for redis-benchmark (__rand_int__: a random key each)."""
        keys, argv = [], []
        for i in range(self.batch):
            k, a = self.args_of(i, now)
            keys.append(k)
            argv.extend(a)
        return ["EVALSHA", sha, str(len(keys))] + keys + argv


def article():
    return Variant("article's script", M.ARTICLE_SCRIPT.encode(), 1,
                   lambda i, now: ("rl:a:__rand_int__",
                                   [str(LIMIT), str(WINDOW), str(now), "m__rand_int__"]))


def zone_argv(alg, now, limit=LIMIT):
    # "q": the window field is the period, a month in UTC (lua/decide.lua); "b": burst is the
    # balance of a missing key, large enough that every decision is admitted.
    window = "14404" if alg == "q" else str(WINDOW)
    burst = {"g": str(limit), "b": "1000000000"}.get(alg, "0")
    return [alg, str(limit), window, "1", burst]


def old(alg, clock):
    return Variant("old script %s clock=%s" % (ALGS[alg], clock), OLD_SCRIPT, 1,
                   lambda i, now: ("rl:o%s:__rand_int__" % alg,
                                   [str(now) if clock == "nginx" else ""] + zone_argv(alg, now)))


def new(alg, clock, batch):
    return Variant("new script %s clock=%s" % (ALGS[alg], clock), M.script_text(), batch,
                   lambda i, now: ("rl:n%s:__rand_int__" % alg,
                                   [str(now) if clock == "nginx" else ""] + zone_argv(alg, now)))


def by_limit(alg, limit, keys, prefill):
    return Variant("%s limit %d" % (ALGS[alg], limit), M.script_text(), 16,
                   lambda i, now: ("rl:b%s%d:__rand_int__" % (alg, limit),
                                   [""] + zone_argv(alg, now, limit)),
                   limit, keys, prefill, alg)


VARIANTS = [
    article(),
    old("l", "redis"), old("l", "nginx"), old("c", "redis"), old("g", "redis"),
    new("l", "redis", 1), new("l", "redis", 16), new("l", "redis", 64),
    new("l", "nginx", 1), new("l", "nginx", 16),
    new("p", "redis", 1), new("p", "redis", 16),
    new("c", "redis", 1), new("c", "redis", 16),
    new("g", "redis", 1), new("g", "redis", 16),
    new("q", "redis", 1), new("q", "redis", 16),
    new("b", "redis", 1), new("b", "redis", 16),
]
# Keys and entries per key such that the warm-up and the run (70,000 decisions over the keys)
# stay under the limit: about half full.
LIMITS = [(10, 50_000, 2), (100, 10_000, 50), (1000, 1000, 500), (10_000, 100, 5000)]
BY_LIMIT = [by_limit(alg, *lim) for lim in LIMITS for alg in ("l", "p")]


def prefill(c, v):
    """v.prefill admitted entries on each of v.keys keys, 20-30 s old: in the window for the
    rest of the run, as the script would have written them."""
    if not v.prefill:
        return
    now = int(time.time() * 1000)
    times = [now - 30_000 + 10_000 * j // v.prefill for j in range(v.prefill)]
    cmds = []
    for i in range(v.keys):
        key = "rl:b%s%d:%012d" % (v.alg, v.limit, i)
        if v.alg == "l":
            args = []
            for j, t in enumerate(times):
                args += [t, t * 1000 + j]
            cmds.append(M.encode(["ZADD", key, "NX"] + args))
            cmds.append(M.encode(["PEXPIRE", key, WINDOW]))
        else:
            cmds.append(M.encode(["SET", key, b"".join(struct.pack("<Q", t)[:6] for t in times),
                                  "PX", WINDOW]))
    for r in c.pipeline(cmds, batch=200):
        if isinstance(r, M.RedisError):
            raise SystemExit("%s: prefill: %s" % (v.name, r))


def cpu(c):
    i = c.info("cpu")
    return float(i["used_cpu_user"]) + float(i["used_cpu_sys"])


def commandstats(c):
    out = {}
    for k, v in c.info("commandstats").items():
        fields = dict(f.split("=", 1) for f in v.split(","))
        out[k[len("cmdstat_"):]] = (int(fields["calls"]), float(fields["usec"]))
    return out


def bench(port, cmd, calls, keys):
    subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", "1",
                    "-P", str(DEPTH), "-r", str(keys), "-n", str(calls), "-q"] + cmd,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run(server, v, decisions):
    c = server.client
    sha = c.cmd("SCRIPT", "LOAD", v.script)
    c.cmd("FLUSHALL")
    prefill(c, v)
    now = int(time.time() * 1000)
    cmd = v.command(sha, now)
    probe = M.Client(server.port)
    # Every reply an admission: the scenario holds, and the script runs without error.
    probe.sock.sendall(M.encode([a.replace("__rand_int__", "probe") for a in cmd]))
    r = probe.read()
    first = r if v.batch == 1 else r[0]
    if isinstance(r, M.RedisError) or not first or first[0] != 1:
        raise SystemExit("%s: unexpected reply %r" % (v.name, r))
    bench(server.port, cmd, WARMUP // v.batch, v.keys)
    c.cmd("CONFIG", "RESETSTAT")
    t0 = cpu(c)
    calls = decisions // v.batch
    bench(server.port, cmd, calls, v.keys)
    used = cpu(c) - t0
    st = commandstats(c)
    # redis-benchmark rounds the count up to whole pipelines.
    evalsha_calls, script_usec = st["evalsha"]
    if not calls <= evalsha_calls < calls + DEPTH:
        raise SystemExit("%s: %d EVALSHA calls, expected %d" % (v.name, evalsha_calls, calls))
    n = evalsha_calls * v.batch
    inner = sum(k for name, (k, _) in st.items() if name not in ("evalsha", "info", "config"))
    # The decisions of the measured run were admitted too: a key still has room after it.
    key, argv = v.args_of(0, now)
    probe.sock.sendall(M.encode(["EVALSHA", sha, 1, key.replace("__rand_int__", "%012d" % 0)]
                                + argv))
    r = probe.read()
    if isinstance(r, M.RedisError) or r[0] != 1:
        raise SystemExit("%s: a key was full after the run: %r" % (v.name, r))
    return {"cpu": used * 1e6 / n, "script": script_usec / n, "cmds": inner / n}


def script_memory(server, calls, keys):
    """The used_memory delta and MEMORY USAGE per key after the script ran `calls(sha)`, lists
    of EVALSHA commands run in turn, each admitted, on keys rl:api:0 .. rl:api:keys-1."""
    c = server.client
    sha = c.cmd("SCRIPT", "LOAD", M.script_text())
    c.cmd("FLUSHALL", "SYNC")
    before = M.used_memory(c)
    fc = M.Client(server.port)
    for cmds in calls(sha):
        for rep in fc.pipeline([M.encode(cmd) for cmd in cmds]):
            if isinstance(rep, M.RedisError) or rep[0] != 1:
                raise SystemExit("memory: %r" % rep)
    fc.sock.close()
    time.sleep(0.2)
    delta = M.used_memory(c) - before
    usage = c.pipeline([M.encode(["MEMORY", "USAGE", "rl:api:%d" % k, "SAMPLES", "0"])
                        for k in range(min(keys, 200))])
    return delta, sum(usage) / len(usage)


def packed_memory(server, n, keys):
    """MEMORY USAGE per key and used_memory per entry of the packed log, n entries on each of
    `keys` keys, written by the script (gateway clock, 100 ms apart, in one window)."""
    t0 = 1_700_000_000_000
    delta, key = script_memory(server, lambda sha: (
        [["EVALSHA", sha, 1, "rl:api:%d" % k, t0 + 100 * r, "p", n, 3_600_000, 1, 0]
         for k in range(keys)] for r in range(n)), keys)
    return {"n": n, "keys": keys, "entry": delta / (keys * n), "key": key}


def key_memory(server, alg, keys):
    """MEMORY USAGE and used_memory delta per key of an O(1) algorithm ("q", "b"): one
    admitted decision per key, written by the script."""
    delta, key = script_memory(server, lambda sha: [
        [["EVALSHA", sha, 1, "rl:api:%d" % k, 1_700_000_000_000] + zone_argv(alg, 0)
         for k in range(keys)]], keys)
    return {"alg": ALGS[alg], "keys": keys, "delta": delta / keys, "key": key}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--decisions", type=int, default=50_000)
    ap.add_argument("--out", default=os.path.join(M.ROOT, "bench", "redis-cost.md"))
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    M.install_signal_cleanup()
    server = M.RedisServer()
    version = server.client.info("server")["redis_version"]
    rng = random.Random(a.seed)
    results = {v.key(): [] for v in VARIANTS + BY_LIMIT}
    for rnd in range(a.rounds):
        order = VARIANTS + BY_LIMIT
        rng.shuffle(order)
        for v in order:
            r = run(server, v, a.decisions)
            results[v.key()].append(r)
            print("round %d %-42s batch %2d  cpu %5.2f us  script %5.2f us  %.2f cmds" % (
                rnd + 1, v.name, v.batch, r["cpu"], r["script"], r["cmds"]), file=sys.stderr)
    memory = [packed_memory(server, n, 100_000 // n) for n in (10, 100, 1000, 10_000)]
    per_key = [key_memory(server, alg, 100_000) for alg in ("q", "b")]
    server.stop()

    def med(rs, k):
        return statistics.median(r[k] for r in rs)

    base = med(results[old("l", "redis").key()], "cpu")
    lines = [
        "# Redis cost per decision",
        "",
        "`bench/redis-cost.py` (%s; Redis %s; %d rounds of %d decisions per variant, interleaved;"
        " redis-benchmark, 1 connection, %d calls deep; %d keys at random; limit %d per %d s,"
        " every decision admitted)." % (M.git_rev(), version, a.rounds, a.decisions, DEPTH,
                                        KEYS, LIMIT, WINDOW // 1000),
        "",
        "Caveat: 2 cores shared with other work (builds, tests); redis-benchmark runs on the same"
        " cores. Compare rows with one another, not with another machine; the spread column"
        " shows the noise.",
        "",
        "| variant | decisions per call | Redis CPU µs per decision (median) | spread | script µs"
        " per decision | commands per decision | vs old sliding_log clock=redis |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for v in VARIANTS:
        rs = results[v.key()]
        c = med(rs, "cpu")
        lines.append("| %s | %d | **%.2f** | %.2f–%.2f | %.2f | %.2f | %.2f× |" % (
            v.name, v.batch, c, min(r["cpu"] for r in rs), max(r["cpu"] for r in rs),
            med(rs, "script"), med(rs, "cmds"), c / base))
    lines += [
        "",
        "- **Redis CPU**: `used_cpu_user + used_cpu_sys` delta over the measured run, per"
        " decision: reading and parsing the call, the script, the reply.",
        "- **script µs**: `EVALSHA` `usec` from `INFO commandstats`, per decision: the script"
        " alone, with the commands it runs.",
        "- **commands**: the commands the script ran (`TIME`, `ZRANGE`, ...), per decision;"
        " `TIME` counts once per call.",
        "",
        "## The sorted-set log against the packed log, by limit",
        "",
        "Batches of 16, clock=redis, every decision admitted; each key holds about half its limit"
        " before the run (entries 20–30 s old).",
        "",
        "| limit | keys | entries per key before | `sliding_log` µs | `sliding_log_packed` µs"
        " | `sliding_log` commands | `sliding_log_packed` commands |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for limit, keys, pre in LIMITS:
        rl, rp = (results[by_limit(alg, limit, keys, pre).key()] for alg in ("l", "p"))
        lines.append("| %d | %d | %d | %.2f (%.2f–%.2f) | %.2f (%.2f–%.2f) | %.2f | %.2f |" % (
            limit, keys, pre,
            med(rl, "cpu"), min(r["cpu"] for r in rl), max(r["cpu"] for r in rl),
            med(rp, "cpu"), min(r["cpu"] for r in rp), max(r["cpu"] for r in rp),
            med(rl, "cmds"), med(rp, "cmds")))
    lines += [
        "",
        "Packed log memory (the script fills each key, 100 ms apart; MEMORY USAGE per key, the"
        " used_memory delta per entry):",
        "",
        "| entries per key | keys | bytes per entry (used_memory) | bytes per key (MEMORY USAGE) |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for m in memory:
        lines.append("| %d | %d | %.1f | %.0f |" % (m["n"], m["keys"], m["entry"], m["key"]))
    lines += [
        "",
        "Quota and balance memory (one decision per key, whatever the limit and count):",
        "",
        "| algorithm | keys | bytes per key (used_memory) | bytes per key (MEMORY USAGE) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for m in per_key:
        lines.append("| %s | %d | %.1f | %.0f |" % (m["alg"], m["keys"], m["delta"], m["key"]))
    md = "\n".join(lines) + "\n"
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
