#!/usr/bin/env python3
"""How far sliding_counter is from the exact sliding_log, on replayed traces.

Starts its own redis-server on a free 127.0.0.1 port, loads the decision script as
src/decide/script/mod.rs assembles it, and replays request traces with an injected clock: every
request is decided twice, by sliding_counter ("c") and by sliding_log ("l"), same limit,
same window, same timestamp, separate keys (two single-zone EVALSHA calls, pipelined). Each
limiter keeps its own history, as two deployments would.

Reports per trace: the decisions that differ (false admits: the counter admits what the log
denies; false denies: the reverse), as counts and % of requests, and the largest number of
requests the counter admitted in any rolling window (t - window, t], against the limit:
how far over the limit it can go. The log's figure is the sanity check (never over).

Traces (fixed seed, so every run replays the same requests), limit 100 per 60 s:
  steady-0.9x  a request every 667 ms (just under the limit's rate)
  steady-2x    a request every 300 ms
  poisson-1.5x Poisson arrivals at 1.5x the limit's rate
  bursty       bursts of 50..200 requests ~20 ms apart, Poisson gaps (mean 60 s)
  boundary     a client that knows the counter's window edges: 100 requests in the last
               second of a window, then one every 100 ms through the next window, then a
               quiet window (the counter's worst case)

Writes bench/accuracy.md and prints it. Python 3 standard library only; shares the Redis and
script helpers of bench/memory.py.

Usage: bench/accuracy.py [--out bench/accuracy.md] [--seed 42] [--redis-server redis-server]
"""

import argparse
import os
import random
import sys
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memory as M  # noqa: E402

