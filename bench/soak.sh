#!/usr/bin/env bash
# Soak test (not run by CI): long mixed traffic against build/nginx + the module while Redis is
# killed and restarted every RESTART_EVERY seconds.
#
# Starts its own redis-server and nginx (WORKERS workers) on free loopback ports, then runs
# `wrk` for DURATION_MIN minutes with bench/soak_wrk.lua: rotating consumer ids far below their
# limit, a few hot ids far over it (REJECTED, then REJECTED_CACHED), a gcra zone, an expensive
# cost=5 endpoint decided over two zones, cost=0 reads, a few busy ids over the limit of a zone
# with reservations (lease=auto), and slow responses of a concurrency zone (limit_rate: about a
# second each, a few ids over their limit of requests in flight). Every RESTART_EVERY seconds Redis
# is killed with SIGKILL and started again on the same port: its data and its script cache are
# gone, so the module must reconnect, get NOSCRIPT, load the script and go on.
#
# Reports, to stdout and OUT (bench/soak.md):
#   - nginx worker RSS (VmRSS) before traffic, after the warm-up, at every restart and at the
#     end; the end must be within 10 % of the after-warm-up figure (RSS_TOLERANCE)
#   - decisions per second and the count of each $ratelimit_status (from the access log, which
#     logs `$ratelimit_status $status $msec`), requests/s of each whole minute, and wrk's totals
#   - per Redis restart: how many requests followed ratelimit_fail, and until how long after the
#     new Redis answered
#   - 5xx responses, error-log lines by level, distinct messages, every [alert]/[crit]/[emerg]
#   - Redis: script calls and NOSCRIPT recoveries per Redis lifetime
#   - an audit from the access log of the lease and concurrency zones, within each Redis
#     lifetime (a Redis killed loses its data, which resets every key): no window over the
#     lease zone's limit, no more requests in flight than the concurrency zone's, counting what
#     Redis and the reservations admitted (ratelimit_fail's admissions are the policy's)
# Exits non-zero when RSS grew beyond the tolerance, a worker crashed, 5xx appeared (with
# FAIL=open), an [alert]/[crit]/[emerg] line was logged, or the audit found a limit exceeded.
#
# Usage: bench/soak.sh            (build first: make build)
# Environment: DURATION_MIN=10 RESTART_EVERY=60 (seconds) WORKERS=2 THREADS=2 CONNS=32
#              IDS=5000 HOT_IDS=5 WARMUP=30 (seconds, included in DURATION_MIN) FAIL=open
#              RSS_TOLERANCE=10 (percent) OUT=bench/soak.md
#              NGINX=build/nginx MODULE=build/ngx_http_ratelimit_module.so KEEP=0 (1: keep the
#              temporary directory with the logs)

set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
. "$ROOT/bench/lib.sh"
NGINX=${NGINX:-$ROOT/build/nginx}
MODULE=${MODULE:-$ROOT/build/ngx_http_ratelimit_module.so}
DURATION_MIN=${DURATION_MIN:-10}
RESTART_EVERY=${RESTART_EVERY:-60}
WORKERS=${WORKERS:-2}
THREADS=${THREADS:-2}
CONNS=${CONNS:-32}
IDS=${IDS:-5000}
HOT_IDS=${HOT_IDS:-5}
WARMUP=${WARMUP:-30}
FAIL=${FAIL:-open}
RSS_TOLERANCE=${RSS_TOLERANCE:-10}
OUT=${OUT:-$ROOT/bench/soak.md}
KEEP=${KEEP:-0}
# The lease zone's limit per 10 s and the concurrency zone's per id (bench/soak_wrk.lua sends
# far more to their busy ids).
LEASE_LIMIT=200
CONC_LIMIT=4

die() { echo "soak: error: $*" >&2; exit 1; }
log() { echo "soak: $(date -u +%H:%M:%S) $*" >&2; }

