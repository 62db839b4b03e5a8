#!/usr/bin/env python3
"""The worker's own cost per request, in instructions (callgrind), for each contender.

Issue 30's harness (the method of the request-path notes): the vendored build/nginx and module,
`master_process off`, one worker, a 6-byte static file, and one location per contender, all in
one configuration so that start-up costs the same:

  none         no limiter
  limit_req    nginx's own limit_req, burst=1000000 nodelay (never rejects)
  exact        ratelimit, sliding_counter limit=10000000 window=60s, decided by Redis each time
  exact_one    the same from one client: every decision its own call and write, so the row does
               not move with how decisions happen to share them (a before/after of the exact
               path's code is read here)
  lease        the same zone with lease=auto (admitted from this worker's reservations)
  lease_bare   the same, `ratelimit_headers off`: what the three headers cost nginx
  two_leases   two leased zones, per client address and per key
  four_leases  four leased zones, per client address, key, route and host (issue 30's "up to 4
               zones" for its allocations)
  deny         a rejection answered from the deny cache (limit 1 per 60 s, taken in warm-up)
  deny_bare    the same, `ratelimit_headers off` (Retry-After stays: every rejection has it)
  limit_req_deny  limit_req rejecting (rate=1r/m, no burst): what the deny cache is held to
  several      the exact zone and one on a second backend (the same Redis under another name):
               a decision asked of each backend, combined all or nothing
  outage       the exact zone on a backend whose Redis is gone (a Unix socket nobody listens on),
               `ratelimit_fail local`: what every request costs while Redis is down, decided
               by the worker's own counters with the circuit breaker open

Each "life" is one nginx under `valgrind --tool=callgrind`: 4 client threads (Python
http.client, one keep-alive connection each, ids b0..b3 in turn) send WARMUP requests (pools,
SCRIPT LOAD, reservations, the remembered rejection), then N requests to the contender's
location, then `SIGQUIT`. Marginal instructions per request = (Ir(N=LARGE) - Ir(N=SMALL)) /
(LARGE - SMALL): start-up, warm-up and shutdown cancel. Likewise the calls to malloc & co per
request, all of them and those made from the module's own code, and the function-level
breakdown (callgrind_annotate --inclusive=yes of both lives, subtracted).

Runs vary (how many requests an event-loop iteration handles, how a lease sizes itself from the
rate it sees): --runs R lives per (contender, N), the median taken.

Starts its own redis-server on a free loopback port (FLUSHALL before each life) and stops it by
its pid. Writes the report (--out, default bench/instructions.md) and prints it.

Usage: bench/instructions.py [--runs 3] [--label TEXT] [--out FILE] [--only a,b] [--small 2000 --large 6000]
"""

import argparse
import functools
import http.client
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIENTS = 4
# Contenders driven by fewer clients than CLIENTS (their warm-up still uses CLIENTS).
CLIENTS_OF = {"exact_one": 1}
IDS = [b"b0", b"b1", b"b2", b"b3"]
WARMUP = 400
# The module's functions in callgrind's names (the crate is ngx_http_ratelimit), and Rust's
# library functions, which only the module calls.
MODULE_FN = re.compile(r"ngx_http_ratelimit::|^<?(core|alloc|std|hashbrown)::|^__rust|^__rdl")
ALLOC_FNS = ("malloc", "calloc", "realloc", "posix_memalign", "memalign", "aligned_alloc")

CONTENDERS = [
    ("none", "/none/", "no limiter"),
    ("limit_req", "/lr/", "`limit_req` burst=1000000 nodelay"),
    ("exact", "/exact/", "`ratelimit` exact"),
    ("exact_one", "/exact/", "`ratelimit` exact, one client (a call per decision)"),
    ("lease", "/lease/", "`ratelimit` lease=auto"),
    ("lease_bare", "/bare/", "`ratelimit` lease=auto, `ratelimit_headers off`"),
    ("two_leases", "/two/", "`ratelimit` two leased zones (address, key)"),
    ("four_leases", "/four/", "`ratelimit` four leased zones (address, key, route, host)"),
    ("deny", "/deny/", "`ratelimit` rejection from the deny cache"),
    ("deny_bare", "/denybare/", "`ratelimit` deny cache, `ratelimit_headers off`"),
    ("limit_req_deny", "/lrdeny/", "`limit_req` rejecting"),
    ("outage", "/outage/", "`ratelimit` during an outage, `ratelimit_fail local`"),
    ("several", "/several/", "`ratelimit` exact on two backends (a zone each)"),
]


