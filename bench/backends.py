#!/usr/bin/env python3
"""Several Redis backends (issue 34): a location with one zone per backend against the same two
zones on one backend, in requests/s, the worker's instructions per request and latency.

Two redis-servers of the bench's own on free loopback ports: the unnamed (default) backend and
`name=regional`. One nginx configuration (bench/instructions.py's head: the vendored build/nginx
and module, `master_process off`, one worker, a 6-byte static file), zones of
`sliding_counter limit=10^7 window=60s` keyed by X-Consumer-Id (never reached: every request is
an admitted decision):

  none    no limiter
  single  one zone on the default backend
  one     two zones (q, q2), both on the default backend: one script call decides both
  two     the same two zones, q on the default backend and r on `regional`: one call to each,
          sent at once, admitted when both admit

Requests/s: `wrk -t1` against each location in turn, --rounds rounds interleaved in one run
(bench/rotate.lua rotates 10,000 ids), the median per location, and the ratios to `one`.
Redis CPU per request: both servers' `INFO cpu` over each wrk run, added up.

Worker CPU per request: bench/instructions.py's `life(...)` (one nginx under callgrind, 4
keep-alive clients, 400 warm-up requests), marginal Ir per request = (Ir(N=large) -
Ir(N=small)) / (large - small), the median of --runs lives.

Latency: one keep-alive connection, --latency-requests requests in a row per location, median,
p90 and p99 of the whole exchange as the client sees it. A Redis "1 ms away" is simulated for
this part: `tc netem` is what should do it, but it is checked only (in a network namespace of the
bench's own, never on the loopback everyone uses) and used nowhere; instead a small proxy of
this script's own (`--proxy`, a process of its own) holds every reply of the regional Redis
--far-ms before passing it on, as backend `far`. Two more locations then show what a distant
backend adds:

  far      one zone on `far` alone
  two_far  q on the default backend and f on `far`: the calls go out at once, so its latency
           should be far's, not far's plus the default backend's

Loopback only; every loop is bounded; everything started here is stopped by its pid on exit.

Usage: bench/backends.py [--rounds 3] [--duration 5] [--conns 16] [--runs 3]
       [--small 2000] [--large 6000] [--latency-requests 2000] [--out bench/backends.md]
"""

import argparse
import http.client
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from callgrind import write_report  # noqa: E402
import instructions as ins  # noqa: E402
from burst import redis_cpu_us  # noqa: E402

ROOT = ins.ROOT
LOCATIONS = [
    ("none", "/none/", "no limiter"),
    ("single", "/single/", "one zone, default backend"),
    ("one", "/one/", "two zones, both on the default backend"),
    ("two", "/two/", "two zones, one per backend (default + `regional`)"),
]


def say(msg):
    print(f"backends: {msg}", file=sys.stderr, flush=True)


def nginx_conf(regional_port, metrics=False, far_port=None):
    """The configuration, for instructions.Bed.life's make_conf(tmp, module, nport, rport)."""
    def make(tmp, module, nport, rport):
        zone = "key=$http_x_consumer_id limit=10000000 window=60s algorithm=sliding_counter"
        far = (f"ratelimit_redis 127.0.0.1:{far_port} name=far timeout=5s;\n"
               f"    ratelimit_zone f {zone} redis=far;") if far_port else ""
        far_loc = ("location /far/ { ratelimit f; try_files /index.html =404; }\n"
                   "        location /two_far/ { ratelimit q; ratelimit f; try_files /index.html =404; }"
                   ) if far_port else ""
        return ins.conf_head(tmp, module) + f"""
    ratelimit_redis 127.0.0.1:{rport} timeout=5s;
    ratelimit_redis 127.0.0.1:{regional_port} name=regional timeout=5s;
    {far}
    ratelimit_log_level info;
    {"ratelimit_metrics_zone 64k;" if metrics else ""}
    ratelimit_zone q  {zone};
    ratelimit_zone q2 {zone};
    ratelimit_zone r  {zone} redis=regional;

    server {{
        listen 127.0.0.1:{nport} backlog=4096;
        root {tmp}/html;
        location /none/   {{ try_files /index.html =404; }}
        location /single/ {{ ratelimit q; try_files /index.html =404; }}
        location /one/    {{ ratelimit q; ratelimit q2; try_files /index.html =404; }}
        location /two/    {{ ratelimit q; ratelimit r; try_files /index.html =404; }}
        {"location = /metrics { ratelimit_metrics; }" if metrics else ""}
        {far_loc}
    }}
}}
"""
    return make


