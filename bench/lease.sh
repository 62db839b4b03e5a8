#!/usr/bin/env bash
# Reservations benchmark (issue 20): exact decisions against `lease=auto`, side by side in one
# run, against no limiter, on the vendored nginx (build/nginx + build/ngx_http_ratelimit_module.so,
# `make build`), 1 worker.
#
# Starts its own redis-server and nginx on free loopback ports. One server, locations that serve
# the same static file:
#   A /a/   no limiter
#   B /b/   `ratelimit exact;`   zone exact  key=$http_x_consumer_id limit=LIMIT window=WINDOW
#                                             algorithm=sliding_counter
#   C /c/   `ratelimit leased;`  zone leased, the same with lease=auto (lease_time's default)
# Workloads (wrk script bench/lease_wrk.lua), limits never reached (LIMIT is far above what any
# id gets in a run):
#   busy     BUSY_KEYS ids in turn (a few busy consumers)
#   zipf     Zipf(ZIPF_S) over ZIPF_IDS ids, drawn in wrk from a CDF table (fixed seed per thread)
#   uniform  rotating over UNIFORM_IDS ids (compare.sh's allow)
# Every run: FLUSHALL, WARMUP seconds of the same load (pools open; C's workers learn each key's
# demand), then DURATION seconds measured. In every round each workload runs A, B and C, the
# order rotated by one per round. Per run: wrk's requests/s and p50/p99; the nginx worker's CPU
# (/proc/<pid>/stat); Redis CPU (INFO cpu) and
# commands (INFO commandstats: script calls = EVALSHA + EVAL, give-backs included); the zone's
# decisions by status and its lease units (ratelimit_metrics JSON), so PASSED_LEASE, the
# requests C admitted from its reservations without Redis.
#
# Then under-admission of a paced key, for B and C: wrk hammers BUSY_KEYS ids far over their
# limit (PACED_LIMIT per PACED_WINDOW, zones pexact and pleased, same algorithm) on /pb/ or
# /pc/, while a paced client (perl, HTTP::Tiny keep-alive) sends PACED_RATE requests/s of its
# own id for PACED_SECONDS: half its limit, so every one of them should be admitted. The paced
# test runs on a freshly started nginx (see below), and the client reads each answer's
# $ratelimit_status (X-RL-Status) to count its requests admitted from a reservation.
#
# Writes bench/lease.md (bench/lease_report.py: medians, per-round ratios, the issue's targets
# met or missed), bench/lease.tsv (raw rows) and bench/lease.meta.tsv (environment, load).
#
# Usage:  make bench-lease   or   bench/lease.sh   (after `make build`)
# Environment (defaults):
#   WORKLOADS="busy zipf uniform" (empty: the paced test only)  DURATION=8 ROUNDS=2 WARMUP=1 (seconds, rounds)
#   THREADS=2 CONNS=64 (wrk)  BUSY_KEYS=4  ZIPF_IDS=100000 ZIPF_S=1.0 ZIPF_SEED=20
#   UNIFORM_IDS=10000  LIMIT=10000000 WINDOW=60s
#   PACED=1 (0 skips the paced test)  PACED_LIMIT=100 PACED_WINDOW=10s PACED_RATE=5
#   PACED_SECONDS=20 PACED_ROUNDS=1
#   NGINX=build/nginx MODULE=build/ngx_http_ratelimit_module.so  KEEP_TMP=1 keeps the temporary
#   directory (configuration, logs)
# The default run takes about 5 minutes on a 2-core machine (18 runs of ~10 s, 2 paced runs of
# ~23 s, start-up and sanity checks).
#
# wrk, nginx and Redis share the machine's cores; nothing is pinned or tuned. Loopback only,
# every loop and wait is bounded, everything started here is stopped by its pid on exit.

