#!/usr/bin/env bash
# Comparison benchmark (issue 4): this module against the article's Lua limiter and against no
# limiter, on the same nginx binary.
#
# Starts its own redis-server and Debian's /usr/sbin/nginx (1.22.1) with ndk + lua +
# ngx_http_ratelimit_module loaded, on free loopback ports. One server, three locations that
# serve the same static file:
#   A /nolimit/  no limiter
#   B /lua/      the article's access_by_lua_block (bench/article_limiter.conf, verbatim apart
#                from the require path and the Redis port), lua-resty-redis from lua-nginx-redis
#   C /module/   `ratelimit bench;`, zone with the article's limit and window (100 per 60 s)
# Scenarios (wrk script bench/compare_wrk.lua), each at 1 or 2 worker processes:
#   allow     X-Consumer-Id rotating over IDS ids, the limit is never reached
#   deny      one id, far over its limit (warmed up over the limit before measuring)
#   mix       90 % rotating ids, 10 % one over-limit id
#   keys100k  rotating over 100,000 ids
# Every run: FLUSHALL, WARMUP seconds of the same load (connection pools, LuaJIT, the hot id
# goes over its limit), then DURATION seconds measured. Contenders are interleaved A B C per
# round. Per run it records wrk's requests/s and p50/p99, the nginx workers' CPU
# (/proc/<pid>/stat), Redis CPU (INFO cpu) and Redis commands (INFO commandstats), divided by
# the requests nginx counted (stub_status), and writes bench/compare.md, bench/compare.png and
# the raw rows bench/compare.tsv.
#
# Usage:  bench/compare.sh
# Environment (defaults):
#   SCENARIOS="allow:1 deny:1 mix:1 keys100k:1 allow:2 deny:2 mix:2"  name[:workers] list
#   DURATION=10 ROUNDS=3 WARMUP=1 (seconds, rounds)  THREADS=2 CONNS=64 (wrk)  IDS=10000
#   MODULE=build/system/ngx_http_ratelimit_module.so (built by `make build-system`)
#   NGINX=/usr/sbin/nginx  NO_CHART=1 skips the PNG (and matplotlib)  KEEP_TMP=1 keeps the
#   temporary directory (configuration, logs)
# The default run takes about 12 minutes on a 2-core machine (63 runs of ~11.4 s).
#
# wrk, nginx and Redis share the machine's cores; nothing is pinned or tuned. Loopback only,
# every loop is bounded, everything started here is stopped on exit.

set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
. "$ROOT/bench/lib.sh"
BENCH=$ROOT/bench
NGINX=${NGINX:-/usr/sbin/nginx}
MODULE=${MODULE:-$ROOT/build/system/ngx_http_ratelimit_module.so}
MODDIR=${MODDIR:-/usr/lib/nginx/modules}
SCENARIOS=${SCENARIOS:-allow:1 deny:1 mix:1 keys100k:1 allow:2 deny:2 mix:2}
THREADS=${THREADS:-2}
CONNS=${CONNS:-64}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-1}
IDS=${IDS:-10000}
NO_CHART=${NO_CHART:-}
OUT_MD=$BENCH/compare.md
OUT_PNG=$BENCH/compare.png
OUT_TSV=$BENCH/compare.tsv
# The article hard-codes `red:eval(SCRIPT, 1, key, 100, 60000, ...)`; the module's zone gets the
# same limit and window so that both limiters keep sorted sets of the same size.
LIMIT=100
WINDOW=60s
MIX_HOT_PERCENT=10
# lua-resty-redis as Debian packages it (lua-nginx-redis): nginx/redis.lua, not resty/redis.lua.
LUA_REDIS=/usr/share/lua/5.1/nginx/redis.lua

die() { echo "compare: error: $*" >&2; exit 1; }
say() { echo "compare: $*" >&2; }

# --- checks -----------------------------------------------------------------------------------
for c in wrk redis-server redis-cli curl timeout python3 ps pgrep getconf sha256sum; do
    command -v "$c" >/dev/null || die "'$c' not found (Debian: apt-get install wrk redis-server redis-tools curl python3 procps)"
done
[ -x "$NGINX" ] || die "$NGINX not found (Debian: apt-get install nginx)"
[ -f "$MODULE" ] || die "module $MODULE not found: run 'make build-system' (or set MODULE=/path/to/ngx_http_ratelimit_module.so built for $NGINX)"
for m in ndk_http_module.so ngx_http_lua_module.so; do
    [ -f "$MODDIR/$m" ] || die "$MODDIR/$m not found (Debian: apt-get install libnginx-mod-http-ndk libnginx-mod-http-lua)"
