#!/bin/sh
# The runtime image's entrypoint. Without a configuration at $NGINX_CONF, generate one from
# nginx/quickstart.conf (Redis at $REDIS_ADDR, listening on $LISTEN).
set -eu
mkdir -p "$NGINX_PREFIX/logs" "$NGINX_PREFIX/html" "$NGINX_PREFIX/tmp"
if [ ! -f "$NGINX_CONF" ]; then
    mkdir -p "$(dirname "$NGINX_CONF")"
    [ -f "$NGINX_PREFIX/html/index.html" ] \
        || echo '<h1>ngx_http_ratelimit</h1>' > "$NGINX_PREFIX/html/index.html"
    sed -e "s|@MODULE@|$RATELIMIT_MODULE|g" -e "s|@REDIS@|$REDIS_ADDR|g" \
        -e "s|@LISTEN@|$LISTEN|g" -e "s|@ROOT@|$NGINX_PREFIX/html|g" \
        /usr/local/share/ngx-ratelimit/quickstart.conf > "$NGINX_CONF"
fi
# Arguments that are options go to nginx (`docker run IMAGE -t` tests the configuration);
# anything else is run as a command.
case "${1:-}" in
    '' | -*) ;;
    *) exec "$@" ;;
esac
# nginx must stay in the foreground; quickstart.conf says so itself.
if grep -Eq '^[[:space:]]*daemon[[:space:]]+off' "$NGINX_CONF"; then
    exec "$NGINX_BIN" -p "$NGINX_PREFIX/" -c "$NGINX_CONF" "$@"
fi
exec "$NGINX_BIN" -p "$NGINX_PREFIX/" -c "$NGINX_CONF" -g 'daemon off;' "$@"
