#!/usr/bin/env bash
# Smoke test of the runtime image against a real Redis, all on loopback (host network):
#
#   1. the image's own quickstart configuration: 5 requests of one consumer get 200, the 6th
#      429 with Retry-After and the RateLimit-* headers, another consumer 200 again
#   2. `nginx -t` of a configuration mounted at $NGINX_CONF (docker run IMAGE -t): a good one
#      passes, one with a bad ratelimit directive fails naming it
#
#   docker/smoke.sh [IMAGE]        (default ngx-ratelimit:ci; DOCKER=, DOCKER_HOST= honoured)
#
# Redis is the host's redis-server on a free port (make deps-run installs it). Every process
# and container it starts is stopped by its own pid or name, also on failure.
set -euo pipefail
IMAGE=${1:-ngx-ratelimit:ci}
DOCKER=${DOCKER:-docker}
name=rl-smoke-$$
tmp=$(mktemp -d)
redis_pid=""

cleanup() {
    $DOCKER rm -f "$name" >/dev/null 2>&1 || true
    if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

free_port() {
    local p
    for p in $(seq "$1" "$(( $1 + 200 ))"); do
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
    done
    echo "error: no free port from $1" >&2; return 1
}
fail() { echo "smoke: FAIL: $*" >&2; echo "--- container log:" >&2; $DOCKER logs "$name" >&2 2>&1 || true; exit 1; }

rport=$(free_port 16379)
redis-server --bind 127.0.0.1 --port "$rport" --save '' --appendonly no --dir "$tmp" \
    --logfile "$tmp/redis.log" &
redis_pid=$!
for _ in $(seq 1 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$rport" ping >/dev/null || fail "redis-server did not start"

port=$(free_port 18480)
echo "smoke: $IMAGE on 127.0.0.1:$port, redis on 127.0.0.1:$rport"
$DOCKER run -d --name "$name" --network host \
    -e REDIS_ADDR="127.0.0.1:$rport" -e LISTEN="127.0.0.1:$port" "$IMAGE" >/dev/null
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done

url=http://127.0.0.1:$port/
for i in 1 2 3 4 5; do
    code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 -H 'X-Consumer-Id: alice' "$url") || fail "request $i: curl failed"
    [ "$code" = 200 ] || fail "request $i: status $code, expected 200"
done
curl -sS -D "$tmp/h" -o /dev/null --max-time 5 -H 'X-Consumer-Id: alice' "$url" || fail "request 6: curl failed"
tr -d '\r' < "$tmp/h" > "$tmp/headers"
head -n1 "$tmp/headers" | grep -q ' 429' || fail "request 6: $(head -n1 "$tmp/headers"), expected 429"
grep -Eiq '^Retry-After: [1-9][0-9]*$' "$tmp/headers" || fail "request 6: no Retry-After"
grep -Eiq '^RateLimit-Limit: 5$' "$tmp/headers" || fail "request 6: no RateLimit-Limit: 5"
grep -Eiq '^RateLimit-Remaining: 0$' "$tmp/headers" || fail "request 6: no RateLimit-Remaining: 0"
grep -Eiq '^RateLimit-Reset: [0-9]+$' "$tmp/headers" || fail "request 6: no RateLimit-Reset"
code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 -H 'X-Consumer-Id: bob' "$url")
[ "$code" = 200 ] || fail "another consumer: status $code, expected 200"
keys=$(redis-cli -p "$rport" --scan --pattern 'rl:quickstart:*' | wc -l)
[ "$keys" = 2 ] || fail "expected 2 keys in Redis, found $keys"
echo "smoke: 5 x 200, then 429 with $(grep -i '^Retry-After' "$tmp/headers") and RateLimit-*; another consumer 200"
$DOCKER stop -t 10 "$name" >/dev/null
# nginx handles the stop signal (SIGQUIT) with a graceful exit: nothing above notice logged.
if $DOCKER logs "$name" 2>&1 | grep -E '\[(alert|crit|emerg)\]'; then fail "alerts in the log"; fi
$DOCKER rm "$name" >/dev/null

# A configuration of one's own, mounted read-only where the entrypoint looks for it.
mkdir -p "$tmp/conf"
module=$($DOCKER run --rm --entrypoint sh "$IMAGE" -c 'echo "$RATELIMIT_MODULE"')
cat > "$tmp/conf/nginx.conf" <<CONF
load_module $module;
events {}
http {
    ratelimit_redis 127.0.0.1:$rport timeout=100ms;
    ratelimit_zone api key=\$http_x_api_key limit=100 window=1m algorithm=gcra burst=10;
    server { listen 127.0.0.1:$port; location / { ratelimit api; ratelimit_headers draft; } }
}
CONF
chmod -R a+rX "$tmp/conf"
out=$($DOCKER run --rm --network host -v "$tmp/conf:/etc/ngx-ratelimit:ro" "$IMAGE" -t 2>&1) \
    || fail "nginx -t of the mounted configuration: $out"
echo "$out" | grep -q 'test is successful' || fail "nginx -t said: $out"
sed -i 's/limit=100 window=1m/limit=100 window=1parsec/' "$tmp/conf/nginx.conf"
if out=$($DOCKER run --rm --network host -v "$tmp/conf:/etc/ngx-ratelimit:ro" "$IMAGE" -t 2>&1); then
    fail "nginx -t accepted window=1parsec"
fi
echo "$out" | grep -q 'window' || fail "nginx -t did not name the bad value: $out"
echo "smoke: nginx -t of a mounted configuration: passes; a bad window= fails ($(echo "$out" | grep -m1 emerg))"
echo "smoke: PASS"