done
[ -f "$LUA_REDIS" ] || die "$LUA_REDIS not found (Debian: apt-get install lua-nginx-redis)"
[ -f "$BENCH/article_limiter.conf" ] || die "$BENCH/article_limiter.conf missing"
[ -f "$BENCH/compare_wrk.lua" ] || die "$BENCH/compare_wrk.lua missing"
case "$ROUNDS$DURATION$WARMUP$THREADS$CONNS$IDS" in *[!0-9]*) die "ROUNDS, DURATION, WARMUP, THREADS, CONNS, IDS must be integers";; esac
[ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 20 ] || die "ROUNDS must be 1..20"
[ "$DURATION" -ge 1 ] && [ "$DURATION" -le 300 ] || die "DURATION must be 1..300 seconds"
[ "$WARMUP" -le 60 ] || die "WARMUP must be 0..60 seconds"
[ "$IDS" -ge 1000 ] || die "IDS must be at least 1000 (with fewer ids the allow path reaches the limit of $LIMIT per $WINDOW)"

# Validate the scenario list before anything starts, and order it by worker count so that each
# nginx configuration is started once.
declare -a PLAN=()
for s in $SCENARIOS; do
    name=${s%%:*}; w=1
    [ "$name" != "$s" ] && w=${s#*:}
    case "$name" in allow|deny|mix|keys100k) ;; *) die "unknown scenario '$name' in SCENARIOS (allow, deny, mix, keys100k, each optionally :1 or :2)";; esac
    case "$w" in 1|2) ;; *) die "worker count in '$s' must be 1 or 2";; esac
    PLAN+=("$w $name")
done
[ "${#PLAN[@]}" -ge 1 ] || die "SCENARIOS is empty"
mapfile -t PLAN < <(printf '%s\n' "${PLAN[@]}" | awk '!seen[$0]++' | sort -s -n -k1,1)

# matplotlib: installed before the long run, so that a failing pip does not waste it.
PY_CHART=""
if [ -z "$NO_CHART" ]; then
    if python3 -c 'import matplotlib' 2>/dev/null; then
        PY_CHART=python3
    else
        # A venv, not `pip install --user`: Debian's python3 refuses --user installs (PEP 668),
        # and bench/.venv keeps it out of the system (bench/.gitignore ignores it).
        if ! "$BENCH/.venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
            say "installing matplotlib into bench/.venv (pip, from PyPI)"
            python3 -m venv "$BENCH/.venv" \
                || die "python3 -m venv failed (Debian: apt-get install python3-venv), or set NO_CHART=1"
            "$BENCH/.venv/bin/pip" install -q matplotlib \
                || die "pip install matplotlib failed; set NO_CHART=1 to skip the chart"
        fi
        PY_CHART=$BENCH/.venv/bin/python
    fi
fi