def start_redis(tmp, name):
    port = ins.free_port()
    proc = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", tmp, "--logfile", os.path.join(tmp, "logs", f"redis-{name}.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ins.wait_port(port, proc, f"redis-server ({name})")
    return port, proc


def stop_proc(proc, sig=signal.SIGTERM, seconds=10):
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


FAR = [
    ("far", "/far/", "one zone on `far` (the regional Redis behind the delaying proxy)"),
    ("two_far", "/two_far/", "q on the default backend + f on `far`, at once"),
]


def proxy_main(listen, target, delay_ms):
    """`--proxy LISTEN TARGET MS`: a TCP proxy on 127.0.0.1:LISTEN to 127.0.0.1:TARGET that
    holds every chunk of the server's replies MS milliseconds (the requests pass at once)."""
    import asyncio
    delay = delay_ms / 1000.0

    async def pipe(reader, writer, hold):
        q = asyncio.Queue()

        async def pump():
            while True:
                data = await reader.read(65536)
                q.put_nowait((time.monotonic() + hold, data))
                if not data:
                    return

        async def drain():
            while True:
                due, data = await q.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    writer.close()
                    return
                writer.write(data)
                await writer.drain()
        try:
            await asyncio.gather(pump(), drain())
        except (ConnectionError, OSError):
            writer.close()

    async def handle(cr, cw):
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            cw.close()
            return
        await asyncio.gather(pipe(cr, uw, 0), pipe(ur, cw, delay))

    async def serve():
        server = await asyncio.start_server(handle, "127.0.0.1", listen)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


def start_proxy(target, delay_ms):
    port = ins.free_port((target,))
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--proxy", str(port), str(target),
                             str(delay_ms)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ins.wait_port(port, proc, "the delaying proxy")
    return port, proc