LIMIT = 100
WINDOW = 60_000
T0 = (1_700_000_000_000 // WINDOW + 1) * WINDOW     # a window start
MAX_REQUESTS = 50_000                               # every trace is bounded


def steady(interval, n):
    return [T0 + round(i * interval) for i in range(n)]


def poisson(rng, rate_per_ms, n):
    t, out = float(T0), []
    for _ in range(n):
        t += rng.expovariate(rate_per_ms)
        out.append(int(t))
    return out


def bursty(rng, n):
    t, out = float(T0), []
    while len(out) < n:
        for _ in range(rng.randint(50, 200)):
            t += rng.expovariate(1 / 20)
            out.append(int(t))
        t += rng.expovariate(1 / 60_000)
    return out[:n]


def boundary(n):
    out, w = [], T0 // WINDOW
    while len(out) < n:
        end = (w + 1) * WINDOW                      # the end of window w
        out.extend(end - 1000 + 10 * i for i in range(LIMIT))
        out.extend(end + 100 * i for i in range(WINDOW // 100))
        w += 3                                      # window w+2 stays quiet
    return out[:n]


def traces(seed):
    rng = random.Random(seed)
    rate = LIMIT / WINDOW                           # the limit's rate, per ms
    return [
        ("steady-0.9x", "a request every 667 ms (0.9x the limit's rate)", steady(667, 12_000)),
        ("steady-2x", "a request every 300 ms (2x)", steady(300, 12_000)),
        ("poisson-1.5x", "Poisson arrivals, mean rate 1.5x", poisson(rng, 1.5 * rate, 12_000)),
        ("bursty", "bursts of 50..200 requests ~20 ms apart, gaps ~60 s (Poisson)", bursty(rng, 12_000)),
        ("boundary", "100 requests in a window's last second, then 1 per 100 ms for a window, "
                     "then a quiet window", boundary(12_000)),
    ]


def max_in_window(admitted, window):
    """The most timestamps in any (t - window, t] (an entry at s counts while t < s + window)."""
    q, best, over = deque(), 0, 0
    for t in admitted:
        q.append(t)
        while q[0] <= t - window:
            q.popleft()
        best = max(best, len(q))
        if len(q) > LIMIT:
            over += 1
    return best, over


def needless_denies(trace, decisions, window):
    """Denials although the limiter's own admitted requests in (t - window, t] left room
    (the log's sanity check: an exact rolling window has none)."""
    q, n = deque(), 0
    for t, a in zip(trace, decisions):
        while q and q[0] <= t - window:
            q.popleft()
        if a:
            q.append(t)
        elif len(q) < LIMIT:
            n += 1
    return n


def replay(client, sha, name, trace):
    assert len(trace) <= MAX_REQUESTS and trace == sorted(trace)
    kc, kl = "rl:acc:%s:c" % name, "rl:acc:%s:l" % name
    cmds = []
    for t in trace:
        cmds.append(M.encode(["EVALSHA", sha, 1, kc, t, "c", LIMIT, WINDOW, 1, 0]))
        cmds.append(M.encode(["EVALSHA", sha, 1, kl, t, "l", LIMIT, WINDOW, 1, 0]))
    replies = client.pipeline(cmds)
    for r in replies:
        if isinstance(r, M.RedisError):
            raise SystemExit("script error: %s" % r)
    c = [r[0] for r in replies[0::2]]
    l = [r[0] for r in replies[1::2]]
    n = len(trace)
    false_admit = sum(1 for a, b in zip(c, l) if a and not b)
    false_deny = sum(1 for a, b in zip(c, l) if b and not a)
    c_max, c_over = max_in_window([t for t, a in zip(trace, c) if a], WINDOW)
    l_max, l_over = max_in_window([t for t, a in zip(trace, l) if a], WINDOW)
    return {
        "name": name, "n": n, "span_s": (trace[-1] - trace[0]) / 1000,
        "c_adm": sum(c), "l_adm": sum(l), "fa": false_admit, "fd": false_deny,
        "c_max": c_max, "l_max": l_max, "c_over": c_over, "l_over": l_over,
        "l_needless": needless_denies(trace, l, WINDOW),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(M.ROOT, "bench", "accuracy.md"))
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--redis-server", default="redis-server")
    a = ap.parse_args()
    M.install_signal_cleanup()

    server = M.RedisServer(a.redis_server)
    c = server.client
    version = c.info("server")["redis_version"]
    sha = c.cmd("SCRIPT", "LOAD", M.script_text())
    rows, desc = [], []
    for name, what, trace in traces(a.seed):
        r = replay(c, sha, name, trace)
        rows.append(r)
        desc.append("- `%s`: %s; %s requests over %.0f s." % (name, what, "{:,}".format(r["n"]), r["span_s"]))
        print(r, flush=True)
    # The keys live for a window of Redis's real time after their last write; a replay
    # takes seconds, but say so if one expired mid-trace (the figures would be wrong).
    expired = int(c.info("stats")["expired_keys"])
    server.stop()
    if expired:
        raise SystemExit("%d keys expired during the replay: results invalid" % expired)

    def pct(x, n):
        return "%.2f%%" % (100.0 * x / n)

    for r in rows:
        # An exact log never exceeds the limit and never denies with room left.
        if r["l_over"] or r["l_needless"] or r["l_max"] > LIMIT:
            raise SystemExit("sliding_log is not exact on %s: %r" % (r["name"], r))
    table = "\n".join(
        "| %s | %s | %s | %s (%+.1f%%) | %d (%s) | %d (%s) | %d (%s) | %d (%s) | %d | **%d** |" % (
            r["name"], "{:,}".format(r["n"]), "{:,}".format(r["l_adm"]), "{:,}".format(r["c_adm"]),
            100.0 * (r["c_adm"] - r["l_adm"]) / r["l_adm"],
            r["fa"] + r["fd"], pct(r["fa"] + r["fd"], r["n"]), r["fa"], pct(r["fa"], r["n"]),
            r["fd"], pct(r["fd"], r["n"]), r["c_over"], pct(r["c_over"], r["n"]),
            r["l_max"], r["c_max"])
        for r in rows)
    tot_n = sum(r["n"] for r in rows)
    tot_fa = sum(r["fa"] for r in rows)
    tot_fd = sum(r["fd"] for r in rows)
    tot_over = sum(r["c_over"] for r in rows)
    R = {r["name"]: r for r in rows}

    def pct_adm(r):
        return "%.0f%%" % (100.0 * r["c_adm"] / r["l_adm"])
    md = f"""# sliding_counter against the exact sliding_log (`bench/accuracy.py`)

Redis {version}, the decision script as `src/decide/script/mod.rs` assembles it (commit {M.git_rev()}),
injected clock. Limit
{LIMIT} per {WINDOW // 1000} s; every request of a trace is decided by both algorithms at the
same timestamp, each on its own key with its own history. Seed {a.seed}.

{chr(10).join(desc)}

| trace | requests | log admits | counter admits (vs log) | decisions differing | false admits (counter yes, log no) | false denies (counter no, log yes) | counter admits over the limit | log max in any {WINDOW // 1000} s | counter max in any {WINDOW // 1000} s |
|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|
{table}

The limit is {LIMIT}. Columns:

- *decisions differing / false admits / false denies*: request by request, the counter's
  decision against the log's, each with its own history. When a client saturates the limit
  the two admit about as many requests but not the same ones (a phase shift: the counter
  admits request i, the log request i+1), so these counts overstate the error there; the next
  columns do not.
- *counter admits over the limit*: counter admissions after which the counter's own admitted
  requests in the rolling window (t − {WINDOW // 1000} s, t] number more than {LIMIT}.
  The log has none on every trace (checked).
- *max in any {WINDOW // 1000} s*: the most admitted requests in any rolling window.

Over all traces: {tot_fa + tot_fd:,} of {tot_n:,} decisions differ from the log's
({pct(tot_fa + tot_fd, tot_n)}: {tot_fa:,} false admits, {tot_fd:,} false denies); against the
exact rule on its own history the counter admitted {tot_over:,} requests over the limit
({pct(tot_over, tot_n)} of all requests).

The counter keeps two fixed-window counts and assumes the previous window's requests were
spread evenly over it, weighting them by the share of the rolling window that still overlaps
it. With steady traffic the assumption holds: below the limit it agrees with the log on every
decision, and a client at 2× the limit gets {pct_adm(R["steady-2x"])} of what the log admits,
never more than {R["steady-2x"]["c_max"]} in any {WINDOW // 1000} s (the request-by-request
differences there are a phase shift, not extra admissions). Random (Poisson) traffic already
breaks it a little: up to {R["poisson-1.5x"]["c_max"]} in a rolling window. Bursts break it:
requests bunched at the end of the previous window are all still inside the rolling window,
but the counter counts only the fraction the overlap gives them, so it admits more (false
admits); requests bunched at its start have already left, but it still counts part of them
(false denies). On the bursty trace it admitted {pct_adm(R["bursty"])} of the log's total and
up to {R["bursty"]["c_max"]} requests in {WINDOW // 1000} s. The worst case is a client that
fills the end of one window and keeps asking through the next (`boundary`):
**{R["boundary"]["c_max"]} requests in {WINDOW // 1000} s against a limit of {LIMIT}**, close to
2× the limit, the bound of this estimate. The log never exceeds the limit. Use the counter
where an overshoot of up to 2× for bursty clients is acceptable and memory per key matters;
use the log (small limits) or gcra (exact, O(1) memory, a rate with a burst) where the limit
must hold in every rolling window.
"""
    md = M.reflow(md)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
