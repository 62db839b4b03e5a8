"""User-space instructions a redis-server spends on a command, counted by valgrind's callgrind:
the same every run whatever else the machine does (system calls are not counted), so scripts
can be compared on a busy machine. Shared by bench/cluster-cost.py and bench/script-cost.py.

A fresh redis-server under `valgrind --tool=callgrind` (its own directory, no persistence) on
a unix socket of its own (a cluster-enabled one on a free loopback port), driven by
redis-benchmark on one connection, `DEPTH` calls deep, `__rand_int__` drawing keys among `keys`;
counted from after a warm-up of a quarter of the calls (callgrind_control -z) to a dump after
the measured ones. Python 3 standard library, plus valgrind, callgrind_control and
redis-benchmark on the PATH.
"""

import os
import shutil
import subprocess
import tempfile
import time

import memory as M

DEPTH = 32


def cluster_ok(c, seconds=10):
    deadline = time.time() + seconds
    while "cluster_state:ok" not in c.cmd("CLUSTER", "INFO"):
        if time.time() > deadline:
            raise SystemExit("the one-node cluster is not ok:\n%s" % c.cmd("CLUSTER", "INFO"))
        time.sleep(0.1)


def instructions_per_call(script, command, calls, keys, cluster=False, check=None, load=None,
                          keep=None, server=None):
    """Instructions per call of `command(sha)` (an argument list for redis-benchmark), the
    script loaded first. `check(client, sha)`, if given, runs after the count (e.g. that the
    calls were admitted). Any failed EVALSHA (or FCALL) call ends the run: the figure would lie.
    `load(client, script)`, if given, loads the script instead of SCRIPT LOAD and returns what
    `command` is given (e.g. FUNCTION LOAD, for FCALL). `keep`: a path the callgrind output is
    copied to, for callgrind_annotate. `server`: the redis-server binary (default: $REDIS_SERVER,
    else redis-server on the PATH)."""
    server = server or os.environ.get("REDIS_SERVER", "redis-server")
    d = tempfile.mkdtemp(prefix="rl-bench-cg.")
    out = os.path.join(d, "callgrind.out")
    # A unix socket: no other process can take it or reach this server by mistake.
    if cluster:
        port = M.free_port()
        listen = ["--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                  "--cluster-config-file", "nodes.conf", "--cluster-port", str(M.free_port())]
        target = ["-h", "127.0.0.1", "-p", str(port)]
    else:
        port = os.path.join(d, "redis.sock")
        listen = ["--port", "0", "--unixsocket", port]
        target = ["-s", port]
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out,
                             server, "--save", "", "--appendonly", "no", "--dir", d]
                            + listen,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                c = M.Client(port)
                # Ours, not a server that took the port first (free_port only found it free).
                if int(c.info("server")["process_id"]) != proc.pid:
                    raise SystemExit("%s: another redis-server answers" % port)
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise SystemExit("redis-server under callgrind did not start")
                time.sleep(0.2)
        if cluster:
            c.cmd("CLUSTER", "ADDSLOTSRANGE", "0", "16383")
            cluster_ok(c, 60)
        sha = load(c, script) if load else c.cmd("SCRIPT", "LOAD", script)
        cmd = command(sha)
        # Whole pipelines: a last pipeline that overshoots -n leaves redis-benchmark's finished
        # count past -n, which its once-a-250-ms check can take for lost clients ("All clients
        # disconnected... aborting": 3 runs in about 150 here, all with -n not a multiple).
        calls = max(calls + (-calls) % DEPTH, DEPTH)

        def bench(n):
            n += (-n) % DEPTH
            r = subprocess.run(["redis-benchmark"] + target + ["-c", "1", "-P", str(DEPTH), "-r",
                                                               str(keys), "-n", str(n), "-q"] + cmd,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if r.returncode != 0:
                raise SystemExit("%s under callgrind: redis-benchmark failed: %s" % (
                    cmd[3:8], r.stderr.strip()[-300:]))

        bench(calls // 4)
        subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        bench(calls)
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stats = c.info("commandstats")
        for name in ("evalsha", "fcall"):
            st = dict(f.split("=", 1) for f in stats.get("cmdstat_" + name, "").split(",") if f)
            if st.get("failed_calls", "0") != "0" or st.get("rejected_calls", "0") != "0":
                raise SystemExit("%s under callgrind: %s %s calls failed" % (
                    cmd[3:8], st.get("failed_calls", "?"), name.upper()))
        if check:
            check(c, sha)
        total = None
        with open(out + ".1") as f:
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    total = int(line.split()[1])
        if total is None:
            raise SystemExit("no totals in %s.1" % out)
        if keep:
            shutil.copyfile(out + ".1", keep)
        return total / calls
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(d, ignore_errors=True)


def write_report(path, lines):
    """The report's lines to `path`, and to stdout for whoever ran it."""
    text = "\n".join(lines) + "\n"
    with open(path, "w") as fh:
        fh.write(text)
    print(text)