set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
die() { echo "lease: error: $*" >&2; exit 1; }
say() { echo "lease: $*" >&2; }
. "$ROOT/bench/lib.sh"
BENCH=$ROOT/bench
NGINX=${NGINX:-$ROOT/build/nginx}
MODULE=${MODULE:-$ROOT/build/ngx_http_ratelimit_module.so}
WORKLOADS=${WORKLOADS-busy zipf uniform}
THREADS=${THREADS:-2}
CONNS=${CONNS:-64}
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-2}
WARMUP=${WARMUP:-1}
BUSY_KEYS=${BUSY_KEYS:-4}
ZIPF_IDS=${ZIPF_IDS:-100000}
ZIPF_S=${ZIPF_S:-1.0}
ZIPF_SEED=${ZIPF_SEED:-20}
UNIFORM_IDS=${UNIFORM_IDS:-10000}
LIMIT=${LIMIT:-10000000}
WINDOW=${WINDOW:-60s}
PACED=${PACED:-1}
PACED_LIMIT=${PACED_LIMIT:-100}
PACED_WINDOW=${PACED_WINDOW:-10s}
PACED_RATE=${PACED_RATE:-5}
PACED_SECONDS=${PACED_SECONDS:-20}
PACED_ROUNDS=${PACED_ROUNDS:-1}
OUT_MD=${OUT_MD:-$BENCH/lease.md}
OUT_TSV=${OUT_TSV:-$BENCH/lease.tsv}
WORKERS=1
ALGORITHM=sliding_counter

# --- checks -----------------------------------------------------------------------------------
for c in wrk redis-server redis-cli curl timeout python3 perl pgrep getconf sha256sum; do
    command -v "$c" >/dev/null || die "'$c' not found (Debian: apt-get install wrk redis-server redis-tools curl python3 perl procps)"
done
perl -MHTTP::Tiny -MTime::HiRes -e1 2>/dev/null || die "perl's HTTP::Tiny and Time::HiRes are missing (Debian: apt-get install perl)"
[ -x "$NGINX" ] || die "$NGINX not found: run 'make build' (or set NGINX= and MODULE=)"
[ -f "$MODULE" ] || die "module $MODULE not found: run 'make build'"
for f in lease_wrk.lua lease_report.py report_meta.py; do [ -f "$BENCH/$f" ] || die "$BENCH/$f missing"; done
case "$ROUNDS$DURATION$WARMUP$THREADS$CONNS$BUSY_KEYS$ZIPF_IDS$ZIPF_SEED$UNIFORM_IDS$LIMIT$PACED$PACED_LIMIT$PACED_RATE$PACED_SECONDS$PACED_ROUNDS" in
    *[!0-9]*) die "ROUNDS, DURATION, WARMUP, THREADS, CONNS, BUSY_KEYS, ZIPF_IDS, ZIPF_SEED, UNIFORM_IDS, LIMIT, PACED* must be integers";;
esac
case "$ZIPF_S" in ''|*[!0-9.]*) die "ZIPF_S must be a number";; esac
[ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 20 ] || die "ROUNDS must be 1..20"
[ "$DURATION" -ge 1 ] && [ "$DURATION" -le 300 ] || die "DURATION must be 1..300 seconds"
[ "$WARMUP" -le 60 ] || die "WARMUP must be 0..60 seconds"
[ "$THREADS" -ge 1 ] && [ "$CONNS" -ge "$THREADS" ] || die "THREADS must be ≥ 1 and CONNS ≥ THREADS"
[ "$BUSY_KEYS" -ge 1 ] && [ "$BUSY_KEYS" -le 100 ] || die "BUSY_KEYS must be 1..100"
[ "$ZIPF_IDS" -ge 2 ] && [ "$ZIPF_IDS" -le 10000000 ] || die "ZIPF_IDS must be 2..10000000"
[ "$UNIFORM_IDS" -ge 1 ] || die "UNIFORM_IDS must be ≥ 1"
[ "$LIMIT" -ge 1000 ] || die "LIMIT must be at least 1000 (the workloads must never reach it)"
[ "$PACED_RATE" -ge 1 ] && [ "$PACED_RATE" -le 100 ] || die "PACED_RATE must be 1..100 requests/s"
[ "$PACED_SECONDS" -ge 1 ] && [ "$PACED_SECONDS" -le 300 ] || die "PACED_SECONDS must be 1..300"
[ "$PACED_ROUNDS" -ge 1 ] && [ "$PACED_ROUNDS" -le 10 ] || die "PACED_ROUNDS must be 1..10"
[ "$PACED_LIMIT" -ge 2 ] || die "PACED_LIMIT must be ≥ 2"
declare -a WLIST=()
for w in $WORKLOADS; do
    case "$w" in busy|zipf|uniform) ;; *) die "unknown workload '$w' in WORKLOADS (busy, zipf, uniform)";; esac
    case " ${WLIST[*]:-} " in *" $w "*) ;; *) WLIST+=("$w");; esac
