#!/usr/bin/env bash
# Topology benchmark (issue 11): what a decision costs in nginx and in Redis when Redis is one
# server over plain TCP, a 3-primary Redis Cluster, or one server over TLS, and what the Cluster's
# cost is made of: Cluster mode alone (one node), the spread over three servers alone. A sibling of
# bench/compare.sh (same nginx, module, wrk script and measurements), for the module's allow
# path only: X-Consumer-Id rotating over IDS ids, the limit (100 per 60 s) never reached.
#
# Variants, all started once at the beginning and all kept running (an idle one costs nothing
# measurable), each with its own nginx instance on its own port:
#   plain    one redis-server over TCP        ratelimit_redis 127.0.0.1:P;
#   cluster  3 primaries, no replicas          ratelimit_redis 127.0.0.1:P1 127.0.0.1:P2 cluster=on;
#            (redis-cli --cluster create ... --cluster-replicas 0; cluster bus on its own
#            free port, --cluster-port)
#   cluster1 1 primary holding all 16384 slots   ratelimit_redis 127.0.0.1:P cluster=on;
#            (CLUSTER ADDSLOTSRANGE 0 16383): cluster mode and the module's Cluster path, every
#            key on one process as in plain; set against cluster it tells what the spread over
#            three processes costs apart from what Cluster mode costs
#   plain3   three redis-servers over TCP, each id on one of them (split_clients, a zone per
#            server with `redis=`, the two others' keys empty): the spread over three processes
#            without Cluster mode
#   tls      one redis-server, --port 0 --tls-port P, a throw-away CA and server certificate
#            made with openssl at start
#                                              ratelimit_redis 127.0.0.1:P ssl=on
#                                                  ssl_trusted_certificate=ca.crt ssl_name=redis.test;
# If the module refuses `ssl=on` (built before TLS support), the tls variant is reported as not
# measured, with nginx -t's reason, and the others run.
#
# Every run: FLUSHALL (every node), WARMUP seconds of the same load (connection pools full, TLS
# handshakes done), then DURATION seconds measured. Variants are interleaved in every round, the
# order rotated by one each round. Per run: wrk's requests/s and p99; the nginx workers' CPU
# (/proc/<pid>/stat) per request nginx counted (stub_status); Redis CPU (INFO cpu,
# used_cpu_user + used_cpu_sys) and script calls (INFO commandstats, EVALSHA + EVAL) summed over
# the variant's nodes, per decision the module counted (ratelimit_metrics, status PASSED). The
# report quotes each variant against plain as per-round ratios (the runs of one round are
# seconds apart): on a shared 2-core machine absolute figures move with everything else. Also
# recorded: Redis connections opened during and open after each run (ratelimit_metrics), the
# CPU other processes took (/proc/stat), and, once before nginx starts, what the idle Redis
# servers cost (a cluster's bus), which is part of every Redis figure.
#
# Writes bench/topology.md (bench/topology_report.py), bench/topology.tsv (raw rows) and
# bench/topology.meta.tsv (environment).
#
# Usage:  bench/topology.sh          (make bench-topology builds the module first)
# Environment (defaults):
#   VARIANTS="plain cluster cluster1 plain3 tls"  WORKER_COUNTS="1" (e.g. "1 2")
#   DURATION=10 ROUNDS=5 WARMUP=2 (seconds, rounds)  THREADS=2 CONNS=64 (wrk)  IDS=10000
#   NGINX=/usr/sbin/nginx MODULE=build/system/ngx_http_ratelimit_module.so (`make build-system`),
#   absolute paths; an nginx with stub_status (the vendored build/nginx has none)
#   KEEP_TMP=1 keeps the temporary directory (configurations, logs, certificates)
# The default run takes about 7 minutes (25 runs of ~13 s, plus start-up); each worker count
# added to WORKER_COUNTS adds as much again.
#
# Loopback only, free ports, every loop bounded, everything started here stopped on exit.

set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
die() { echo "topology: error: $*" >&2; exit 1; }
say() { echo "topology: $*" >&2; }
. "$ROOT/bench/lib.sh"
BENCH=$ROOT/bench
NGINX=${NGINX:-/usr/sbin/nginx}
MODULE=${MODULE:-$ROOT/build/system/ngx_http_ratelimit_module.so}
VARIANTS=${VARIANTS:-plain cluster cluster1 plain3 tls}
WORKER_COUNTS=${WORKER_COUNTS:-1}
THREADS=${THREADS:-2}
CONNS=${CONNS:-64}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-5}
WARMUP=${WARMUP:-2}
IDS=${IDS:-10000}
OUT_MD=${OUT_MD:-$BENCH/topology.md}
OUT_TSV=${OUT_TSV:-$BENCH/topology.tsv}
LIMIT=100
WINDOW=60s
CLUSTER_NODES=3
IDLE_SECONDS=5
TLS_NAME=redis.test

