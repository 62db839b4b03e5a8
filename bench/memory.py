#!/usr/bin/env python3
"""Redis memory per limited key and per admitted request, for each algorithm.

Starts its own redis-server (default configuration apart from no persistence) on a free
127.0.0.1 port, loads the decision script exactly as src/decide/script/mod.rs assembles it (the
include_str! files of SCRIPT, concatenated), and drives it with EVALSHA, pipelined, with an
injected clock. Keys have the module's shape `rl:<zone>:<key>`, the key an IPv4 address.

For each algorithm (sliding_log "l", sliding_counter "c", gcra "g") and for the article's
own sliding-window script (string members `<now>-<32 hex>`, the reference point):

  * N requests per key, N = 10, 100, 1000, 10000, over K keys with K*N = 100,000:
    MEMORY USAGE (SAMPLES 0, averaged over sampled keys) and the INFO used_memory delta,
    per key and per admitted request;
  * at scale: 100k keys x 10 requests, 100k keys x 1 request, and 20k keys x 10 requests
    (the issue's reference shape);
  * large limits (sliding_counter, gcra): limit 10, 1,000, 1,000,000 and 1,000,000,000
    (the module's maximum), 10k keys, each taking the whole limit in 10 requests: their
    values are fixed-length packed strings, so the memory must not depend on the limit;
  * zset-max-listpack-entries (default 128) raised above N, at N = 1000 and 10000: memory
    and the script's cost per call (INFO commandstats usec_per_call).

Writes bench/memory.md (a table and guidance) and prints it. Python 3 standard library only.

Usage: bench/memory.py [--quick] [--out bench/memory.md] [--redis-server redis-server]
"""

import argparse
import atexit
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where `SCRIPT` is, relative to the repo.
SCRIPT_RS = os.path.join("src", "decide", "script", "mod.rs")

# The article's script (sliding-window-article.txt), verbatim apart from comments: the
# reference point for memory.
ARTICLE_SCRIPT = """
local key    = KEYS[1]
local limit  = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local now    = tonumber(ARGV[3])
local member = ARGV[4]
redis.call('ZREMRANGEBYSCORE', key, 0, now - window)
local used = redis.call('ZCARD', key)
if used < limit then
  redis.call('ZADD', key, now, member)
  redis.call('PEXPIRE', key, window)
  return { 1, limit - used - 1, 0 }
end
local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
local retry_after = window
if oldest[2] then
  retry_after = (tonumber(oldest[2]) + window) - now
end
return { 0, 0, retry_after }
"""


# ---------------------------------------------------------------------------------------------
# The script, as the module sends it


def script_parts(root=ROOT):
    """The lua/ files of `SCRIPT` in src/decide/script/mod.rs, in concat! order."""
    with open(os.path.join(root, SCRIPT_RS), encoding="utf-8") as f:
        rs = f.read()
    m = re.search(r"\bconst\s+SCRIPT\s*:\s*&(?:'static\s+)?str\s*=\s*concat!\s*\((.*?)\)\s*;", rs, re.S)
    if not m:
        raise SystemExit("no `const SCRIPT: &str = concat!(...);` in " + SCRIPT_RS)
    body = re.sub(r"//[^\n]*", "", m.group(1))
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    parts = re.findall(r'include_str!\s*\(\s*"([^"]+)"\s*\)', body)
    rest = re.sub(r'include_str!\s*\(\s*"[^"]+"\s*\)\s*,?', "", body).strip()
    if not parts or rest:
        raise SystemExit("SCRIPT is not a list of include_str! entries: %r" % rest)
    return [os.path.normpath(os.path.join(os.path.dirname(SCRIPT_RS), p)) for p in parts]


def script_text(root=ROOT):
    out = b""
    for p in script_parts(root):
        with open(os.path.join(root, p), "rb") as f:
            out += f.read()
    return out


# ---------------------------------------------------------------------------------------------
# A redis-server of our own, and a pipelining RESP client


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class RedisServer:
    def __init__(self, binary="redis-server", extra=()):
        self.dir = tempfile.mkdtemp(prefix="rl-bench-redis.")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--daemonize", "no",
             "--logfile", os.path.join(self.dir, "redis.log"), *extra],
            stdin=subprocess.DEVNULL, start_new_session=True)
        atexit.register(self.stop)
        deadline = time.time() + 10
        while True:
            try:
                self.client = Client(self.port)
                self.client.cmd("PING")
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise SystemExit("redis-server did not start (log: %s)" % self.dir)
                time.sleep(0.05)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.dir and os.path.isdir(self.dir):
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None