done
[ "${#WLIST[@]}" -ge 1 ] || [ "$PACED" = 1 ] || die "WORKLOADS is empty and PACED=0: nothing to measure"

# --- processes --------------------------------------------------------------------------------
tmp=$(mktemp -d /tmp/ngx-ratelimit-lease.XXXXXX)
redis_pid=""
hammer_pid=""
paced_pid=""
stop_nginx() { stop_nginx_pidfile "$tmp/nginx.pid"; }
cleanup() {
    stop_pid "$paced_pid"
    stop_pid "$hammer_pid"
    stop_nginx
    stop_pid "$redis_pid"
    if [ -n "${KEEP_TMP:-}" ]; then say "kept $tmp (KEEP_TMP)"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rport=$(free_port)
nport=$(free_port "$rport")
rcli() { timeout 10 redis-cli -p "$rport" "$@"; }

start_bench_redis

mkdir -p "$tmp/html" "$tmp/logs" "$tmp/tmp"
# The size of nginx's default index.html, as in bench/run.sh and compare.sh.
page=$(printf '<!DOCTYPE html>\n<html><head><title>bench</title></head><body>\n%s\n</body></html>\n' \
       "$(head -c 450 /dev/zero | tr '\0' 'x')")
for d in a b c pb pc; do mkdir -p "$tmp/html/$d"; printf '%s' "$page" > "$tmp/html/$d/index.html"; done
chmod -R a+rX "$tmp"

WORKER=""
start_nginx() {
    cat > "$tmp/nginx.conf" <<EOF
load_module $MODULE;
$(nginx_conf_head "$tmp" "$WORKERS")

    ratelimit_redis 127.0.0.1:$rport;
    # B and C differ only in lease=; the paced test's zones likewise. Separate zones keep
    # separate Redis keys (rl:<zone>:<id>).
    ratelimit_zone exact  key=\$http_x_consumer_id limit=$LIMIT window=$WINDOW algorithm=$ALGORITHM;
    ratelimit_zone leased key=\$http_x_consumer_id limit=$LIMIT window=$WINDOW algorithm=$ALGORITHM lease=auto;
    ratelimit_zone pexact  key=\$http_x_consumer_id limit=$PACED_LIMIT window=$PACED_WINDOW algorithm=$ALGORITHM;
    ratelimit_zone pleased key=\$http_x_consumer_id limit=$PACED_LIMIT window=$PACED_WINDOW algorithm=$ALGORITHM lease=auto;
    # A decision Redis did not make is a 503, so it shows as non-2xx instead of passing as a
    # fast "allowed" request. Rejections of the hammered keys are not logged (info is below
    # error_log's level): the paced test measures limiting, not log writing.
    ratelimit_fail closed;
    ratelimit_log_level info;
    ratelimit_metrics_zone 64k;

    server {
        listen 127.0.0.1:$nport;
        root $tmp/html;
        location /a/ { }
        location /b/ { ratelimit exact; }
        location /c/ { ratelimit leased; }
        # The paced client reads how each of its requests was admitted (not a throughput
        # measurement: a header costs nothing that matters here).
        location /pb/ { ratelimit pexact; add_header X-RL-Status \$ratelimit_status always; }
        location /pc/ { ratelimit pleased; add_header X-RL-Status \$ratelimit_status always; }
        location = /lease-metrics { ratelimit_metrics; }
    }
}
EOF
    "$NGINX" -p "$tmp/" -c "$tmp/nginx.conf" -t -q 2> "$tmp/nginx-t.log" \
        || { cat "$tmp/nginx-t.log" >&2; die "nginx -t failed (a module without lease=? see above)"; }
    "$NGINX" -p "$tmp/" -c "$tmp/nginx.conf" || { cat "$tmp/logs/error.log" >&2; die "nginx did not start"; }
    for _ in $(seq 1 50); do [ -s "$tmp/nginx.pid" ] && port_in_use "$nport" && break; sleep 0.1; done
    port_in_use "$nport" || { cat "$tmp/logs/error.log" >&2; die "nginx did not start"; }
    local master w=()
    master=$(cat "$tmp/nginx.pid")
    for _ in $(seq 1 50); do
        mapfile -t w < <(pgrep -P "$master")
        [ "${#w[@]}" -eq "$WORKERS" ] && break
        sleep 0.1
    done
    [ "${#w[@]}" -eq "$WORKERS" ] || die "expected $WORKERS nginx worker, found ${#w[@]}"
    WORKER=${w[0]}
}

