#!/usr/bin/env bash
# make test-deb: the package as an operator meets it, on this machine's packaged nginx.
#   packaging/test-deb.sh build/libnginx-mod-http-ratelimit_<version>_<arch>.deb
#   1. lintian: no errors
#   2. apt install ./<deb>: the module is enabled in /etc/nginx/modules-enabled beside
#      libnginx-mod-http-lua and `nginx -t` of the stock /etc/nginx/nginx.conf passes
#   3. a copy of the stock nginx.conf (same modules-enabled, mime.types, conf.d; only pid, logs and
#      sites-enabled changed) with a site that uses `ratelimit`, on its own redis-server and
#      nginx on free loopback ports: 200, 200 (Lua), 200, then 429 with Retry-After
#   4. apt-get remove: nginx -t still passes; apt-get purge: nothing of the package is left
# Needs root (or sudo) for apt. Never starts nginx's or redis's system service: installs run
# under a policy-rc.d that denies service starts, and the servers here are stopped by their pid.
set -euo pipefail

deb=$(realpath "$1")
pkg=libnginx-mod-http-ratelimit
mod=/usr/lib/nginx/modules/ngx_http_ratelimit_module.so
enabled=/etc/nginx/modules-enabled/50-mod-http-ratelimit.conf
[ -f "$deb" ] || { echo "error: $deb not found (make deb)" >&2; exit 1; }

