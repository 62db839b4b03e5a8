#!/usr/bin/env bash
# Two or more builds of the module side by side in one run, on one machine: the allow scenario
# of bench/compare.sh, with every build's module a contender of its own.
#
# Why: bench/compare.md's ratios move with the machine, not only with the code. The run of
# 2026-12-03 (Intel Xeon) against the one before (AMD EPYC) showed Redis CPU per decision
# module/Lua 0.55 -> 0.68 and requests/s module/no limiter 0.51 -> 0.41 after changes that cut
# the work of both; 0f2e2b8 measured here beside 09b916f on the new machine gave the new
# machine's ratios, not the old ones (bench/compare-builds.md, docs/benchmarks.md). A
# before/after of the code is measured so, in one run, not as two compare.md files from two hosts.
#
# One redis-server, one Debian /usr/sbin/nginx per build (each on its own port, all idle but
# the one measured), contenders interleaved in every round: no limiter and the article's Lua
# block (on the first build's nginx; neither runs the module), then each build's /module/.
# Every run: FLUSHALL, WARMUP s of the same load, DURATION s measured. Besides requests/s and
# CPU per request it counts what does not depend on the machine's speed: script calls per
# request and decisions per call (EVALSHA in INFO commandstats against the requests nginx
# counted), Redis commands per request, and Redis's own time per call (EVALSHA's usec).
#
# Usage:  BUILDS="old=/path/a.so new=/path/b.so" bench/compare-builds.sh > rows.tsv
#   each .so built by `make build-system` (a second tree: git worktree add ../old <commit>)
# Environment (defaults): W=1 (workers) ROUNDS=5 DURATION=8 WARMUP=1 THREADS=2 CONNS=64
#   IDS=10000  KEEP_TMP=1 keeps the temporary directory
# Prints one TSV row per run on stdout and the medians per contender on stderr. wrk, nginx
# and Redis share the machine's cores: compare wall-clock figures only as ratios within the
# run; "other CPU" is the machine's busy time that none of them used.

set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
. "$ROOT/bench/lib.sh"
die() { echo "compare-builds: error: $*" >&2; exit 1; }
say() { echo "compare-builds: $*" >&2; }

NGINX=${NGINX:-/usr/sbin/nginx}
MODDIR=${MODDIR:-/usr/lib/nginx/modules}
BUILDS=${BUILDS:-}
W=${W:-1}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-8}
WARMUP=${WARMUP:-1}
THREADS=${THREADS:-2}
CONNS=${CONNS:-64}
IDS=${IDS:-10000}

for c in wrk redis-server redis-cli curl timeout getconf; do
    command -v "$c" >/dev/null || die "'$c' not found"
done
[ -x "$NGINX" ] || die "$NGINX not found (Debian: apt-get install nginx)"
case "$W$ROUNDS$DURATION$WARMUP$THREADS$CONNS$IDS" in *[!0-9]*) die "W, ROUNDS, DURATION, WARMUP, THREADS, CONNS, IDS must be integers";; esac
[ "$IDS" -ge 1000 ] || die "IDS must be at least 1000 (the limit of 100 per 60 s must not be reached)"
declare -A MOD PORT WPIDS
names=()
for b in $BUILDS; do
    name=${b%%=*}; so=${b#*=}
    [ "$name" != "$b" ] && [ -n "$name" ] || die "BUILDS takes name=path pairs, got '$b'"
    case "$name" in nolimit|lua|*[!A-Za-z0-9_-]*) die "build name '$name': letters, digits, - and _, not nolimit or lua";; esac
    [ -z "${MOD[$name]:-}" ] || die "build name '$name' given twice"
    [ -f "$so" ] || die "$so not found (make build-system in that tree)"
    MOD[$name]=$so; names+=("$name")
done
[ "${#names[@]}" -ge 2 ] || die "BUILDS needs two builds or more: BUILDS=\"old=/path/a.so new=/path/b.so\""