# --- processes --------------------------------------------------------------------------------
tmp=$(mktemp -d /tmp/ngx-ratelimit-compare.XXXXXX)
redis_pid=""
stop_nginx() { stop_nginx_pidfile "$tmp/nginx.pid"; }
cleanup() {
    stop_nginx
    stop_pid "$redis_pid"
    if [ -n "${KEEP_TMP:-}" ]; then say "kept $tmp (KEEP_TMP)"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM


rport=$(free_port)
nport=$(free_port "$rport")
rcli() { redis-cli -p "$rport" "$@"; }

redis-server --bind 127.0.0.1 --port "$rport" --save '' --appendonly no --dir "$tmp" \
    --logfile "$tmp/redis.log" &
redis_pid=$!
for _ in $(seq 1 50); do rcli ping >/dev/null 2>&1 && break; sleep 0.1; done
rcli ping >/dev/null 2>&1 || { cat "$tmp/redis.log" >&2; die "redis-server did not start"; }

mkdir -p "$tmp/html/nolimit" "$tmp/html/lua" "$tmp/html/module" "$tmp/logs" "$tmp/tmp"
# The size of nginx's default index.html, as in bench/run.sh.
page=$(printf '<!DOCTYPE html>\n<html><head><title>bench</title></head><body>\n%s\n</body></html>\n' \
       "$(head -c 450 /dev/zero | tr '\0' 'x')")
for d in nolimit lua module; do printf '%s' "$page" > "$tmp/html/$d/index.html"; done
sed "s/@REDIS_PORT@/$rport/" "$BENCH/article_limiter.conf" > "$tmp/article_limiter.conf"
chmod -R a+rX "$tmp"

start_nginx() {  # start_nginx workers
    cat > "$tmp/nginx.conf" <<EOF
load_module $MODDIR/ndk_http_module.so;
load_module $MODDIR/ngx_http_lua_module.so;
load_module $MODULE;
$(nginx_conf_head "$tmp" "$1")
    # Debian's LuaJIT default path has /usr/share/lua/5.1 already; say it so that another
    # LuaJIT build still finds nginx/redis.lua.
    lua_package_path "/usr/share/lua/5.1/?.lua;;";

    ratelimit_redis 127.0.0.1:$rport;
    ratelimit_zone bench key=\$http_x_consumer_id limit=$LIMIT window=$WINDOW;
    # The article's limiter logs nothing when it rejects; the module logs every rejection at
    # "error" by default. Logged at "info" (below error_log's level) neither writes a line per
    # rejection, so the deny path measures limiting, not log writing.
    ratelimit_log_level info;

    server {
        listen 127.0.0.1:$nport;
        root $tmp/html;
        location /nolimit/ { }
        location /lua/ {
            include $tmp/article_limiter.conf;
        }
        location /module/ { ratelimit bench; }
        location = /compare-status { stub_status; }
    }
}
EOF
    "$NGINX" -p "$tmp/" -c "$tmp/nginx.conf" -t -q 2> "$tmp/nginx-t.log" \
        || { cat "$tmp/nginx-t.log" >&2; die "nginx -t failed"; }
    "$NGINX" -p "$tmp/" -c "$tmp/nginx.conf" || { cat "$tmp/logs/error.log" >&2; die "nginx did not start"; }
    for _ in $(seq 1 50); do [ -s "$tmp/nginx.pid" ] && port_in_use "$nport" && break; sleep 0.1; done
    port_in_use "$nport" || { cat "$tmp/logs/error.log" >&2; die "nginx did not start"; }
    local master
    master=$(cat "$tmp/nginx.pid")
    for _ in $(seq 1 50); do
        mapfile -t WORKERS < <(pgrep -P "$master")
        [ "${#WORKERS[@]}" -eq "$1" ] && break
        sleep 0.1
    done
    [ "${#WORKERS[@]}" -eq "$1" ] || die "expected $1 nginx worker(s), found ${#WORKERS[@]}"
}

base() { echo "http://127.0.0.1:$nport"; }

# Each contender must really do what it claims before anything is measured: B and C admit the
# first LIMIT requests of an id with RateLimit headers and refuse the next with 429, A never.
sanity() {
    local loc url hdrs codes args=() i
    rcli flushall >/dev/null
    for loc in nolimit lua module; do
        url="$(base)/$loc/index.html"
        hdrs=$(curl -sS -D - -o /dev/null --max-time 5 -H 'X-Consumer-Id: compare-probe' "$url") \
            || die "GET $url failed"
        echo "$hdrs" | head -n1 | grep -q ' 200' || die "GET $url: $(echo "$hdrs" | head -n1)"
        if [ "$loc" = nolimit ]; then
            echo "$hdrs" | grep -qi '^RateLimit-' && die "/nolimit/ answers RateLimit headers"
        else
            echo "$hdrs" | grep -qi "^RateLimit-Limit: *$LIMIT" \
                || die "GET $url has no 'RateLimit-Limit: $LIMIT' header: the limiter is not running; see $tmp/logs/error.log"
        fi
        args=()
        for i in $(seq 1 "$LIMIT"); do args+=(-o /dev/null "$url"); done
        codes=$(curl -sS --max-time 30 -w '%{http_code}\n' -H 'X-Consumer-Id: compare-probe' "${args[@]}" | sort | uniq -c | tr -s ' ' | tr '\n' ',')
        case "$loc" in
            nolimit) [ "$codes" = " $LIMIT 200," ] || die "/nolimit/: $LIMIT more requests answered: $codes" ;;
            *)       [ "$codes" = " $((LIMIT - 1)) 200, 1 429," ] \
                         || die "/$loc/: requests 2..$((LIMIT + 1)) of one id answered '$codes', expected $((LIMIT - 1)) x 200 then 429" ;;
        esac
    done
    [ "$(rcli exists rl:sw:compare-probe rl:bench:compare-probe)" = 2 ] \
        || die "the limiters' keys (rl:sw:compare-probe, rl:bench:compare-probe) are not in Redis"
    rcli flushall >/dev/null
}

