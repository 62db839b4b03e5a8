#!/usr/bin/env python3
"""Redis CPU per rate-limit decision, the script alone: no nginx, no wrk.

Starts its own redis-server on a free 127.0.0.1 port (stopped by pid at exit) and drives it with
redis-benchmark (one connection, pipelined 32 calls deep, keys drawn at random among 10,000) for
each variant: the article's script, the old module script (t/ref/decide-v1.lua, one decision
per call) and the current one (lua/decide.lua, as src/script.rs assembles it) per algorithm,
clock and batch size. The scenario is the issue's: limit 100 per 60 s, every decision admitted.

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

ALGS = {"l": "sliding_log", "c": "sliding_counter", "g": "gcra"}


class Variant:
    def __init__(self, name, script, batch, args_of):
        self.name, self.script, self.batch, self.args_of = name, script, batch, args_of

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


def zone_argv(alg, now):
    burst = str(LIMIT) if alg == "g" else "0"
    return [alg, str(LIMIT), str(WINDOW), "1", burst]


def old(alg, clock):
    return Variant("old script %s clock=%s" % (ALGS[alg], clock), OLD_SCRIPT, 1,
                   lambda i, now: ("rl:o%s:__rand_int__" % alg,
                                   [str(now) if clock == "nginx" else ""] + zone_argv(alg, now)))


def new(alg, clock, batch):
    return Variant("new script %s clock=%s" % (ALGS[alg], clock), M.script_text(), batch,
                   lambda i, now: ("rl:n%s:__rand_int__" % alg,
                                   ["1", str(now) if clock == "nginx" else ""]
                                   + zone_argv(alg, now)))


VARIANTS = [
    article(),
    old("l", "redis"), old("l", "nginx"), old("c", "redis"), old("g", "redis"),
    new("l", "redis", 1), new("l", "redis", 16), new("l", "redis", 64),
    new("l", "nginx", 1), new("l", "nginx", 16),
    new("c", "redis", 1), new("c", "redis", 16),
    new("g", "redis", 1), new("g", "redis", 16),
]


def cpu(c):
    i = c.info("cpu")
    return float(i["used_cpu_user"]) + float(i["used_cpu_sys"])


def commandstats(c):
    out = {}
    for k, v in c.info("commandstats").items():
        fields = dict(f.split("=", 1) for f in v.split(","))
        out[k[len("cmdstat_"):]] = (int(fields["calls"]), float(fields["usec"]))
    return out


def bench(port, cmd, calls):
    subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", "1",
                    "-P", str(DEPTH), "-r", str(KEYS), "-n", str(calls), "-q"] + cmd,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run(server, v, decisions):
    c = server.client
    sha = c.cmd("SCRIPT", "LOAD", v.script)
    c.cmd("FLUSHALL")
    now = int(time.time() * 1000)
    cmd = v.command(sha, now)
    probe = M.Client(server.port)
    # Every reply an admission: the scenario holds, and the script runs without error.
    probe.sock.sendall(M.encode([a.replace("__rand_int__", "probe") for a in cmd]))
    r = probe.read()
    first = r if v.batch == 1 else r[0]
    if isinstance(r, M.RedisError) or not first or first[0] != 1:
        raise SystemExit("%s: unexpected reply %r" % (v.name, r))
    bench(server.port, cmd, WARMUP // v.batch)
    c.cmd("CONFIG", "RESETSTAT")
    t0 = cpu(c)
    calls = decisions // v.batch
    bench(server.port, cmd, calls)
    used = cpu(c) - t0
    st = commandstats(c)
    # redis-benchmark rounds the count up to whole pipelines.
    evalsha_calls, script_usec = st["evalsha"]
    if not calls <= evalsha_calls < calls + DEPTH:
        raise SystemExit("%s: %d EVALSHA calls, expected %d" % (v.name, evalsha_calls, calls))
    n = evalsha_calls * v.batch
    inner = sum(k for name, (k, _) in st.items() if name not in ("evalsha", "info", "config"))
    # The decisions of the measured run were admitted too: none of the keys reached the limit.
    return {"cpu": used * 1e6 / n, "script": script_usec / n, "cmds": inner / n}


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
    results = {v.name + "/%d" % v.batch: [] for v in VARIANTS}
    for rnd in range(a.rounds):
        order = VARIANTS[:]
        rng.shuffle(order)
        for v in order:
            r = run(server, v, a.decisions)
            results[v.name + "/%d" % v.batch].append(r)
            print("round %d %-42s batch %2d  cpu %5.2f us  script %5.2f us  %.2f cmds" % (
                rnd + 1, v.name, v.batch, r["cpu"], r["script"], r["cmds"]), file=sys.stderr)
    server.stop()

    def med(rs, k):
        return statistics.median(r[k] for r in rs)

    base = med(results["old script sliding_log clock=redis/1"], "cpu")
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
        rs = results[v.name + "/%d" % v.batch]
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
    ]
    md = "\n".join(lines) + "\n"
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