# --- checks -----------------------------------------------------------------------------------
for c in wrk redis-server redis-cli curl timeout python3 pgrep getconf sha256sum openssl; do
    command -v "$c" >/dev/null || case "$c" in
        wrk) die "'wrk' not found (Debian: apt-get install wrk)" ;;
        redis-server|redis-cli) die "'$c' not found (Debian: apt-get install redis-server redis-tools)" ;;
        openssl) die "'openssl' not found (Debian: apt-get install openssl); needed for the tls variant's certificates" ;;
        *) die "'$c' not found (Debian: apt-get install curl python3 procps coreutils)" ;;
    esac
done
[ -x "$NGINX" ] || die "$NGINX not found (Debian: apt-get install nginx), or set NGINX=build/nginx after 'make build'"
[ -f "$MODULE" ] || die "module $MODULE not found: run 'make build-system' (or set MODULE= to one built for $NGINX)"
[ -f "$BENCH/compare_wrk.lua" ] || die "$BENCH/compare_wrk.lua missing"
[ -f "$BENCH/topology_report.py" ] || die "$BENCH/topology_report.py missing"
case "$ROUNDS$DURATION$WARMUP$THREADS$CONNS$IDS" in *[!0-9]*) die "ROUNDS, DURATION, WARMUP, THREADS, CONNS, IDS must be integers";; esac
[ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 20 ] || die "ROUNDS must be 1..20"
[ "$DURATION" -ge 1 ] && [ "$DURATION" -le 300 ] || die "DURATION must be 1..300 seconds"
[ "$WARMUP" -le 60 ] || die "WARMUP must be 0..60 seconds"
[ "$THREADS" -ge 1 ] && [ "$CONNS" -ge "$THREADS" ] || die "THREADS must be ≥ 1 and CONNS ≥ THREADS"
[ "$IDS" -ge 1000 ] || die "IDS must be at least 1000 (with fewer ids the allow path reaches the limit of $LIMIT per $WINDOW)"
declare -a VLIST=()
for v in $VARIANTS; do
    case "$v" in plain|cluster|cluster1|plain3|tls) ;; *) die "unknown variant '$v' in VARIANTS (plain, cluster, cluster1, plain3, tls)";; esac
    case " ${VLIST[*]:-} " in *" $v "*) ;; *) VLIST+=("$v");; esac
done
[ "${#VLIST[@]}" -ge 1 ] || die "VARIANTS is empty"
case " ${VLIST[*]} " in *" plain "*) ;; *) say "no plain variant: the report has no ratios";; esac
declare -a WLIST=()
for w in $WORKER_COUNTS; do
    case "$w" in 1|2|3|4) WLIST+=("$w");; *) die "WORKER_COUNTS: '$w' is not 1..4";; esac
done
[ "${#WLIST[@]}" -ge 1 ] || die "WORKER_COUNTS is empty"
has() { case " ${VLIST[*]} " in *" $1 "*) return 0;; esac; return 1; }
if has tls; then
    # Not `redis-cli --help | grep -q`: grep's early exit would fail the pipe (pipefail).
    case "$(redis-cli --help 2>&1 || true)" in *--tls*) ;; *) false;; esac \
        || die "this redis-cli has no --tls (Debian's redis-tools 7 has it); or leave tls out of VARIANTS"
fi