tmp=$(mktemp -d /tmp/ngx-ratelimit-builds.XXXXXX)
redis_pid=""
cleanup() {
    local b
    for b in "${names[@]}"; do stop_nginx_pidfile "$tmp/$b/nginx.pid"; done
    stop_pid "$redis_pid"
    if [ -n "${KEEP_TMP:-}" ]; then say "kept $tmp (KEEP_TMP)"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rport=$(free_port)
rcli() { redis-cli -p "$rport" "$@"; }
start_bench_redis
sed "s/@REDIS_PORT@/$rport/" "$ROOT/bench/article_limiter.conf" > "$tmp/article_limiter.conf"
# The size of nginx's default index.html, as in compare.sh.
page=$(printf '<!DOCTYPE html>\n<html><head><title>bench</title></head><body>\n%s\n</body></html>\n' \
       "$(head -c 450 /dev/zero | tr '\0' 'x')")

for b in "${names[@]}"; do
    d=$tmp/$b
    mkdir -p "$d/html/nolimit" "$d/html/lua" "$d/html/module" "$d/logs" "$d/tmp"
    for x in nolimit lua module; do printf '%s' "$page" > "$d/html/$x/index.html"; done
    # The workers run as nobody: the files must be readable to them.
    chmod -R a+rX "$tmp"
    p=$(free_port "$rport" "${PORT[@]}"); PORT[$b]=$p
    cat > "$d/nginx.conf" <<EOF
load_module $MODDIR/ndk_http_module.so;
load_module $MODDIR/ngx_http_lua_module.so;
load_module ${MOD[$b]};
$(nginx_conf_head "$d" "$W")
    lua_package_path "/usr/share/lua/5.1/?.lua;;";
    ratelimit_redis 127.0.0.1:$rport;
    ratelimit_zone bench key=\$http_x_consumer_id limit=100 window=60s;
    ratelimit_log_level info;
    server {
        listen 127.0.0.1:$p;
        root $d/html;
        location /nolimit/ { }
        location /lua/ { include $tmp/article_limiter.conf; }
        location /module/ { ratelimit bench; }
        location = /builds-status { stub_status; }
    }
}
EOF
    "$NGINX" -p "$d/" -c "$d/nginx.conf" || { cat "$d/logs/error.log" >&2; die "nginx of '$b' did not start"; }
    for _ in $(seq 1 50); do [ -s "$d/nginx.pid" ] && port_in_use "$p" && break; sleep 0.1; done
    port_in_use "$p" || { cat "$d/logs/error.log" >&2; die "nginx of '$b' did not start"; }
    for _ in $(seq 1 50); do
        mapfile -t ws < <(pgrep -P "$(cat "$d/nginx.pid")")
        [ "${#ws[@]}" -eq "$W" ] && break
        sleep 0.1
    done
    [ "${#ws[@]}" -eq "$W" ] || die "nginx of '$b': expected $W worker(s), found ${#ws[@]}"
    WPIDS[$b]="${ws[*]}"
    code=$(curl -sS -o /dev/null -w '%{http_code}' -H 'X-Consumer-Id: probe' "http://127.0.0.1:$p/module/index.html")
    [ "$code" = 200 ] || die "nginx of '$b': /module/ answered $code"
done

ticks() {  # CPU clock ticks (user + system) of the given pids
    local t=0 pid f
    for pid in "$@"; do read -r -a f <<< "$(cut -d')' -f2- "/proc/$pid/stat")"; t=$((t + f[11] + f[12])); done
    echo "$t"
}
self_ticks() {  # this shell with its waited-for children (wrk, curl, redis-cli)
    local f; read -r -a f <<< "$(cut -d')' -f2- "/proc/$$/stat")"; echo $((f[11] + f[12] + f[13] + f[14]))
}
machine() { local a; read -r -a a < /proc/stat; echo $((a[1]+a[2]+a[3]+a[6]+a[7]+a[8])) $((a[1]+a[2]+a[3]+a[4]+a[5]+a[6]+a[7]+a[8])); }
requests() { curl -sS --max-time 5 "http://127.0.0.1:$1/builds-status" | awk 'NR == 3 { print $3 }'; }
reads() { sed -n 's/^total_reads_processed:\([0-9]*\)/\1/p' "$1"; }
evalsha_usec() { sed -n 's/^cmdstat_evalsha:.*usec=\([0-9]*\),.*/\1/p' "$1"; }
run_wrk() {  # run_wrk port location seconds
    timeout $(( $3 + 60 )) wrk -t"$THREADS" -c"$CONNS" -d"$3s" --timeout 5s --latency \
        -s "$ROOT/bench/compare_wrk.lua" "http://127.0.0.1:$1/$2/index.html" -- "$IDS" 0 > "$tmp/wrk.out" 2>&1 \
        || { cat "$tmp/wrk.out" >&2; die "wrk failed on :$1/$2/"; }
    grep '^BENCH ' "$tmp/wrk.out" || { cat "$tmp/wrk.out" >&2; die "no BENCH line from wrk"; }
}

hz=$(getconf CLK_TCK)
contenders=(nolimit lua "${names[@]}")
say "redis on 127.0.0.1:$rport; ${#contenders[@]} contenders x $ROUNDS rounds of ${WARMUP}s + ${DURATION}s, $W worker(s)"
printf 'round\tcontender\trps\tp99_us\trequests\tworker_cpu_us_per_req\tredis_cpu_us_per_req\tcalls_per_req\tdecisions_per_call\tcommands_per_req\tevalsha_usec_per_call\tredis_reads_per_req\tother_cpu_pct\n' \
    | tee "$tmp/rows.tsv"
