#!/usr/bin/env bash
# Concurrency slots benchmark (issue 23): what keeping requests in flight costs Redis. A slot is
# renewed every lease_time / 3 by its worker's sweep, the slots due in one tick in one script
# call; this measures that cost per held slot per second, for a few lease times and numbers of
# requests in flight, to choose lease_time's default from.
#
# Starts its own redis-server and nginx (vendored build, 1 worker) on free loopback ports. The
# limited location serves a static file slowly (`limit_rate`), so that each request stays in
# flight for HOLD seconds without a backend; zone `conc`, algorithm=concurrency, one key per
# request (as many consumers with a request each), limit far above 1.
# A client (bench/hold_clients.py) opens SLOTS connections, sends one request on each and reads
# them to the end. Once every slot is taken (ZCOUNT over the keys, checked), Redis's CPU (INFO cpu)
# and commands (INFO commandstats) are read over MEASURE quiet seconds. The same span with no
# request in flight is measured first: Redis's own idle cost, subtracted.
#
# Writes bench/concurrency.md (a table per run: renewals per slot per second, script calls per
# second and renewals per call, Redis CPU per held slot per second and per renewal).
#
# Usage:  make bench-concurrency   or   bench/concurrency.sh   (after `make build`)
# Environment (defaults): LEASES="1s 5s 15s"  SLOTS_LIST="100 1000"  MEASURE=10
#   NGINX=build/nginx MODULE=build/ngx_http_ratelimit_module.so  KEEP_TMP=1
# The default run takes about 3 minutes.

set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
die() { echo "concurrency: error: $*" >&2; exit 1; }
say() { echo "concurrency: $*" >&2; }
. "$ROOT/bench/lib.sh"
BENCH=$ROOT/bench
NGINX=${NGINX:-$ROOT/build/nginx}
MODULE=${MODULE:-$ROOT/build/ngx_http_ratelimit_module.so}
LEASES=${LEASES:-1s 5s 15s}
SLOTS_LIST=${SLOTS_LIST:-100 1000}
MEASURE=${MEASURE:-10}
OUT_MD=${OUT_MD:-$BENCH/concurrency.md}

for c in redis-server redis-cli python3 timeout; do
    command -v "$c" >/dev/null || die "'$c' not found (Debian: apt-get install redis-server redis-tools python3)"
done
[ -x "$NGINX" ] || die "$NGINX not found: run 'make build' (or set NGINX= and MODULE=)"
[ -f "$MODULE" ] || die "module $MODULE not found: run 'make build'"
case "$MEASURE" in ''|*[!0-9]*) die "MEASURE must be an integer";; esac
[ "$MEASURE" -ge 2 ] && [ "$MEASURE" -le 120 ] || die "MEASURE must be 2..120 seconds"
for n in $SLOTS_LIST; do
    case "$n" in ''|*[!0-9]*) die "SLOTS_LIST: '$n' is not an integer";; esac
    [ "$n" -ge 1 ] && [ "$n" -le 3000 ] || die "SLOTS_LIST: $n must be 1..3000"
done
for l in $LEASES; do
    case "$l" in [0-9]*s) ;; *) die "LEASES: '$l' is not a lease_time in seconds (e.g. 5s)";; esac
done
ulimit -n 20000 2>/dev/null || true

tmp=$(mktemp -d /tmp/ngx-ratelimit-concurrency.XXXXXX)
redis_pid=""
client_pid=""
cleanup() {
    stop_pid "$client_pid"
    stop_nginx_pidfile "$tmp/nginx.pid"
    stop_pid "$redis_pid"
    if [ -n "${KEEP_TMP:-}" ]; then say "kept $tmp (KEEP_TMP)"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rport=$(free_port)
nport=$(free_port "$rport")
rcli() { timeout 10 redis-cli -p "$rport" "$@"; }
start_bench_redis

mkdir -p "$tmp/logs" "$tmp/tmp" "$tmp/html"
redis_snapshot() { rcli info cpu commandstats | tr -d '\r' > "$1" || die "INFO failed"; }
in_redis() {  # slots held in Redis now: members over every key of the zone, in one call
    rcli eval "local s = 0 for _, k in ipairs(redis.call('KEYS', 'rl:conc:*')) do s = s + redis.call('ZCARD', k) end return s" 0
}

start_nginx() {  # lease_time hold_seconds
    # 1 byte a second is too slow for nginx's send buffers to matter: the file lasts HOLD s.
    head -c $(( $2 * 100 )) /dev/zero > "$tmp/html/f"
    chmod -R a+rX "$tmp"
    {
        echo "load_module $MODULE;"
        nginx_conf_head "$tmp" 1 | sed 's/worker_connections 1024/worker_connections 8192/'
        cat <<EOF
    ratelimit_redis 127.0.0.1:$rport;
    ratelimit_zone conc key=\$arg_k limit=100 algorithm=concurrency lease_time=$1;
    ratelimit_metrics_zone 64k;
    server {
        listen 127.0.0.1:$nport;
        root $tmp/html;
        location /h { ratelimit conc; limit_rate 100; alias $tmp/html/f; }
        location = /metrics { ratelimit_metrics; }
    }
}
EOF
    } > "$tmp/nginx.conf"
    "$NGINX" -p "$tmp" -c "$tmp/nginx.conf" -t -q || die "nginx -t failed"
    "$NGINX" -p "$tmp" -c "$tmp/nginx.conf" || die "nginx did not start"
    for _ in $(seq 1 50); do port_in_use "$nport" && return 0; sleep 0.1; done
    die "nginx does not listen on $nport"
}

