#!/usr/bin/env python3
"""Markdown report of bench/topology.sh: plain vs cluster vs TLS, ratios measured side by side.

Usage: topology_report.py RAW.tsv META.tsv OUT.md   (standard library only)

RAW.tsv has one row per measured run (see topology.sh), META.tsv key<TAB>value lines.
nginx CPU is divided by the requests nginx counted (stub_status); Redis CPU and script calls by
the decisions the module counted as PASSED (ratelimit_metrics). A ratio to plain is taken
within each round (runs seconds apart) and the report gives the median of those ratios with
their range: on a shared machine the ratio moves much less than either figure.
"""

import csv
import statistics
import sys

from report_meta import read_meta

ORDER = ["plain", "cluster", "cluster1", "plain3", "tls"]
LABEL = {
    "plain": "plain: 1 server, TCP",
    "cluster": "cluster: 3 primaries",
    "cluster1": "cluster1: 1 primary, every slot",
    "plain3": "plain3: 3 servers, ids split",
    "tls": "tls: 1 server, TLS",
}


def load(raw_path, meta_path):
    with open(raw_path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    for r in rows:
        for k, v in list(r.items()):
            if k not in ("variant", "script_calls_by_node"):
                r[k] = float(v) if v not in ("", None) else 0.0
        n = r["nginx_requests"] if r["nginx_requests"] > 0 else r["requests"]
        d = r["decisions"] if r["decisions"] > 0 else n
        r["cpu_us"] = r["worker_cpu_s"] * 1e6 / n if n else 0.0
        r["redis_us"] = r["redis_cpu_s"] * 1e6 / d if d else 0.0
        r["calls"] = r["script_calls"] / d if d else 0.0
        # Reports from before the column: no figure rather than 0 %.
        if "redis_sys_s" in r and r["redis_cpu_s"]:
            r["redis_sys_pct"] = 100.0 * r["redis_sys_s"] / r["redis_cpu_s"]
        r["p99_ms"] = r["p99_us"] / 1000.0
    return rows, read_meta(meta_path)


def fmt(x, digits):
    if digits == 0:
        return "{:,.0f}".format(x)
    return "{:.{}f}".format(x, digits)


def cell(vals, digits):
    m = statistics.median(vals)
    if len(vals) == 1:
        return fmt(m, digits)
    return "%s (%s–%s)" % (fmt(m, digits), fmt(min(vals), digits), fmt(max(vals), digits))


METRICS = [  # field, header, digits
    ("rps", "requests/s", 0),
    ("p99_ms", "p99 ms", 2),
    ("cpu_us", "nginx CPU µs/req", 1),
    ("redis_us", "Redis CPU µs/decision (all nodes)", 1),
    ("calls", "script calls/decision", 3),
    ("redis_sys_pct", "Redis CPU in the kernel %", 0),
]
RATIOS = [("rps", "req/s"), ("p99_ms", "p99"), ("cpu_us", "nginx CPU"), ("redis_us", "Redis CPU")]


def main():
    raw, meta_path, out = sys.argv[1:4]
    rows, meta = load(raw, meta_path)
    by = {}
    for r in rows:
        by.setdefault(int(r["workers"]), {}).setdefault(r["variant"], {})[int(r["round"])] = r
    skipped = {k[len("skipped_"):]: v for k, v in meta.items() if k.startswith("skipped_")}
    variants = {r["variant"] for r in rows}

    o = []
    o.append("# ngx_http_ratelimit: Redis topologies, plain vs Cluster vs TLS\n")
    o.append(
        "Run %s on `%s`, %s CPUs (%s); %s; %s; Redis %s; wrk %s. Repository commit %s; "
        "module `%s` built from commit %s (sha256 %s…).\n"
        % (meta.get("date"), meta.get("arch"), meta.get("ncpu"), meta.get("cpu"), meta.get("nginx"),
           meta.get("openssl"), meta.get("redis"), meta.get("wrk"), meta.get("commit"),
           meta.get("module"), meta.get("module_commit"), meta.get("module_sha256")))
    o.append(
        "The module's allow path: `X-Consumer-Id` rotating over %s ids, limit %s per %s never "
        "reached (compare.sh's *allow*). `wrk -t%s -c%s -d%ss --latency`, %s round(s); in every "
        "round each variant once, order rotated by one per round; before every run `FLUSHALL` "
        "on every node and a %s s warm-up with the same load (pools open, TLS handshakes done). "
        "Each variant has its own nginx (same binary, module and configuration apart from "
        "`ratelimit_redis`, `ratelimit_fail closed` so a decision Redis did not make is a 503). "
        "Variants:\n"
        % (meta.get("ids"), meta.get("limit"), meta.get("window"), meta.get("threads"),
           meta.get("conns"), meta.get("duration"), meta.get("rounds"), meta.get("warmup")))
    o.append("- **plain**: one redis-server over TCP, `ratelimit_redis 127.0.0.1:P;`")
    o.append("- **cluster**: %s primaries, no replicas (`redis-cli --cluster create ... "
             "--cluster-replicas 0`), `ratelimit_redis 127.0.0.1:P1 ... cluster=on;` (seeds: all "
             "nodes)" % meta.get("cluster_nodes", "3"))
    if "cluster1" in variants:
        o.append("- **cluster1**: one cluster-enabled primary holding all 16384 slots (`CLUSTER "
                 "ADDSLOTSRANGE 0 16383`), `ratelimit_redis 127.0.0.1:P cluster=on;`: Cluster "
                 "mode and the module's Cluster path with every key on one process, as in plain")
    if "plain3" in variants:
        o.append("- **plain3**: three redis-servers over TCP without Cluster mode, each id on one of "
                 "them (`split_clients` over the id, a zone per server with `redis=`, the other "
                 "two zones' keys empty): the spread over three processes alone")
    o.append("- **tls**: one redis-server with `--port 0 --tls-port P` (RSA 2048 certificate from "
             "a throw-away CA), `ratelimit_redis 127.0.0.1:P ssl=on "
             "ssl_trusted_certificate=ca.crt ssl_name=redis.test;`\n")
    o.append(
        "wrk, nginx and every Redis share the CPUs, nothing pinned or tuned: **ratios to plain "
        "within a round are the result**, absolute figures move with the machine. Load average "
        "(1, 5, 15 min) at start %s, at end %s (wrk, nginx and Redis themselves load the machine "
        "during the run; the *other CPU* column of the runs below is what everything else took). "
        "Total run time %s s.\n"
        % (meta.get("load_start"), meta.get("load_end"), meta.get("elapsed_s")))
    o.append(
        "nginx CPU: user + system of the variant's workers (`/proc/<pid>/stat`) per request nginx "
        "counted. Redis CPU: `used_cpu_user + used_cpu_sys` of `INFO cpu`, summed over the "
        "variant's nodes (a cluster's idle gossip included), per decision the module counted "
        "(`ratelimit_metrics`, `PASSED`). Script calls: `EVALSHA` + `EVAL` calls in `INFO "
        "commandstats`, summed over the nodes, per decision: below 1 is batching (the decisions "
        "of one event-loop iteration on one connection go as one call; with Cluster, one call per "
        "slot).\n")

    for w in sorted(by):
        vs = by[w]
        names = [v for v in ORDER if v in vs] + sorted(v for v in vs if v not in ORDER)
        o.append("## %d worker%s\n" % (w, "" if w == 1 else "s"))
        o.append("Medians of the rounds, min–max in brackets.\n")
        hdr = ["variant"] + [h for _, h, _ in METRICS]
        o.append("| " + " | ".join(hdr) + " |")
        o.append("|---|" + "---:|" * len(METRICS))
        for v in names:
            rs = list(vs[v].values())
            o.append("| %s | %s |" % (LABEL.get(v, v),
                                      " | ".join(cell([r[f] for r in rs], d) if all(f in r for r in rs) else "–"
                                                 for f, _, d in METRICS)))
        for v, why in sorted(skipped.items()):
            if v not in vs:
                o.append("| %s | %s |" % (LABEL.get(v, v), why.replace("|", "\\|")) + " |" * (len(METRICS) - 1))
        o.append("")
        if "plain" in vs and len(names) > 1:
            o.append("Ratios to plain, taken within each round (median, min–max):\n")
            o.append("| variant | " + " | ".join(h for _, h in RATIOS) + " | Redis CPU µs/decision − plain | nginx CPU µs/req − plain |")
            o.append("|---|" + "---:|" * (len(RATIOS) + 2))
            for v in names:
                if v == "plain":
                    continue
                rounds = sorted(set(vs[v]) & set(vs["plain"]))
                cells = []
                for f, _ in RATIOS:
                    rat = [vs[v][k][f] / vs["plain"][k][f] for k in rounds if vs["plain"][k][f]]
                    cells.append(cell(rat, 2) if rat else "–")
                for f in ("redis_us", "cpu_us"):
                    diff = [vs[v][k][f] - vs["plain"][k][f] for k in rounds]
                    cells.append(("%+.1f" % statistics.median(diff)) if diff else "–")
                o.append("| %s | %s |" % (LABEL.get(v, v), " | ".join(cells)))
            o.append("")

    idle = {k[len("idle_redis_cpu_ms_per_s_"):]: float(v) for k, v in meta.items()
            if k.startswith("idle_redis_cpu_ms_per_s_") and v}
    if idle:
        parts = []
        for v in [v for v in ORDER if v in idle] + sorted(v for v in idle if v not in ORDER):
            rps = [r["decisions"] / (r["duration_us"] / 1e6) for r in rows
                   if r["variant"] == v and r["duration_us"]]
            at = ""
            if rps:
                at = " (%.2f µs per decision at the median %s decisions/s)" % (
                    idle[v] * 1000 / statistics.median(rps), fmt(statistics.median(rps), 0))
            parts.append("%s %.2f ms/s%s" % (v, idle[v], at))
        o.append("Redis CPU with no traffic, before nginx started (%s s; cron, and for the cluster "
                 "its bus), part of the Redis figures above: %s.\n"
                 % (meta.get("idle_seconds", "?"), "; ".join(parts)))

    o.append("## Every run\n")
    o.append("| workers | round | variant | requests/s | p99 ms | nginx CPU µs/req | Redis CPU µs/dec | "
             "script calls/dec | script calls by node | Redis connections open | non-2xx | other decisions | "
             "Redis connects | error lines | other CPU % |")
    o.append("|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        o.append("| %d | %d | %s | %s | %.2f | %.1f | %.1f | %.3f | %s | %s | %d | %d | %d | %d | %.1f |" % (
            r["workers"], r["round"], r["variant"], fmt(r["rps"], 0), r["p99_ms"], r["cpu_us"],
            r["redis_us"], r["calls"], r["script_calls_by_node"].replace(",", ", "),
            "%d" % r["connections"] if "connections" in r else "?", r["non2xx"],
            r["other_decisions"], r["connects"], r["error_lines"], r["other_cpu_pct"]))
    o.append("")
    o.append("*Other decisions*: decisions the module counted with a status other than `PASSED` "
             "(0 expected: the limit is never reached, and a failure would be `FAILED_CLOSED`). "
             "*Redis connects*: connections the workers opened during the measured seconds (0 "
             "expected: the pools are open after the warm-up, so no handshake is measured); "
             "*connections open*: at the end of the run, all workers and nodes (a worker opens "
             "another, up to `pool_size` per node, when each open one carries 16 decisions in "
             "flight; decisions spread over more connections make smaller batches). "
             "*Other CPU*: the share of the machine's CPU that processes other than this "
             "benchmark's (wrk, nginx, Redis) took during the run.")
    with open(out, "w") as f:
        f.write("\n".join(o) + "\n")


if __name__ == "__main__":
    main()
