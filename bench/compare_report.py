#!/usr/bin/env python3
"""Markdown report of bench/compare.sh: medians, ranges and the issue's targets.

Usage: compare_report.py RAW.tsv META.tsv OUT.md [BEFORE.tsv]   (standard library only)

BEFORE.tsv: the raw rows of an earlier run, whose module p99 the targets compare against.

RAW.tsv has one row per measured run (see compare.sh); META.tsv is key<TAB>value lines.
Per-request costs are divided by the requests nginx counted during the run (stub_status), not
by wrk's count, which misses the requests still in flight when wrk stops.
"""

import csv
import statistics
import sys

from report_meta import read_meta

CONTENDERS = [("nolimit", "A no limiter"), ("lua", "B article Lua"), ("module", "C this module")]
SCEN_ORDER = ["allow", "deny", "mix", "keys100k"]


def load(raw_path, meta_path):
    with open(raw_path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    for r in rows:
        for k, v in r.items():
            if k not in ("scenario", "contender", "redis_commands"):
                r[k] = float(v) if v not in ("", None) else 0.0
        r.setdefault("other_cpu_pct", 0.0)
        n = r["nginx_requests"] if r["nginx_requests"] > 0 else r["requests"]
        r["n"] = n
        r["cpu_us"] = r["worker_cpu_s"] * 1e6 / n if n else 0.0
        r["redis_us"] = r["redis_cpu_s"] * 1e6 / n if n else 0.0
        r["calls_script"] = r["redis_calls_script"] / n if n else 0.0
        r["calls_total"] = r["redis_calls_total"] / n if n else 0.0
        r["non2xx_share"] = r["non2xx"] / r["requests"] if r["requests"] else 0.0
        cmds = {}
        for item in (r.get("redis_commands") or "-").split(","):
            name, _, calls = item.partition(":")
            if calls:
                cmds[name] = float(calls) / n if n else 0.0
        r["cmds"] = cmds
    return rows, read_meta(meta_path)


def groups(rows):
    """{(scenario, workers): {contender: [rows by round]}} in a stable order."""
    out = {}
    for r in rows:
        out.setdefault((r["scenario"], int(r["workers"])), {}).setdefault(r["contender"], []).append(r)
    key = lambda sw: (sw[1], SCEN_ORDER.index(sw[0]) if sw[0] in SCEN_ORDER else 99)
    return {k: out[k] for k in sorted(out, key=key)}


def med(rs, f):
    return statistics.median(r[f] for r in rs)


def rng(rs, f):
    v = [r[f] for r in rs]
    return min(v), max(v)


def per_round_ratio(a, b, f):
    """Ratios a/b of the same round (contenders of a round ran back to back)."""
    by = {r["round"]: r[f] for r in b}
    v = [r[f] / by[r["round"]] for r in a if by.get(r["round"])]
    return (min(v), max(v)) if v else (float("nan"), float("nan"))


def fmt_int(x):
    return f"{x:,.0f}"


def ms(us):
    return f"{us / 1000:.2f}"


def scen_title(s, w, meta):
    ids = int(meta.get("ids", "10000"))
    hot = meta.get("mix_hot_percent", "10")
    desc = {
        "allow": f"allow: {ids:,} rotating ids, limit never reached",
        "deny": "deny: one id far over its limit",
        "mix": f"mix: {100 - int(hot)} % rotating over {ids:,} ids, {hot} % one over-limit id",
        "keys100k": "keys100k: 100,000 rotating ids, limit never reached",
    }.get(s, s)
    return f"{desc}; {w} worker{'s' if w > 1 else ''}"


def main():
    raw_path, meta_path, out_path = sys.argv[1:4]
    baseline = sys.argv[4] if len(sys.argv) > 4 else None
    rows, meta = load(raw_path, meta_path)
    g = groups(rows)
    out = []
    w = out.append
    warnings = []

    w("# ngx_http_ratelimit compared: no limiter, the article's Lua limiter, this module\n")
    w(f"Run {meta['date']} on `{meta['arch']}`, {meta['ncpu']} CPUs ({meta['cpu']}); "
      f"nginx {meta['nginx'].replace('nginx/', '')} (Debian's /usr/sbin/nginx, the same binary and "
      f"configuration for every contender), {meta['lua_module']}; Redis {meta['redis']}; "
      f"wrk {meta['wrk']}. Repository commit {meta['commit']}; module built from commit "
      f"{meta['module_commit']} (sha256 {meta['module_sha256']}…).\n")
    w(f"`wrk -t{meta['threads']} -c{meta['conns']} -d{meta['duration']}s --latency`, "
      f"{meta['rounds']} round(s), contenders interleaved A B C in every round; before every run "
      f"`FLUSHALL` and a {meta['warmup']} s warm-up with the same load (the over-limit id of deny "
      f"and mix is over its limit before the measurement starts). Values are medians of the rounds, "
      f"min–max in brackets. Same static file ({meta['page_bytes']} bytes) in every location. "
      f"Both limiters: limit {meta['limit']} per {meta['window']} per `X-Consumer-Id` "
      f"(the article's hard-coded values). The article's block is run as written: `EVAL` of the "
      f"script text, nginx clock; the module as configured by default apart from "
      f"`ratelimit_log_level info` (the article logs nothing on a rejection): `EVALSHA`, Redis clock. "
      f"wrk, nginx and Redis share the {meta['ncpu']} CPUs, nothing pinned or tuned: ratios, not "
      f"absolute numbers, are the result. Total run time {int(float(meta['elapsed_s'])) // 60} min "
      f"{int(float(meta['elapsed_s'])) % 60} s. Load average (1, 5, 15 min) {meta.get('load', '?')}: "
      f"anything else running on the machine during the run shows in the min–max ranges.\n")
    prev_cpu = meta.get("previous_cpu")
    if prev_cpu and prev_cpu != meta["cpu"]:
        w(f"**Another machine than the run this one replaced** ({meta.get('previous_date', '?')}, "
          f"{prev_cpu}, module {meta.get('previous_module_commit', '?')}): hosts speed up nginx, "
          f"Redis's round trips and the script's work by different factors, so even the ratios "
          f"below are not comparable with that run's. A before/after of the code is measured in "
          f"one run: `make bench-compare-builds`.\n")
    w("wrk is closed-loop: each of its connections sends the next request when the answer "
      "arrives, so at a fixed connection count the mean latency is connections / requests per "
      "second; a faster contender is not given more work. p99 shows the tail within that.\n")

    # ---- targets ------------------------------------------------------------------------------
    targets = []  # (what, scenario title, measured text, met)

    def ratio_row(what, sw, a, b, f, target, higher_is_better, fmtv="{:.2f}"):
        x = med(a, f) / med(b, f) if med(b, f) else float("nan")
        lo, hi = per_round_ratio(a, b, f)
        met = x >= target if higher_is_better else x <= target
        targets.append((what, f"{sw[0]}, {sw[1]}w",
                        f"{fmtv.format(x)} ({fmtv.format(lo)}–{fmtv.format(hi)})",
                        ("≥ " if higher_is_better else "≤ ") + f"{target:g}", met))

    before = groups(load(baseline, meta_path)[0]) if baseline else {}
    for sw, c in g.items():
        s = sw[0]
        if not all(k in c for k, _ in CONTENDERS):
            continue
        A, B, C = c["nolimit"], c["lua"], c["module"]
        if s == "allow":
            ratio_row("Redis CPU per decision module / Lua", sw, C, B, "redis_us", 0.5, False)
            x = med(C, "cpu_us") - med(A, "cpu_us")
            lo, hi = rng(C, "cpu_us")
            targets.append(("worker CPU per request module − no limiter, µs", f"{s}, {sw[1]}w",
                            f"{x:+.1f} (module {lo:.1f}–{hi:.1f})", "≤ +3", x <= 3))
        if s == "allow" and sw[1] == 1:
            ratio_row("requests/s module / no limiter", sw, C, A, "rps", 0.65, True)
            ratio_row("requests/s module / Lua", sw, C, B, "rps", 1.6, True)
        old = before.get(sw, {})
        if "module" in old and "nolimit" in old:
            # Relative to the no limiter of the same run: runs on a shared 2-core machine differ
            # in load, and the no limiter's p99 moves with it.
            x = med(C, "p99_us") / med(A, "p99_us")
            was = med(old["module"], "p99_us") / med(old["nolimit"], "p99_us")
            targets.append(("p99 module / no limiter, now vs before (bench/compare-before.tsv)",
                            f"{s}, {sw[1]}w", f"{x:.2f} (before {was:.2f})", "≤ before",
                            x <= was))

    w("## Targets of the issue\n")
    w("Ratios of medians; in brackets the range of the same ratio within each round.\n")
    w("| target | scenario | measured | wanted | |")
    w("|---|---|---:|---|---|")
    for what, s, m, want, met in targets:
        w(f"| {what} | {s} | {m} | {want} | {'**met**' if met else '**missed**'} |")
    nmet = sum(1 for t in targets if t[4])
    w(f"\n{nmet} of {len(targets)} met.\n")

    # ---- per scenario ---------------------------------------------------------------------------
    w("## Results\n")
    w("Per request: nginx worker CPU (user + system of all workers, /proc/<pid>/stat) and Redis CPU "
      "(`INFO cpu`, used_cpu_user + used_cpu_sys) in microseconds; Redis calls from outside = "
      "`EVAL` + `EVALSHA` calls; total = all commands in `INFO commandstats`, which in Redis 7 also "
      "counts every command a script runs (`ZREMRANGEBYSCORE`, `ZCARD`, `ZADD`, `PEXPIRE`, `TIME`, "
      "...). Denominator: the requests nginx counted during the run.\n")
    for sw, c in g.items():
        w(f"### {scen_title(sw[0], sw[1], meta)}\n")
        w("| contender | requests/s | p50 ms | p99 ms | worker CPU µs/req | Redis CPU µs/req "
          "| Redis calls from outside/req | Redis commands total/req | non-2xx |")
        w("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for k, label in CONTENDERS:
            if k not in c:
                continue
            rs = c[k]
            lo, hi = rng(rs, "rps")
            p50lo, p50hi = rng(rs, "p50_us")
            p99lo, p99hi = rng(rs, "p99_us")
            cl, ch = rng(rs, "cpu_us")
            w(f"| {label} | {fmt_int(med(rs, 'rps'))} ({fmt_int(lo)}–{fmt_int(hi)}) "
              f"| {ms(med(rs, 'p50_us'))} ({ms(p50lo)}–{ms(p50hi)}) "
              f"| {ms(med(rs, 'p99_us'))} ({ms(p99lo)}–{ms(p99hi)}) "
              f"| {med(rs, 'cpu_us'):.1f} ({cl:.1f}–{ch:.1f}) "
              f"| {med(rs, 'redis_us'):.1f} "
              f"| {med(rs, 'calls_script'):.3f} | {med(rs, 'calls_total'):.2f} "
              f"| {100 * med(rs, 'non2xx_share'):.1f} % |")
        w("")
        for k, label in CONTENDERS:
            rs = c.get(k, [])
            names = sorted({n for r in rs for n in r["cmds"]})
            if not names:
                continue
            per = {n: statistics.median(r["cmds"].get(n, 0.0) for r in rs) for n in names}
            w(f"{label}, Redis commands per request: "
              + ", ".join(f"`{n.upper()}` {per[n]:.2f}" for n in sorted(names, key=lambda n: (-per[n], n)))
              + "  ")
        w("")

        # What each scenario must look like for its numbers to mean anything.
        s = sw[0]
        for k, _ in CONTENDERS:
            for r in c.get(k, []):
                where = f"{s}, {sw[1]}w, {k}, round {int(r['round'])}"
                share = r["non2xx_share"]
                if k == "nolimit" or s in ("allow", "keys100k"):
                    if r["non2xx"] > 0:
                        warnings.append(f"{where}: {int(r['non2xx'])} non-2xx responses where none were expected")
                elif s == "deny" and share < 0.99:
                    warnings.append(f"{where}: only {100 * share:.1f} % rejected; the id was not over its limit")
                elif s == "mix":
                    want = float(meta.get("mix_hot_percent", "10")) / 100
                    if abs(share - want) > 0.02:
                        warnings.append(f"{where}: {100 * share:.1f} % rejected, expected about {100 * want:.0f} %")
                if r["socket_errors"] > 0:
                    warnings.append(f"{where}: {int(r['socket_errors'])} socket errors/timeouts reported by wrk")
                if r["error_lines"] > 0:
                    warnings.append(f"{where}: {int(r['error_lines'])} error-level lines in nginx's error log")

    busy = [r for r in rows if r["other_cpu_pct"] > 5]
    if busy:
        warnings.append(
            f"{len(busy)} of {len(rows)} runs shared the machine with other processes using more than "
            f"5 % of its CPU (up to {max(r['other_cpu_pct'] for r in busy):.0f} %; column \"other CPU\" "
            f"below): their numbers are lower and noisier than on an idle machine.")
    if warnings:
        w("## Warnings\n")
        for x in warnings:
            w(f"- {x}")
        w("")
    else:
        w("No warnings: no unexpected non-2xx response, no socket error, no error-level line in "
          "nginx's error log; deny and mix rejected the expected shares.\n")

    # ---- raw --------------------------------------------------------------------------------------
    w("## Every run\n")
    w("| scenario | workers | round | contender | requests/s | p50 ms | p99 ms | requests (nginx) "
      "| non-2xx | worker CPU s | Redis CPU s | calls from outside | commands total | other CPU |")
    w("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sw, c in g.items():
        rs = sorted((r for k, _ in CONTENDERS for r in c.get(k, [])),
                    key=lambda r: (r["round"], [k for k, _ in CONTENDERS].index(r["contender"])))
        for r in rs:
            w(f"| {sw[0]} | {sw[1]} | {int(r['round'])} | {r['contender']} | {fmt_int(r['rps'])} "
              f"| {ms(r['p50_us'])} | {ms(r['p99_us'])} | {fmt_int(r['n'])} | {fmt_int(r['non2xx'])} "
              f"| {r['worker_cpu_s']:.2f} | {r['redis_cpu_s']:.2f} | {fmt_int(r['redis_calls_script'])} "
              f"| {fmt_int(r['redis_calls_total'])} | {r['other_cpu_pct']:.0f} % |")
    w("\n\"other CPU\": CPU used during the run by processes other than nginx's workers, "
      "redis-server and the benchmark with wrk, in % of the whole machine (/proc/stat).")
    w("\nRaw rows: `bench/compare.tsv`. Chart: `bench/compare.png`. Command: `bench/compare.sh`.")

    with open(out_path, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