# --- processes --------------------------------------------------------------------------------
tmp=$(mktemp -d /tmp/ngx-ratelimit-topology.XXXXXX)
declare -a REDIS_PIDS=()
declare -A NPORT=() WORKERS_OF=() SKIPPED=()
stop_nginx() { stop_nginx_pidfile "$tmp/$1/nginx.pid"; }  # stop_nginx variant
cleanup() {
    local v pid
    for v in plain cluster cluster1 plain3 tls; do stop_nginx "$v"; done
    for pid in "${REDIS_PIDS[@]}"; do stop_pid "$pid"; done
    if [ -n "${KEEP_TMP:-}" ]; then say "kept $tmp (KEEP_TMP)"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# new_port: a free port, none handed out before, in $PORT (not $(...): the list must persist).
USED_PORTS=""
new_port() {
    # shellcheck disable=SC2086
    PORT=$(free_port $USED_PORTS) || exit 1
    USED_PORTS+=" $PORT"
}

# Ports of each variant's Redis nodes (client ports).
declare -A RPORTS=()
declare -a CLUSTER_BUS=()
for v in "${VLIST[@]}"; do
    case "$v" in
        plain|tls) new_port; RPORTS[$v]=$PORT ;;
        cluster1) new_port; RPORTS[$v]=$PORT; new_port; CLUSTER1_BUS=$PORT ;;
        plain3)
            RPORTS[$v]=""
            for _ in 1 2 3; do new_port; RPORTS[$v]+="$PORT "; done
            RPORTS[$v]=${RPORTS[$v]% } ;;
        cluster)
            RPORTS[$v]=""
            for _ in $(seq 1 "$CLUSTER_NODES"); do
                new_port; RPORTS[$v]+="$PORT "
                new_port; CLUSTER_BUS+=("$PORT")
            done
            RPORTS[$v]=${RPORTS[$v]% } ;;
    esac
    new_port; NPORT[$v]=$PORT
done

# redis-cli for a variant's node: vcli variant port args...
vcli() {
    local v=$1 p=$2; shift 2
    if [ "$v" = tls ]; then
        timeout 10 redis-cli --tls --cacert "$tmp/tls/ca.crt" --sni "$TLS_NAME" -p "$p" "$@"
    else
        timeout 10 redis-cli -p "$p" "$@"
    fi
}
wait_ping() {  # wait_ping variant port log
    for _ in $(seq 1 50); do [ "$(vcli "$1" "$2" ping 2>/dev/null)" = PONG ] && return 0; sleep 0.1; done
    cat "$3" >&2
    die "redis-server for $1 on port $2 did not start"
}
start_redis() {  # start_redis variant port dir extra-args...
    local v=$1 p=$2 d=$3; shift 3
    mkdir -p "$d"
    redis-server --bind 127.0.0.1 --save '' --appendonly no --dir "$d" --logfile "$d/redis.log" "$@" &
    REDIS_PIDS+=("$!")
    wait_ping "$v" "$p" "$d/redis.log"
}

if has plain; then
    start_redis plain "${RPORTS[plain]}" "$tmp/redis-plain" --port "${RPORTS[plain]}"
fi

if has cluster; then
    i=0; seeds=()
    for p in ${RPORTS[cluster]}; do
        start_redis cluster "$p" "$tmp/redis-cluster-$p" --port "$p" --cluster-enabled yes \
            --cluster-port "${CLUSTER_BUS[$i]}" --cluster-config-file "$tmp/redis-cluster-$p/nodes.conf" \
            --cluster-node-timeout 5000
        seeds+=("127.0.0.1:$p"); i=$((i + 1))
    done
    timeout 60 redis-cli --cluster create "${seeds[@]}" --cluster-replicas 0 --cluster-yes \
        > "$tmp/cluster-create.log" 2>&1 || { cat "$tmp/cluster-create.log" >&2; die "redis-cli --cluster create failed"; }
    # Every node must see the whole cluster (all slots, all nodes) before nginx asks one of them
    # for CLUSTER SLOTS.
    ok=0
    for _ in $(seq 1 100); do
        ok=1
        for p in ${RPORTS[cluster]}; do
            info=$(vcli cluster "$p" cluster info 2>/dev/null | tr -d '\r') || { ok=0; break; }
            grep -q '^cluster_state:ok' <<< "$info" && grep -q "^cluster_known_nodes:$CLUSTER_NODES\$" <<< "$info" \
                && grep -q '^cluster_slots_assigned:16384' <<< "$info" || { ok=0; break; }
        done
        [ "$ok" = 1 ] && break
        sleep 0.1
    done
    [ "$ok" = 1 ] || die "the cluster did not reach cluster_state:ok with $CLUSTER_NODES known nodes on every node within 10 s"
fi

if has plain3; then
    for p in ${RPORTS[plain3]}; do start_redis plain3 "$p" "$tmp/redis-plain3-$p" --port "$p"; done
fi

