# Shell helpers shared by the bench/ scripts (sourced; the caller defines die()).

# Stops a process: TERM, up to 5 s to exit, then KILL.
stop_pid() {
    local pid=$1
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port() {  # a free loopback port, not one of the arguments
    local p
    for _ in $(seq 1 200); do
        p=$((20000 + RANDOM % 30000))
        case " $* " in *" $p "*) continue;; esac
        port_in_use "$p" || { echo "$p"; return 0; }
    done
    die "no free loopback port found"
}