# --- measurement ------------------------------------------------------------------------------
CLK_TCK=$(getconf CLK_TCK)
worker_cpu() {  # seconds of CPU (user + system) used so far by the nginx workers
    local pid stat total=0
    for pid in "${WORKERS[@]}"; do
        stat=$(cat "/proc/$pid/stat" 2>/dev/null) || die "nginx worker $pid is gone; see $tmp/logs/error.log"
        stat=${stat##*) }   # fields after "(comm)"; utime and stime are fields 14 and 15
        read -r -a f <<< "$stat"
        total=$((total + f[11] + f[12]))
    done
    awk -v t="$total" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", t / hz }'
}
# Other processes on the machine (builds, tests, other benchmarks) take CPU from wrk, nginx and
# Redis and skew every number. Measured, not guessed: all busy CPU of the machine (/proc/stat)
# minus what the nginx workers, redis-server and this script with its children (wrk, curl,
# redis-cli) used. Printed as "busy busy_of_ours total" in clock ticks.
cpu_ticks() {
    local all ours pid stat
    read -r -a all < /proc/stat   # cpu user nice system idle iowait irq softirq steal ...
    ours=0
    for pid in "${WORKERS[@]}" "$redis_pid"; do
        stat=$(cat "/proc/$pid/stat"); stat=${stat##*) }; read -r -a f <<< "$stat"
        ours=$((ours + f[11] + f[12]))
    done
    stat=$(cat "/proc/$$/stat"); stat=${stat##*) }; read -r -a f <<< "$stat"
    ours=$((ours + f[11] + f[12] + f[13] + f[14]))   # utime stime cutime cstime of this shell
    echo "$((all[1] + all[2] + all[3] + all[6] + all[7] + all[8])) $ours $((all[1] + all[2] + all[3] + all[4] + all[5] + all[6] + all[7] + all[8]))"
}
redis_snapshot() { rcli info cpu commandstats | tr -d '\r' > "$1"; }
nginx_requests() {  # requests nginx has read so far (stub_status), this one included
    curl -sS --max-time 5 "$(base)/compare-status" | awk 'NR == 3 { print $3 }'
}
error_lines() { grep -cE '\[(error|crit|alert|emerg)\]' "$tmp/logs/error.log" || true; }

scenario_args() {  # wrk script arguments: ids hot_percent
    case "$1" in
        allow) echo "$IDS 0" ;;
        deny) echo "0 100" ;;
        mix) echo "$IDS $MIX_HOT_PERCENT" ;;
        keys100k) echo "100000 0" ;;
    esac
}

run_wrk() {  # run_wrk location seconds scenario -> BENCH line
    # shellcheck disable=SC2046
    timeout $(( $2 + 60 )) wrk -t"$THREADS" -c"$CONNS" -d"$2s" --timeout 5s --latency \
        -s "$BENCH/compare_wrk.lua" "$(base)/$1/index.html" -- $(scenario_args "$3") > "$tmp/wrk.out" 2>&1 \
        || { cat "$tmp/wrk.out" >&2; die "wrk failed on /$1/"; }
    grep '^BENCH ' "$tmp/wrk.out" || { cat "$tmp/wrk.out" >&2; die "no BENCH line from wrk"; }
}
field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<< "$2"; }

printf 'scenario\tworkers\tcontender\tround\trequests\tnginx_requests\tduration_us\trps\tp50_us\tp99_us\tnon2xx\tsocket_errors\tworker_cpu_s\tredis_cpu_s\tredis_calls_total\tredis_calls_script\terror_lines\tredis_commands\tother_cpu_pct\n' > "$tmp/raw.tsv"