if has cluster1; then
    p=${RPORTS[cluster1]}
    start_redis cluster1 "$p" "$tmp/redis-cluster1" --port "$p" --cluster-enabled yes \
        --cluster-port "$CLUSTER1_BUS" --cluster-config-file "$tmp/redis-cluster1/nodes.conf" \
        --cluster-node-timeout 5000
    vcli cluster1 "$p" cluster addslotsrange 0 16383 > /dev/null || die "CLUSTER ADDSLOTSRANGE on cluster1 failed"
    for _ in $(seq 1 100); do
        vcli cluster1 "$p" cluster info 2>/dev/null | tr -d '\r' | grep -q '^cluster_state:ok' && break
        sleep 0.1
    done
    vcli cluster1 "$p" cluster info 2>/dev/null | tr -d '\r' | grep -q '^cluster_state:ok' \
        || die "the one-node cluster did not reach cluster_state:ok within 10 s"
fi

if has tls; then
    d=$tmp/tls; mkdir -p "$d"
    {
        openssl req -x509 -newkey rsa:2048 -nodes -keyout "$d/ca.key" -out "$d/ca.crt" -days 2 -subj "/CN=ngx-ratelimit bench CA" \
        && openssl req -newkey rsa:2048 -nodes -keyout "$d/redis.key" -out "$d/redis.csr" -subj "/CN=$TLS_NAME" \
        && printf 'subjectAltName=DNS:%s,IP:127.0.0.1\n' "$TLS_NAME" > "$d/san.ext" \
        && openssl x509 -req -in "$d/redis.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
               -out "$d/redis.crt" -days 2 -extfile "$d/san.ext"
    } > "$d/openssl.log" 2>&1 || { cat "$d/openssl.log" >&2; die "openssl could not make the test certificates"; }
    # Absolute paths: Redis resolves tls-* files after changing into --dir.
    start_redis tls "${RPORTS[tls]}" "$tmp/redis-tls" --port 0 --tls-port "${RPORTS[tls]}" \
        --tls-cert-file "$d/redis.crt" --tls-key-file "$d/redis.key" --tls-ca-cert-file "$d/ca.crt" \
        --tls-auth-clients no
fi

nodes() { echo "${RPORTS[$1]}"; }
flushall() {  # every node of a variant (a cluster's primaries each hold their slots' keys)
    local p
    for p in $(nodes "$1"); do vcli "$1" "$p" flushall >/dev/null || die "FLUSHALL on $1 node $p failed"; done
}

# What the servers cost with nothing to do (cron at hz 10; a cluster's bus pings and gossip):
# part of every measured Redis CPU figure, reported beside it. Milliseconds of CPU per second.
declare -A IDLE_MS=()
idle_cpu() {
    local v
    for v in "${VLIST[@]}"; do redis_snapshot "$v" "$tmp/idle0-$v"; done
    sleep "$IDLE_SECONDS"
    for v in "${VLIST[@]}"; do
        redis_snapshot "$v" "$tmp/idle1-$v"
        IDLE_MS[$v]=$(redis_delta "$tmp/idle0-$v" "$tmp/idle1-$v" | awk -v s="$IDLE_SECONDS" '{ printf "%.2f", $1 * 1000 / s }')
    done
}

page=$(printf '<!DOCTYPE html>\n<html><head><title>bench</title></head><body>\n%s\n</body></html>\n' \
       "$(head -c 450 /dev/zero | tr '\0' 'x')")

redis_directive() {
    case "$1" in
        plain) echo "ratelimit_redis 127.0.0.1:${RPORTS[plain]};" ;;
        cluster)
            local p a=""
            for p in $(nodes cluster); do a+="127.0.0.1:$p "; done
            echo "ratelimit_redis ${a}cluster=on;" ;;
        cluster1) echo "ratelimit_redis 127.0.0.1:${RPORTS[cluster1]} cluster=on;" ;;
        plain3)
            local p i=0
            for p in $(nodes plain3); do echo "ratelimit_redis 127.0.0.1:$p name=s$i;"; i=$((i + 1)); done ;;
        tls) echo "ratelimit_redis 127.0.0.1:${RPORTS[tls]} ssl=on ssl_trusted_certificate=$tmp/tls/ca.crt ssl_name=$TLS_NAME;" ;;
    esac
}

# The zones: one, named bench; plain3 has a zone per server (bench0..2, `redis=`), and each id
# a key in one of them only (an empty key is not limited), so each decision goes to one server.
zones() {
    if [ "$1" = plain3 ]; then
        printf '    split_clients "$http_x_consumer_id" $bench_shard { 33.3%% 0; 33.3%% 1; * 2; }\n'
        for i in 0 1 2; do
            printf '    map $bench_shard $bench_key%s { %s $http_x_consumer_id; default ""; }\n' "$i" "$i"
            printf '    ratelimit_zone bench%s key=$bench_key%s limit=%s window=%s redis=s%s;\n' "$i" "$i" "$LIMIT" "$WINDOW" "$i"
        done
    else
        printf '    ratelimit_zone bench key=$http_x_consumer_id limit=%s window=%s;\n' "$LIMIT" "$WINDOW"
    fi
}
limits() {
    if [ "$1" = plain3 ]; then echo "ratelimit bench0; ratelimit bench1; ratelimit bench2;"; else echo "ratelimit bench;"; fi
}

