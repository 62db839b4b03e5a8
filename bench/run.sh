#!/usr/bin/env bash
# Benchmark: the cost of ngx_http_ratelimit on one nginx.
#
# Starts its own redis-server and nginx (build/nginx + build/ngx_http_ratelimit_module.so, one
# worker) on free loopback ports. The nginx serves the same static file in two locations:
#   /unlimited/  no rate limiting
#   /limited/    `ratelimit bench;` with a limit that is never reached: bench/rotate.lua rotates
#                X-Consumer-Id over many ids, so every request is an admitted decision (one
#                Redis script call that records it)
# and runs `wrk -t2 -c64 -d10s` on each, interleaved A B A B A B (3 rounds). It prints the
# median requests/s and p50/p99 latency per location and the ratio limited/unlimited as a
# markdown table, to stdout and to bench/results.md.
#
# Nothing is tuned: default nginx and Redis settings apart from what the setup needs. wrk,
# nginx and Redis share this machine's cores, so absolute numbers say little; the ratio is the
# result. Loopback only; every loop is bounded; everything started here is stopped on exit.
#
# Usage: make bench   (builds first)   or   bench/run.sh
# Environment: THREADS=2 CONNS=64 DURATION=10 (seconds) ROUNDS=3 WARMUP=2 (seconds)
#              CONSUMERS=10000 LIMIT=1000 WINDOW=10s OUT=bench/results.md
#              NGINX=build/nginx MODULE=build/ngx_http_ratelimit_module.so

set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
. "$ROOT/bench/lib.sh"
NGINX=${NGINX:-$ROOT/build/nginx}
MODULE=${MODULE:-$ROOT/build/ngx_http_ratelimit_module.so}
THREADS=${THREADS:-2}
CONNS=${CONNS:-64}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-2}
CONSUMERS=${CONSUMERS:-10000}
LIMIT=${LIMIT:-1000}
WINDOW=${WINDOW:-10s}
OUT=${OUT:-$ROOT/bench/results.md}

die() { echo "bench: error: $*" >&2; exit 1; }

[ -x "$NGINX" ] || die "$NGINX not found: run 'make build' first"
[ -f "$MODULE" ] || die "$MODULE not found: run 'make build' first"
for c in wrk redis-server redis-cli curl timeout; do
    command -v "$c" >/dev/null || die "'$c' not found (Debian: apt-get install wrk redis-server curl)"
done
case "$ROUNDS$DURATION$WARMUP$THREADS$CONNS" in *[!0-9]*) die "ROUNDS, DURATION, WARMUP, THREADS, CONNS must be integers";; esac
[ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 20 ] || die "ROUNDS must be 1..20"
[ "$DURATION" -ge 1 ] && [ "$DURATION" -le 300 ] || die "DURATION must be 1..300 seconds"