base() { echo "http://127.0.0.1:$nport"; }
zone_of() { case "$1" in a) echo "-";; b) echo exact;; c) echo leased;; pb) echo pexact;; pc) echo pleased;; esac; }
label() { case "$1" in a) echo "A no limiter";; b) echo "B exact";; c) echo "C lease=auto";; esac; }

# "passed passed_lease other reserved returned" of a zone so far (ratelimit_metrics JSON);
# zeros for "-".
decisions() {
    local json
    json=$(curl -sS --max-time 5 "$(base)/lease-metrics?format=json") || die "GET /lease-metrics failed"
    python3 -c '
import json, sys
z = sys.argv[1]
m = json.loads(sys.stdin.read())
if z == "-":
    print("0 0 0 0 0"); sys.exit(0)
d = m["zones"][z]["decisions"]
u = m["zones"][z].get("lease_units", {})
p, pl = d.get("PASSED", 0), d.get("PASSED_LEASE", 0)
print(p, pl, sum(d.values()) - p - pl, u.get("reserved", 0), u.get("returned", 0))' "$1" <<< "$json"
}
error_lines() { grep -cE '\[(error|crit|alert|emerg)\]' "$tmp/logs/error.log" || true; }
last_errors() { grep -E '\[(error|crit|alert|emerg)\]' "$tmp/logs/error.log" | tail -n 3 | sed "s#$tmp/##" || true; }

# Each contender must really do what it claims before anything is measured.
sanity() {
    local loc url hdrs codes args=() i t pl admitted e0
    e0=$(error_lines)
    rcli flushall >/dev/null
    for loc in a b c; do
        url="$(base)/$loc/index.html"
        hdrs=$(curl -sS -D - -o /dev/null --max-time 5 -H 'X-Consumer-Id: lease-probe' "$url") \
            || die "GET $url failed"
        case "${hdrs%%$'\r'*}" in *' 200'*) ;; *) die "GET /$loc/: ${hdrs%%$'\r'*}: $(last_errors)";; esac
        if [ "$loc" = a ]; then
            grep -qi '^RateLimit-' <<< "$hdrs" && die "/a/ answers RateLimit headers"
        else
            grep -qi "^RateLimit-Limit: *$LIMIT" <<< "$hdrs" \
                || die "GET /$loc/ has no 'RateLimit-Limit: $LIMIT' header: the limiter is not running"
        fi
    done
    [ "$(rcli exists rl:exact:lease-probe rl:leased:lease-probe)" = 2 ] \
        || die "the limiters' keys (rl:exact:lease-probe, rl:leased:lease-probe) are not in Redis"
    # C must admit from reservations: a key asked for again gets units reserved, and the
    # requests after that are PASSED_LEASE.
    t=$(decisions leased); read -r _ pl _ <<< "$t"
    args=(); for i in $(seq 1 30); do args+=(-o /dev/null "$(base)/c/index.html"); done
    codes=$(curl -sS --max-time 30 -w '%{http_code}\n' -H 'X-Consumer-Id: lease-probe' "${args[@]}" | sort | uniq -c | tr -s ' ' | tr '\n' ',')
    [ "$codes" = " 30 200," ] || die "/c/: 30 requests of one id answered '$codes'; $(last_errors)"
    t=$(decisions leased); read -r _ i _ <<< "$t"
    [ "$i" -gt "$pl" ] || die "/c/: no request admitted from a reservation (PASSED_LEASE) out of 30 of one id: lease=auto is not at work; $(last_errors)"
    # The paced test's zones limit: B admits exactly PACED_LIMIT of PACED_LIMIT + 1, C never
    # more (reservations may leave a few units unspent), and both reject the last one.
    for loc in pb pc; do
        url="$(base)/$loc/index.html"
        args=(); for i in $(seq 1 $((PACED_LIMIT + 1))); do args+=(-o /dev/null "$url"); done
        codes=$(curl -sS --max-time 60 -w '%{http_code}\n' -H 'X-Consumer-Id: lease-probe' "${args[@]}")
        admitted=$(grep -c '^200$' <<< "$codes" || true)
        [ "$(tail -n1 <<< "$codes")" = 429 ] || die "/$loc/: request $((PACED_LIMIT + 1)) of one id was not refused ($(tail -n1 <<< "$codes"))"
        [ "$(grep -cv '^\(200\|429\)$' <<< "$codes" || true)" = 0 ] || die "/$loc/: answers other than 200 and 429: $(sort <<< "$codes" | uniq -c | tr '\n' ' '); $(last_errors)"
        if [ "$loc" = pb ]; then
            [ "$admitted" = "$PACED_LIMIT" ] || die "/pb/: $admitted of $((PACED_LIMIT + 1)) requests admitted, expected $PACED_LIMIT"
        else
            [ "$admitted" -le "$PACED_LIMIT" ] || die "/pc/: $admitted of $((PACED_LIMIT + 1)) requests admitted: over the limit of $PACED_LIMIT"
            SANITY_PC=$admitted
        fi
    done
    [ "$(error_lines)" = "$e0" ] || die "error lines in nginx's log during the sanity checks: $(last_errors)"
    rcli flushall >/dev/null
}