write_conf() {  # write_conf variant workers
    local v=$1 d=$tmp/$1
    mkdir -p "$d/html/module" "$d/logs" "$d/tmp"
    printf '%s' "$page" > "$d/html/module/index.html"
    cat > "$d/nginx.conf" <<EOF
load_module $MODULE;
$(nginx_conf_head "$d" "$2")

    $(redis_directive "$v")
$(zones "$v")
    # A decision Redis does not make is a 503, so it shows as non-2xx instead of passing as a
    # fast "allowed" request.
    ratelimit_fail closed;
    ratelimit_log_level info;
    ratelimit_metrics_zone 64k;

    server {
        listen 127.0.0.1:${NPORT[$v]};
        root $d/html;
        location /module/ { $(limits "$v") }
        location = /topology-status { stub_status; }
        location = /topology-metrics { ratelimit_metrics; }
    }
}
EOF
    chmod -R a+rX "$tmp"
}

# The tls variant on a module without TLS: nginx -t refuses `ssl=on`. Reported, not fatal.
if has tls; then
    write_conf tls 1
    if ! "$NGINX" -p "$tmp/tls/" -c "$tmp/tls/nginx.conf" -t -q 2> "$tmp/tls/nginx-t.log"; then
        if grep -qi 'ssl' "$tmp/tls/nginx-t.log"; then
            SKIPPED[tls]="not measured: this module refuses ssl=on ($(sed -n 's/.*\[emerg\] [0-9]*#[0-9]*: //p' "$tmp/tls/nginx-t.log" | head -n1 | sed "s#$tmp/##"))"
            say "tls variant ${SKIPPED[tls]}"
            VLIST=("${VLIST[@]/tls}"); mapfile -t VLIST < <(printf '%s\n' "${VLIST[@]}" | grep -v '^$')
        else
            cat "$tmp/tls/nginx-t.log" >&2; die "nginx -t failed for the tls variant"
        fi
    fi
fi
[ "${#VLIST[@]}" -ge 1 ] || die "no variant left to measure"

start_nginx() {  # start_nginx variant workers
    local v=$1 d=$tmp/$1 master
    write_conf "$v" "$2"
    "$NGINX" -p "$d/" -c "$d/nginx.conf" -t -q 2> "$d/nginx-t.log" \
        || { cat "$d/nginx-t.log" >&2; die "nginx -t failed for $v"; }
    "$NGINX" -p "$d/" -c "$d/nginx.conf" || { cat "$d/logs/error.log" >&2; die "nginx ($v) did not start"; }
    for _ in $(seq 1 50); do [ -s "$d/nginx.pid" ] && port_in_use "${NPORT[$v]}" && break; sleep 0.1; done
    port_in_use "${NPORT[$v]}" || { cat "$d/logs/error.log" >&2; die "nginx ($v) did not start"; }
    master=$(cat "$d/nginx.pid")
    local -a w=()
    for _ in $(seq 1 50); do
        mapfile -t w < <(pgrep -P "$master")
        [ "${#w[@]}" -eq "$2" ] && break
        sleep 0.1
    done
    [ "${#w[@]}" -eq "$2" ] || die "expected $2 nginx worker(s) for $v, found ${#w[@]}"
    WORKERS_OF[$v]="${w[*]}"
}

base() { echo "http://127.0.0.1:${NPORT[$1]}"; }