def die(msg):
    print(f"instructions: error: {msg}", file=sys.stderr)
    sys.exit(1)


def say(msg):
    print(f"instructions: {msg}", file=sys.stderr, flush=True)


def free_port(exclude=()):
    for p in range(20000 + os.getpid() % 5000, 32000):
        if p in exclude:
            continue
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", p)) != 0:
                return p
    die("no free loopback port")


def conf_head(tmp, module, connections=256):
    """nginx.conf up to the inside of `http {}`: one worker in the foreground, its files in tmp
    (bench/burst.py's configuration starts the same way, with more connections)."""
    rlimit = f"worker_rlimit_nofile {2 * connections};\n" if connections > 256 else ""
    return f"""load_module {module};
daemon off;
master_process off;
worker_processes 1;
{rlimit}error_log {tmp}/logs/error.log warn;
pid {tmp}/nginx.pid;
events {{ worker_connections {connections}; }}
http {{
    default_type text/html;
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 600s;
    client_body_temp_path {tmp}/tmp/client_body;
    proxy_temp_path {tmp}/tmp/proxy;
    fastcgi_temp_path {tmp}/tmp/fastcgi;
    uwsgi_temp_path {tmp}/tmp/uwsgi;
    scgi_temp_path {tmp}/tmp/scgi;
"""


def nginx_conf(tmp, module, nport, rport):
    return conf_head(tmp, module) + f"""
    limit_req_zone $http_x_consumer_id zone=lr:10m rate=100000r/s;
    limit_req_zone $http_x_consumer_id zone=lrdeny:10m rate=1r/m;
    limit_req_status 429;
    # Rejections are not logged (info is below error_log's level), by either limiter.
    limit_req_log_level info;

    ratelimit_redis 127.0.0.1:{rport};
    ratelimit_log_level info;
    ratelimit_zone exact  key=$http_x_consumer_id limit=10000000 window=60s algorithm=sliding_counter;
    ratelimit_zone leased key=$http_x_consumer_id limit=10000000 window=60s algorithm=sliding_counter lease=auto;
    ratelimit_zone per_addr key=$binary_remote_addr limit=10000000 window=60s algorithm=sliding_counter lease=auto;
    ratelimit_zone per_key  key=$http_x_consumer_id limit=10000000 window=60s algorithm=sliding_counter lease=auto;
    ratelimit_zone per_route key=$uri limit=10000000 window=60s algorithm=sliding_counter lease=auto;
    ratelimit_zone per_host key=$host limit=10000000 window=60s algorithm=sliding_counter lease=auto;
    ratelimit_zone denied key=$http_x_consumer_id limit=1 window=60s algorithm=sliding_counter;
    ratelimit_redis 127.0.0.1:{rport} name=other;
    ratelimit_zone exact_other key=$http_x_consumer_id limit=10000000 window=60s algorithm=sliding_counter redis=other;
    ratelimit_redis unix:{tmp}/nobody.sock name=down fail_threshold=1 fail_backoff=60s;
    ratelimit_zone down key=$http_x_consumer_id limit=10000000 window=60s algorithm=sliding_counter redis=down;

    server {{
        listen 127.0.0.1:{nport};
        root {tmp}/html;
        location /none/ {{ try_files /index.html =404; }}
        location /lr/ {{ limit_req zone=lr burst=1000000 nodelay; try_files /index.html =404; }}
        location /lrdeny/ {{ limit_req zone=lrdeny; try_files /index.html =404; }}
        location /exact/ {{ ratelimit exact; try_files /index.html =404; }}
        location /lease/ {{ ratelimit leased; try_files /index.html =404; }}
        location /bare/ {{ ratelimit leased; ratelimit_headers off; try_files /index.html =404; }}
        location /two/ {{ ratelimit per_addr; ratelimit per_key; try_files /index.html =404; }}
        location /four/ {{ ratelimit per_addr; ratelimit per_key; ratelimit per_route; ratelimit per_host; try_files /index.html =404; }}
        location /deny/ {{ ratelimit denied; try_files /index.html =404; }}
        location /denybare/ {{ ratelimit denied; ratelimit_headers off; try_files /index.html =404; }}
        location /outage/ {{ ratelimit down; ratelimit_fail local; try_files /index.html =404; }}
        location /several/ {{ ratelimit exact; ratelimit exact_other; try_files /index.html =404; }}
    }}
}}
"""