# --- measurement ------------------------------------------------------------------------------
CLK_TCK=$(getconf CLK_TCK)
pids_ticks() {  # user + system clock ticks of the given pids
    local pid stat total=0
    for pid in "$@"; do
        stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
        stat=${stat##*) }   # fields after "(comm)"; utime and stime are fields 14 and 15
        read -r -a f <<< "$stat"
        total=$((total + f[11] + f[12]))
    done
    echo "$total"
}
worker_cpu() {  # seconds of CPU used so far by the nginx worker
    local t
    t=$(pids_ticks "$WORKER") || die "the nginx worker $WORKER is gone; see $tmp/logs/error.log"
    awk -v t="$t" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", t / hz }'
}
# CPU the rest of the machine took during a run (builds, tests, other benchmarks): all busy CPU
# (/proc/stat) minus the nginx worker, redis-server and this script with its children (wrk,
# curl, redis-cli, perl). "busy ours total" in clock ticks.
cpu_ticks() {
    local all ours stat
    read -r -a all < /proc/stat   # cpu user nice system idle iowait irq softirq steal ...
    ours=$(pids_ticks "$WORKER" "$redis_pid") || die "the nginx worker or redis-server is gone"
    stat=$(cat "/proc/$$/stat"); stat=${stat##*) }; read -r -a f <<< "$stat"
    ours=$((ours + f[11] + f[12] + f[13] + f[14]))   # utime stime cutime cstime of this shell
    echo "$((all[1] + all[2] + all[3] + all[6] + all[7] + all[8])) $ours $((all[1] + all[2] + all[3] + all[4] + all[5] + all[6] + all[7] + all[8]))"
}
redis_snapshot() { rcli info cpu commandstats | tr -d '\r' > "$1" || die "INFO failed"; }

wrk_args() {  # lease_wrk.lua arguments of a workload
    case "$1" in
        busy) echo "busy $BUSY_KEYS" ;;
        zipf) echo "zipf $ZIPF_IDS $ZIPF_S $ZIPF_SEED" ;;
        uniform) echo "uniform $UNIFORM_IDS" ;;
    esac
}
run_wrk() {  # run_wrk location seconds workload out -> BENCH line
    # shellcheck disable=SC2046
    timeout $(( $2 + 60 )) wrk -t"$THREADS" -c"$CONNS" -d"$2s" --timeout 5s --latency \
        -s "$BENCH/lease_wrk.lua" "$(base)/$1/index.html" -- $(wrk_args "$3") > "$4" 2>&1 \
        || { cat "$4" >&2; die "wrk failed on /$1/"; }
    grep '^BENCH ' "$4" || { cat "$4" >&2; die "no BENCH line from wrk"; }
}
field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<< "$2"; }