[ -x "$NGINX" ] || die "$NGINX not found: run 'make build' first"
[ -f "$MODULE" ] || die "$MODULE not found: run 'make build' first"
for c in wrk redis-server redis-cli curl timeout awk; do
    command -v "$c" >/dev/null || die "'$c' not found (Debian: apt-get install wrk redis-server curl)"
done
for v in DURATION_MIN RESTART_EVERY WORKERS THREADS CONNS IDS HOT_IDS WARMUP RSS_TOLERANCE; do
    case "${!v}" in ''|*[!0-9]*) die "$v must be a non-negative integer";; esac
done
[ "$DURATION_MIN" -ge 1 ] && [ "$DURATION_MIN" -le 1440 ] || die "DURATION_MIN must be 1..1440"
[ "$RESTART_EVERY" -ge 5 ] || die "RESTART_EVERY must be at least 5 seconds"
[ "$WORKERS" -ge 1 ] && [ "$WORKERS" -le 64 ] || die "WORKERS must be 1..64"
[ "$IDS" -ge 1 ] || die "IDS must be at least 1"
case "$FAIL" in open|closed|local) ;; *) die "FAIL must be open, closed or local";; esac
TOTAL=$((DURATION_MIN * 60))
[ "$WARMUP" -lt "$TOTAL" ] || die "WARMUP must be shorter than the run"

commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "uncommitted")
git -C "$ROOT" diff --quiet HEAD -- src lua 2>/dev/null || commit+=" (+local changes in src/ or lua/)"
started=$(date -u '+%Y-%m-%d %H:%M UTC')