for r in $(seq 1 "$ROUNDS"); do
    for c in "${contenders[@]}"; do
        case $c in
            nolimit|lua) b=${names[0]}; loc=$c ;;
            *) b=$c; loc=module ;;
        esac
        p=${PORT[$b]}
        # shellcheck disable=SC2086
        set -- ${WPIDS[$b]}
        rcli flushall >/dev/null
        if [ "$WARMUP" -gt 0 ]; then run_wrk "$p" "$loc" "$WARMUP" >/dev/null; fi
        n0=$(requests "$p"); rcli info cpu stats commandstats | tr -d '\r' > "$tmp/redis0"
        w0=$(ticks "$@"); rd0=$(ticks "$redis_pid"); s0=$(self_ticks); read -r busy0 all0 <<< "$(machine)"
        line=$(run_wrk "$p" "$loc" "$DURATION")
        read -r busy1 all1 <<< "$(machine)"; s1=$(self_ticks); rd1=$(ticks "$redis_pid"); w1=$(ticks "$@")
        rcli info cpu stats commandstats | tr -d '\r' > "$tmp/redis1"; n1=$(requests "$p")
        read -r rcpu _ calls _ <<< "$(redis_delta "$tmp/redis0" "$tmp/redis1")"
        # The status request itself is one of nginx's.
        n=$((n1 - n0 - 1))
        awk -v r="$r" -v c="$c" -v line="$line" -v n="$n" -v wt=$((w1 - w0)) -v hz="$hz" \
            -v rcpu="$rcpu" -v calls="$calls" -v u0="$(evalsha_usec "$tmp/redis0")" \
            -v u1="$(evalsha_usec "$tmp/redis1")" -v rr=$(( $(reads "$tmp/redis1") - $(reads "$tmp/redis0") )) -v f="$tmp/redis0" -v g="$tmp/redis1" \
            -v other=$(( (busy1 - busy0) - (w1 - w0) - (rd1 - rd0) - (s1 - s0) )) -v all=$((all1 - all0)) '
            function field(k) { return (match(line, k "=[0-9.]+") ? substr(line, RSTART + length(k) + 1, RLENGTH - length(k) - 1) : 0) }
            function cmds(file,   t, a, x) {
                while ((getline x < file) > 0)
                    if (x ~ /^cmdstat_/ && x !~ /^cmdstat_info:/) { split(x, a, /[=,]/); t += a[2] }
                return t }
            BEGIN {
                printf "%s\t%s\t%.0f\t%s\t%d\t%.2f\t%.2f\t%.4f\t%.2f\t%.3f\t%.1f\t%.3f\t%.0f\n", r, c,
                    field("rps"), field("p99_us"), n, wt / hz * 1e6 / n, rcpu * 1e6 / n, calls / n,
                    (calls ? n / calls : 0), (cmds(g) - cmds(f)) / n,
                    (calls && u1 != "" ? (u1 - u0) / calls : 0), rr / n, (all > 0 && other > 0 ? 100 * other / all : 0) }' \
            | tee -a "$tmp/rows.tsv"
    done
done

# Medians per contender, and each build's ratios to the Lua block and to no limiter.
awk -F'\t' 'NR > 1 { k = $2; if (!(k in seen)) { seen[k] = 1; order[++m] = k }
                     for (i = 3; i <= 13; i++) v[k, i, ++cnt[k, i]] = $i }
    function med(k, i,   n, j, a, t, x, y) {
        n = cnt[k, i]; for (j = 1; j <= n; j++) a[j] = v[k, i, j] + 0
        for (x = 2; x <= n; x++) { t = a[x]; for (y = x - 1; y >= 1 && a[y] > t; y--) a[y + 1] = a[y]; a[y + 1] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    END {
        printf "medians of %d rounds:\n%-10s %9s %8s %10s %10s %9s %9s %9s %9s %9s\n", cnt[order[1], 3], "contender",
            "req/s", "p99 us", "worker us", "redis us", "calls/req", "dec/call", "cmds/req", "reads/req", "other %"
        for (j = 1; j <= m; j++) { k = order[j]
            printf "%-10s %9.0f %8.0f %10.2f %10.2f %9.4f %9.2f %9.3f %9.3f %9.0f\n", k, med(k, 3), med(k, 4),
                med(k, 6), med(k, 7), med(k, 8), med(k, 9), med(k, 10), med(k, 12), med(k, 13) }
        printf "ratios of medians:\n%-10s %22s %20s %26s\n", "build", "redis us/decision /Lua", "req/s /no limiter", "worker us - no limiter"
        for (j = 3; j <= m; j++) { k = order[j]
            printf "%-10s %22.2f %20.2f %+26.2f\n", k, med(k, 7) / med("lua", 7), med(k, 3) / med("nolimit", 3), med(k, 6) - med("nolimit", 6) }
    }' "$tmp/rows.tsv" >&2
