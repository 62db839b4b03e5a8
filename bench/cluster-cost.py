#!/usr/bin/env python3
"""Why a Cluster decision costs Redis more than one server's: the script alone, one process.

bench/topology.sh measures the whole path (nginx, three primaries sharing two cores) and finds
the cluster's Redis CPU per decision well above one server's. This takes the three suspects
apart on one redis-server process each, with no nginx and no other Redis competing:

  * batch size: at the same load a node gets a third of the decisions of an event-loop
    iteration, so its calls carry a third as many, and each call's fixed cost (reading the
    call, the script's set-up, TIME, the reply) is shared by fewer decisions;
  * the node batch's form (lua/decide.lua): keys after the first decision's are undeclared,
    passed as arguments, each probed by its first access (an EXISTS before it until issue 31);
  * cluster mode itself: a cluster-enabled redis-server serving every slot, where Redis checks
    each key a script touches against the slots it serves.

Variants: a plain server with declared keys (batches of 1, 3 and 12: 12 is about what one
server's calls carry in bench/topology.md, 3 what each node's carry), a plain server with the
node batch's form (3, 12), and the one-node cluster with it (1, 3, 12). Every decision is a
sliding_log admission with clock=redis (limit 100 per 60 s, keys at random among 10,000), as
in the topology benchmark. Each run: FLUSHALL, a warm-up, CONFIG RESETSTAT, then the measured
decisions, redis-benchmark on one connection 32 calls deep; Redis CPU is the used_cpu_user +
used_cpu_sys delta per decision. Variants run in a new random order each round.

Then, per variant, user-space instructions per decision of a fresh redis-server under
valgrind's callgrind (repeatable on a noisy machine; system calls not counted).

Writes bench/cluster-cost.md and prints it. Python 3 standard library, plus redis-server,
redis-benchmark, valgrind and callgrind_control on the PATH; every server on free loopback
ports, stopped at exit.

Usage: bench/cluster-cost.py [--rounds 5] [--decisions 60000] [--out bench/cluster-cost.md]
       [--root DIR [--declared-only]]   (the script of another checkout, e.g. `git worktree add
       DIR <commit>`; --declared-only for one from before node batches)
"""

import argparse
import os
import random
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import callgrind as C  # noqa: E402
import memory as M  # noqa: E402

KEYS, LIMIT, WINDOW, WARMUP = 10_000, 100, 60_000, 20_000
DEPTH = C.DEPTH
# (server, batch, node form)
VARIANTS = [("plain", 1, False), ("plain", 3, False), ("plain", 12, False),
            ("plain", 3, True), ("plain", 12, True),
            ("cluster", 1, False), ("cluster", 3, True), ("cluster", 12, True)]


def call(sha, batch, node_form):
    """One EVALSHA as src/codec/call.rs writes it: a plain batch declares every key; a node batch
    declares the first decision's and passes the others as "k<m>" and the keys."""
    keys = ["rl:c%d:__rand_int__" % i for i in range(batch)]
    argv = []
    for _ in keys:
        argv += ["", "l", str(LIMIT), str(WINDOW), "1", "0"]
    if node_form:
        return ["EVALSHA", sha, "1", keys[0], "k%d" % (batch - 1)] + keys[1:] + argv
    return ["EVALSHA", sha, str(batch)] + keys + argv


def cpu(c):
    i = c.info("cpu")
    return float(i["used_cpu_user"]) + float(i["used_cpu_sys"])