tmp=$(mktemp -d /tmp/ngx-ratelimit-soak.XXXXXX)
redis_pid=""
wrk_pid=""
cleanup() {
    if [ -n "$wrk_pid" ]; then kill -TERM "$wrk_pid" 2>/dev/null || true; fi
    if [ -s "$tmp/nginx.pid" ]; then
        stop_pid "$(cat "$tmp/nginx.pid")"
    fi
    stop_pid "$redis_pid"
    if [ "$KEEP" = 1 ]; then echo "soak: logs kept in $tmp" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM


rport=$(free_port)
nport=$(free_port "$rport")
rcli() { timeout 5 redis-cli -p "$rport" "$@"; }

# --- redis ------------------------------------------------------------------------------------
redis_lives=0
start_redis() {
    redis-server --bind 127.0.0.1 --port "$rport" --save '' --appendonly no --dir "$tmp" \
        --logfile "$tmp/redis.log" &
    redis_pid=$!
    disown "$redis_pid"   # no "Killed" job notice at each restart; bash still reaps it
    for _ in $(seq 1 100); do rcli ping >/dev/null 2>&1 && break; sleep 0.05; done
    rcli ping >/dev/null 2>&1 || { tail -n 20 "$tmp/redis.log" >&2; die "redis-server did not start"; }
    redis_lives=$((redis_lives + 1))
}
# Script calls and keys of the Redis that is about to die: one line per lifetime.
redis_stats() {
    local info
    info=$(rcli info commandstats 2>/dev/null || true)
    local evalsha eval load noscript keys
    evalsha=$(awk -F'[:=,]' '/^cmdstat_evalsha:/ { print $3 }' <<< "$info")
    eval=$(awk -F'[:=,]' '/^cmdstat_eval:/ { print $3 }' <<< "$info")
    load=$(awk -F'[:=,]' '/^cmdstat_script\|load:/ { print $3 }' <<< "$info")
    # Redis >= 7 counts a NOSCRIPT reply as a failed call of EVALSHA.
    noscript=$(sed -n 's/^cmdstat_evalsha:.*failed_calls=\([0-9]*\).*/\1/p' <<< "$info")
    keys=$(rcli dbsize 2>/dev/null || echo '?')
    echo "${evalsha:-0} ${eval:-0} ${load:-0} ${noscript:-?} $keys"
}
kill_redis() {
    kill -KILL "$redis_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$redis_pid" 2>/dev/null || break; sleep 0.05; done
}
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

start_redis

# --- nginx ------------------------------------------------------------------------------------
mkdir -p "$tmp/html/api" "$tmp/html/gcra" "$tmp/html/search" "$tmp/html/quota" "$tmp/html/lease" \
    "$tmp/html/conc" "$tmp/logs" "$tmp/tmp"
for d in api gcra search quota lease; do printf 'ok\n' > "$tmp/html/$d/index.html"; done
# 16 KiB sent at limit_rate 16k: a request of the concurrency zone holds its slot about a second.
head -c 16384 /dev/zero | tr '\0' 'x' > "$tmp/html/conc/index.html"
chmod -R a+rX "$tmp"

cat > "$tmp/nginx.conf" <<EOF
load_module $MODULE;
worker_processes $WORKERS;
error_log $tmp/logs/error.log notice;
pid $tmp/nginx.pid;
events { worker_connections 4096; }
http {
    default_type text/plain;
    log_format soak '\$ratelimit_status \$status \$msec \$request_time \$uri \$http_x_consumer_id \$ratelimit_time';
    access_log $tmp/logs/access.log soak buffer=256k flush=1s;
    client_body_temp_path $tmp/tmp/client_body;
    proxy_temp_path $tmp/tmp/proxy;
    fastcgi_temp_path $tmp/tmp/fastcgi;
    uwsgi_temp_path $tmp/tmp/uwsgi;
    scgi_temp_path $tmp/tmp/scgi;

    ratelimit_redis 127.0.0.1:$rport timeout=200ms;
    ratelimit_zone api   key=\$http_x_consumer_id limit=100 window=10s;
    ratelimit_zone pace  key=\$http_x_consumer_id limit=10 window=1s algorithm=gcra burst=5;
    ratelimit_zone daily key=\$http_x_consumer_id limit=1000000 window=1d algorithm=sliding_counter;
    ratelimit_zone leased key=\$http_x_consumer_id limit=$LEASE_LIMIT window=10s lease=auto;
    ratelimit_zone conc  key=\$http_x_consumer_id limit=$CONC_LIMIT algorithm=concurrency;
    ratelimit_fail $FAIL;
    # Rejections at warn, so that [error] lines are Redis failures only.
    ratelimit_log_level warn;

    server {
        listen 127.0.0.1:$nport;
        root $tmp/html;
        location /api/    { ratelimit api; }
        location /gcra/   { ratelimit pace; }
        location /search/ { ratelimit api cost=5; ratelimit daily; }
        location /quota/  { ratelimit api cost=0; }
        location /lease/  { ratelimit leased; }
        location /conc/   { ratelimit conc; limit_rate 16k; }
    }
}
EOF
"$NGINX" -p "$tmp/" -c "$tmp/nginx.conf" -t -q || die "nginx -t failed"
"$NGINX" -p "$tmp/" -c "$tmp/nginx.conf"
for _ in $(seq 1 50); do [ -s "$tmp/nginx.pid" ] && port_in_use "$nport" && break; sleep 0.1; done
port_in_use "$nport" || { cat "$tmp/logs/error.log" >&2; die "nginx did not start"; }
master=$(cat "$tmp/nginx.pid")
base="http://127.0.0.1:$nport"

worker_pids() { pgrep -P "$master" | sort -n | tr '\n' ' '; }
# Total VmRSS of the workers in KiB, and the per-worker figures.
rss() {
    local total=0 each="" p v
    for p in $(worker_pids); do
        v=$(awk '/^VmRSS:/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo 0)
        total=$((total + ${v:-0})); each+="${v:-0} "
    done
    echo "$total ${each% }"
}
for _ in $(seq 1 50); do [ "$(worker_pids | wc -w)" -ge "$WORKERS" ] && break; sleep 0.1; done

# --- sanity -----------------------------------------------------------------------------------
hdrs=$(curl -sS -D - -o /dev/null --max-time 5 -H 'X-Consumer-Id: soak-probe' "$base/api/index.html")
echo "$hdrs" | head -n1 | grep -q ' 200' || die "GET /api/ did not answer 200: $(echo "$hdrs" | head -n1)"
echo "$hdrs" | grep -qi '^RateLimit-Limit:' || die "GET /api/ has no RateLimit-Limit header"
sleep 1.5; : > "$tmp/logs/access.log"   # the probe is not part of the run (flush=1s has written it)

pids0=$(worker_pids)
read -r rss0 rss0_each <<< "$(rss)"
log "nginx on $base ($WORKERS workers: $pids0), redis on 127.0.0.1:$rport; ${DURATION_MIN} min," \
    "Redis killed every ${RESTART_EVERY}s, ratelimit_fail $FAIL; worker RSS ${rss0} KiB before traffic"

# --- traffic ----------------------------------------------------------------------------------
t0=$(date +%s)
timeout $((TOTAL + 120)) wrk -t"$THREADS" -c"$CONNS" -d"${TOTAL}s" --timeout 5s --latency \
    -s "$ROOT/bench/soak_wrk.lua" "$base/" -- "$IDS" "$HOT_IDS" > "$tmp/wrk.out" 2>&1 &
wrk_pid=$!

samples="| elapsed (s) | event | worker RSS total (KiB) | per worker (KiB) |"$'\n'"|---:|---|---:|---|"$'\n'
samples+="| 0 | before traffic | $rss0 | $rss0_each |"$'\n'
lifetimes=""
sleep "$WARMUP"
read -r rss_w rss_w_each <<< "$(rss)"
samples+="| $(( $(date +%s) - t0 )) | after ${WARMUP}s warm-up (baseline) | $rss_w | $rss_w_each |"$'\n'
log "after warm-up: worker RSS $rss_w KiB ($rss_w_each)"

next=$RESTART_EVERY
restarts=0
max_down_ms=0
while :; do
    now=$(( $(date +%s) - t0 ))
    [ "$now" -lt $((TOTAL - 5)) ] || break
    kill -0 "$wrk_pid" 2>/dev/null || { log "wrk ended early"; break; }
    if [ "$now" -ge "$next" ]; then
        read -r r r_each <<< "$(rss)"
        st=$(redis_stats)
        lifetimes+="| $redis_lives | $(awk '{ print $1 " | " $2 " | " $3 " | " $4 " | " $5 }' <<< "$st") |"$'\n'
        d0=$(now_ms)
        kill_redis
        start_redis
        d1=$(now_ms)
        d=$((d1 - d0))
        echo "$((restarts + 1)) $d0 $d1" >> "$tmp/restarts"
        [ "$d" -le "$max_down_ms" ] || max_down_ms=$d
        restarts=$((restarts + 1))
        samples+="| $now | Redis restart $restarts (down ${d} ms) | $r | $r_each |"$'\n'
        log "restart $restarts at ${now}s: Redis down ${d} ms; worker RSS before it $r KiB ($r_each)"
        next=$((next + RESTART_EVERY))
    fi
    sleep 1
done

read -r rss1 rss1_each <<< "$(rss)"
samples+="| $(( $(date +%s) - t0 )) | end of traffic | $rss1 | $rss1_each |"$'\n'
st=$(redis_stats)
lifetimes+="| $redis_lives (last) | $(awk '{ print $1 " | " $2 " | " $3 " | " $4 " | " $5 }' <<< "$st") |"$'\n'
for _ in $(seq 1 240); do kill -0 "$wrk_pid" 2>/dev/null || break; sleep 0.5; done
wait "$wrk_pid" || log "wrk exited with $?"
wrk_pid=""
pids1=$(worker_pids)

# Graceful quit: the access log buffer is flushed; leaked sockets would be logged.
kill -QUIT "$master"
for _ in $(seq 1 100); do kill -0 "$master" 2>/dev/null || break; sleep 0.1; done
kill -0 "$master" 2>/dev/null && log "nginx did not quit within 10 s"

# --- report -----------------------------------------------------------------------------------
wrkline=$(grep '^SOAK ' "$tmp/wrk.out" || true)
[ -n "$wrkline" ] || { cat "$tmp/wrk.out" >&2; die "no SOAK line from wrk"; }
field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<< "$wrkline"; }
requests=$(field requests); dur_us=$(field duration_us); rps=$(field rps)
p50=$(field p50_us); p99=$(field p99_us); sockerr=$(field socket_errors); non2xx=$(field non2xx)

alog="$tmp/logs/access.log"
status_table=$(awk '{ c[$1]++; n++ } END { for (s in c) printf "| %s | %d | %.2f %% |\n", s, c[s], 100 * c[s] / n }' "$alog" | sort)
logged=$(wc -l < "$alog")
decisions=$(awk '$1 != "-" && $1 != "" { n++ } END { print n + 0 }' "$alog")
redis_decisions=$(awk '$1 == "PASSED" || $1 == "REJECTED" { n++ } END { print n + 0 }' "$alog")
http_table=$(awk '{ c[$2]++ } END { for (s in c) printf "| %s | %d |\n", s, c[s] }' "$alog" | sort)
fivexx=$(awk '$2 ~ /^5/ { n++ } END { print n + 0 }' "$alog")
dur_s=$(awk -v u="$dur_us" 'BEGIN { printf "%.1f", u / 1e6 }')
dps=$(awk -v d="$decisions" -v u="$dur_us" 'BEGIN { printf "%.0f", (u > 0 ? d / (u / 1e6) : 0) }')
# Requests per second of each whole wall-clock minute (the first and last, partial, left out).
minutes=$(awk '{ c[int($3 / 60)]++ } END {
        lo = hi = ""; for (m in c) { if (lo == "" || m < lo) lo = m; if (hi == "" || m > hi) hi = m }
        n = 0; for (m = lo + 1; m < hi; m++) { r = c[m] / 60; n++
            if (n == 1 || r < mn) mn = r; if (n == 1 || r > mx) mx = r }
        if (n) printf "%d whole minutes: %.0f to %.0f requests/s", n, mn, mx
        else printf "(no whole minute)" }' "$alog")
# Requests that followed ratelimit_fail, per Redis restart: how long clients saw the outage.
touch "$tmp/restarts"
fo_table=$(awk -v rf="$tmp/restarts" '
    BEGIN { n = 0; while ((getline line < rf) > 0) { split(line, a, " "); n++; k[n] = a[2]; r[n] = a[3] } }
    $1 == "FAILED_OPEN" || $1 == "FAILED_CLOSED" {
        t = int($3 * 1000); i = 0
        for (j = n; j >= 1; j--) if (t >= k[j] - 1000) { i = j; break }
        c[i]++
        if (!(i in first) || t < first[i]) first[i] = t
        if (!(i in last) || t > last[i]) last[i] = t
    }
    END {
        for (j = 1; j <= n; j++)
            printf "| %d | %d | %d | %s | %s |\n", j, r[j] - k[j], c[j] + 0,
                (j in first ? first[j] - k[j] : "-"), (j in last ? last[j] - r[j] : "-")
        if (0 in c) printf "| before the first restart | - | %d | - | - |\n", c[0]
    }' "$alog")

# The audit of the lease and concurrency zones, per Redis lifetime (see the top).
audit=$(python3 - "$alog" "$tmp/restarts" "$LEASE_LIMIT" "$CONC_LIMIT" <<'PY'
import sys, bisect, collections
log, restarts, lease_limit, conc_limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
# A lifetime ends when Redis is killed; what was spent while it was down (reservations) is the
# dead lifetime's, what came after the new Redis answered the new one's.
ups, outages = [], []
for line in open(restarts):
    n, killed, up = line.split()
    ups.append(int(up))
    outages.append((int(killed), int(up)))
def life(t):
    return bisect.bisect_right(ups, t)
# A decision asked within a timeout (200 ms) of a kill, or while Redis was down, may have been
# run by the Redis that died or, sent again after NOSCRIPT, by the next one; a unit spent while
# Redis was down may be of either (the next Redis answers before this script's PING loop sees
# it, up to 50 ms later): which lifetime they count in cannot be told from the log, so they are
# left out of both (and counted).
def unsure(t):
    return any(k - 200 <= t <= u for k, u in outages)
lease = collections.defaultdict(list)
conc = collections.defaultdict(list)
counts = collections.Counter()
# Each admission lies in an interval its decision certainly lies in: a reservation's spending at
# $ratelimit_time, a decision of Redis between $ratelimit_time (sent) and the log's $msec plus
# SLACK (Redis's TIME for a reply read later in the event loop iteration that set the cached
# clock). A window is exceeded only by admissions certainly inside it: a wider interval can hide
# an overshoot of at most its width, never invent one (as t/410-lease-guarantee.t audits).
SLACK = 10
for line in open(log):
    f = line.split()
    if len(f) < 7:
        continue
    st, end, took, uri, key = f[0], float(f[2]) * 1000, float(f[3]) * 1000, f[4], f[5]
    start = end - took
    if uri.startswith('/lease/') and st in ('PASSED', 'PASSED_LEASE'):
        t = float(f[6]) * 1000
        if unsure(t):
            counts['unsure'] += 1
            continue
        hi = t if st == 'PASSED_LEASE' else end + SLACK
        lease[(life(t), key)].append((t, hi))
        counts['lease ' + st] += 1
    elif uri.startswith('/conc/') and st == 'PASSED':
        # Certainly held from SLACK after the decision was asked (by then Redis has run it)
        # to the log's $msec (the slot goes back after the response): workers' cached clocks
        # differ by an iteration, so a freed slot may be taken "before" the log of its last
        # holder ends.
        t = float(f[6]) * 1000 + SLACK
        if unsure(t - SLACK):
            counts['unsure'] += 1
        elif t < end:
            conc[(life(t), key)].append((t, end))
        counts['conc PASSED'] += 1
worst_w, worst_o = 0, 0
for k, iv in lease.items():
    # For each admission's latest instant: the admissions certainly in the window ending there.
    iv.sort(key=lambda x: x[1])
    los = []
    for lo, hi in iv:
        bisect.insort(los, lo)
        worst_w = max(worst_w, len(los) - bisect.bisect_right(los, hi - 10000))
for k, iv in conc.items():
    ev = sorted([(s, 1) for s, e in iv] + [(e, -1) for s, e in iv], key=lambda x: (x[0], x[1]))
    cur = 0
    for _, d in ev:
        cur += d
        worst_o = max(worst_o, cur)
ok = worst_w <= lease_limit and worst_o <= conc_limit
print(f"| lease=auto, sliding_log {lease_limit} per 10 s | {counts['lease PASSED']} by Redis, "
      f"{counts['lease PASSED_LEASE']} from reservations | most in one window: {worst_w} | "
      f"{'within' if worst_w <= lease_limit else 'OVER'} |")
print(f"| concurrency {conc_limit} in flight | {counts['conc PASSED']} by Redis | "
      f"most at once: {worst_o} | {'within' if worst_o <= conc_limit else 'OVER'} |")
print(f"| admitted within 200 ms of a kill or while Redis was down (which lifetime is unknown) | "
      f"{counts['unsure']} left out | | |")
print('AUDIT ' + ('ok' if ok else 'over'))
PY
)
audit_ok=$(sed -n 's/^AUDIT //p' <<< "$audit")
audit_table=$(grep -v '^AUDIT ' <<< "$audit")

elog="$tmp/logs/error.log"
level_table=$(grep -o '^[0-9/]* [0-9:]* \[[a-z]*\]' "$elog" | awk '{ c[$3]++ } END { for (l in c) printf "| %s | %d |\n", l, c[l] }' | sort)
# Distinct messages: the level and text, without time, pid, connection numbers and client details.
messages=$(sed -E 's/^[0-9/]+ [0-9:]+ (\[[a-z]+\]) [0-9]+#[0-9]+: (\*[0-9]+ )?/\1 /; s/, client: .*//; s/[0-9]+(ms|s)\b/N\1/g; s/ [0-9]+ / N /g' "$elog" \
    | sed -E 's/127\.0\.0\.1:[0-9]+/127.0.0.1:PORT/g; s/"(hot|c)-[0-9]+"/"ID"/g' \
    | sort | uniq -c | sort -rn | head -n 25 | awk '{ n = $1; $1 = ""; sub(/^ /, ""); gsub(/\|/, "\\|"); printf "| %d | `%s` |\n", n, $0 }')
bad=$(grep -E '\[(alert|crit|emerg)\]|open socket|exited on signal' "$elog" || true)
bad_n=$( [ -n "$bad" ] && wc -l <<< "$bad" || echo 0)

growth=$(awk -v a="$rss_w" -v b="$rss1" 'BEGIN { printf "%.1f", (a > 0 ? 100 * (b - a) / a : 0) }')
rss_ok=$(awk -v g="$growth" -v t="$RSS_TOLERANCE" 'BEGIN { print (g <= t ? 1 : 0) }')

verdict=PASS
problems=""
[ "$rss_ok" = 1 ] || { verdict=FAIL; problems+="- worker RSS grew ${growth} % (tolerance ${RSS_TOLERANCE} %)."$'\n'; }
[ "$pids0" = "$pids1" ] || { verdict=FAIL; problems+="- worker pids changed ($pids0 -> $pids1): a worker died."$'\n'; }
[ "$bad_n" -eq 0 ] || { verdict=FAIL; problems+="- $bad_n alert/crit/emerg/open-socket/crash lines in the error log."$'\n'; }
if [ "$FAIL" = open ] && [ "$fivexx" -ne 0 ]; then
    verdict=FAIL; problems+="- $fivexx responses with a 5xx status although ratelimit_fail is open."$'\n'
fi
[ "$audit_ok" = ok ] || { verdict=FAIL; problems+="- the audit found a limit exceeded (below)."$'\n'; }
[ "$sockerr" -eq 0 ] || problems+="- wrk reported $sockerr socket errors/timeouts."$'\n'
[ "$logged" -ge $((requests * 99 / 100)) ] || problems+="- the access log has $logged lines for $requests requests."$'\n'

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)

report=$(cat <<EOF
# ngx_http_ratelimit soak test

**$verdict** — ${DURATION_MIN} min of mixed traffic, Redis killed (SIGKILL) and restarted on the same
port every ${RESTART_EVERY} s ($restarts restarts, each down at most ${max_down_ms} ms; data and script cache lost each
time), \`ratelimit_fail $FAIL\`. Worker RSS after the ${WARMUP} s warm-up $rss_w KiB, at the end $rss1 KiB:
**${growth} %** (tolerance ${RSS_TOLERANCE} %).
${problems:+
Problems:

$problems}
## Traffic

\`wrk -t$THREADS -c$CONNS -d${TOTAL}s\` with \`bench/soak_wrk.lua\` ($IDS rotating consumer ids under their limits,
$HOT_IDS hot ids far over it, gcra zone, cost=5 over two zones, cost=0 reads):
$requests requests in $dur_s s, **$(printf '%.0f' "$rps") requests/s**, p50 $(awk -v u="$p50" 'BEGIN{printf "%.2f", u/1000}') ms,
p99 $(awk -v u="$p99" 'BEGIN{printf "%.2f", u/1000}') ms, socket errors $sockerr, non-2xx (429s included) $non2xx.

Decisions (access-log lines with a \$ratelimit_status): $decisions, **$dps per second**; of them
asked of Redis (PASSED + REJECTED): $redis_decisions. Access-log lines: $logged.

| \$ratelimit_status | requests | share |
|---|---:|---:|
$status_table

| HTTP status | requests |
|---|---:|
$http_table

5xx responses: **$fivexx**. Throughput over $minutes.

## Audit of the lease and concurrency zones

From the access log, per Redis lifetime (a killed Redis loses every key: the next one starts
them over), counting each admission at the start of its request (\$msec − \$request_time) and
what Redis and the reservations admitted; \`ratelimit_fail $FAIL\`'s admissions are the policy's.
A unit reserved before a kill and spent while Redis was down counts in the lifetime that
reserved it; a decision asked within 200 ms (the \`timeout\`) of a kill or while Redis was down
may have been run by either Redis (sent again after \`NOSCRIPT\`), and a unit spent while Redis was
down may be of either (the next one answers before the script's PING loop sees it): both are left
out, counted.

| zone | admissions audited | worst | verdict |
|---|---|---|---|
$audit_table

## Redis restarts as the clients saw them

Requests decided by \`ratelimit_fail\` (FAILED_OPEN/FAILED_CLOSED, by \`\$msec\` in the access log),
grouped by the restart they follow. "Last after Redis was back" is how long after the new Redis
answered PING requests still followed \`ratelimit_fail\` (connection errors noticed late, then the
module's reconnect back-off).

| restart | Redis down (ms) | requests not decided by Redis | first after the kill (ms) | last after Redis was back (ms) |
|---:|---:|---:|---:|---:|
${fo_table:-| - | - | 0 | - | - |}

## nginx worker memory (VmRSS)

$samples
## Error log

| level | lines |
|---|---:|
${level_table:-| (none) | 0 |}

Distinct messages (time, pid, connection, client and numbers normalised; top 25):

| lines | message |
|---:|---|
${messages:-| 0 | (empty log) |}

[alert]/[crit]/[emerg], "open socket", "exited on signal": **$bad_n**
$( [ -n "$bad" ] && printf '\n```\n%s\n```\n' "$(head -n 20 <<< "$bad")" )

## Redis lifetimes

Counted just before each kill (commandstats of that Redis process; NOSCRIPT replies are failed
EVALSHA calls, each followed by a SCRIPT LOAD and an EVAL).

| lifetime | EVALSHA calls | EVAL calls | SCRIPT LOAD calls | EVALSHA failed (NOSCRIPT) | keys |
|---|---:|---:|---:|---:|---:|
${lifetimes%$'\n'}

## Setup

Started $started, commit $commit (at the start; module and nginx as built then); $("$NGINX" -v 2>&1 | sed 's/^nginx version: //') (build/nginx,
$WORKERS workers, access log buffered); $(redis-server --version | awk '{print "Redis " $3}' | sed 's/v=//');
$(wrk -v 2>&1 | head -n1 | awk '{print $1, $2}'); $(nproc) CPUs ($cpu), shared by wrk, nginx and Redis on loopback.
Zones: \`api\` sliding_log 100/10s, \`pace\` gcra 10/1s burst 5, \`daily\` sliding_counter 10⁶/1d,
\`leased\` sliding_log $LEASE_LIMIT/10s with \`lease=auto\`, \`conc\` concurrency $CONC_LIMIT in flight (responses
of 16 KiB at \`limit_rate 16k\`), all keyed on \`X-Consumer-Id\`; rejections logged at warn.
EOF
)

printf '%s\n' "$report" | tee "$OUT"
echo "soak: written to ${OUT#"$ROOT"/}" >&2
[ "$verdict" = PASS ]
