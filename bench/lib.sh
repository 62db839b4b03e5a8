# Shell helpers shared by the bench/ scripts (sourced; the caller defines die()).

# Stops a process: TERM, up to 5 s to exit, then KILL.
stop_pid() {
    local pid=$1
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
}

# Stops the nginx whose master pid is in a pid file (graceful QUIT, up to 5 s, then KILL).
stop_nginx_pidfile() {
    local pid pf=$1
    [ -s "$pf" ] || return 0
    pid=$(cat "$pf")
    kill -QUIT "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$pf"
}

# The head every benchmark's nginx.conf shares, up to the inside of `http {`: one directory
# holds the logs, the pid file and the temporary files. nginx_conf_head dir workers
nginx_conf_head() {
    cat <<EOF
worker_processes $2;
error_log $1/logs/error.log warn;
pid $1/nginx.pid;
events { worker_connections 1024; }
http {
    default_type text/html;
    access_log off;
    client_body_temp_path $1/tmp/client_body;
    proxy_temp_path $1/tmp/proxy;
    fastcgi_temp_path $1/tmp/fastcgi;
    uwsgi_temp_path $1/tmp/uwsgi;
    scgi_temp_path $1/tmp/scgi;
EOF
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Below the kernel's ephemeral range (32768 and up here), from which the benchmark's own
# outgoing connections take their ports: none can take this one before the server binds it.
free_port() {  # a free loopback port, not one of the arguments
    local p
    for _ in $(seq 1 200); do
        p=$((10000 + RANDOM % 22000))
        case " $* " in *" $p "*) continue;; esac
        port_in_use "$p" || { echo "$p"; return 0; }
    done
    die "no free loopback port found"
}

# The environment lines every benchmark's meta.tsv starts with: machine, tools, the repository
# commit and the module's own (its sources' commit, and whether they had changes). Needs ROOT,
# NGINX and MODULE.
bench_meta_env() {
    local module_commit="unknown" dir
    dir=$(dirname "$MODULE")
    if git -C "$dir" rev-parse --short HEAD >/dev/null 2>&1; then
        module_commit=$(git -C "$dir" rev-parse --short HEAD)
        git -C "$dir" diff --quiet HEAD -- ':/src' ':/lua' ':/Cargo.toml' ':/Cargo.lock' 2>/dev/null \
            || module_commit+=" (+uncommitted changes in src/ or lua/)"
    fi
    printf 'date\t%s\n' "$(date -u '+%Y-%m-%d %H:%M UTC')"
    printf 'arch\t%s\n' "$(uname -m)"
    printf 'cpu\t%s\n' "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
    printf 'ncpu\t%s\n' "$(nproc)"
    printf 'redis\t%s\n' "$(redis-server --version | awk '{print $3}' | sed 's/v=//')"
    printf 'wrk\t%s\n' "$(wrk -v 2>&1 | head -n1 | awk '{print $2}')"
    printf 'commit\t%s\n' "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    printf 'module_commit\t%s\n' "$module_commit"
    printf 'module_sha256\t%s\n' "$(sha256sum "$MODULE" | cut -c1-16)"
}

# Redis's CPU and commands between two snapshots of `INFO cpu commandstats` (one server; the
# caller's redis_snapshot writes them).
# redis_delta before after -> "cpu_seconds total_calls script_calls per-command"
# INFO itself is left out: the snapshots are the only INFO calls, and they are not the workload.
redis_delta() {
    awk -F'[:=,]' '
        /^used_cpu_(sys|user):/ { cpu[FILENAME == ARGV[1]] += $2 }
        /^cmdstat_/ { c = $1; sub(/^cmdstat_/, "", c); if (c == "info") next
                      if (FILENAME == ARGV[1]) before[c] = $3; else { after[c] = $3; names[c] = 1 } }
        END { total = 0; ev = 0; list = ""
              for (c in names) { d = after[c] - before[c]; if (d <= 0) continue
                                 total += d; if (c == "eval" || c == "evalsha") ev += d
                                 list = list (list == "" ? "" : ",") c ":" d }
              printf "%.6f %d %d %s\n", cpu[0] - cpu[1], total, ev, (list == "" ? "-" : list) }' "$1" "$2"
}

# A redis-server of the benchmark's own on $rport (no persistence, its files in $tmp); sets
# redis_pid, and waits until it answers (through the caller's rcli).
start_bench_redis() {
    redis-server --bind 127.0.0.1 --port "$rport" --save '' --appendonly no --dir "$tmp" \
        --logfile "$tmp/redis.log" &
    redis_pid=$!
    for _ in $(seq 1 50); do [ "$(rcli ping 2>/dev/null)" = PONG ] && return 0; sleep 0.1; done
    cat "$tmp/redis.log" >&2
    die "redis-server did not start"
}