tmp=$(mktemp -d /tmp/ngx-ratelimit-bench.XXXXXX)
redis_pid=""
cleanup() {
    if [ -s "$tmp/nginx.pid" ]; then
        stop_pid "$(cat "$tmp/nginx.pid")"
    fi
    stop_pid "$redis_pid"
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM


rport=$(free_port)
nport=$(free_port "$rport")

# --- redis ------------------------------------------------------------------------------------
redis-server --bind 127.0.0.1 --port "$rport" --save '' --appendonly no --dir "$tmp" \
    --logfile "$tmp/redis.log" &
redis_pid=$!
for _ in $(seq 1 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$rport" ping >/dev/null 2>&1 || { cat "$tmp/redis.log" >&2; die "redis-server did not start"; }

# --- nginx ------------------------------------------------------------------------------------
mkdir -p "$tmp/html/unlimited" "$tmp/html/limited" "$tmp/logs" "$tmp/tmp"
# A small static page (the size of nginx's default index.html).
page=$(printf '<!DOCTYPE html>\n<html><head><title>bench</title></head><body>\n%s\n</body></html>\n' \
       "$(head -c 450 /dev/zero | tr '\0' 'x')")
printf '%s' "$page" > "$tmp/html/unlimited/index.html"
printf '%s' "$page" > "$tmp/html/limited/index.html"
chmod -R a+rX "$tmp"

cat > "$tmp/nginx.conf" <<EOF
load_module $MODULE;
$(nginx_conf_head "$tmp" 1)

    ratelimit_redis 127.0.0.1:$rport;
    ratelimit_zone bench key=\$http_x_consumer_id limit=$LIMIT window=$WINDOW;

    server {
        listen 127.0.0.1:$nport;
        root $tmp/html;
        location /unlimited/ { }
        location /limited/ { ratelimit bench; }
    }
}
EOF
"$NGINX" -p "$tmp/" -c "$tmp/nginx.conf" -t -q || die "nginx -t failed"
"$NGINX" -p "$tmp/" -c "$tmp/nginx.conf"
for _ in $(seq 1 50); do [ -s "$tmp/nginx.pid" ] && port_in_use "$nport" && break; sleep 0.1; done
port_in_use "$nport" || { cat "$tmp/logs/error.log" >&2; die "nginx did not start"; }

base="http://127.0.0.1:$nport"

# --- sanity: the limited location really decides in Redis -----------------------------------
hdrs=$(curl -sS -D - -o /dev/null --max-time 5 -H 'X-Consumer-Id: bench-probe' "$base/limited/index.html")
echo "$hdrs" | head -n1 | grep -q ' 200' || die "GET /limited/ did not answer 200: $(echo "$hdrs" | head -n1)"
echo "$hdrs" | grep -qi '^RateLimit-Limit:' \
    || die "GET /limited/ has no RateLimit-Limit header: the module is not limiting this location"
[ "$(redis-cli -p "$rport" dbsize)" -ge 1 ] || die "no key in Redis after a limited request"
curl -sS -o /dev/null --max-time 5 -H 'X-Consumer-Id: bench-probe' "$base/unlimited/index.html" \
    || die "GET /unlimited/ failed"

script_calls() {  # EVALSHA + EVAL calls so far
    redis-cli -p "$rport" info commandstats \
        | awk -F'[:=,]' '/^cmdstat_(evalsha|eval):/ { n += $3 } END { print n + 0 }'
}

run_wrk() {  # run_wrk location duration -> prints the BENCH line
    timeout $(( $2 + 60 )) wrk -t"$THREADS" -c"$CONNS" -d"$2s" --timeout 5s --latency \
        -s "$ROOT/bench/rotate.lua" "$base/$1/index.html" -- "$CONSUMERS" > "$tmp/wrk.out" 2>&1 \
        || { cat "$tmp/wrk.out" >&2; die "wrk failed on /$1/"; }
    grep '^BENCH ' "$tmp/wrk.out" || { cat "$tmp/wrk.out" >&2; die "no BENCH line from wrk"; }
}
field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<< "$2"; }

echo "bench: nginx on $base (1 worker), redis on 127.0.0.1:$rport; wrk -t$THREADS -c$CONNS -d${DURATION}s," \
     "$ROUNDS rounds, warm-up ${WARMUP}s per location" >&2

if [ "$WARMUP" -gt 0 ]; then
    run_wrk unlimited "$WARMUP" > /dev/null
    run_wrk limited "$WARMUP" > /dev/null
fi

declare -a U_RPS U_P50 U_P99 L_RPS L_P50 L_P99 L_CALLS
non2xx=0; sockerr=0
raw=""
for r in $(seq 1 "$ROUNDS"); do
    for loc in unlimited limited; do
        before=$(script_calls)
        line=$(run_wrk "$loc" "$DURATION")
        after=$(script_calls)
        rps=$(field rps "$line"); p50=$(field p50_us "$line"); p99=$(field p99_us "$line")
        reqs=$(field requests "$line")
        n2=$(field non2xx "$line"); se=$(field socket_errors "$line")
        non2xx=$((non2xx + n2)); sockerr=$((sockerr + se))
        calls=$((after - before))
        if [ "$loc" = unlimited ]; then
            U_RPS+=("$rps"); U_P50+=("$p50"); U_P99+=("$p99")
        else
            L_RPS+=("$rps"); L_P50+=("$p50"); L_P99+=("$p99")
            L_CALLS+=("$(awk -v c="$calls" -v n="$reqs" 'BEGIN { printf "%.3f", (n > 0 ? c / n : 0) }')")
        fi
        raw+=$(printf '| %d | %s | %.0f | %.2f | %.2f | %s | %s | %s |' "$r" "$loc" "$rps" \
               "$(awk -v u="$p50" 'BEGIN{print u/1000}')" "$(awk -v u="$p99" 'BEGIN{print u/1000}')" \
               "$reqs" "$n2" "$([ "$loc" = limited ] && echo "$calls" || echo "-")")$'\n'
        echo "bench: round $r $loc: $(printf '%.0f' "$rps") req/s, p50 ${p50}us, p99 ${p99}us, non-2xx $n2" >&2
    done
