# syntax=docker/dockerfile:1
#
# ngx_http_ratelimit in a container. Needs BuildKit (the default builder of current Docker).
#
#   docker build -t ngx-ratelimit .
#       nginx 1.28.3 (the vendored nginx the module is built with) + the module, on
#       debian:bookworm-slim
#   docker build --target test .
#       builds both variants of `make` inside the image and runs `make test` (cargo test and the
#       t/ suites against build/nginx and against Debian's /usr/sbin/nginx with lua); the build
#       fails if a test fails
#   docker build --build-arg FLAVOR=openresty -t ngx-ratelimit:openresty .
#   docker build --build-arg FLAVOR=openresty --build-arg OPENRESTY_VERSION=1.27.1.2 ...
#       OpenResty (downloaded from openresty.org during the build) + the module built against
#       OpenResty's own configured nginx source tree
#
#   docker run --rm -p 8080:8080 -e REDIS_ADDR=redis.example:6379 ngx-ratelimit
#       serves nginx/quickstart.conf (5 requests / 10 s per X-Consumer-Id) against that Redis.
#       Mount your own configuration at $NGINX_CONF to use it instead; load the module from
#       $RATELIMIT_MODULE.
#
# A module only loads into the nginx it was built against (same version and configure
# signature), which is why every runtime image carries its own nginx next to the module.
#
# This file was written on machines without a Docker engine: it has not been built there.

ARG FLAVOR=vendored
ARG OPENRESTY_VERSION=1.27.1.2

# ---------------------------------------------------------------------------------------------
# Toolchain and C build dependencies (bindgen needs libclang; nginx needs pcre2, openssl, zlib).
FROM rust:1-bookworm AS deps
ENV DEBIAN_FRONTEND=noninteractive \
    CARGO_TERM_COLOR=never
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        gcc make libclang-dev libpcre2-dev libssl-dev zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src

# ---------------------------------------------------------------------------------------------
# The module and the vendored nginx 1.28.3 (nginx-src crate): build/ngx_http_ratelimit_module.so
# and build/nginx.
FROM deps AS build
COPY . .
RUN make build

# ---------------------------------------------------------------------------------------------
# `docker build --target test .`: the same as CI (.ci/run) minus the fresh machine.
# Debian's official images forbid service starts during apt-get (policy-rc.d), so installing
# nginx and redis-server here starts nothing; the tests start their own servers on loopback.
FROM build AS test
RUN apt-get update \
 && apt-get install -y --no-install-recommends $(make -s print-apt-packages) \
 && rm -rf /var/lib/apt/lists/*
RUN make build-system \
 && make test

# ---------------------------------------------------------------------------------------------
# OpenResty: its configure prepares build/nginx-<version>/ (nginx source + objs/Makefile +
# ngx_auto_config.h), which is exactly what nginx-sys needs (NGINX_BUILD_DIR=<that>/objs).
FROM deps AS build-openresty
ARG OPENRESTY_VERSION
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl perl ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt
RUN curl -fsSL "https://openresty.org/download/openresty-${OPENRESTY_VERSION}.tar.gz" | tar xz
WORKDIR /opt/openresty-${OPENRESTY_VERSION}
# --with-compat keeps the module signature compatible with other dynamic modules built with it.
RUN ./configure --prefix=/usr/local/openresty \
        --with-compat --with-threads --with-pcre-jit \
        --with-http_ssl_module --with-http_v2_module --with-http_realip_module \
        -j"$(nproc)" \
 && make -j"$(nproc)" \
 && make install
WORKDIR /src
COPY . .
RUN objs=$(ls -d /opt/openresty-${OPENRESTY_VERSION}/build/nginx-*/objs) \
 && echo "building against $objs" \
 && NGINX_BUILD_DIR="$objs" CARGO_TARGET_DIR=/src/target/openresty \
        cargo build --release --no-default-features --features export-modules \
 && install -D -m 0644 target/openresty/release/libngx_http_ratelimit.so \
        /usr/local/openresty/nginx/modules/ngx_http_ratelimit_module.so \
 && printf '%s\n' \
        'load_module /usr/local/openresty/nginx/modules/ngx_http_ratelimit_module.so;' \
        'events {}' 'http { server { listen 127.0.0.1:8080; } }' > /tmp/smoke.conf \
 && /usr/local/openresty/nginx/sbin/nginx -t -c /tmp/smoke.conf

# ---------------------------------------------------------------------------------------------
# Runtime, vendored flavour: build/nginx (prefix /usr/local/nginx, as it was configured) + module.
FROM debian:bookworm-slim AS runtime-vendored
RUN apt-get update \
 && apt-get install -y --no-install-recommends libpcre2-8-0 libssl3 zlib1g ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/nginx /usr/local/nginx/sbin/nginx
COPY --from=build /src/build/ngx_http_ratelimit_module.so /usr/local/nginx/modules/
ENV NGINX_BIN=/usr/local/nginx/sbin/nginx \
    NGINX_PREFIX=/usr/local/nginx \
    RATELIMIT_MODULE=/usr/local/nginx/modules/ngx_http_ratelimit_module.so

# ---------------------------------------------------------------------------------------------
# Runtime, OpenResty flavour.
FROM debian:bookworm-slim AS runtime-openresty
RUN apt-get update \
 && apt-get install -y --no-install-recommends libpcre2-8-0 libssl3 zlib1g ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build-openresty /usr/local/openresty /usr/local/openresty
ENV NGINX_BIN=/usr/local/openresty/nginx/sbin/nginx \
    NGINX_PREFIX=/usr/local/openresty/nginx \
    RATELIMIT_MODULE=/usr/local/openresty/nginx/modules/ngx_http_ratelimit_module.so

# ---------------------------------------------------------------------------------------------
# The image: runtime-vendored or runtime-openresty, by --build-arg FLAVOR.
FROM runtime-${FLAVOR} AS runtime
ENV NGINX_CONF=/etc/ngx-ratelimit/nginx.conf \
    REDIS_ADDR=127.0.0.1:6379 \
    LISTEN=8080
COPY nginx/quickstart.conf nginx/nginx.conf /usr/local/share/ngx-ratelimit/
COPY --chmod=0755 <<'EOF' /usr/local/bin/docker-entrypoint.sh
#!/bin/sh
# Without a configuration at $NGINX_CONF, generate one from nginx/quickstart.conf.
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
# nginx must stay in the foreground; quickstart.conf says so itself.
if grep -Eq '^[[:space:]]*daemon[[:space:]]+off' "$NGINX_CONF"; then
    exec "$NGINX_BIN" -p "$NGINX_PREFIX/" -c "$NGINX_CONF" "$@"
fi
exec "$NGINX_BIN" -p "$NGINX_PREFIX/" -c "$NGINX_CONF" -g 'daemon off;' "$@"
EOF
EXPOSE 8080
STOPSIGNAL SIGQUIT
ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]