runs=$(( ${#PLAN[@]} * 3 * ROUNDS ))
say "redis on 127.0.0.1:$rport, nginx on 127.0.0.1:$nport; $runs runs of ${WARMUP}s warm-up + ${DURATION}s" \
    "(wrk -t$THREADS -c$CONNS); about $(( runs * (WARMUP + DURATION + 1) / 60 + 1 )) min"
start_time=$(date +%s)
# Other work on the machine (builds, tests) skews everything; the report shows the load.
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
cur_workers=""
run_no=0
for entry in "${PLAN[@]}"; do
    read -r w scen <<< "$entry"
    if [ "$w" != "$cur_workers" ]; then
        stop_nginx
        start_nginx "$w"
        sanity
        cur_workers=$w
        say "nginx with $w worker(s) (pids ${WORKERS[*]}) passed the sanity checks"
    fi
    for r in $(seq 1 "$ROUNDS"); do
        for c in nolimit lua module; do
            run_no=$((run_no + 1))
            # Same starting state for every run: empty Redis, then the warm-up (which also puts
            # the hot id of deny/mix over its limit before the measurement starts).
            rcli flushall >/dev/null
            if [ "$WARMUP" -gt 0 ]; then run_wrk "$c" "$WARMUP" "$scen" > /dev/null; fi
            e0=$(error_lines); n0=$(nginx_requests); redis_snapshot "$tmp/redis0"; cpu0=$(worker_cpu)
            read -r busy0 ours0 all0 <<< "$(cpu_ticks)"
            line=$(run_wrk "$c" "$DURATION" "$scen")
            read -r busy1 ours1 all1 <<< "$(cpu_ticks)"
            cpu1=$(worker_cpu); redis_snapshot "$tmp/redis1"; n1=$(nginx_requests); e1=$(error_lines)
            foreign=$(awk -v b=$((busy1 - busy0)) -v o=$((ours1 - ours0)) -v t=$((all1 - all0)) \
                      'BEGIN { f = (t > 0 ? 100 * (b - o) / t : 0); printf "%.1f", (f < 0 ? 0 : f) }')
            read -r rcpu rtotal rscript rcmds <<< "$(redis_delta "$tmp/redis0" "$tmp/redis1")"
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
                "$scen" "$w" "$c" "$r" "$(field requests "$line")" "$((n1 - n0 - 1))" \
                "$(field duration_us "$line")" "$(field rps "$line")" "$(field p50_us "$line")" \
                "$(field p99_us "$line")" "$(field non2xx "$line")" "$(field socket_errors "$line")" \
                "$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.2f", b - a }')" \
                "$rcpu" "$rtotal" "$rscript" "$((e1 - e0))" "$rcmds" "$foreign" >> "$tmp/raw.tsv"
            say "[$run_no/$runs] $scen w=$w round $r $c: $(printf '%.0f' "$(field rps "$line")") req/s," \
                "p99 $(field p99_us "$line")us, non-2xx $(field non2xx "$line"), other processes ${foreign}% CPU"
        done
    done
done
stop_nginx
elapsed=$(( $(date +%s) - start_time ))

# --- report -----------------------------------------------------------------------------------
pkgver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo "?"; }
{
    bench_meta_env
    printf 'nginx\t%s\n' "$("$NGINX" -v 2>&1 | sed 's/^nginx version: //')"
    printf 'lua_module\t%s\n' "libnginx-mod-http-lua $(pkgver libnginx-mod-http-lua), lua-nginx-redis $(pkgver lua-nginx-redis), LuaJIT $(pkgver libluajit2-5.1-2)"
    printf 'threads\t%s\nconns\t%s\nduration\t%s\nrounds\t%s\nwarmup\t%s\nids\t%s\n' \
        "$THREADS" "$CONNS" "$DURATION" "$ROUNDS" "$WARMUP" "$IDS"
    printf 'load\t%s\n' "at start $load_start, at end $(cut -d' ' -f1-3 /proc/loadavg)"
    printf 'limit\t%s\nwindow\t%s\nmix_hot_percent\t%s\nelapsed_s\t%s\npage_bytes\t%s\n' \
        "$LIMIT" "$WINDOW" "$MIX_HOT_PERCENT" "$elapsed" "$(printf '%s' "$page" | wc -c)"
    # The run this one replaces, for the report to say when it was another machine: ratios
    # move with the host, not only with the code (docs/benchmarks.md, 2026-12-03).
    if [ -f "${OUT_TSV%.tsv}.meta.tsv" ]; then
        sed -n 's/^\(date\|cpu\|module_commit\)\t/previous_\1\t/p' "${OUT_TSV%.tsv}.meta.tsv"
    fi
} > "$tmp/meta.tsv"

cp "$tmp/raw.tsv" "$OUT_TSV"
# Kept beside the rows, so that the report can be written again (compare_report.py).
cp "$tmp/meta.tsv" "${OUT_TSV%.tsv}.meta.tsv"
# The module's p99 before issue 10 (batching), for its "no worse than before" target.
python3 "$BENCH/compare_report.py" "$OUT_TSV" "$tmp/meta.tsv" "$OUT_MD" "$BENCH/compare-before.tsv" \
    || die "compare_report.py failed"
if [ -n "$PY_CHART" ]; then
    "$PY_CHART" "$BENCH/chart.py" "$OUT_TSV" "$OUT_PNG" || die "chart.py failed"
    say "written: ${OUT_MD#"$ROOT"/}, ${OUT_PNG#"$ROOT"/}, ${OUT_TSV#"$ROOT"/} in ${elapsed}s"
else
    say "written: ${OUT_MD#"$ROOT"/}, ${OUT_TSV#"$ROOT"/} (NO_CHART: no PNG) in ${elapsed}s"
fi