def wait_port(port, proc, what, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            die(f"{what} exited ({proc.returncode})")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    die(f"{what} did not listen on {port}")


def drive(port, path, count, clients=CLIENTS):
    """count requests from `clients` keep-alive connections, ids in turn; returns the statuses."""
    statuses = {}
    lock = threading.Lock()
    errors = []

    def client(c):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            mine = {}
            for i in range(c, count, clients):
                conn.request("GET", path, headers={"X-Consumer-Id": IDS[i % len(IDS)]})
                resp = conn.getresponse()
                resp.read()
                mine[resp.status] = mine.get(resp.status, 0) + 1
            conn.close()
            with lock:
                for k, v in mine.items():
                    statuses[k] = statuses.get(k, 0) + v
        except Exception as e:  # reported once the threads are joined
            errors.append(e)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        die(f"client failed on {path}: {errors[0]!r}")
    return statuses



def compressed_name(names, kind, rest):
    """A name of a callgrind file, whose names are compressed: "(N) name" defines N for its kind
    (ob, fl, fn), "(N)" alone refers to it; `names` keeps the definitions."""
    m = re.match(r"\((\d+)\)(?: (.*))?$", rest)
    if not m:
        return rest
    key = (kind, m.group(1))
    if m.group(2) is not None:
        names[key] = m.group(2)
    return names.get(key, "")

def parse_callgrind(path, module_so):
    """Total Ir; calls to the malloc family, all and those from the module's object; the
    allocator's own Ir (glibc's malloc.c, whoever called it), and of it what the module's own
    calls to malloc, free and realloc cost (their inclusive Ir)."""
    names = {}
    total = None
    allocs = {"all": 0, "module": 0, "allocator_ir": 0, "module_alloc_ir": 0}
    ob = fn_is_module = None
    fl = ""
    cfn = None
    in_allocator = after_call = module_alloc_call = False
    module_base = os.path.basename(module_so)

    def name_of(kind, rest):
        return compressed_name(names, kind, rest)

    with open(path, errors="replace") as f:
        for line in f:
            if line[0] in "0123456789+-*":
                # A cost line: a call's inclusive cost right after `calls=`, else the function's own.
                if in_allocator and not after_call:
                    allocs["allocator_ir"] += int(line.split()[1])
                if module_alloc_call:
                    allocs["module_alloc_ir"] += int(line.split()[1])
                after_call = module_alloc_call = False
                continue
            after_call = module_alloc_call = False
            if line.startswith("ob="):
                ob = name_of("ob", line[3:].rstrip("\n"))
            elif line.startswith("cob="):
                name_of("ob", line[4:].rstrip("\n"))
            elif line.startswith("fl="):
                fl = name_of("fl", line[3:].rstrip("\n"))
            elif line.startswith("fi=") or line.startswith("fe="):
                name_of("fl", line[3:].rstrip("\n"))
            elif line.startswith("cfi=") or line.startswith("cfl="):
                name_of("fl", line[4:].rstrip("\n"))
            elif line.startswith("fn="):
                name_of("fn", line[3:].rstrip("\n"))
                fn_is_module = ob is not None and ob.endswith(module_base)
                in_allocator = fl.endswith("/malloc/malloc.c")
            elif line.startswith("cfn="):
                cfn = name_of("fn", line[4:].rstrip("\n"))
            elif line.startswith("calls="):
                after_call = True
                module_alloc_call = fn_is_module and (cfn in ALLOC_FNS or cfn == "free")
                n = int(line[6:].split()[0])
                if cfn in ALLOC_FNS:
                    allocs["all"] += n
                    if fn_is_module:
                        allocs["module"] += n
            elif line.startswith("summary:") or line.startswith("totals:"):
                total = int(line.split()[1])
    if total is None:
        die(f"no total in {path}")
    return total, allocs


def annotate(path):
    """Per function: inclusive Ir (callgrind_annotate --inclusive=yes: the row that names the
    object, which holds the whole function; its inlined parts, listed again under their own
    files without one, are in it already), and self Ir (every row of the function, inlined
    code included)."""
    rows = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+([^:]*):(.*?)( \[[^\]]*\])?$")
    fns, files = {}, {}
    for inclusive in ("yes", "no"):
        out = subprocess.run(
            ["callgrind_annotate", f"--inclusive={inclusive}", "--auto=no", "--threshold=100", path],
            capture_output=True, text=True, check=True,
        ).stdout
        for line in out.splitlines():
            m = rows.match(line)
            if not m or (inclusive == "yes" and not m.group(4)):
                continue
            ir, fn = int(m.group(1).replace(",", "")), m.group(3)
            incl, own = fns.get(fn, (0, 0))
            fns[fn] = (incl + ir, own) if inclusive == "yes" else (incl, own + ir)
            if inclusive == "no" and MODULE_FN.search(fn):
                f = source_of(m.group(2))
                files[f] = files.get(f, 0) + ir
    return fns, files