class RedisError(Exception):
    pass


def encode(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if not isinstance(a, bytes):
            a = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Client:
    def __init__(self, port):
        """`port`: a loopback TCP port, or the path of a unix socket."""
        if isinstance(port, str):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(60)
            self.sock.connect(port)
        else:
            self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.pos = 0

    def _fill(self):
        data = self.sock.recv(1 << 20)
        if not data:
            raise OSError("redis closed the connection")
        if self.pos:
            self.buf = self.buf[self.pos:]
            self.pos = 0
        self.buf += data

    def _line(self):
        while True:
            i = self.buf.find(b"\r\n", self.pos)
            if i >= 0:
                line = self.buf[self.pos:i]
                self.pos = i + 2
                return line
            self._fill()

    def read(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            return RedisError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) - self.pos < n + 2:
                self._fill()
            v = self.buf[self.pos:self.pos + n]
            self.pos += n + 2
            try:
                return v.decode()
            except UnicodeDecodeError:
                return v    # binary (the packed counter and gcra values)
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise OSError("bad RESP: %r" % line)

    def cmd(self, *args):
        self.sock.sendall(encode(args))
        r = self.read()
        if isinstance(r, RedisError):
            raise r
        return r

    def pipeline(self, commands, batch=2000):
        """Sends encoded commands in batches; returns all replies in order."""
        replies = []
        for i in range(0, len(commands), batch):
            chunk = commands[i:i + batch]
            self.sock.sendall(b"".join(chunk))
            replies.extend(self.read() for _ in chunk)
        return replies

    def info(self, section):
        out = {}
        for line in self.cmd("INFO", section).splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                out[k] = v
        return out


def used_memory(c):
    return int(c.info("memory")["used_memory"])


def evalsha_usec(c):
    """usec_per_call of EVALSHA since the last CONFIG RESETSTAT."""
    st = c.info("commandstats").get("cmdstat_evalsha", "")
    m = re.search(r"usec_per_call=([0-9.]+)", st)
    return float(m.group(1)) if m else float("nan")


def install_signal_cleanup():
    def handler(signum, frame):
        sys.exit(128 + signum)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)


# ---------------------------------------------------------------------------------------------
# The measurements