if [ "$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo=sudo; else
    echo "error: test-deb installs a package: run it as root or with sudo" >&2; exit 1
fi
# The test purges the package at the end: it must not take away an operator's installation.
if dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed'; then
    echo "error: $pkg is already installed; test-deb would remove it (apt-get purge $pkg first)" >&2
    exit 1
fi

tmp=$(mktemp -d)
chmod 755 "$tmp"
created_policy=""
installed=""
redis_pid=""
cleanup() {
    local rc=$? pid
    if [ -s "$tmp/nginx.pid" ]; then
        pid=$(cat "$tmp/nginx.pid")
        kill -QUIT "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; fi
    if [ -n "$installed" ]; then
        echo "test-deb: purging $pkg after a failure"
        $sudo apt-get purge -y -q "$pkg" >/dev/null 2>&1 || true
    fi
    [ -n "$created_policy" ] && $sudo rm -f /usr/sbin/policy-rc.d
    if [ "$rc" -ne 0 ] && [ -f "$tmp/error.log" ]; then
        echo "--- nginx error.log" >&2; tail -n 30 "$tmp/error.log" >&2
    fi
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT

# nginx -t, quiet unless it fails (third-party modules of the stock set log [info] lines).
nginx_t() {
    $sudo /usr/sbin/nginx -t "$@" >"$tmp/nginx-t.log" 2>&1 || { cat "$tmp/nginx-t.log" >&2; return 1; }
}

free_port() {
    local p
    for p in $(seq "$1" "$(( $1 + 200 ))"); do
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
    done
    echo "error: no free port from $1" >&2; return 1
}

echo "==> lintian $(basename "$deb")"
lint_rc=0
lintian --fail-on error "$deb" >"$tmp/lintian.log" 2>&1 || lint_rc=$?
grep -v 'running with root privileges' "$tmp/lintian.log" || true
[ "$lint_rc" -eq 0 ] || { echo "error: lintian reports errors (exit $lint_rc)" >&2; exit 1; }

echo "==> apt-get install $deb"
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
    $sudo chmod 755 /usr/sbin/policy-rc.d
    created_policy=1
fi
installed=1
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "$deb" >"$tmp/apt.log" 2>&1 ||
    { cat "$tmp/apt.log" >&2; exit 1; }
[ -f "$mod" ] || { echo "error: $mod not installed" >&2; exit 1; }
[ "$(readlink "$enabled")" = /usr/share/nginx/modules-available/mod-http-ratelimit.conf ] ||
    { echo "error: $enabled is not enabled" >&2; exit 1; }
[ -e /etc/nginx/modules-enabled/50-mod-http-lua.conf ] ||
    { echo "error: libnginx-mod-http-lua is not enabled: the test loads the module beside it" >&2; exit 1; }
nginx_t
echo "==> nginx -t of /etc/nginx/nginx.conf: ok with $(ls /etc/nginx/modules-enabled/ | grep -c '\.conf$') modules enabled, lua and ratelimit among them"

rport=$(free_port 16379)
port=$(free_port 18280)
redis-server --bind 127.0.0.1 --port "$rport" --save '' --appendonly no --dir "$tmp" \
    --logfile "$tmp/redis.log" &
redis_pid=$!
for _ in $(seq 1 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$rport" ping >/dev/null || { echo "error: redis-server did not start" >&2; cat "$tmp/redis.log" >&2; exit 1; }

# Debian's stock nginx.conf with only what would touch the system's server changed; each
# substitution is checked, so that a changed stock file fails here instead of testing nothing.
cp /etc/nginx/nginx.conf "$tmp/nginx.conf"
subst() {
    grep -qF "$1" "$tmp/nginx.conf" || { echo "error: '$1' not in /etc/nginx/nginx.conf" >&2; exit 1; }
    sed -i "s|$(printf '%s' "$1" | sed 's/[][\\.*^$|]/\\&/g')|$2|" "$tmp/nginx.conf"
}
subst 'pid /run/nginx.pid;' "pid $tmp/nginx.pid;"
subst 'error_log /var/log/nginx/error.log;' "error_log $tmp/error.log notice;"
subst 'access_log /var/log/nginx/access.log;' "access_log $tmp/access.log;"
subst 'include /etc/nginx/sites-enabled/*;' "include $tmp/site.conf;"
mkdir -p "$tmp/html"
echo static-ok > "$tmp/html/index.html"
cat > "$tmp/site.conf" <<EOF
ratelimit_redis 127.0.0.1:$rport timeout=500ms;
ratelimit_zone deb key=\$binary_remote_addr limit=3 window=60s;
server {
    listen 127.0.0.1:$port;
    root $tmp/html;
    ratelimit deb;
    location = /lua { content_by_lua_block { ngx.say("lua-ok") } }
}
EOF
chmod -R a+rX "$tmp"
nginx_t -c "$tmp/nginx.conf" -e "$tmp/error.log"
$sudo /usr/sbin/nginx -c "$tmp/nginx.conf" -e "$tmp/error.log"
for _ in $(seq 1 50); do [ -s "$tmp/nginx.pid" ] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done

codes=""
for path in /index.html /lua /index.html /index.html; do
    codes="$codes $(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port$path")"
done
headers=$(curl -sS --max-time 5 -D - -o /dev/null "http://127.0.0.1:$port/index.html")
retry=$(printf '%s' "$headers" | tr -d '\r' | sed -n 's/^Retry-After: *//Ip')
if [ "$codes" != " 200 200 200 429" ] || ! [[ "$retry" =~ ^[0-9]+$ ]] || [ "$retry" -lt 1 ] || [ "$retry" -gt 60 ]; then
    echo "error: expected 200 200 200 429 and then a 429 with Retry-After 1..60, got:$codes" >&2
    printf '%s\n' "$headers" >&2
    exit 1
fi
if grep -E '\[(alert|crit|emerg)\]' "$tmp/error.log"; then echo "error: see the error log above" >&2; exit 1; fi
echo "==> smoke: stock nginx.conf + ratelimit site on 127.0.0.1:$port:$codes, then 429 Retry-After: $retry"
pid=$(cat "$tmp/nginx.pid")
kill -QUIT "$pid"
for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
rm -f "$tmp/nginx.pid"

echo "==> apt-get remove $pkg"
DEBIAN_FRONTEND=noninteractive $sudo apt-get remove -y -q "$pkg" >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log" >&2; exit 1; }
[ ! -e "$mod" ] && [ ! -e "$enabled" ] || { echo "error: the module is still installed or enabled after remove" >&2; exit 1; }
nginx_t
echo "==> apt-get purge $pkg"
DEBIAN_FRONTEND=noninteractive $sudo apt-get purge -y -q "$pkg" >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log" >&2; exit 1; }
installed=""
left=$(ls -d /etc/nginx/modules-enabled/*ratelimit* /usr/share/nginx/modules-available/*ratelimit* "$mod" 2>/dev/null || true)
if [ -n "$left" ] || dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q installed; then
    echo "error: left after purge: ${left:-the dpkg status}" >&2; exit 1
fi
nginx_t
echo "==> test-deb: lintian clean of errors, installed, served 200s then 429, removed and purged; nginx -t passes"