def source_of(path):
    """A source file as the breakdown names it: the module's own, Rust's library, a crate."""
    path = re.sub(r"^.*?/library/", "rust:", path)
    path = re.sub(r"^.*?/registry/src/[^/]+/", "crate:", path)
    return re.sub(r"^" + re.escape(ROOT) + "/", "", path)


class Bed:
    def __init__(self, args):
        self.args = args
        self.nginx = os.path.abspath(args.nginx)
        self.module = os.path.abspath(args.module)
        self.tmp = tempfile.mkdtemp(prefix="ngx-ratelimit-instr.")
        self.redis = None
        for d in ("html", "logs", "tmp", "cg"):
            os.makedirs(os.path.join(self.tmp, d))
        with open(os.path.join(self.tmp, "html", "index.html"), "w") as f:
            f.write("hello\n")  # 6 bytes

    def start_redis(self):
        self.rport = free_port()
        self.redis = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.rport), "--save", "",
             "--appendonly", "no", "--dir", self.tmp, "--logfile", os.path.join(self.tmp, "logs", "redis.log")],
        )
        wait_port(self.rport, self.redis, "redis-server")

    def redis_cmd(self, *words):
        with socket.create_connection(("127.0.0.1", self.rport), timeout=10) as s:
            msg = f"*{len(words)}\r\n" + "".join(f"${len(w)}\r\n{w}\r\n" for w in words)
            s.sendall(msg.encode())
            reply = s.recv(1024)
            if not reply.startswith(b"+"):
                die(f"redis {words}: {reply!r}")

    def life(self, contender, path, n, run, make_conf=nginx_conf, driver=drive):
        """One nginx under callgrind: warm-up, n requests (`driver`), quit. Returns the
        callgrind file. bench/burst.py gives its own configuration and driver."""
        self.redis_cmd("FLUSHALL")
        nport = free_port((self.rport,))
        conf = os.path.join(self.tmp, "nginx.conf")
        with open(conf, "w") as f:
            f.write(make_conf(self.tmp, self.module, nport, self.rport))
        out = os.path.join(self.tmp, "cg", f"{contender}.{n}.{run}.out")
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             self.nginx, "-p", self.tmp + "/", "-c", conf],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.tmp, "logs", "valgrind.log"), "w"),
        )
        try:
            wait_port(nport, proc, "nginx under callgrind", seconds=120)
            warm = drive(nport, path, WARMUP)
            got = driver(nport, path, n)
        finally:
            # A graceful quit waits for timers nginx may not cancel (a Redis connection's):
            # then a fast one. Either way the shutdown is a constant, which the difference
            # cancels.
            for sig, seconds in ((signal.SIGQUIT, 30), (signal.SIGTERM, 60)):
                if proc.poll() is None:
                    proc.send_signal(sig)
                try:
                    proc.wait(timeout=seconds)
                    break
                except subprocess.TimeoutExpired:
                    say(f"nginx ({contender}) still running {seconds} s after {sig.name}")
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                die(f"nginx ({contender}) did not quit")
        return out, warm, got

    def stop(self):
        if self.redis and self.redis.poll() is None:
            self.redis.terminate()
            try:
                self.redis.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.redis.kill()
        if self.args.keep:
            say(f"kept {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def fmt_int(x):
    return f"{x:,.0f}"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--small", type=int, default=2000)
    p.add_argument("--large", type=int, default=6000)
    p.add_argument("--only", default="")
    p.add_argument("--label", default="")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "instructions.md"))
    p.add_argument("--nginx", default=os.path.join(ROOT, "build", "nginx"))
    p.add_argument("--module", default=os.path.join(ROOT, "build", "ngx_http_ratelimit_module.so"))
    p.add_argument("--top", type=int, default=25, help="module functions in each breakdown")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--commit", default="", help="what the module was built from (default: this tree's HEAD)")
    args = p.parse_args()
    for tool in ("valgrind", "callgrind_annotate", "redis-server"):
        if not shutil.which(tool):
            die(f"{tool} not found (make deps-bench)")
    for f in (args.nginx, args.module):
        if not os.path.exists(f):
            die(f"{f} missing: run make build")
    only = set(filter(None, args.only.split(",")))
    contenders = [c for c in CONTENDERS if not only or c[0] in only or c[0] == "none"]
    span = args.large - args.small

    bed = Bed(args)
    results = {}
    try:
        bed.start_redis()
        for name, path, _ in contenders:
            per_run = []
            for run in range(args.runs):
                lives = {}
                for n in (args.small, args.large):
                    driver = functools.partial(drive, clients=CLIENTS_OF.get(name, CLIENTS))
                    out, warm, got = bed.life(name, path, n, run, driver=driver)
                    total, allocs = parse_callgrind(out, args.module)
                    lives[n] = (out, total, allocs, got)
                ir = (lives[args.large][1] - lives[args.small][1]) / span
                al = {k: (lives[args.large][2][k] - lives[args.small][2][k]) / span
                      for k in ("all", "module", "allocator_ir", "module_alloc_ir")}
                per_run.append((ir, al, lives))
                say(f"{name} run {run + 1}: {ir:,.0f} Ir/request, malloc {al['all']:.2f} "
                    f"(module {al['module']:.2f}), statuses {lives[args.large][3]}")
            # The run whose Ir is the median: its lives give the breakdown.
            per_run.sort(key=lambda r: r[0])
            mid = per_run[len(per_run) // 2]
            results[name] = {
                "ir": [r[0] for r in per_run],
                "median": mid[0],
                "alloc": mid[1],
                # Without what glibc's allocator spends on nginx's own allocations, which moves
                # with the heap's layout; the module's own allocations are kept in.
                "apart": sorted(r[0] - r[1]["allocator_ir"] + r[1]["module_alloc_ir"]
                                for r in per_run),
                "statuses": mid[2][args.large][3],
                "lives": mid[2],
            }
        breakdown = {}
        for name, _, _ in contenders:
            if name in ("none", "limit_req", "limit_req_deny", "lease_bare", "deny_bare"):
                continue
            lives = results[name]["lives"]
            (big, big_files), (small, small_files) = (annotate(lives[n][0]) for n in (args.large, args.small))
            fns = {k: tuple((b - s) / span for b, s in zip(v, small.get(k, (0, 0))))
                   for k, v in big.items()}
            files = {k: (v - small_files.get(k, 0)) / span for k, v in big_files.items()}
            breakdown[name] = (fns, files)
    finally:
        bed.stop()

    report = render(args, contenders, results, breakdown)
    with open(args.out, "w") as f:
        f.write(report)
    print(report)


def short(fn):
    """A function's name without its crate path and hash, for the table."""
    fn = re.sub(r"::h[0-9a-f]{16}$", "", fn)
    fn = fn.replace("ngx_http_ratelimit::", "")
    return fn if len(fn) <= 90 else fn[:87] + "..."


def render(args, contenders, results, breakdown):
    none = results["none"]["median"]
    lines = []
    w = lines.append
    w("# The request path in instructions")
    w("")
    w("`make bench-instructions` (bench/instructions.py): one nginx (`master_process off`, 1 worker,")
    w("6-byte static file) under callgrind per life, 4 keep-alive clients over 4 busy ids, "
      f"{WARMUP} warm-up requests,")
    w(f"marginal Ir per request = (Ir(N={args.large}) - Ir(N={args.small})) / {args.large - args.small}; "
      f"median of {args.runs} runs (each run's figure listed).")
    w("Allocations: calls to malloc, calloc, realloc and posix_memalign per request, marginal as Ir;")
    w("\"module\" counts those made from the module's own code. \"Nginx's allocations\": the Ir of glibc's")
    w("malloc.c per request (malloc, free and their internals) over no limiter, the module's own calls")
    w("set apart: nginx makes the same allocations in every row (its connection's buffer, the request's")
    w("pool and a second block of it), whose cost depends on the heap's layout, which the module's")
    w("long-lived allocations shape; a row moves by that much from run to run with no allocation of its")
    w("own, so the column after it leaves it out (the module's own allocations stay in).")
    if args.label:
        w("")
        w(f"**{args.label}**")
    w("")
    w(f"Machine: {os.uname().machine}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
      f"module built from {args.commit or git_head()}.")
    w("")
    w("| location | Ir/request | over no limiter | of which nginx's allocations | over no limiter, those apart (runs) | runs | allocs/request (module) | statuses (last life) |")
    w("|---|---:|---:|---:|---:|---|---:|---|")
    none_alloc = results["none"]["alloc"]["allocator_ir"]
    none_apart = results["none"]["apart"][len(results["none"]["apart"]) // 2]
    for name, _, label in contenders:
        r = results[name]
        over = "—" if name == "none" else f"{r['median'] - none:+,.0f}"
        own = r["alloc"]["allocator_ir"] - r["alloc"]["module_alloc_ir"]
        heap = "—" if name == "none" else f"{own - none_alloc:+,.0f}"
        apart = [a - none_apart for a in r["apart"]]
        apart = "—" if name == "none" else (f"{apart[len(apart) // 2]:+,.0f} ("
                                            + " / ".join(f"{a:+,.0f}" for a in apart) + ")")
        runs = " / ".join(fmt_int(x) for x in r["ir"])
        st = ", ".join(f"{k}: {v}" for k, v in sorted(r["statuses"].items()))
        w(f"| {label} | {fmt_int(r['median'])} | {over} | {heap} | {apart} | {runs} | "
          f"{r['alloc']['all']:.2f} ({r['alloc']['module']:.2f}) | {st} |")
    for name, (fns, files) in breakdown.items():
        label = next(c[2] for c in contenders if c[0] == name)
        w("")
        w(f"## {label}: the module's functions, inclusive Ir per request")
        w("")
        w("| inclusive Ir/request | self Ir/request | function |")
        w("|---:|---:|---|")
        mod = sorted(((v, k) for k, v in fns.items() if MODULE_FN.search(k) and max(v) >= 5),
                     reverse=True)
        for (incl, own), k in mod[: args.top]:
            w(f"| {fmt_int(incl)} | {fmt_int(own)} | `{short(k)}` |")
        w("")
        w("Self Ir per request of the module's and Rust's functions, by the source file of the code")
        w("(inlined code counts where it was written):")
        w("")
        w("| self Ir/request | source |")
        w("|---:|---|")
        for v, f in sorted(((v, f) for f, v in files.items() if v >= 5), reverse=True)[: args.top]:
            w(f"| {fmt_int(v)} | `{f}` |")
        w("")
        w("| inclusive Ir/request | self Ir/request | the allocator (nginx's calls and the module's) |")
        w("|---:|---:|---|")
        everyone = ALLOC_FNS + ("free", "_int_malloc", "_int_free")
        for (incl, own), k in sorted(((v, k) for k, v in fns.items() if k in everyone and v[0] >= 5),
                                     reverse=True):
            w(f"| {fmt_int(incl)} | {fmt_int(own)} | `{k}` |")
    w("")
    return "\n".join(lines)


def git_head():
    try:
        out = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD", "--", "src", "lua"]).returncode
        return out + (" (+uncommitted changes in src/ or lua/)" if dirty else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


if __name__ == "__main__":
    main()