# Before anything is measured each variant must really limit through its Redis: the first LIMIT
# requests of one id pass with RateLimit headers, the next is refused, and its key is in Redis.
sanity() {
    local v=$1 url hdrs codes args=() i p k n=0
    flushall "$v"
    url="$(base "$v")/module/index.html"
    hdrs=$(curl -sS -D - -o /dev/null --max-time 5 -H 'X-Consumer-Id: topology-probe' "$url") \
        || die "$v: GET $url failed"
    case "${hdrs%%$'\r'*}" in *' 200'*) ;; *) die "$v: GET $url: ${hdrs%%$'\r'*}; see $tmp/$v/logs/error.log";; esac
    grep -qi "^RateLimit-Limit: *$LIMIT" <<< "$hdrs" \
        || die "$v: GET $url has no 'RateLimit-Limit: $LIMIT' header; see $tmp/$v/logs/error.log"
    for i in $(seq 1 "$LIMIT"); do args+=(-o /dev/null "$url"); done
    codes=$(curl -sS --max-time 30 -w '%{http_code}\n' -H 'X-Consumer-Id: topology-probe' "${args[@]}" | sort | uniq -c | tr -s ' ' | tr '\n' ',')
    [ "$codes" = " $((LIMIT - 1)) 200, 1 429," ] \
        || die "$v: requests 2..$((LIMIT + 1)) of one id answered '$codes', expected $((LIMIT - 1)) x 200 then 429; see $tmp/$v/logs/error.log"
    # DBSIZE, not EXISTS: a cluster node that does not own the key's slot answers MOVED.
    for p in $(nodes "$v"); do
        k=$(vcli "$v" "$p" dbsize | tr -d '\r')
        case "$k" in ''|*[!0-9]*) die "$v: DBSIZE on node $p answered '$k'";; esac
        n=$((n + k))
    done
    if [ "$n" != 1 ]; then
        for p in $(nodes "$v"); do say "$v: node $p keys: $(vcli "$v" "$p" --scan | tr '\n' ' ')"; done
        die "$v: $n keys on the variant's nodes after one id's requests, expected 1 (rl:bench:topology-probe)"
    fi
    flushall "$v"
}