WINDOW = 3_600_000                     # 1 h: nothing expires while a scenario runs
W0 = (1_700_000_000_000 // WINDOW + 1) * WINDOW   # a window start near 2023-11
ZONE = "api"


def ip_key(i):
    return "rl:%s:10.%d.%d.%d" % (ZONE, (i >> 16) & 255, (i >> 8) & 255, i & 255)


# The stored values of sliding_counter and gcra (lua/sliding_counter.lua, lua/gcra.lua):
# struct.pack('<BI4I4', window index % 256, current, previous) and struct.pack('<dI4', ms, r)
# with TAT = ms + r / limit.
COUNTER_FORMAT = "<BII"
GCRA_FORMAT = "<dI"


def show_value(alg, v, limit=None):
    """A stored value as text: sorted-set members and text as they are, packed values decoded."""
    if not isinstance(v, bytes) and alg not in ("c", "g"):
        return v
    b = v if isinstance(v, bytes) else v.encode()
    if alg == "c" and len(b) == struct.calcsize(COUNTER_FORMAT):
        return "%d B: window%%256=%d cur=%d prev=%d" % ((len(b),) + struct.unpack(COUNTER_FORMAT, b))
    if alg == "g" and len(b) == struct.calcsize(GCRA_FORMAT):
        ms, r = struct.unpack(GCRA_FORMAT, b)
        return "%d B: TAT %.0f + %d/%s ms" % (len(b), ms, r, limit if limit is not None else "limit")
    return "%d B: %s" % (len(b), b.hex())


# Large limits: the gcra window is 1 ms longer than the hour, so that the TAT's remainder r
# (in 1/limit ms) is not 0 as it would be for any limit dividing 3,600,000.
BIG_GCRA_WINDOW = WINDOW + 1


def big_costs(alg, limit):
    """(limit, window, cost, burst) of the large-limit rows: 10 requests take the whole limit
    (gcra: the burst) or, with a cost that does not divide it, nearly all of it."""
    if alg == "c":
        return limit, WINDOW, max(1, limit // 10), 0
    return limit, BIG_GCRA_WINDOW, max(1, limit // 10 - 1), limit


class Driver:
    def __init__(self, client, port, sha, article_sha, seed=1):
        self.c = client
        self.port = port
        self.sha = sha
        self.article_sha = article_sha
        self.rng = random.Random(seed)
        self.big = None     # a limit: the large-limit rows (big_costs)

    def command(self, alg, key, now, n):
        """The EVALSHA of one admitted request on a key that will take n requests."""
        if self.big is not None:
            limit, window, cost, burst = big_costs(alg, self.big)
            return encode(["EVALSHA", self.sha, 1, key, now, alg, limit, window, cost, burst])
        if alg == "floor":
            # Not a limiter: the least a key with a TTL costs in Redis (a 1-byte integer value).
            return encode(["SET", key, "1", "PX", WINDOW])
        if alg == "article":
            member = "%d-%032x" % (now, self.rng.getrandbits(128))
            return encode(["EVALSHA", self.article_sha, 1, key, n, WINDOW, now, member])
        if alg == "l":
            return encode(["EVALSHA", self.sha, 1, key, now, "l", n, WINDOW, 1, 0])
        if alg == "c":
            return encode(["EVALSHA", self.sha, 1, key, now, "c", n, WINDOW, 1, 0])
        if alg == "g":
            # limit 7n per window: a fractional spacing, so the TAT has a remainder (r in
            # 1/limit ms) as it usually does; burst n admits all n (exactly: the TAT is kept
            # in integers).
            return encode(["EVALSHA", self.sha, 1, key, now, "g", 7 * n, WINDOW, 1, n])
        raise ValueError(alg)

    def fill(self, alg, keys, n):
        """n admitted requests on each of `keys` keys, 100 ms apart (all in one window), over
        a connection of its own: closed afterwards, so that its query and reply buffers are
        not counted in used_memory."""
        admitted = 0
        fc = Client(self.port)
        for r in range(n):
            now = W0 + 100 * r
            cmds = [self.command(alg, ip_key(k), now, n) for k in range(keys)]
            for rep in fc.pipeline(cmds):
                if isinstance(rep, RedisError):
                    raise SystemExit("script error: %s" % rep)
                admitted += 1 if rep == "OK" else rep[0]
        fc.sock.close()
        # Wait until Redis has freed the closed client.
        for _ in range(100):
            if int(self.c.info("clients")["connected_clients"]) == 1:
                break
            time.sleep(0.01)
        if admitted != keys * n:
            raise SystemExit("%s: %d of %d requests admitted" % (alg, admitted, keys * n))

    def measure(self, alg, keys, n, sample=200):
        c = self.c
        c.cmd("FLUSHALL", "SYNC")
        c.cmd("CONFIG", "RESETSTAT")
        before = used_memory(c)
        t = time.time()
        self.fill(alg, keys, n)
        elapsed = time.time() - t
        usec = evalsha_usec(c)
        after = used_memory(c)
        dbsize = c.cmd("DBSIZE")
        if dbsize != keys:
            raise SystemExit("%s: %d keys, expected %d" % (alg, dbsize, keys))
        idx = sorted(self.rng.sample(range(keys), min(sample, keys)))
        usage = c.pipeline([encode(["MEMORY", "USAGE", ip_key(i), "SAMPLES", "0"]) for i in idx])
        enc = c.cmd("OBJECT", "ENCODING", ip_key(idx[0]))
        k0 = ip_key(idx[0])
        if alg in ("l", "article"):
            card = c.cmd("ZCARD", k0)
            if card != n:
                raise SystemExit("%s: ZCARD %d, expected %d" % (alg, card, n))
            value = c.cmd("ZRANGE", k0, 0, 0)[0]
        else:
            v = c.cmd("GET", k0)
            limit = self.big if self.big is not None else 7 * n
            value = show_value(alg, v, limit)
            want = {"c": struct.calcsize(COUNTER_FORMAT), "g": struct.calcsize(GCRA_FORMAT)}.get(alg)
            if want and len(v if isinstance(v, bytes) else v.encode()) != want:
                raise SystemExit("%s: a value of %d bytes, expected %d: %s" % (alg, len(v), want, value))
        mu = sum(usage) / len(usage)
        delta = after - before
        return {
            "alg": alg, "keys": keys, "n": n, "encoding": enc, "value": value, "limit": self.big,
            "mu_key": mu, "mu_req": mu / n,
            "delta_key": delta / keys, "delta_req": delta / (keys * n),
            "usec": usec, "rate": keys * n / elapsed if elapsed > 0 else 0,
        }


def git_rev(root=ROOT):
    try:
        rev = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "lua", SCRIPT_RS],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (rev or "?") + (" (lua/ or %s modified)" % SCRIPT_RS if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def reflow(md, width=96):
    """Rewraps paragraphs and bullet items of generated markdown; tables, headings and
    indented blocks stay as they are."""
    import textwrap
    out = []
    for block in md.split("\n\n"):
        lines = block.split("\n")
        if any(l.lstrip().startswith(("|", "#")) for l in lines):
            out.append(block)
            continue
        items, cur = [], []
        for l in lines:
            if l.startswith("- ") and cur:
                items.append(cur)
                cur = []
            cur.append(l.strip())
        if cur:
            items.append(cur)
        wrapped = []
        for it in items:
            text = " ".join(it)
            bullet = text.startswith("- ")
            wrapped.append(textwrap.fill(text, width, subsequent_indent="  " if bullet else "",
                                         break_on_hyphens=False, break_long_words=False))
        out.append("\n".join(wrapped))
    return "\n\n".join(out)


ALG_NAMES = {"l": "sliding_log", "c": "sliding_counter", "g": "gcra", "article": "article log",
             "floor": "(floor: `SET k 1 PX`)"}


def span(lo, hi):
    """"88" or "143–154": a range of byte counts, one number when both ends agree."""
    return "%.0f" % lo if round(lo) == round(hi) else "%.0f–%.0f" % (lo, hi)


def fmt_row(r):
    return "| %s | %s | %s | %s | %.0f | %.1f | %.0f | %.1f | %.1f | `%s` |" % (
        ALG_NAMES[r["alg"]], "{:,}".format(r["keys"]), "{:,}".format(r["n"]), r["encoding"],
        r["mu_key"], r["mu_req"], r["delta_key"], r["delta_req"], r["usec"], r["value"])


BIG_LIMITS = (10, 1000, 1_000_000, 1_000_000_000)


def fmt_big_row(r):
    limit, window, cost, burst = big_costs(r["alg"], r["limit"])
    return "| %s | %s | %s | %s × 10%s | %s | %.0f | %.0f | %.1f | `%s` |" % (
        ALG_NAMES[r["alg"]], "{:,}".format(limit), "{:,}".format(r["keys"]), "{:,}".format(cost),
        (", burst %s" % "{:,}".format(burst)) if burst else "", r["encoding"], r["mu_key"],
        r["delta_key"], r["usec"], r["value"])


BIG_HEADER = ("| algorithm | limit | keys | units taken per key | encoding | MEMORY USAGE /key "
              "| used_memory Δ /key | µs/call | sample value |\n"
              "|---|---:|---:|---|---|---:|---:|---:|---|")


HEADER = ("| algorithm | keys | requests/key | encoding | MEMORY USAGE /key | /request "
          "| used_memory Δ /key | /request | µs/call | sample member or value |\n"
          "|---|---:|---:|---|---:|---:|---:|---:|---:|---|")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10x fewer keys (a smoke run)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "memory.md"))
    ap.add_argument("--redis-server", default="redis-server")
    a = ap.parse_args()
    install_signal_cleanup()
    div = 10 if a.quick else 1

    server = RedisServer(a.redis_server)
    c = server.client
    # Per-command latency histograms (Redis 7) are allocated on a command's first call and
    # freed by CONFIG RESETSTAT: tens of kB that would land in the used_memory deltas.
    c.cmd("CONFIG", "SET", "latency-tracking", "no")
    version = c.info("server")["redis_version"]
    lp_entries = c.cmd("CONFIG", "GET", "zset-max-listpack-entries")[1]
    lp_value = c.cmd("CONFIG", "GET", "zset-max-listpack-value")[1]
    sha = c.cmd("SCRIPT", "LOAD", script_text())
    article_sha = c.cmd("SCRIPT", "LOAD", ARTICLE_SCRIPT)
    d = Driver(c, server.port, sha, article_sha)
    algs = ["l", "c", "g", "article"]

    per_key = []
    for n in (10, 100, 1000, 10000):
        keys = max(1, 100_000 // n // div)
        for alg in algs:
            r = d.measure(alg, keys, n)
            per_key.append(r)
            print(fmt_row(r), flush=True)

    scale = []
    for keys, n in ((100_000 // div, 1), (100_000 // div, 10), (20_000 // div, 10)):
        for alg in algs + (["floor"] if n == 1 else []):
            r = d.measure(alg, keys, n, sample=1000)
            scale.append(r)
            print(fmt_row(r), flush=True)

    big_rows = []
    for limit in BIG_LIMITS:
        d.big = limit
        for alg in ("c", "g"):
            r = d.measure(alg, 10_000 // div, 10)
            big_rows.append(r)
            print(fmt_big_row(r), flush=True)
    d.big = None

    lp = []
    for entries in (128, 1024, 16384):
        c.cmd("CONFIG", "SET", "zset-max-listpack-entries", entries)
        for n in (1000, 10000):
            keys = max(1, 100_000 // n // div)
            for alg in ("l", "article"):
                r = d.measure(alg, keys, n)
                r["lp"] = entries
                lp.append(r)
                print(entries, fmt_row(r), flush=True)
    c.cmd("CONFIG", "SET", "zset-max-listpack-entries", lp_entries)

    # What a value's length does to a string key: MEMORY USAGE of `rl:api:10.0.0.1` holding
    # the packed values the counter and gcra store, the text formats they stored before, and
    # an integer alternative.
    probes = []
    for v, what in ((struct.pack(COUNTER_FORMAT, 472223 % 256, 1_000_000_000, 1_000_000_000),
                     "counter, packed (window % 256, current, previous): any limit"),
                    (struct.pack(GCRA_FORMAT, 1700003314285, 999_999_999),
                     "gcra, packed (whole ms, remainder): any limit"),
                    ("472223:10:0", "counter text (previous format), 1 h window"),
                    ("28333380:57:60", "counter text (previous format), 60 s window"),
                    ("1700003314285.7153", "gcra TAT as %.17g text (previous format)"),
                    ("1700003314285715", "an integer TAT (µs)")):
        c.cmd("FLUSHALL", "SYNC")
        c.cmd("SET", "rl:api:10.0.0.1", v, "PX", WINDOW)
        shown = ("%d bytes: %s" % (len(v), v.hex())) if isinstance(v, bytes) else v
        probes.append((shown, what, c.cmd("OBJECT", "ENCODING", "rl:api:10.0.0.1"),
                       c.cmd("MEMORY", "USAGE", "rl:api:10.0.0.1", "SAMPLES", "0")))
    server.stop()

    def find(rows, alg, keys, n):
        for r in rows:
            if r["alg"] == alg and r["keys"] == keys and r["n"] == n:
                return r
        return None

    big = 100_000 // div
    log10 = find(scale, "l", big, 10)
    art10 = find(scale, "article", 20_000 // div, 10)
    art_small = find(per_key, "article", 100_000 // 10 // div, 10)
    floor = find(scale, "floor", big, 1)
    ctr = [r for r in per_key + scale + big_rows if r["alg"] == "c"]
    gcra = [r for r in per_key + scale + big_rows if r["alg"] == "g"]
    big_mu = max(r["mu_key"] for r in big_rows)
    probe_rows = "\n".join("  | `%s` | %s | %s | %d |" % p for p in probes)
    lp_rows = "\n".join(
        "| %d | %s | %s | %s | %.1f | %.1f | %.1f |" % (
            r["lp"], ALG_NAMES[r["alg"]], "{:,}".format(r["n"]), r["encoding"],
            r["mu_req"], r["delta_req"], r["usec"]) for r in lp)

    md = f"""# Redis memory per limited key (`bench/memory.py`)

Redis {version} (jemalloc), default configuration (`zset-max-listpack-entries {lp_entries}`,
`zset-max-listpack-value {lp_value}`), started by the benchmark on a free port with no
persistence (and `latency-tracking no`, so that per-command latency histograms do not blur
the used_memory deltas). Each request is one `EVALSHA` of the decision script exactly as `src/decide/script/mod.rs`
assembles it (`{", ".join(os.path.basename(p) for p in script_parts())}`), pipelined, with an
injected clock: the requests of a key are 100 ms apart inside one 1 h window, every one
admitted (sliding_log and sliding_counter: limit = requests per key; gcra: limit 7 × that
per window, so that the stored TAT has a fraction of a ms (the remainder r ≠ 0) as it usually
does, burst = requests per key). Keys are `rl:api:10.x.y.z`. The article's script (`ZADD key now "<now>-<32 hex>"`) is
the reference point. {"**Quick run: 10× fewer keys.**" if div > 1 else ""}

Run: {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, commit {git_rev()}, {os.cpu_count()} CPUs shared with
whatever else runs on the machine (µs/call is indicative only).

- **MEMORY USAGE**: `MEMORY USAGE key SAMPLES 0`, averaged over up to 200 (at scale 1,000)
  sampled keys: the value, the key name and its dictionary entry.
- **used_memory Δ**: `INFO memory` `used_memory` after minus before, divided by keys or by
  admitted requests: also the expiry entry and the hash tables' buckets, i.e. what a
  production Redis really pays.
- **µs/call**: `INFO commandstats` `usec_per_call` of `EVALSHA` (Redis-side script time).

## N requests per key (K keys, K × N = {100_000 // div:,})

{HEADER}
{chr(10).join(fmt_row(r) for r in per_key)}

## At scale

{HEADER}
{chr(10).join(fmt_row(r) for r in scale)}

## Large limits (sliding_counter, gcra)

{10_000 // div:,} keys, each taking (nearly) its whole limit in 10 admitted requests 100 ms
apart, so that the stored counts and remainders are as large as the limit makes them. The
counter's window is 1 h; gcra's is 1 h + 1 ms, with burst = limit and a cost of limit/10 − 1,
so that its remainder r is not 0 (at limit 10 it is 0 whatever the cost: 10 requests of 1
unit are exactly 10 spacings). {BIG_LIMITS[-1]:,} is the largest limit the module accepts.

{BIG_HEADER}
{chr(10).join(fmt_big_row(r) for r in big_rows)}

## Summary

- **sliding_log at scale** ({big:,} keys × 10 entries): **{log10["delta_req"]:.1f} bytes per
  entry** by used_memory Δ ({log10["mu_req"]:.1f} by MEMORY USAGE). Goal ≤ 50:
  **{"met" if log10["delta_req"] <= 50 else "NOT met"}**. Members (the clock in µs, or ms × 1000 plus a count) and scores (ms) are
  integers, which a listpack stores as integers: about 20 bytes per entry, plus the key's fixed
  cost spread over its entries.
- **The article's members** (`<now>-<32 hex>`, 46 bytes): {art10["delta_req"]:.1f} bytes per
  entry at {art10["keys"]:,} keys × 10 (the issue measured 79.5) and
  {art_small["mu_req"]:.1f} in a key of {art_small["n"]} entries by MEMORY USAGE (the issue:
  72.8). At {big:,} keys × 10 our log takes
  {log10["delta_req"] / find(scale, "article", big, 10)["delta_req"] * 100:.0f}% of the
  article's memory.
- **sliding_counter**: {span(min(r["mu_key"] for r in ctr), max(r["mu_key"] for r in ctr))}
  bytes per key by MEMORY USAGE, {span(min(r["delta_key"] for r in ctr if r["keys"] >= 1000), max(r["delta_key"] for r in ctr if r["keys"] >= 1000))}
  by used_memory Δ (rows with ≥ 1,000 keys), whatever the limit (up to
  {BIG_LIMITS[-1]:,}). Its value is 9 bytes, `struct.pack('<BI4I4', window index % 256,
  current, previous)`: the same length for any count.
- **gcra**: {span(min(r["mu_key"] for r in gcra), max(r["mu_key"] for r in gcra))}
  bytes per key by MEMORY USAGE, {span(min(r["delta_key"] for r in gcra if r["keys"] >= 1000), max(r["delta_key"] for r in gcra if r["keys"] >= 1000))}
  by used_memory Δ, whatever the limit. Its value is the TAT exactly, as whole ms plus a
  remainder r in 1/limit ms: 12 bytes, `struct.pack('<dI4', ms, r)`.
- **Value length matters** for the string keys: up to 12 bytes a value shares one 32-byte
  allocation with its object header, 13–28 bytes take 48, and an integer is stored in the
  object itself. Both packed values fit in the 32-byte class whatever the limit; the text
  formats they replaced (`<window>:<current>:<previous>`, the TAT as `%.17g`) took 48 as soon
  as they passed 12 characters: a counter from 1,000 requests in a 1 h window or from 10 in a
  60 s window, and every gcra TAT with decimals. MEMORY USAGE of `rl:api:10.0.0.1` holding:

  | value | shape | encoding | MEMORY USAGE |
  |---|---|---|---:|
{probe_rows}

- **Goal "< 100 bytes per key"** (counter, gcra): by MEMORY USAGE
  **{"met" if max(r["mu_key"] for r in ctr + gcra) < 100 else "NOT met"}**
  (max {max(r["mu_key"] for r in ctr + gcra):.0f} over every row, {big_mu:.0f} at limits
  {", ".join("{:,}".format(l) for l in BIG_LIMITS)}), for key names like these
  (`rl:api:10.x.y.z`, 15–17 bytes): a longer zone name or key adds its length, by allocation
  size classes. By used_memory Δ
  **{"met" if max(r["delta_key"] for r in ctr + gcra if r["keys"] >= 1000) < 100 else "NOT met"}**,
  and not reachable with one Redis key per limited key: Redis's own floor for a key with a TTL
  (`SET rl:api:10.x.y.z 1 PX …`, row "floor") is already {floor["delta_key"]:.0f} bytes by
  used_memory Δ ({floor["mu_key"]:.0f} by MEMORY USAGE): the key's dict entry and name, the
  value object, the expiry entry and both hash tables' buckets. The counter adds
  {find(scale, "c", big, 1)["delta_key"] - floor["delta_key"]:.0f} bytes to that floor and gcra
  {find(scale, "g", big, 1)["delta_key"] - floor["delta_key"]:.0f}.
  (used_memory Δ rows with few keys, N ≥ 1,000, are within a few kB of noise per key.)

## `zset-max-listpack-entries` at 1,000+ entries per key

Past {lp_entries} entries (or a member longer than {lp_value} bytes) a sorted set is
converted to a skiplist plus a hash table: every entry becomes an sds string, a skiplist node
and a dict entry. Raising the limit above the entries per key keeps the compact listpack, at
the price of O(N) work per insert and per prune (one memmove of the listpack), which shows
in the script's time per call:

| zset-max-listpack-entries | algorithm | requests/key | encoding | MEMORY USAGE /request | used_memory Δ /request | µs/call |
|---:|---|---:|---|---:|---:|---:|
{lp_rows}

## Guidance

- **sliding_log**: exact; memory grows with the admitted requests in the window. Up to 128
  entries per key (the default listpack limit) an entry costs ~20 bytes plus ~{find(scale, "l", big, 1)["delta_key"]:.0f}
  bytes per key: {log10["delta_req"]:.0f} bytes per entry at 10 per key, ~{find(per_key, "l", 100_000 // 100 // div, 100)["delta_req"]:.0f}
  at 100 per key, less than half the article's format. Past 128 entries the sorted set becomes
  a skiplist and each entry costs ~{find(per_key, "l", 100_000 // 1000 // div, 1000)["delta_req"]:.0f}–{find(per_key, "l", 100_000 // 10000 // div, 10000)["delta_req"]:.0f}
  bytes ({find(per_key, "l", 100_000 // 1000 // div, 1000)["mu_key"] / 1e3:.0f} kB per saturated key at limit 1,000,
  {find(per_key, "l", 100_000 // 10000 // div, 10000)["mu_key"] / 1e6:.1f} MB at 10,000). Use it
  for limits up to ~100 per window, or when exactness and an audit trail of admitted
  requests are worth the memory; avoid it for limits in the thousands over many keys.
- **sliding_counter** and **gcra**: one packed string of a fixed length per key (9 and 12
  bytes) whatever the limit,
  ~{span(*sorted((find(scale, "c", big, 10)["delta_key"], find(scale, "g", big, 10)["delta_key"])))} bytes per key in
  production terms (a million keys ≈ {find(scale, "g", big, 10)["delta_key"] * 1e6 / 2**20:.0f} MiB): the
  choice for large limits or many keys. gcra is exact for a rate with a burst; the counter
  approximates a rolling window (bench/accuracy.md: how far it can be off).
- **zset-max-listpack-entries** raised above the limit keeps the log at ~20 bytes per entry
  even at 1,000–10,000 entries per key, but each decision then costs time proportional to
  the entries (µs/call above) and the setting is server-wide (all sorted sets). Prefer the
  counter or gcra for such limits; raise it only for a dedicated Redis and limits of a few
  hundred.
"""
    md = reflow(md)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
