#!/usr/bin/env bash
# A private Docker daemon for CI and for machines where none runs, started so that it leaves the
# host's network alone: no bridge, no iptables or ip-forwarding changes. Builds and containers
# then use the host network (docker build/run --network host) and talk only on loopback.
#
#   eval "$(docker/dockerd.sh start [DIR])"   starts dockerd (Debian's docker.io) with its socket,
#                                            pid file, log and exec root in DIR (default
#                                            /run/ngx-ratelimit-docker) and its images in
#                                            /var/lib/ngx-ratelimit-docker (kept: a later run
#                                            reuses the base images and layers); prints
#                                            `export DOCKER_HOST=unix://DIR/docker.sock`
#   docker/dockerd.sh stop [DIR]              stops that daemon by its pid (and the containerd it
#                                            started with it), after removing its containers
#
# Needs root. Nothing is started when start finds a daemon already answering at DIR's socket.
set -euo pipefail
cmd=${1:-}
dir=${2:-/run/ngx-ratelimit-docker}
data=${DOCKERD_DATA_ROOT:-/var/lib/ngx-ratelimit-docker}
sock=$dir/docker.sock
pidf=$dir/dockerd.pid
client=/usr/bin/docker
[ -x "$client" ] || client=docker

case $cmd in
start)
    mkdir -p "$dir"
    if DOCKER_HOST=unix://$sock "$client" version >/dev/null 2>&1; then
        echo "export DOCKER_HOST=unix://$sock"; exit 0
    fi
    [ -x /usr/sbin/dockerd ] || { echo "error: /usr/sbin/dockerd missing (apt-get install docker.io)" >&2; exit 1; }
    # setsid: the daemon outlives this script, not the caller's process group signals.
    setsid /usr/sbin/dockerd --host "unix://$sock" --pidfile "$pidf" \
        --data-root "$data" --exec-root "$dir/exec" \
        --bridge none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
        > "$dir/dockerd.log" 2>&1 < /dev/null &
    for _ in $(seq 1 120); do
        DOCKER_HOST=unix://$sock "$client" version >/dev/null 2>&1 && { echo "export DOCKER_HOST=unix://$sock"; exit 0; }
        sleep 0.5
    done
    echo "error: dockerd did not answer within 60 s" >&2; tail -n 20 "$dir/dockerd.log" >&2; exit 1
    ;;
stop)
    [ -s "$pidf" ] || exit 0
    pid=$(cat "$pidf")
    ids=$(DOCKER_HOST=unix://$sock "$client" ps -aq 2>/dev/null || true)
    # shellcheck disable=SC2086
    [ -z "$ids" ] || DOCKER_HOST=unix://$sock "$client" rm -f $ids >/dev/null 2>&1 || true
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
    rm -f "$pidf"
    # dockerd leaves its default network namespace mounted (nsfs) in the exec root.
    if mountpoint -q "$dir/exec/netns/default" 2>/dev/null; then umount "$dir/exec/netns/default" || true; fi
    ;;
*)
    echo "usage: $0 start|stop [DIR]" >&2; exit 2 ;;
esac