def run(script, server, cluster, batch, node_form, decisions):
    c = server.client
    if cluster:
        C.cluster_ok(c)
    sha = c.cmd("SCRIPT", "LOAD", script)
    c.cmd("FLUSHALL")
    cmd = call(sha, batch, node_form)

    def bench(calls):
        r = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(server.port), "-c",
                            "1", "-P", str(DEPTH), "-r", str(KEYS), "-n", str(calls), "-q"] + cmd,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise SystemExit("batch %d: redis-benchmark failed: %s%s" % (
                batch, r.stderr.strip()[-300:], "\n" + c.cmd("CLUSTER", "INFO") if cluster else ""))

    bench(WARMUP // batch)
    c.cmd("CONFIG", "RESETSTAT")
    t0 = cpu(c)
    bench(decisions // batch)
    used = cpu(c) - t0
    st = dict(f.split("=", 1) for f in c.info("commandstats")["cmdstat_evalsha"].split(","))
    # A NOTLOCAL or any other error would be a decision not taken: the figure would lie.
    if st.get("failed_calls", "0") != "0":
        raise SystemExit("%s batch %d: %s EVALSHA calls failed" % (server, batch, st["failed_calls"]))
    probe = M.Client(server.port)
    probe.sock.sendall(M.encode([a.replace("__rand_int__", "probe") for a in cmd]))
    r = probe.read()
    first = r if batch == 1 else r[0]
    if isinstance(r, M.RedisError) or isinstance(first, M.RedisError) or first[0] != 1:
        raise SystemExit("batch %d: unexpected reply %r" % (batch, r))
    return used * 1e6 / (int(st["calls"]) * batch)


def instructions(script, cluster, batch, node_form, decisions):
    """User-space instructions per decision of a fresh redis-server under callgrind
    (bench/callgrind.py)."""
    return C.instructions_per_call(script, lambda sha: call(sha, batch, node_form),
                                   decisions // batch, KEYS, cluster) / batch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--decisions", type=int, default=60_000)
    ap.add_argument("--out", default=os.path.join(M.ROOT, "bench", "cluster-cost.md"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--instruction-decisions", type=int, default=6_000,
                    help="decisions per variant under callgrind (0: no instruction counts)")
    ap.add_argument("--root", default=M.ROOT,
                    help="the checkout whose lua/ script is measured (an older commit's worktree,"
                    " to compare scripts; the report names its commit)")
    ap.add_argument("--declared-only", action="store_true",
                    help="only the variants whose keys are all declared: for a script from before"
                    " node batches (commit 366ce51), which refuses their form")
    a = ap.parse_args()
    script = M.script_text(a.root)
    variants = [v for v in VARIANTS if not (a.declared_only and v[2])]
    M.install_signal_cleanup()
    servers = {"plain": M.RedisServer()}
    # nodes.conf is relative to the server's own --dir; the bus gets a free port of its own
    # (the default, port + 10000, may be past 65535 or taken).
    servers["cluster"] = M.RedisServer(extra=("--cluster-enabled", "yes",
                                              "--cluster-config-file", "nodes.conf",
                                              "--cluster-port", str(M.free_port())))
    servers["cluster"].client.cmd("CLUSTER", "ADDSLOTSRANGE", "0", "16383")
    version = servers["plain"].client.info("server")["redis_version"]
    rng = random.Random(a.seed)
    results = {v: [] for v in variants}
    for rnd in range(a.rounds):
        order = list(variants)
        rng.shuffle(order)
        for v in order:
            us = run(script, servers[v[0]], v[0] == "cluster", v[1], v[2], a.decisions)
            results[v].append(us)
            print("round %d %-7s batch %2d %-9s %6.2f us/decision" % (
                rnd + 1, v[0], v[1], "node form" if v[2] else "declared", us), file=sys.stderr)
    for s in servers.values():
        s.stop()

    med = {v: statistics.median(rs) for v, rs in results.items()}
    instr = {}
    if a.instruction_decisions:
        for v in variants:
            instr[v] = instructions(script, v[0] == "cluster", v[1], v[2],
                                   a.instruction_decisions)
            print("callgrind %-7s batch %2d %-9s %8.0f instructions/decision" % (
                v[0], v[1], "node form" if v[2] else "declared", instr[v]), file=sys.stderr)
    # Fixed cost per call F and cost per decision D from one server's batches of 1 and 12:
    # cost(b) = F / b + D.
    f = (med[("plain", 1, False)] - med[("plain", 12, False)]) / (1 - 1 / 12)
    d = med[("plain", 12, False)] - f / 12
    base = med[("plain", 12, False)]
    lines = [
        "# Redis cost per decision: one server against a Cluster node",
        "",
        "`bench/cluster-cost.py` (%s; Redis %s; %d rounds of %d decisions per variant,"
        " interleaved; redis-benchmark, 1 connection, %d calls deep; %d keys at random; limit %d"
        " per %d s, sliding_log, clock=redis, every decision admitted). One redis-server per"
        " server kind, nothing else competing: what the script costs, not what three processes"
        " sharing two cores cost." % (M.git_rev(a.root), version, a.rounds, a.decisions, DEPTH, KEYS,
                                      LIMIT, WINDOW // 1000),
        "",
        "| server | decisions per call | keys | Redis CPU µs per decision (median) | min–max |"
        " vs one server, batches of 12 | user-space instructions per decision (callgrind) |"
        " vs one server, batches of 12 |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    ibase = instr.get(("plain", 12, False))
    for v in variants:
        rs = results[v]
        lines.append("| %s | %d | %s | **%.2f** | %.2f–%.2f | %.2f× | %s | %s |" % (
            "one server" if v[0] == "plain" else "cluster-enabled, one node, every slot",
            v[1], "first decision's declared, others probed" if v[2] else "all declared",
            med[v], min(rs), max(rs), med[v] / base,
            "{:,.0f}".format(instr[v]) if v in instr else "–",
            "%.2f×" % (instr[v] / ibase) if v in instr else "–"))
    lines += [
        "",
        "From one server's batches of 1 and 12 (cost = F / batch + D): a call's fixed cost F ="
        " **%.1f µs** (reading it, the script's set-up, `TIME`, the reply), a decision's own"
        " cost D = **%.1f µs**." % (f, d),
        "",
        "Reading it against bench/topology.md: at the same load one server's calls carry about"
        " 12 decisions and each node's about 3, a third of an event-loop iteration's decisions"
        " each. The cluster's extra Redis CPU per decision is then mostly F paid four times as"
        " often, which no form of batch removes without holding decisions back for longer than"
        " an iteration; the probes and cluster mode add the rest (the node-form and cluster rows"
        " against one server's at the same batch size).",
        "",
        "Instructions: one run per variant of %d decisions on a fresh redis-server under"
        " `valgrind --tool=callgrind`, counted after a warm-up; repeatable whatever the machine"
        " does, but blind to the kernel: the read, write and event-loop system calls of each call"
        " are in the CPU columns only, which is why the CPU ratios of small batches exceed the"
        " instruction ratios." % a.instruction_decisions if instr else
        "Instructions: not counted (--instruction-decisions 0).",
    ]
    C.write_report(a.out, lines)


if __name__ == "__main__":
    main()