# The paced client: RATE requests/s of one id for SECONDS, on a schedule (not back to back),
# one keep-alive connection. Prints "sent=N ok=N rejected=N other=N late_ms=N local=N" (late_ms:
# the most a request started after its slot; local: admitted from a reservation, PASSED_LEASE).
PACED_PL='
use strict; use warnings;
use HTTP::Tiny; use Time::HiRes qw(time sleep);
my ($url, $id, $rate, $secs) = @ARGV;
my $http = HTTP::Tiny->new(keep_alive => 1, timeout => 5);
my $n = int($rate * $secs); my $t0 = time; my ($ok, $rej, $other, $late, $local) = (0, 0, 0, 0, 0);
for my $i (0 .. $n - 1) {
    my $d = $t0 + $i / $rate - time;
    if ($d > 0) { sleep $d } elsif (-$d > $late) { $late = -$d }
    my $r = $http->get($url, { headers => { "X-Consumer-Id" => $id } });
    if ($r->{status} == 200) { $ok++ } elsif ($r->{status} == 429) { $rej++ } else { $other++ }
    $local++ if ($r->{headers}{"x-rl-status"} // "") eq "PASSED_LEASE";
}
printf "sent=%d ok=%d rejected=%d other=%d late_ms=%d local=%d\n", $n, $ok, $rej, $other, $late * 1000, $local;
'

COLS='workload\tcontender\tround\trequests\tduration_us\trps\tp50_us\tp99_us\tnon2xx\tsocket_errors\tworker_cpu_s\tredis_cpu_s\tscript_calls\tredis_calls_total\tpassed\tpassed_lease\tother_decisions\tlease_reserved\tlease_returned\terror_lines\tpaced_sent\tpaced_ok\tpaced_rejected\tpaced_other\tpaced_late_ms\tpaced_local\tredis_commands\tother_cpu_pct\n'
printf "$COLS" > "$tmp/raw.tsv"

# measure workload contender round location seconds [paced-id]: one measured run, a row of
# raw.tsv. With a paced id, the paced client runs beside wrk (started a second after it, and
# done a second before it ends).
measure() {
    local wl=$1 c=$2 r=$3 loc=$4 secs=$5 pid_id=${6:-} zone t line e0 e1 n cpu0 cpu1
    local p0 pl0 o0 rs0 rt0 p1 pl1 o1 rs1 rt1 busy0 ours0 all0 busy1 ours1 all1 foreign
    local rcpu rscript rtotal rcmds paced="0 0 0 0 0 0"
    zone=$(zone_of "$loc")
    e0=$(error_lines); t=$(decisions "$zone"); read -r p0 pl0 o0 rs0 rt0 <<< "$t"
    redis_snapshot "$tmp/redis0"; cpu0=$(worker_cpu)
    t=$(cpu_ticks); read -r busy0 ours0 all0 <<< "$t"
    if [ -n "$pid_id" ]; then
        # Started directly (not through a function), so that the pids are timeout's, which
        # passes cleanup's TERM on to wrk and perl.
        # shellcheck disable=SC2046
        timeout $(( secs + 60 )) wrk -t"$THREADS" -c"$CONNS" -d"${secs}s" --timeout 5s --latency \
            -s "$BENCH/lease_wrk.lua" "$(base)/$loc/index.html" -- $(wrk_args busy) > "$tmp/hammer.out" 2>&1 &
        hammer_pid=$!
        sleep 1
        timeout $((PACED_SECONDS + 30)) perl -e "$PACED_PL" "$(base)/$loc/index.html" "$pid_id" \
            "$PACED_RATE" "$PACED_SECONDS" > "$tmp/paced.out" 2>&1 &
        paced_pid=$!
        wait "$paced_pid" || { cat "$tmp/paced.out" >&2; die "the paced client failed"; }
        paced_pid=""
        wait "$hammer_pid" || { cat "$tmp/hammer.out" >&2; die "the hammering wrk failed"; }
        hammer_pid=""
        line=$(grep '^BENCH ' "$tmp/hammer.out") || { cat "$tmp/hammer.out" >&2; die "no BENCH line from the hammering wrk"; }
        t=$(cat "$tmp/paced.out")
        paced="$(field sent " $t") $(field ok " $t") $(field rejected " $t") $(field other " $t") $(field late_ms " $t") $(field local " $t")"
    else
        line=$(run_wrk "$loc" "$secs" "$wl" "$tmp/wrk.out")
    fi
    t=$(cpu_ticks); read -r busy1 ours1 all1 <<< "$t"
    cpu1=$(worker_cpu); redis_snapshot "$tmp/redis1"
    t=$(decisions "$zone"); read -r p1 pl1 o1 rs1 rt1 <<< "$t"; e1=$(error_lines)
    foreign=$(awk -v b=$((busy1 - busy0)) -v o=$((ours1 - ours0)) -v t=$((all1 - all0)) \
              'BEGIN { f = (t > 0 ? 100 * (b - o) / t : 0); printf "%.1f", (f < 0 ? 0 : f) }')
    t=$(redis_delta "$tmp/redis0" "$tmp/redis1"); read -r rcpu rtotal rscript rcmds <<< "$t"
    # Requests: the ones wrk completed (the vendored nginx has no stub_status), plus the paced
    # client's. At most CONNS more were in flight when wrk stopped: 0.02 % of a run's.
    n=$(( $(field requests "$line") + ${paced%% *} ))
    local -a pc
    read -r -a pc <<< "$paced"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
        "$wl" "$c" "$r" "$n" \
        "$(field duration_us "$line")" "$(field rps "$line")" "$(field p50_us "$line")" \
        "$(field p99_us "$line")" "$(field non2xx "$line")" "$(field socket_errors "$line")" \
        "$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.2f", b - a }')" \
        "$rcpu" "$rscript" "$rtotal" "$((p1 - p0))" "$((pl1 - pl0))" "$((o1 - o0))" \
        "$((rs1 - rs0))" "$((rt1 - rt0))" "$((e1 - e0))" "${pc[0]}" "${pc[1]}" "${pc[2]}" "${pc[3]}" "${pc[4]}" "${pc[5]}" \
        "$rcmds" "$foreign" >> "$tmp/raw.tsv"
    LAST_LINE=$line
    LAST_SHARE=$(awk -v p=$((p1 - p0)) -v l=$((pl1 - pl0)) -v s="$rscript" -v n="$n" \
        'BEGIN { printf "%.3f script calls/req, %.1f%% from reservations", (n ? s / n : 0), (p + l ? 100 * l / (p + l) : 0) }')
    LAST_PACED=$paced
    # Not fatal: on a loaded machine Redis can miss the 200 ms timeout of a few decisions (503s
    # by ratelimit_fail closed). The row keeps them; the report names such runs.
    [ "$(field non2xx "$line")" = 0 ] || [ -n "$pid_id" ] \
        || say "warning: $wl /$loc/: $(field non2xx "$line") non-2xx answers with a limit never reached: $(last_errors | tail -n1)"
}