# --- measurement ------------------------------------------------------------------------------
CLK_TCK=$(getconf CLK_TCK)
pids_ticks() {  # user + system clock ticks of the given pids (a gone pid: error)
    local pid stat total=0
    for pid in "$@"; do
        stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
        stat=${stat##*) }   # fields after "(comm)"; utime and stime are fields 14 and 15
        read -r -a f <<< "$stat"
        total=$((total + f[11] + f[12]))
    done
    echo "$total"
}
worker_cpu() {  # seconds of CPU used so far by the variant's nginx workers
    local t
    # shellcheck disable=SC2086
    t=$(pids_ticks ${WORKERS_OF[$1]}) || die "an nginx worker of $1 is gone; see $tmp/$1/logs/error.log"
    awk -v t="$t" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", t / hz }'
}
# CPU the rest of the machine took during a run (builds, tests, other benchmarks): all busy CPU
# (/proc/stat) minus every nginx worker and redis-server started here and this script with its
# children (wrk, curl, redis-cli). "busy ours total" in clock ticks.
cpu_ticks() {
    local all ours v stat
    read -r -a all < /proc/stat   # cpu user nice system idle iowait irq softirq steal ...
    ours=$(pids_ticks "${REDIS_PIDS[@]}") || die "a redis-server is gone; see $tmp/redis-*/redis.log"
    for v in "${VLIST[@]}"; do
        # shellcheck disable=SC2086
        ours=$((ours + $(pids_ticks ${WORKERS_OF[$v]} || echo 0)))
    done
    stat=$(cat "/proc/$$/stat"); stat=${stat##*) }; read -r -a f <<< "$stat"
    ours=$((ours + f[11] + f[12] + f[13] + f[14]))   # utime stime cutime cstime of this shell
    echo "$((all[1] + all[2] + all[3] + all[6] + all[7] + all[8])) $ours $((all[1] + all[2] + all[3] + all[4] + all[5] + all[6] + all[7] + all[8]))"
}
redis_snapshot() {  # redis_snapshot variant file: INFO cpu + commandstats of each node, tagged
    local p
    : > "$2"
    for p in $(nodes "$1"); do
        vcli "$1" "$p" info cpu commandstats | tr -d '\r' | sed "s/^/$p /" >> "$2" \
            || die "INFO on $1 node $p failed"
    done
}
# redis_delta before after -> "cpu_seconds script_calls total_calls per-node-script-calls
# sys_seconds" (sys: the part of cpu_seconds spent in the kernel)
# summed over the nodes; INFO (the snapshots themselves) left out.
redis_delta() {
    awk -F'[ :=,]' '
        { node = $1 }
        $2 ~ /^used_cpu_(sys|user)$/ { cpu[FILENAME == ARGV[1]] += $3 }
        $2 == "used_cpu_sys" { sys[FILENAME == ARGV[1]] += $3 }
        $2 ~ /^cmdstat_/ { c = $2; sub(/^cmdstat_/, "", c); if (c == "info") next
                           v = $4 * (FILENAME == ARGV[1] ? -1 : 1)
                           total += v
                           if (c == "eval" || c == "evalsha") { ev += v; per[node] += v; nodes[node] = 1 } }
        END { list = ""
              for (n in nodes) list = list (list == "" ? "" : ",") n ":" per[n]
              printf "%.6f %d %d %s %.6f\n", cpu[0] - cpu[1], ev, total, (list == "" ? "-" : list), sys[0] - sys[1] }' "$1" "$2"
}
nginx_requests() {  # requests nginx has read so far (stub_status), this one included
    curl -sS --max-time 5 "$(base "$1")/topology-status" | awk 'NR == 3 { print $3 }'
}
decisions() {  # "passed other connects open": decisions PASSED, any other status, Redis
                # connections opened so far, Redis connections open now (all workers, all nodes)
    curl -sS --max-time 5 "$(base "$1")/topology-metrics?format=json" | python3 -c '
import json, sys
m = json.load(sys.stdin)
# plain3 decides in three zones, bench0..2: a decision is in one of them.
ds = [z["decisions"] for name, z in m["zones"].items() if name.startswith("bench")]
passed = sum(d.get("PASSED", 0) for d in ds)
# Servers of the unnamed backend under "redis", of named ones (plain3) under "backends".
servers = list(m["redis"].values()) + [s for b in m.get("backends", {}).values() for s in b.values()]
print(passed, sum(sum(d.values()) for d in ds) - passed,
      sum(s.get("connects", 0) for s in servers),
      sum(s.get("connections", 0) for s in servers))'
}
error_lines() { grep -cE '\[(error|crit|alert|emerg)\]' "$tmp/$1/logs/error.log" || true; }

run_wrk() {  # run_wrk variant seconds -> BENCH line
    timeout $(( $2 + 60 )) wrk -t"$THREADS" -c"$CONNS" -d"$2s" --timeout 5s --latency \
        -s "$BENCH/compare_wrk.lua" "$(base "$1")/module/index.html" -- "$IDS" 0 > "$tmp/wrk.out" 2>&1 \
        || { cat "$tmp/wrk.out" >&2; die "wrk failed on $1"; }
    grep '^BENCH ' "$tmp/wrk.out" || { cat "$tmp/wrk.out" >&2; die "no BENCH line from wrk"; }
}
field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<< "$2"; }

printf 'variant\tworkers\tround\trequests\tnginx_requests\tdecisions\tother_decisions\tconnects\tconnections\tduration_us\trps\tp50_us\tp99_us\tnon2xx\tsocket_errors\tworker_cpu_s\tredis_cpu_s\tscript_calls\tredis_calls_total\terror_lines\tscript_calls_by_node\tother_cpu_pct\tredis_sys_s\n' > "$tmp/raw.tsv"

runs=$(( ${#WLIST[@]} * ${#VLIST[@]} * ROUNDS ))
say "variants ${VLIST[*]} (${#WLIST[@]} worker count(s): ${WLIST[*]}); $runs runs of ${WARMUP}s warm-up + ${DURATION}s" \
    "(wrk -t$THREADS -c$CONNS); about $(( runs * (WARMUP + DURATION + 2) / 60 + 1 )) min"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
start_time=$(date +%s)
idle_cpu
say "idle Redis CPU (ms/s): $(for v in "${VLIST[@]}"; do printf '%s %s  ' "$v" "${IDLE_MS[$v]}"; done)"
run_no=0
for w in "${WLIST[@]}"; do
    for v in "${VLIST[@]}"; do stop_nginx "$v"; start_nginx "$v" "$w"; sanity "$v"; done
    say "nginx with $w worker(s) per variant passed the sanity checks ($(for v in "${VLIST[@]}"; do printf '%s: %s  ' "$v" "${WORKERS_OF[$v]}"; done))"
    for r in $(seq 1 "$ROUNDS"); do
        # The order rotates by one each round, so that no variant always runs first (right
        # after a FLUSHALL of the others, or after the previous worker count).
        n=${#VLIST[@]}
        for k in $(seq 0 $((n - 1))); do
            v=${VLIST[$(( (k + r - 1) % n ))]}
            run_no=$((run_no + 1))
            flushall "$v"
            if [ "$WARMUP" -gt 0 ]; then run_wrk "$v" "$WARMUP" > /dev/null; fi
            # Assigned before read: a failing $(...) then stops the script (set -e).
            e0=$(error_lines "$v"); n0=$(nginx_requests "$v"); t=$(decisions "$v"); read -r d0 o0 c0 _ <<< "$t"
            redis_snapshot "$v" "$tmp/redis0"; cpu0=$(worker_cpu "$v")
            t=$(cpu_ticks); read -r busy0 ours0 all0 <<< "$t"
            line=$(run_wrk "$v" "$DURATION")
            t=$(cpu_ticks); read -r busy1 ours1 all1 <<< "$t"
            cpu1=$(worker_cpu "$v"); redis_snapshot "$v" "$tmp/redis1"
            t=$(decisions "$v"); read -r d1 o1 c1 open1 <<< "$t"; n1=$(nginx_requests "$v"); e1=$(error_lines "$v")
            foreign=$(awk -v b=$((busy1 - busy0)) -v o=$((ours1 - ours0)) -v t=$((all1 - all0)) \
                      'BEGIN { f = (t > 0 ? 100 * (b - o) / t : 0); printf "%.1f", (f < 0 ? 0 : f) }')
            t=$(redis_delta "$tmp/redis0" "$tmp/redis1"); read -r rcpu rscript rtotal rbynode rsys <<< "$t"
            [ "$rscript" -gt 0 ] || die "$v: no script call reached Redis during the run; see $tmp/$v/logs/error.log"
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
                "$v" "$w" "$r" "$(field requests "$line")" "$((n1 - n0 - 1))" "$((d1 - d0))" "$((o1 - o0))" \
                "$((c1 - c0))" "$open1" "$(field duration_us "$line")" "$(field rps "$line")" "$(field p50_us "$line")" \
                "$(field p99_us "$line")" "$(field non2xx "$line")" "$(field socket_errors "$line")" \
                "$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.2f", b - a }')" \
                "$rcpu" "$rscript" "$rtotal" "$((e1 - e0))" "$rbynode" "$foreign" "$rsys" >> "$tmp/raw.tsv"
            say "[$run_no/$runs] w=$w round $r $v: $(printf '%.0f' "$(field rps "$line")") req/s," \
                "p99 $(field p99_us "$line")us, $(awk -v c="$rscript" -v d=$((d1 - d0)) 'BEGIN { printf "%.2f", d ? c / d : 0 }') script calls/decision," \
                "non-2xx $(field non2xx "$line"), other processes ${foreign}% CPU"
        done
    done
done
for v in "${VLIST[@]}"; do stop_nginx "$v"; done
elapsed=$(( $(date +%s) - start_time ))

# --- report -----------------------------------------------------------------------------------
{
    bench_meta_env
    printf 'nginx\t%s\n' "$("$NGINX" -v 2>&1 | sed 's/^nginx version: //') ($NGINX)"
    printf 'openssl\t%s\n' "$(openssl version | awk '{print $1, $2}')"
    printf 'module\t%s\n' "${MODULE#"$ROOT"/}"
    printf 'threads\t%s\nconns\t%s\nduration\t%s\nrounds\t%s\nwarmup\t%s\nids\t%s\nlimit\t%s\nwindow\t%s\n' \
        "$THREADS" "$CONNS" "$DURATION" "$ROUNDS" "$WARMUP" "$IDS" "$LIMIT" "$WINDOW"
    printf 'load_start\t%s\nload_end\t%s\n' "$load_start" "$(cut -d' ' -f1-3 /proc/loadavg)"
    printf 'elapsed_s\t%s\n' "$elapsed"
    printf 'cluster_nodes\t%s\n' "$CLUSTER_NODES"
    for v in "${VLIST[@]}"; do printf 'idle_redis_cpu_ms_per_s_%s\t%s\n' "$v" "${IDLE_MS[$v]}"; done
    printf 'idle_seconds\t%s\n' "$IDLE_SECONDS"
    for v in "${!SKIPPED[@]}"; do printf 'skipped_%s\t%s\n' "$v" "${SKIPPED[$v]}"; done
} > "$tmp/meta.tsv"

cp "$tmp/raw.tsv" "$OUT_TSV"
cp "$tmp/meta.tsv" "${OUT_TSV%.tsv}.meta.tsv"
python3 "$BENCH/topology_report.py" "$OUT_TSV" "${OUT_TSV%.tsv}.meta.tsv" "$OUT_MD" || die "topology_report.py failed"
say "written: ${OUT_MD#"$ROOT"/}, ${OUT_TSV#"$ROOT"/}, ${OUT_TSV#"$ROOT"/} (.meta.tsv) in ${elapsed}s"