done

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ms() { awk -v u="$1" 'BEGIN { printf "%.2f", u / 1000 }'; }

u_rps=$(median "${U_RPS[@]}"); u_p50=$(median "${U_P50[@]}"); u_p99=$(median "${U_P99[@]}")
l_rps=$(median "${L_RPS[@]}"); l_p50=$(median "${L_P50[@]}"); l_p99=$(median "${L_P99[@]}")
l_calls=$(median "${L_CALLS[@]}")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }

errors=$(grep -cE '\[(error|crit|alert|emerg)\]' "$tmp/logs/error.log" || true)
warnings=""
[ "$non2xx" -eq 0 ] || warnings+="- WARNING: $non2xx non-2xx responses (the limit was reached or requests failed); the comparison is not clean."$'\n'
[ "$sockerr" -eq 0 ] || warnings+="- WARNING: $sockerr socket errors/timeouts reported by wrk."$'\n'
[ "$errors" -eq 0 ] || warnings+="- WARNING: $errors error-level lines in nginx's error log (Redis failures make requests FAILED_OPEN, which skips the Redis round trip)."$'\n'
awk -v c="$l_calls" 'BEGIN { exit !(c < 0.99) }' \
    && warnings+="- WARNING: only $l_calls Redis script calls per limited request: some requests were not decided in Redis."$'\n'

commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "uncommitted")
git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || commit+=" (+local changes)"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)

report=$(cat <<EOF
# ngx_http_ratelimit benchmark

Same nginx, same static file ($(printf '%s' "$page" | wc -c) bytes), same requests (every request
carries a rotating \`X-Consumer-Id\`, $CONSUMERS ids); \`/limited/\` adds \`ratelimit bench;\`
(\`limit=$LIMIT window=$WINDOW\`, never reached, so every request is an admitted decision:
one Redis script call).
\`wrk -t$THREADS -c$CONNS -d${DURATION}s --latency\`, locations interleaved over $ROUNDS round(s) after a
${WARMUP} s warm-up of each; medians of the rounds.

| location | requests/s | p50 latency (ms) | p99 latency (ms) |
|---|---:|---:|---:|
| unlimited | $(printf '%.0f' "$u_rps") | $(ms "$u_p50") | $(ms "$u_p99") |
| limited | $(printf '%.0f' "$l_rps") | $(ms "$l_p50") | $(ms "$l_p99") |
| **ratio limited/unlimited** | **$(ratio "$l_rps" "$u_rps")** | $(ratio "$l_p50" "$u_p50") | $(ratio "$l_p99" "$u_p99") |

Redis script calls per limited request (median): $l_calls. Non-2xx responses: $non2xx.
Socket errors: $sockerr. Error-level lines in nginx's error log: $errors.
${warnings:+
$warnings}
Every round:

| round | location | requests/s | p50 (ms) | p99 (ms) | requests | non-2xx | script calls |
|---|---|---:|---:|---:|---:|---:|---:|
${raw%$'\n'}

Setup: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit; $("$NGINX" -v 2>&1 | sed 's/^nginx version: //')
(build/nginx, 1 worker, module from \`make build\`, release profile); $(redis-server --version | awk '{print "Redis " $3}' | sed 's/v=//');
$(wrk -v 2>&1 | head -n1 | awk '{print $1, $2}'); $(nproc) CPUs ($cpu). wrk, nginx and
redis-server share these CPUs, all on loopback; nothing is pinned or tuned. Absolute numbers
depend on the machine; the ratio is the result.
EOF
)

printf '%s\n' "$report" | tee "$OUT"
echo "bench: written to ${OUT#"$ROOT"/}" >&2