rows=()
for lease in $LEASES; do
    for n in $SLOTS_LIST; do
        secs=${lease%s}
        # Long enough for the slots to be taken, then MEASURE quiet seconds, then a margin.
        hold=$(( MEASURE + 10 + n / 200 ))
        start_nginx "$lease" "$hold"
        rcli flushall >/dev/null
        sleep 1
        redis_snapshot "$tmp/idle0"; sleep "$MEASURE"; redis_snapshot "$tmp/idle1"
        read -r idle_cpu _ _ _ <<< "$(redis_delta "$tmp/idle0" "$tmp/idle1")"
        python3 "$BENCH/hold_clients.py" 127.0.0.1 "$nport" "$n" $(( hold + 30 )) > "$tmp/client.out" &
        client_pid=$!
        held=0
        for _ in $(seq 1 100); do
            held=$(in_redis)
            [ "$held" -ge "$n" ] && break
            sleep 0.2
        done
        [ "$held" -ge "$n" ] || die "only $held of $n slots held after 20 s"
        # The slots' first renewals are spread over the first third of a lease already.
        sleep 1
        redis_snapshot "$tmp/r0"; sleep "$MEASURE"; redis_snapshot "$tmp/r1"
        held_after=$(in_redis)
        read -r cpu total calls per <<< "$(redis_delta "$tmp/r0" "$tmp/r1")"
        renewed=$(curl -s "http://127.0.0.1:$nport/metrics" 2>/dev/null \
            | sed -n 's/^ratelimit_concurrency_slots_total{zone="conc",event="renewed"} //p')
        say "lease_time=$lease slots=$n: held $held then $held_after; redis cpu ${cpu}s (idle ${idle_cpu}s), $calls script calls, $renewed renewals so far"
        wait "$client_pid" || die "the client failed: $(cat "$tmp/client.out")"
        client_pid=""
        lapsed=$(curl -s "http://127.0.0.1:$nport/metrics" \
            | sed -n 's/^ratelimit_concurrency_slots_total{zone="conc",event="lapsed"} //p')
        stop_nginx_pidfile "$tmp/nginx.pid"
        rows+=("$lease $secs $n $held_after $cpu $idle_cpu $calls ${lapsed:-0} $per")
    done
done

{
    echo "# ngx_http_ratelimit: what held concurrency slots cost Redis"
    echo
    echo "\`bench/concurrency.sh\`, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, redis $(redis-server --version | awk '{print $3}' | sed 's/v=//'), module $(git rev-parse --short HEAD 2>/dev/null || echo unknown)."
    echo "1 nginx worker; N requests in flight, one key each (a static file sent at 100 B/s), over $MEASURE s once every slot is taken;"
    echo "Redis CPU is INFO cpu's user + sys over that span, minus the same span measured idle just before."
    echo
    echo "| lease_time | slots held | script calls/s | renewals per call | renewals per slot per second | Redis CPU per held slot per second | Redis CPU per renewal | lapsed | commands |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
    for r in "${rows[@]}"; do
        read -r lease secs n held cpu idle calls lapsed per <<< "$r"
        awk -v lease="$lease" -v secs="$secs" -v n="$n" -v held="$held" -v cpu="$cpu" -v idle="$idle" \
            -v calls="$calls" -v m="$MEASURE" -v lapsed="$lapsed" -v per="$per" 'BEGIN {
            net = cpu - idle; if (net < 0) net = 0
            # Each slot is renewed once per lease_time / 3 (rounded up to the 100 ms sweep).
            every = int((secs * 1000 / 3 + 99) / 100) * 100 / 1000
            rps = n / every
            printf "| %s | %d | %.1f | %.1f | %.2f | %.1f µs | %.1f µs | %d | %s |\n", lease, held,
                calls / m, (calls > 0 ? rps * m / calls : 0), 1 / every, net * 1e6 / m / n,
                net * 1e6 / (rps * m), lapsed, per }'
    done
    echo
    echo "Renewals per slot per second are the sweep's cadence (one per lease_time / 3, rounded up to"
    echo "its 100 ms tick), checked by the lapsed column (0: every renewal landed in time)."
} > "$OUT_MD"
cat "$OUT_MD"