def netem_available():
    """Whether the kernel has netem: tried on a veth pair in a namespace of our own, removed
    at once. Nothing on the loopback that other processes use is touched."""
    if not shutil.which("ip") or not shutil.which("tc") or os.geteuid() != 0:
        return False, "not root, or no ip/tc"
    ns = f"rlbench{os.getpid()}"
    try:
        if subprocess.run(["ip", "netns", "add", ns], capture_output=True).returncode != 0:
            return False, "ip netns add fails"
        subprocess.run(["ip", "-n", ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
                       capture_output=True)
        r = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "v0", "root", "netem", "delay", "1ms"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return False, f"tc netem: {r.stderr.strip()}"
        return True, ""
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def run_wrk(port, path, seconds, conns):
    cmd = ["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--timeout", "5s", "--latency",
           "-s", os.path.join(ROOT, "bench", "rotate.lua"), f"http://127.0.0.1:{port}{path}", "--", "10000"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    m = re.search(r"^BENCH (.*)$", out.stdout, re.M)
    if out.returncode != 0 or not m:
        ins.die(f"wrk failed on {path}: {out.stdout[-500:]} {out.stderr[-500:]}")
    f = dict(kv.split("=", 1) for kv in m.group(1).split())
    if int(f["non2xx"]) or int(f["socket_errors"]):
        ins.die(f"wrk on {path}: {f['non2xx']} non-2xx, {f['socket_errors']} socket errors")
    return {k: float(v) for k, v in f.items()}


def sequential_latency(port, path, n):
    """n requests in a row on one keep-alive connection: the client's view of each, in µs."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        conn.request("GET", path, headers={"X-Consumer-Id": f"lat-{i % 100}"})
        resp = conn.getresponse()
        resp.read()
        out.append((time.perf_counter() - t0) * 1e6)
        if resp.status != 200:
            ins.die(f"{path}: answered {resp.status}")
    conn.close()
    out.sort()
    return {"p50": out[len(out) // 2], "p90": out[int(len(out) * 0.9)], "p99": out[int(len(out) * 0.99)]}


def script_calls(port):
    """EVAL and EVALSHA calls so far (INFO commandstats) of the Redis on port."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(b"INFO commandstats\r\n")
        text = b""
        while not text.endswith(b"\r\n\r\n") and b"cmdstat_info" not in text:
            chunk = c.recv(65536)
            if not chunk:
                break
            text += chunk
    return sum(int(m) for m in re.findall(rb"cmdstat_eval(?:sha)?:calls=(\d+)", text))


def throughput(bed, args, regional_port, far_port):
    """wrk rounds over every location of one nginx, plus Redis CPU per request and latency."""
    conf = os.path.join(bed.tmp, "nginx-wrk.conf")
    nport = ins.free_port((bed.rport, regional_port, far_port))
    with open(conf, "w") as f:
        f.write(nginx_conf(regional_port, far_port=far_port)(bed.tmp, bed.module, nport, bed.rport))
    proc = subprocess.Popen([bed.nginx, "-p", bed.tmp + "/", "-c", conf],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = {name: [] for name, _, _ in LOCATIONS}
    lat = {}
    try:
        ins.wait_port(nport, proc, "nginx")
        for name, path, _ in LOCATIONS:
            run_wrk(nport, path, 1, args.conns)  # warm-up: pools, SCRIPT LOAD
        for rnd in range(args.rounds):
            for name, path, _ in LOCATIONS:
                cpu0 = redis_cpu_us(bed.rport) + redis_cpu_us(regional_port)
                calls0 = (script_calls(bed.rport), script_calls(regional_port))
                w = run_wrk(nport, path, args.duration, args.conns)
                cpu1 = redis_cpu_us(bed.rport) + redis_cpu_us(regional_port)
                calls1 = (script_calls(bed.rport), script_calls(regional_port))
                n = max(w["requests"], 1)
                w["redis_us"] = (cpu1 - cpu0) / n
                w["calls_d"] = (calls1[0] - calls0[0]) / n
                w["calls_r"] = (calls1[1] - calls0[1]) / n
                w["redis_per_call"] = (cpu1 - cpu0) / max(calls1[0] - calls0[0] + calls1[1] - calls0[1], 1)
                runs[name].append(w)
                say(f"round {rnd + 1} {name}: {w['rps']:,.0f} req/s, p50 {w['p50_us']:.0f} µs, "
                    f"p99 {w['p99_us']:.0f} µs, Redis {w['redis_us']:.2f} µs/request")
        for name, path, _ in LOCATIONS + FAR:
            lat[name] = sequential_latency(nport, path, args.latency_requests)
            say(f"latency {name}: p50 {lat[name]['p50']:.0f} µs, p99 {lat[name]['p99']:.0f} µs")
    finally:
        stop_proc(proc, signal.SIGQUIT, 30)
    return runs, lat


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=int, default=5)
    p.add_argument("--conns", type=int, default=16)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--small", type=int, default=2000)
    p.add_argument("--large", type=int, default=6000)
    p.add_argument("--latency-requests", type=int, default=2000)
    p.add_argument("--skip-callgrind", action="store_true")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "backends.md"))
    p.add_argument("--nginx", default=os.path.join(ROOT, "build", "nginx"))
    p.add_argument("--module", default=os.path.join(ROOT, "build", "ngx_http_ratelimit_module.so"))
    p.add_argument("--far-ms", type=float, default=1.0, help="the proxy's hold of each reply")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    if len(sys.argv) == 5 and sys.argv[1] == "--proxy":
        proxy_main(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
        return
    args = p.parse_args()
    if not 1 <= args.rounds <= 20 or not 1 <= args.duration <= 300:
        ins.die("--rounds must be 1..20 and --duration 1..300")
    for tool in ("wrk", "redis-server") + (() if args.skip_callgrind else ("valgrind",)):
        if not shutil.which(tool):
            ins.die(f"{tool} not found (make deps-bench)")
    for f in (args.nginx, args.module):
        if not os.path.exists(f):
            ins.die(f"{f} missing: run make build")
    netem, why = netem_available()
    say("tc netem: " + ("available" if netem else f"not available ({why}): both Redis servers local"))

    bed = ins.Bed(args)
    regional = proxy = None
    ir = {}
    try:
        bed.start_redis()
        regional_port, regional = start_redis(bed.tmp, "regional")
        far_port, proxy = start_proxy(regional_port, args.far_ms)
        runs, lat = throughput(bed, args, regional_port, far_port)
        if not args.skip_callgrind:
            make = nginx_conf(regional_port)
            for name, path, _ in LOCATIONS:
                irs = []
                for run in range(args.runs):
                    lives = {}
                    for n in (args.small, args.large):
                        out, _, got = bed.life(name, path, n, run, make_conf=make)
                        if got.get(200, 0) != n:
                            ins.die(f"{name}: {n} requests answered {got}")
                        lives[n] = ins.parse_callgrind(out, args.module)[0]
                        os.remove(out)
                    irs.append((lives[args.large] - lives[args.small]) / (args.large - args.small))
                    say(f"{name} run {run + 1}: {irs[-1]:,.0f} Ir/request")
                ir[name] = (statistics.median(irs), irs)
    finally:
        stop_proc(proxy)
        stop_proc(regional)
        bed.stop()

    med = {name: {k: statistics.median(w[k] for w in runs[name])
                  for k in ("rps", "p50_us", "p99_us", "redis_us", "calls_d", "calls_r", "redis_per_call")}
           for name, _, _ in LOCATIONS}
    lines = [
        "# Several Redis backends: one zone per backend against two zones on one backend",
        "",
        f"`make bench-backends` (bench/backends.py), commit {ins.git_head()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.uname().machine}, {os.cpu_count()} CPUs. "
        "One nginx worker (`master_process off`), two local redis-servers, zones "
        "`sliding_counter limit=10^7 window=60s` (every request an admitted decision). "
        f"Requests/s: `wrk -t1 -c{args.conns} -d{args.duration}s`, locations interleaved, median of "
        f"{args.rounds} rounds in one run; Redis CPU: both servers' `INFO cpu` over each wrk run. "
        "wrk, nginx and both Redis servers share the machine's cores: compare rows of one run, not runs.",
        "",
        "| location | req/s | ratio to `one` | p50 µs | p99 µs | Redis CPU µs/request (both) | "
        "script calls/request (default + regional) | Redis CPU µs/call | rounds (req/s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, _, what in LOCATIONS:
        m = med[name]
        lines.append(f"| {what} | {m['rps']:,.0f} | {m['rps'] / med['one']['rps']:.2f}× | {m['p50_us']:,.0f} | "
                     f"{m['p99_us']:,.0f} | {m['redis_us']:.2f} | {m['calls_d']:.3f} + {m['calls_r']:.3f} | "
                     + (f"{m['redis_per_call']:.1f}" if m['calls_d'] + m['calls_r'] > 0 else "—") + " | "
                     + " / ".join(f"{w['rps']:,.0f}" for w in runs[name]) + " |")
    if ir:
        lines += [
            "",
            "## The worker's instructions per request (callgrind)",
            "",
            f"bench/instructions.py's lives: 4 keep-alive clients, {ins.WARMUP} warm-up requests, marginal Ir "
            f"per request = (Ir(N={args.large}) - Ir(N={args.small})) / {args.large - args.small}, median of "
            f"{args.runs} lives (each listed).",
            "",
            "| location | Ir/request | over no limiter | over `one` | lives |",
            "|---|---:|---:|---:|---|",
        ]
        for name, _, what in LOCATIONS:
            m, irs = ir[name]
            over_one = "—" if name in ("none", "single", "one") else f"{m - ir['one'][0]:+,.0f}"
            lines.append(f"| {what} | {m:,.0f} | {m - ir['none'][0]:+,.0f} | {over_one} | "
                         + " / ".join(f"{x:,.0f}" for x in irs) + " |")
    lines += [
        "",
        "## Latency, one request at a time",
        "",
        f"One keep-alive connection, {args.latency_requests} requests in a row per location; the client's view "
        "of each exchange.",
        "",
        "| location | p50 µs | p90 µs | p99 µs |",
        "|---|---:|---:|---:|",
    ]
    for name, _, what in LOCATIONS + FAR:
        v = lat[name]
        lines.append(f"| {what} | {v['p50']:,.0f} | {v['p90']:,.0f} | {v['p99']:,.0f} |")
    lines += [
        "",
        f"`far` is the regional Redis behind this script's proxy, which holds each reply {args.far_ms:g} ms "
        "(Python's event loop wakes in whole milliseconds, so it may hold a little longer): its row is "
        "the distance as the worker sees it. " + (
            "`tc netem` would be the better way; this machine's kernel has it, this bench does not use it yet."
            if netem else f"`tc netem` is not available here ({why}).")
        + f" A location of two backends, one of them `far`, answers in "
        f"{lat['two_far']['p50']:,.0f} µs at the median against {lat['far']['p50']:,.0f} µs for `far` alone "
        f"and {lat['single']['p50']:,.0f} µs for one zone on the default backend: the two calls go out at once.",
    ]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
