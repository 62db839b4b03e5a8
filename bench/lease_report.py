#!/usr/bin/env python3
"""Markdown report of bench/lease.sh: no limiter vs exact vs lease=auto, and the issue's targets.

Usage: lease_report.py RAW.tsv META.tsv OUT.md   (standard library only)

RAW.tsv has one row per measured run (see lease.sh), META.tsv key<TAB>value lines. Per request
means per request wrk completed (and the paced client's, in the paced runs); per admitted request, per decision the zone
counted as PASSED or PASSED_LEASE (ratelimit_metrics). Ratios between contenders are taken
within each round (runs seconds apart, same load on the machine) and the report gives the median
of those ratios with their range. Targets are judged on the medians, and the report says whether
every round met them too. Nothing here changes a measurement to meet a target.
"""

import csv
import statistics
import sys

from report_meta import read_meta

CONTENDERS = ["a", "b", "c"]
LABEL = {"a": "A no limiter", "b": "B exact", "c": "C lease=auto"}
WORKLOADS = ["busy", "zipf", "uniform"]
TEXT_FIELDS = ("workload", "contender", "redis_commands")


def load(raw_path):
    with open(raw_path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    for r in rows:
        for k, v in list(r.items()):
            if k not in TEXT_FIELDS:
                r[k] = float(v) if v not in ("", None) else 0.0
        n = r["requests"]
        adm = r["passed"] + r["passed_lease"]
        r["n"] = n
        r["admitted"] = adm
        r["cpu_us"] = r["worker_cpu_s"] * 1e6 / n if n else 0.0
        r["redis_us"] = r["redis_cpu_s"] * 1e6 / n if n else 0.0
        r["calls"] = r["script_calls"] / n if n else 0.0
        r["calls_adm"] = r["script_calls"] / adm if adm else float("nan")
        r["local"] = r["passed_lease"] / adm if adm else float("nan")
        r["p99_ms"] = r["p99_us"] / 1000.0
    return rows


def fmt(x, digits):
    if x != x:  # nan
        return "–"
    if digits == 0:
        return "{:,.0f}".format(x)
    return "{:.{}f}".format(x, digits)


def cell(vals, digits, pct=False):
    vals = [v for v in vals if v == v]
    if not vals:
        return "–"
    k = 100.0 if pct else 1.0
    m = statistics.median(vals) * k
    if len(vals) == 1:
        return fmt(m, digits) + ("%" if pct else "")
    return "%s (%s–%s)%s" % (fmt(m, digits), fmt(min(vals) * k, digits), fmt(max(vals) * k, digits),
                             "%" if pct else "")


def per_round(by, wl, f, g):
    """[g(row_of_contender_x, ...)] per round where every needed contender ran."""
    out = []
    rounds = set.intersection(*(set(by.get(wl, {}).get(c, {})) for c in CONTENDERS)) \
        if wl in by else set()
    for k in sorted(rounds):
        v = g({c: by[wl][c][k] for c in CONTENDERS}, f)
        if v is not None:
            out.append(v)
    return out


def ratio(x, y):
    return lambda rs, f: (rs[x][f] / rs[y][f]) if rs[y][f] else None


def diff(x, y):
    return lambda rs, f: rs[x][f] - rs[y][f]


def main():
    raw, meta_path, out = sys.argv[1:4]
    rows = load(raw)
    meta = read_meta(meta_path)
    by = {}
    for r in rows:
        by.setdefault(r["workload"], {}).setdefault(r["contender"], {})[int(r["round"])] = r

    o = []
    o.append("# ngx_http_ratelimit: reservations (`lease=auto`) against exact decisions\n")
    o.append(
        "Run %s on `%s`, %s CPUs (%s); %s; Redis %s; wrk %s. Repository commit %s; module `%s` "
        "built from commit %s (sha256 %s…).\n"
        % (meta.get("date"), meta.get("arch"), meta.get("ncpu"), meta.get("cpu"), meta.get("nginx"),
           meta.get("redis"), meta.get("wrk"), meta.get("commit"), meta.get("module"),
           meta.get("module_commit"), meta.get("module_sha256")))
    o.append(
        "One nginx, %s worker, one Redis over TCP, each contender a location serving the same "
        "%s-byte file: **A** no limiter; **B** `algorithm=%s limit=%s window=%s` (exact: every "
        "decision made by the script); **C** the same zone with `lease=auto` (default "
        "`lease_time`). B and C are separate zones (separate Redis keys) with "
        "`ratelimit_fail closed`, so a decision Redis did not make would be a 503, not a fast "
        "pass. Limits are never reached in the three workloads:\n"
        % (meta.get("workers"), meta.get("page_bytes"), meta.get("algorithm"), meta.get("limit"),
           meta.get("window")))
    o.append("- **busy**: %s ids in turn (a few busy consumers)" % meta.get("busy_keys"))
    o.append("- **zipf**: Zipf s=%s over %s ids, drawn in wrk from a precomputed CDF by binary "
             "search, seed %s + thread number (the same id sequence for every contender)"
             % (meta.get("zipf_s"), meta.get("zipf_ids"), meta.get("zipf_seed")))
    o.append("- **uniform**: rotating over %s ids (compare.sh's *allow*)\n" % meta.get("uniform_ids"))
    o.append(
        "`wrk -t%s -c%s -d%ss --latency`, %s round(s); in every round each workload runs A, B "
        "and C, the order rotated by one per round; before every run `FLUSHALL` and a %s s "
        "warm-up with the same load (pools open, C's worker has seen each key's demand). One "
        "nginx serves the whole run, workloads in the order above, then the paced test: what C's "
        "worker keeps between requests (its reservation table) carries over from one workload "
        "to the next, as a long-running worker's would.\n"
        % (meta.get("threads"), meta.get("conns"), meta.get("duration"), meta.get("rounds"),
           meta.get("warmup")))
    # What the runs measured, not what the machine was assumed to be doing.
    other = [float(r["other_cpu_pct"]) for r in rows]
    o.append(
        "**Machine load.** wrk, nginx and Redis share the 2 CPUs, nothing pinned; processes other "
        "than this benchmark took %s %% of the CPUs during the runs (the *other CPU* column "
        "below, per run). `uptime` at start: `%s`; at end: `%s`. **Ratios within a round are the "
        "result**; absolute figures move with the machine. Total run time %s s.\n"
        % ("%.1f–%.1f" % (min(other), max(other)) if other else "(not measured)",
           meta.get("uptime_start"), meta.get("uptime_end"), meta.get("elapsed_s")))
    o.append(
        "Per request: per request wrk completed (the vendored nginx has no `stub_status`; at most "
        "the connections' count more were in flight when wrk stopped). nginx CPU: user + system of the "
        "worker (`/proc/<pid>/stat`, 10 ms ticks). Redis CPU: `used_cpu_user + used_cpu_sys` "
        "(`INFO cpu`). Script calls: `EVALSHA` + `EVAL` (`INFO commandstats`; reservations, "
        "exact decisions and give-backs alike; below 1 per request in B is the module's batching: "
        "the decisions of one event-loop iteration go as one call). Admitted: the zone's "
        "`PASSED` + `PASSED_LEASE` decisions (`ratelimit_metrics`); *local*: the share of them "
        "admitted from a reservation without Redis (`PASSED_LEASE`).\n")

    metrics = [
        ("rps", "requests/s", 0, False),
        ("p99_ms", "p99 ms", 2, False),
        ("calls", "script calls/req", 4, False),
        ("calls_adm", "script calls/admitted", 4, False),
        ("redis_us", "Redis CPU µs/req", 2, False),
        ("cpu_us", "nginx CPU µs/req", 1, False),
        ("local", "admitted locally", 2, True),
    ]
    for wl in [w for w in WORKLOADS if w in by] + sorted(w for w in by if w not in WORKLOADS + ["paced"]):
        vs = by[wl]
        o.append("## %s\n" % wl)
        o.append("Medians of the rounds, min–max in brackets.\n")
        o.append("| contender | " + " | ".join(h for _, h, _, _ in metrics) + " | ×A req/s | nginx CPU − A µs/req |")
        o.append("|---|" + "---:|" * (len(metrics) + 2))
        for c in CONTENDERS:
            if c not in vs:
                continue
            rs = list(vs[c].values())
            cells = []
            for f, _, d, pct in metrics:
                if c == "a" and f in ("calls", "calls_adm", "local"):
                    cells.append("–")
                else:
                    cells.append(cell([r[f] for r in rs], d, pct))
            if c == "a":
                cells += ["1", "0"]
            else:
                cells.append(cell(per_round(by, wl, "rps", ratio(c, "a")), 2))
                dd = per_round(by, wl, "cpu_us", diff(c, "a"))
                cells.append(("%+.1f" % statistics.median(dd)) if dd else "–")
            o.append("| %s | %s |" % (LABEL[c], " | ".join(cells)))
        o.append("")
        if "b" in vs and "c" in vs:
            rr = per_round(by, wl, "redis_us", ratio("c", "b"))
            cr = per_round(by, wl, "calls", ratio("c", "b"))
            sp = per_round(by, wl, "rps", ratio("c", "b"))
            o.append("C against B within each round: Redis CPU per request ×%s, script calls per "
                     "request ×%s, requests/s ×%s.\n" % (cell(rr, 2), cell(cr, 2), cell(sp, 2)))

    bad = [r for r in rows if r["workload"] != "paced" and (r["non2xx"] or r["other_decisions"] or r["error_lines"])]
    if bad:
        o.append("**Runs with failed decisions** (non-2xx answers, decisions other than admitted, "
                 "or error lines, where the limit is never reached: Redis answering later than the "
                 "200 ms `timeout` on a loaded machine, so `ratelimit_fail closed` answered 503; "
                 "these runs' figures include the fast 503s): %s.\n"
                 % "; ".join("%s round %d %s: %d non-2xx, %d error lines" % (
                     r["workload"], r["round"], LABEL.get(r["contender"], r["contender"]),
                     r["non2xx"], r["error_lines"]) for r in bad))

    idle_c = [r for r in rows if r["contender"] == "c" and r["lease_reserved"] == 0]
    if idle_c:
        o.append("**C reserved no unit at all** in %s: every decision of C there was an exact "
                 "one (its worker asked for no reservation, or Redis granted none), so these rows "
                 "measure exact decisions under `lease=auto`, not reservations.\n"
                 % ", ".join("%s round %d" % (r["workload"], r["round"]) for r in idle_c))

    # --- targets ---
    o.append("## The issue's targets (1 worker)\n")
    o.append("| target | measured (median, min–max of rounds) | met? |")
    o.append("|---|---|---|")

    def verdict(vals, ok):
        vals = [v for v in vals if v == v]
        if not vals:
            return "not measured"
        med = statistics.median(vals)
        alln = sum(1 for v in vals if ok(v))
        if ok(med):
            return ("**met**" if alln == len(vals) else "**met** on the median (%d of %d rounds)" % (alln, len(vals)))
        return "**missed**" + ("" if alln == 0 else " on the median (%d of %d rounds met it)" % (alln, len(vals)))

    if "busy" in by and "c" in by["busy"]:
        v = [r["calls_adm"] for r in by["busy"]["c"].values()]
        o.append("| busy keys: script calls per admitted request ≤ 0.1 | %s | %s |"
                 % (cell(v, 4), verdict(v, lambda x: x <= 0.1)))
        v = per_round(by, "busy", "rps", ratio("c", "a"))
        o.append("| busy keys: allow path ≥ 0.85× no limiter (requests/s C / A) | %s | %s |"
                 % (cell(v, 2), verdict(v, lambda x: x >= 0.85)))
    if "zipf" in by:
        v = per_round(by, "zipf", "redis_us", ratio("c", "b"))
        o.append("| Zipf: Redis CPU per request ≤ 0.4× exact mode's (C / B) | %s | %s |"
                 % (cell(v, 2), verdict(v, lambda x: x <= 0.4)))
    if "busy" in by and "c" in by["busy"]:
        v = per_round(by, "busy", "cpu_us", diff("c", "a"))
        loc = [r["local"] for r in by["busy"]["c"].values()]
        o.append("| nginx CPU per locally admitted request ≤ no limiter + 1 µs (busy, where C "
                 "admits %s locally: C − A µs/req) | %s | %s |"
                 % (cell(loc, 2, True), cell(v, 1), verdict(v, lambda x: x <= 1.0)))
    paced = by.get("paced", {})
    for c in ("b", "c"):
        if c in paced:
            v = [r["paced_ok"] / r["paced_sent"] for r in paced[c].values() if r["paced_sent"]]
            o.append("| paced key at half its limit admitted ≥ 99 %% (%s) | %s | %s |"
                     % (LABEL[c], cell(v, 1, True), verdict(v, lambda x: x >= 0.99)))
    o.append("")
    o.append("For reference, the issue's exact-mode figures (measured before leases, 1 worker, "
             "Zipf 1.0 over 100,000 ids): 0.64× the requests/s of no limiter, 8.6 µs of Redis "
             "CPU and 0.18 script calls per request; compare them with B's zipf row above.\n")

    # --- paced ---
    if paced:
        o.append("## Under-admission of a paced key\n")
        o.append(
            "Zones with `limit=%s window=%s` (B: exact, C: `lease=auto`), same algorithm. wrk "
            "(same threads and connections) hammers %s ids far over their limit for %s s; a "
            "second after it starts, a paced client (perl HTTP::Tiny, one keep-alive "
            "connection, requests on a fixed schedule) sends %s requests/s of its own id for %s "
            "s: half its limit, so every one should be admitted. nginx is restarted for this "
            "test, so that the paced key can enter the reservation table of C's worker (the "
            "workloads above leave it with up to 10,000 keys, and a key that cannot be added is "
            "decided exactly). *Paced from reservations*: the paced requests whose "
            "`$ratelimit_status` (an `X-RL-Status` header on these locations) was `PASSED_LEASE`. "
            "Before the runs, the sanity "
            "check sent %s requests of one id in a row to C's zone: %s admitted (B: exactly the "
            "limit).\n"
            % (meta.get("paced_limit"), meta.get("paced_window"), meta.get("busy_keys"),
               int(float(meta.get("paced_seconds", "0"))) + 2, meta.get("paced_rate"),
               meta.get("paced_seconds"), int(meta.get("paced_limit", "0")) + 1,
               meta.get("sanity_pc_admitted", "?").split(" ")[0]))
        o.append("| contender | round | paced sent | admitted | rejected | other | admitted % | "
                 "paced from reservations | latest start ms | hammer req/s | hammer admitted | "
                 "zone admitted locally | script calls/req |")
        o.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for c in ("b", "c"):
            for k in sorted(paced.get(c, {})):
                r = paced[c][k]
                ham = r["admitted"] - r["paced_ok"]
                o.append("| %s | %d | %d | %d | %d | %d | %s | %d | %d | %s | %d | %s | %s |" % (
                    LABEL[c], k, r["paced_sent"], r["paced_ok"], r["paced_rejected"], r["paced_other"],
                    fmt(100.0 * r["paced_ok"] / r["paced_sent"], 1) if r["paced_sent"] else "–",
                    r.get("paced_local", 0),
                    r["paced_late_ms"], fmt(r["rps"], 0), ham, fmt(100 * r["local"], 1) + "%",
                    fmt(r["calls"], 4)))
        o.append("")
        o.append("*Hammer admitted*: the zone's admissions during the run less the paced ones, over "
                 "%s ids; *latest start*: how late the paced client started its most delayed "
                 "request against its schedule (a loaded machine delays it)."
                 % meta.get("busy_keys"))
        o.append("")

    # --- every run ---
    o.append("## Every run\n")
    o.append("| workload | round | contender | requests/s | p99 ms | non-2xx | nginx CPU µs/req | "
             "Redis CPU µs/req | script calls | admitted | PASSED_LEASE | other decisions | "
             "units reserved | units returned | Redis commands | error lines | other CPU % |")
    o.append("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for r in rows:
        o.append("| %s | %d | %s | %s | %.2f | %d | %.1f | %.2f | %d | %d | %d | %d | %d | %d | %s | %d | %.1f |" % (
            r["workload"], r["round"], LABEL.get(r["contender"], r["contender"]), fmt(r["rps"], 0),
            r["p99_ms"], r["non2xx"], r["cpu_us"], r["redis_us"], r["script_calls"], r["admitted"],
            r["passed_lease"], r["other_decisions"], r["lease_reserved"], r["lease_returned"],
            r["redis_commands"].replace(",", ", "), r["error_lines"], r["other_cpu_pct"]))
    o.append("")
    o.append("*Other decisions*: statuses other than `PASSED` and `PASSED_LEASE` (0 expected where "
             "the limit is never reached; `REJECTED` in the paced runs). *Redis commands*: every "
             "command Redis ran during the run but `INFO` (client tracking's own included).")
    with open(out, "w") as f:
        f.write("\n".join(o) + "\n")


if __name__ == "__main__":
    main()
