#!/usr/bin/env python3
"""What a delayed request costs (issue 33): the worker's instructions (callgrind) and Redis's
calls per request, for a burst of requests into `delay=`, beside the same burst decided at once.

One worker (bench/instructions.py's harness: the vendored build/nginx and module,
`master_process off`, a 6-byte static file), three locations on one key per burst:

  none    no limiter
  exact   ratelimit, gcra limit=10^9 per second burst=10^9: every request admitted at once
  delay   ratelimit, gcra limit=1000 per second burst=1 delay=5s: the first admitted at once,
          each of the others recorded 1 ms after the one before it, waiting on its own timer

Each life: the harness's warm-up (400 keep-alive requests), then a burst of N requests at
once, each on its own connection (`Connection: close`), then `SIGQUIT`. Marginal per request =
(Ir(N=LARGE) - Ir(N=SMALL)) / (LARGE - SMALL), the median of --runs lives. Redis's script calls
and decisions per request are read from the metrics page of a life outside callgrind (each
burst of LARGE once, counted by the module: `ratelimit_redis_call_duration_seconds_count`, the
script calls, and the decisions by status).

Usage: bench/delay.py [--runs 3] [--small 200] [--large 1000] [--out bench/delay.md]
"""

import argparse
import asyncio
import os
import resource
import signal
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from callgrind import write_report  # noqa: E402
import instructions as ins  # noqa: E402

ROOT = ins.ROOT
LOCATIONS = [
    ("none", "/none/", "no limiter"),
    ("exact", "/exact/", "`ratelimit`, admitted at once"),
    ("delay", "/delay/", "`ratelimit ... delay=5s`, all but the first delayed"),
]


def nginx_conf(tmp, module, nport, rport):
    return ins.conf_head(tmp, module, connections=4096) + f"""
    ratelimit_redis 127.0.0.1:{rport} timeout=10s;
    ratelimit_log_level info;
    ratelimit_metrics_zone 64k;
    ratelimit_zone open  key=$http_x_consumer_id limit=1000000000 window=1s algorithm=gcra burst=1000000000;
    ratelimit_zone paced key=$http_x_consumer_id limit=1000 window=1s algorithm=gcra burst=1;

    server {{
        listen 127.0.0.1:{nport} backlog=4096;
        root {tmp}/html;
        location /none/ {{ try_files /index.html =404; }}
        location /exact/ {{ ratelimit open; try_files /index.html =404; }}
        location /delay/ {{ ratelimit paced delay=5s; try_files /index.html =404; }}
        location = /metrics {{ ratelimit_metrics; }}
    }}
}}
"""


async def one(port, path, key):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: b\r\nX-Consumer-Id: {key}\r\n"
                 "Connection: close\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0


def burst(port, path, n, key="burst"):
    """n requests at once, each on its own connection; returns the statuses."""
    async def run():
        return await asyncio.gather(*(one(port, path, key) for _ in range(n)))
    statuses = {}
    for s in asyncio.run(run()):
        statuses[s] = statuses.get(s, 0) + 1
    return statuses


def metrics_text(port):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    return c.getresponse().read().decode()


def sample(text, series):
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def redis_per_request(bed, args):
    """Script calls and decisions per request of a burst of LARGE, nginx outside callgrind."""
    out = {}
    for name, path, _ in LOCATIONS[1:]:
        bed.redis_cmd("FLUSHALL")
        nport = ins.free_port((bed.rport,))
        conf = os.path.join(bed.tmp, "nginx-plain.conf")
        with open(conf, "w") as f:
            f.write(nginx_conf(bed.tmp, bed.module, nport, bed.rport))
        proc = subprocess.Popen([bed.nginx, "-p", bed.tmp + "/", "-c", conf],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            ins.wait_port(nport, proc, "nginx")
            burst(nport, path, 10, key="warm")
            before = metrics_text(nport)
            got = burst(nport, path, args.large)
            after = metrics_text(nport)
        finally:
            proc.send_signal(signal.SIGQUIT)
            proc.wait(timeout=60)
        server = f'server="127.0.0.1:{bed.rport}"'
        calls = (sample(after, f"ratelimit_redis_call_duration_seconds_count{{{server}}}")
                 - sample(before, f"ratelimit_redis_call_duration_seconds_count{{{server}}}"))
        delayed = sample(after, "ratelimit_delayed_requests_total") - sample(before, "ratelimit_delayed_requests_total")
        out[name] = (calls / args.large, delayed, got)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--small", type=int, default=200)
    p.add_argument("--large", type=int, default=1000)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "delay.md"))
    p.add_argument("--nginx", default=os.path.join(ROOT, "build", "nginx"))
    p.add_argument("--module", default=os.path.join(ROOT, "build", "ngx_http_ratelimit_module.so"))
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 16384), hard))
    bed = ins.Bed(args)
    results = {}
    try:
        bed.start_redis()
        for name, path, _ in LOCATIONS:
            for n in (args.small, args.large):
                irs = []
                for run in range(args.runs):
                    out, _, got = bed.life(name, path, n, run, make_conf=nginx_conf, driver=burst)
                    if got.get(200, 0) != n:
                        ins.die(f"{name}: a burst of {n} answered {got}")
                    irs.append(ins.parse_callgrind(out, args.module)[0])
                    os.remove(out)
                    ins.say(f"{name} n={n} run {run}: {irs[-1]:,} Ir")
                results[(name, n)] = statistics.median(irs)
        redis = redis_per_request(bed, args)
    finally:
        bed.stop()
    per = {name: (results[(name, args.large)] - results[(name, args.small)]) / (args.large - args.small)
           for name, _, _ in LOCATIONS}
    lines = [
        "# A burst into `delay=`: the worker's instructions and Redis's calls per request",
        "",
        f"`make bench-delay` (bench/delay.py), commit {ins.git_head()}: one worker under callgrind, "
        f"a burst of {args.small} and of {args.large} requests at once (a connection each), "
        f"median of {args.runs} lives; marginal Ir per request = difference / {args.large - args.small}.",
        "",
        "| location | Ir/request | over no limiter | script calls/request | delayed |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, _, what in LOCATIONS:
        calls, delayed, _ = redis.get(name, (0.0, 0, {}))
        lines.append(f"| {what} | {per[name]:,.0f} | {per[name] - per['none']:+,.0f} | "
                     f"{calls:.3f} | {delayed:.0f} |")
    lines += [
        "",
        f"A delayed request costs the worker {per['delay'] - per['exact']:+,.0f} instructions over "
        "one admitted at once (its timer, its places kept for a give-back, the metrics), "
        "and no second Redis call: the one that decides it records it, with a ledger entry besides.",
    ]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
