# ngx_http_ratelimit in a container. Needs BuildKit: DOCKER_BUILDKIT=1 with Docker 20.10 (its
# built-in Dockerfile frontend: no `# syntax=` line, so nothing but the FROM images is pulled),
# the default builder of current engines.
#
#   docker build -t ngx-ratelimit .
#       nginx 1.28.3 (the vendored nginx the module is built with) + the module, on
#       debian:bookworm-slim (about 90 MB)
#   docker build --target test .
#       `make build` and `make test TEST_SYSTEM=0` inside the image (cargo test, a short fuzz
#       run, the t/ suites against build/nginx; `--build-arg TEST_SYSTEM=1` adds the suites
#       against Debian's /usr/sbin/nginx with Lua, `--build-arg TEST_VALGRIND=1` the valgrind
#       pass); the build fails if a test fails. It starts from rust:1-bookworm and
#       installs nothing itself: the Makefile's package lists must be complete.
#       --build-arg TEST_HARNESS=test-nginx runs the t/ suites under the real
#       Test::Nginx::Socket, installed from CPAN (cpanminus) during the build.
#   docker build --build-arg FLAVOR=openresty -t ngx-ratelimit:openresty .
#       OpenResty + the module built against OpenResty's own configured nginx source tree, from
#       openresty-$OPENRESTY_VERSION.tar.gz placed in the build context (nothing is downloaded;
#       docs/docker.md says where to get it)
#
#   Extra CA certificates (a TLS-inspecting proxy, an internal registry mirror) for the steps
#   that fetch crates: --secret id=ca_bundle,src=/path/to/bundle.pem (docker/with-ca).
#   No registry at all: `make docker-bases` makes the FROM images from Debian's packages.
#
#   docker run --rm -p 8080:8080 -e REDIS_ADDR=redis.example:6379 ngx-ratelimit
#       serves nginx/quickstart.conf (5 requests / 10 s per X-Consumer-Id) against that Redis.
#       Mount your own configuration at $NGINX_CONF to use it instead; load the module from
#       $RATELIMIT_MODULE. `docker run ... ngx-ratelimit -t` tests the configuration.
#
# A module only loads into the nginx it was built against (same version and configure
# signature), which is why every runtime image carries its own nginx next to the module.

ARG FLAVOR=vendored
ARG OPENRESTY_VERSION=1.27.1.2

# ---------------------------------------------------------------------------------------------
# Toolchain: Rust and Debian, plus the C build dependencies the Makefile lists (make deps-build:
# bindgen's libclang, nginx's pcre2, openssl, zlib). Only the Makefile installs packages, so a
# package missing from its lists fails here as it would on a fresh machine.
FROM rust:1-bookworm AS deps
ENV DEBIAN_FRONTEND=noninteractive \
    CARGO_TERM_COLOR=never \
    CARGO_TERM_PROGRESS_WHEN=never
WORKDIR /src
# make itself, the one thing needed before the Makefile can say what else is needed.
RUN command -v make >/dev/null \
 || { apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*; }
COPY Makefile ./
COPY docker/with-ca /usr/local/bin/with-ca
RUN make deps-build && rm -rf /var/lib/apt/lists/*

# ---------------------------------------------------------------------------------------------
# The module and the vendored nginx 1.28.3 (nginx-src crate): build/ngx_http_ratelimit_module.so
# and build/nginx.
FROM deps AS build
COPY . .
RUN --mount=type=secret,id=ca_bundle with-ca make build

# ---------------------------------------------------------------------------------------------
# `docker build --target test .`: what CI's `make test` does, in an image that had nothing but
# Debian, Rust and the Makefile's own installs. Debian's images forbid service starts during
# apt-get (policy-rc.d), so installing nginx and redis-server here starts nothing; the tests
# start their own servers on loopback (build with --network host where the daemon has no
# bridge).
FROM build AS test
ARG TEST_HARNESS=rltest
# CI's `make test` on the host runs the valgrind pass; `--build-arg TEST_VALGRIND=1` runs it here too.
# The host's pass also fuzzes the RESP decoder for a minute: here a short run checks the driver
# builds and runs in the image, and keeps CI within its time.
# The system build's suites (Lua beside the module) ran on the host too; `--build-arg
# TEST_SYSTEM=1` runs them here as well (about 6 minutes more).
ARG TEST_VALGRIND=0
ARG TEST_SYSTEM=0
ARG FUZZ_SECONDS=10
RUN --mount=type=secret,id=ca_bundle \
    if [ "$TEST_HARNESS" = test-nginx ]; then with-ca make deps-test-nginx; fi \
 && with-ca make test TEST_HARNESS="$TEST_HARNESS" TEST_VALGRIND="$TEST_VALGRIND" \
      TEST_SYSTEM="$TEST_SYSTEM" FUZZ_SECONDS="$FUZZ_SECONDS"

# ---------------------------------------------------------------------------------------------
# OpenResty, from the tarball in the build context: its ./configure copies bundle/ to build/
# and configures build/nginx-<version>/ (nginx source + objs/Makefile + ngx_auto_config.h),
# which is exactly what nginx-sys needs (NGINX_BUILD_DIR=<that>/objs).
FROM deps AS build-openresty
ARG OPENRESTY_VERSION
RUN apt-get update \
 && apt-get install -y --no-install-recommends perl \
 && rm -rf /var/lib/apt/lists/*
COPY openresty-${OPENRESTY_VERSION}.tar.gz /opt/
WORKDIR /opt
RUN tar xzf openresty-${OPENRESTY_VERSION}.tar.gz && rm openresty-${OPENRESTY_VERSION}.tar.gz
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
RUN --mount=type=secret,id=ca_bundle \
    objs=$(ls -d /opt/openresty-${OPENRESTY_VERSION}/build/nginx-*/objs) \
 && echo "building against $objs" \
 && NGINX_BUILD_DIR="$objs" CARGO_TARGET_DIR=/src/target/openresty \
        with-ca cargo build --release --no-default-features --features export-modules \
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
 && apt-get install -y --no-install-recommends libpcre2-8-0 libssl3 zlib1g \
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
 && apt-get install -y --no-install-recommends libpcre2-8-0 libssl3 zlib1g \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build-openresty /usr/local/openresty /usr/local/openresty
ENV NGINX_BIN=/usr/local/openresty/nginx/sbin/nginx \
    NGINX_PREFIX=/usr/local/openresty/nginx \
    RATELIMIT_MODULE=/usr/local/openresty/nginx/modules/ngx_http_ratelimit_module.so

# ---------------------------------------------------------------------------------------------
# The image: runtime-vendored or runtime-openresty, by --build-arg FLAVOR. BuildKit builds only
# the stages this one needs.
FROM runtime-${FLAVOR} AS runtime
ENV NGINX_CONF=/etc/ngx-ratelimit/nginx.conf \
    REDIS_ADDR=127.0.0.1:6379 \
    LISTEN=8080
COPY nginx/quickstart.conf nginx/nginx.conf /usr/local/share/ngx-ratelimit/
# Executable in the repository; COPY keeps the mode (no --chmod: not every builder has it).
COPY docker/entrypoint.sh /usr/local/bin/docker-entrypoint.sh
EXPOSE 8080
STOPSIGNAL SIGQUIT
ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]