main_runs=$(( ${#WLIST[@]} * 3 * ROUNDS ))
paced_runs=$(( PACED == 1 ? 2 * PACED_ROUNDS : 0 ))
say "redis on 127.0.0.1:$rport, nginx on 127.0.0.1:$nport, $WORKERS worker; $main_runs runs of ${WARMUP}s warm-up + ${DURATION}s" \
    "(wrk -t$THREADS -c$CONNS), $paced_runs paced runs of $((PACED_SECONDS + 2))s; about" \
    "$(( (main_runs * (WARMUP + DURATION + 2) + paced_runs * (PACED_SECONDS + 5) + 30) / 60 + 1 )) min"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
uptime_start=$(uptime)
start_time=$(date +%s)
start_nginx
SANITY_PC=""
sanity
say "nginx (worker pid $WORKER) passed the sanity checks (/pc/ admitted $SANITY_PC of $((PACED_LIMIT + 1)) requests of one id in a row)"

run_no=0
CONTENDERS=(a b c)
for wl in "${WLIST[@]}"; do
    for r in $(seq 1 "$ROUNDS"); do
        # The order rotates by one each round, so that no contender always runs first.
        for k in 0 1 2; do
            c=${CONTENDERS[$(( (k + r - 1) % 3 ))]}
            run_no=$((run_no + 1))
            rcli flushall >/dev/null
            if [ "$WARMUP" -gt 0 ]; then run_wrk "$c" "$WARMUP" "$wl" "$tmp/warm.out" > /dev/null; fi
            measure "$wl" "$c" "$r" "$c" "$DURATION"
            say "[$run_no/$main_runs] $wl round $r $(label "$c"): $(printf '%.0f' "$(field rps "$LAST_LINE")") req/s," \
                "p99 $(field p99_us "$LAST_LINE")us$([ "$c" = a ] || echo ", $LAST_SHARE")"
        done
    done
done

if [ "$PACED" = 1 ]; then
    # A worker of its own: the workloads above leave C's worker with up to 10,000 keys in its
    # reservation table, and a key it cannot add is decided exactly; the paced key must be one
    # that can get reservations, or the test measures exact decisions twice.
    stop_nginx
    start_nginx
    say "nginx restarted for the paced test (worker pid $WORKER)"
    for r in $(seq 1 "$PACED_ROUNDS"); do
        for c in b c; do
            rcli flushall >/dev/null
            measure paced "$c" "$r" "p$c" $((PACED_SECONDS + 2)) "paced-$r"
            read -r s o j x l lo <<< "$LAST_PACED"
            say "paced round $r $(label "$c"): $o of $s paced requests admitted ($lo from reservations; $j rejected, $x other, at most ${l} ms late)" \
                "beside $(printf '%.0f' "$(field rps "$LAST_LINE")") req/s on $BUSY_KEYS ids over their limit"
        done
    done
fi
stop_nginx
elapsed=$(( $(date +%s) - start_time ))

# --- report -----------------------------------------------------------------------------------
{
    bench_meta_env
    printf 'nginx\t%s\n' "$("$NGINX" -v 2>&1 | sed 's/^nginx version: //') (${NGINX#"$ROOT"/})"
    printf 'module\t%s\n' "${MODULE#"$ROOT"/}"
    printf 'workers\t%s\nalgorithm\t%s\nlimit\t%s\nwindow\t%s\n' "$WORKERS" "$ALGORITHM" "$LIMIT" "$WINDOW"
    printf 'threads\t%s\nconns\t%s\nduration\t%s\nrounds\t%s\nwarmup\t%s\n' \
        "$THREADS" "$CONNS" "$DURATION" "$ROUNDS" "$WARMUP"
    printf 'busy_keys\t%s\nzipf_ids\t%s\nzipf_s\t%s\nzipf_seed\t%s\nuniform_ids\t%s\n' \
        "$BUSY_KEYS" "$ZIPF_IDS" "$ZIPF_S" "$ZIPF_SEED" "$UNIFORM_IDS"
    printf 'paced_limit\t%s\npaced_window\t%s\npaced_rate\t%s\npaced_seconds\t%s\n' \
        "$PACED_LIMIT" "$PACED_WINDOW" "$PACED_RATE" "$PACED_SECONDS"
    printf 'sanity_pc_admitted\t%s of %s\n' "$SANITY_PC" "$((PACED_LIMIT + 1))"
    printf 'load_start\t%s\nload_end\t%s\n' "$load_start" "$(cut -d' ' -f1-3 /proc/loadavg)"
    printf 'uptime_start\t%s\nuptime_end\t%s\n' "$(sed 's/^ *//' <<< "$uptime_start")" "$(uptime | sed 's/^ *//')"
    printf 'elapsed_s\t%s\npage_bytes\t%s\n' "$elapsed" "$(printf '%s' "$page" | wc -c)"
} > "$tmp/meta.tsv"

cp "$tmp/raw.tsv" "$OUT_TSV"
cp "$tmp/meta.tsv" "${OUT_TSV%.tsv}.meta.tsv"
python3 "$BENCH/lease_report.py" "$OUT_TSV" "${OUT_TSV%.tsv}.meta.tsv" "$OUT_MD" || die "lease_report.py failed"
say "written: ${OUT_MD#"$ROOT"/}, ${OUT_TSV#"$ROOT"/}, ${OUT_TSV%.tsv}.meta.tsv in ${elapsed}s"
