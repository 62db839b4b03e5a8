# ngx_http_ratelimit: build, run and test.
#
#   make build          module + matching nginx from the vendored nginx 1.28.3 (nginx-src crate)
#                       -> build/ngx_http_ratelimit_module.so, build/nginx
#   make build-system   module for Debian's packaged nginx (nginx-dev sources, 1.22.1)
#                       -> build/system/ngx_http_ratelimit_module.so (loads into /usr/sbin/nginx)
#   make deb            the Debian package libnginx-mod-http-ratelimit of that build (dh_nginx)
#                       -> build/libnginx-mod-http-ratelimit_<version>_<arch>.deb
#   make test-deb       lintian, apt install, a ratelimit site through the stock nginx.conf
#                       (own redis-server + nginx on free ports), apt-get remove and purge
#   make build-for NGINX_SRC=/path/to/nginx-x.y.z NGINX_BIN=/path/to/nginx
#                       module for any nginx: its source tree (or tarball) configured with the
#                       arguments `NGINX_BIN -V` prints, plus --with-compat
#                       -> build/for/nginx-<version>-<hash>/ngx_http_ratelimit_module.so
#   make test-build-for build-for against nginx 1.28.0 (nginx-src crate) and 1.22.1 (nginx-dev),
#                       each nginx compiled here; t/010-basic.t on both; the cross-load refusal
#   make run            redis-server + nginx on 127.0.0.1:8080 with nginx/quickstart.conf
#   make test           docs' links and configurations (nginx -t), src/'s layers, cargo test, 60 s of RESP fuzzing, prove -r t against the vendored build
#                       and against the system build (built if needed), every suite again under
#                       valgrind (checks that cannot hold there are skipped with their reason);
#                       TEST_SYSTEM=0 / TEST_VALGRIND=0: without the system suites / the valgrind pass;
#                       TEST_HARNESS=test-nginx: the suites under the real Test::Nginx::Socket
#   make docker-bases   the Dockerfile's FROM images from Debian's packages (no registry needed)
#   make docker-build | docker-smoke | docker-test   the image, its smoke test, make test in it
#   make bench          wrk benchmark, unlimited vs limited location (bench/run.sh)
#   make bench-compare  no limiter vs the article's Lua block vs this module (bench/compare.sh)
#   make bench-compare-builds BUILDS="old=a.so new=b.so"  two builds of the module side by side
#                       in one run, allow scenario: ratios and decisions per call (bench/compare-builds.sh)
#   make bench-topology one Redis over TCP vs a 3-primary Cluster vs TLS, nginx and Redis CPU
#                       per decision (bench/topology.sh)
#   make bench-lease    no limiter vs exact vs lease=auto, 1 worker: busy keys, Zipf, uniform,
#                       and a paced key's under-admission (bench/lease.sh)
#   make bench-instructions  the worker's own instructions and mallocs per request under
#                       callgrind: no limiter, limit_req, exact, lease=auto, two leased zones,
#                       deny-cache rejection (bench/instructions.py)
#   make bench-concurrency  what held concurrency slots cost Redis per slot per second, by
#                       lease_time and slots in flight (bench/concurrency.sh)
#   make bench-script-cost  Redis instructions per decision of the script (callgrind), per
#                       algorithm, lease and batch size (bench/script-cost.py)
#   make bench-backends a location with one zone per backend vs the same two zones on one
#                       backend: requests/s, worker instructions and latency (bench/backends.py)
#   make fmt | lint | clean
#
# Missing Debian packages are installed with apt-get (as root, or through sudo), without
# starting their services.
# Set SKIP_APT=1 to skip that check on a machine that provides the dependencies otherwise.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.ONESHELL:
.DEFAULT_GOAL := build
MAKEFLAGS += --no-print-directory
# Recipes are scripts that say what they do; `make V=1 ...` shows them as well.
ifndef V
.SILENT:
endif

CARGO        ?= cargo
CARGO_FLAGS  ?=
PROVE        ?= prove
# Files are independent (own ports, Redis and servroot), so two run at once.
PROVE_FLAGS  ?= -r -j2
# Suites run against the system nginx (Debian's 1.22.1 + libnginx-mod-http-lua).
SYSTEM_SUITES ?= t
PORT         ?= 8080

ROOT       := $(abspath .)
BUILD      := $(ROOT)/build
SYS_BUILD  := $(BUILD)/system
MODULE     := $(BUILD)/ngx_http_ratelimit_module.so
NGINX      := $(BUILD)/nginx
SYS_MODULE := $(SYS_BUILD)/ngx_http_ratelimit_module.so
SYS_NGINX  ?= /usr/sbin/nginx
SYS_SRC    ?= /usr/share/nginx/src
SYS_MODDIR ?= /usr/lib/nginx/modules
# The system build has its own target dir so that it never invalidates the vendored one.
SYS_TARGET := $(ROOT)/target/system

# Debian packages, by purpose.
APT_BUILD  := gcc make libclang-dev libpcre2-dev libssl-dev zlib1g-dev
# curl: smoke-system requests a static file and a Lua location.
APT_SYSTEM := nginx-dev libnginx-mod-http-ndk libnginx-mod-http-lua curl
# g++: the fuzz step builds libfuzzer-sys, whose C++ sources need it.
# iproute2 + iptables: the network-namespace bed (t/lib/RLTest/Netns.pm) cuts a gateway off Redis.
APT_TEST   := redis-server redis-tools libtest-base-perl lua-nginx-redis curl valgrind g++ prometheus \
              iproute2 iptables
# What openresty/test-nginx (Test::Nginx::Socket, for TEST_HARNESS=test-nginx) needs from Debian;
# Test::Nginx itself is not packaged: cpanminus installs it from CPAN (make deps-test-nginx).
APT_TEST_NGINX := libtext-diff-perl libtest-longstring-perl libwww-perl libhttp-message-perl \
              libipc-run-perl liburi-perl liblist-moreutils-perl cpanminus
# make deb / test-deb: debhelper and dh_nginx (nginx-dev) build the package, lintian checks it.
APT_DEB    := debhelper dpkg-dev fakeroot nginx-dev lintian
APT_DOCKER := docker.io debootstrap
APT_RUN    := redis-server redis-tools curl
APT_BENCH  := redis-server redis-tools wrk curl nginx-dev libnginx-mod-http-ndk libnginx-mod-http-lua \
              lua-nginx-redis python3-venv valgrind
APT_ALL    := $(sort $(APT_BUILD) $(APT_SYSTEM) $(APT_TEST) $(APT_RUN) $(APT_BENCH) $(APT_DEB))

# The valgrind pass of `make test`; TEST_VALGRIND=0 skips it (the Docker test image: CI's own
# `make test` on the host has run it on the same sources).
TEST_VALGRIND ?= 1
# The system build's suites (Debian's nginx 1.22.1 + OpenResty's Lua module) in `make test`;
# TEST_SYSTEM=0 skips them (the Docker test image, so that CI stays within its time: the host's
# `make test` has run them on the same sources, and the image still runs cargo test, the fuzz
# driver and the vendored suites).
TEST_SYSTEM ?= 1

# The harness the t/ suites run under: rltest (t/lib/RLTest.pm) or test-nginx (the real
# Test::Nginx::Socket, from CPAN or from a checkout named by TEST_NGINX_LIB=/path/to/test-nginx/lib).
TEST_HARNESS ?= rltest
TEST_NGINX_LIB ?=
HARNESS_ENV = RLTEST_HARNESS=$(TEST_HARNESS) $(if $(TEST_NGINX_LIB),PERL5LIB=$(abspath $(TEST_NGINX_LIB))$${PERL5LIB:+:$$PERL5LIB})

# $(call apt_ensure,packages): install those of the packages that are not installed yet.
define apt_ensure
if [ "$${SKIP_APT:-}" = 1 ] || ! command -v dpkg-query >/dev/null; then exit 0; fi
missing=""
for p in $(1); do
	dpkg-query -W -f='$${Status}' "$$p" 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"
done
[ -z "$$missing" ] && exit 0
echo "==> installing missing packages:$$missing"
if [ "$$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo=sudo; else
	echo "error: missing packages:$$missing (run as root or install them; SKIP_APT=1 skips this check)" >&2; exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Install without starting the packages' services (nginx on :80, redis on :6379): the project
# starts its own servers on free loopback ports.
if [ ! -e /usr/sbin/policy-rc.d ]; then
	printf '#!/bin/sh\nexit 101\n' | $$sudo tee /usr/sbin/policy-rc.d >/dev/null
	$$sudo chmod 755 /usr/sbin/policy-rc.d
	trap '$$sudo rm -f /usr/sbin/policy-rc.d' EXIT
fi
$$sudo apt-get update -q
$$sudo apt-get install -y -q --no-install-recommends $$missing
endef

.PHONY: build build-system run test test-unit test-vendored test-system test-fuzz test-valgrind \
        bench bench-compare bench-topology \
        smoke smoke-system fmt fmt-check lint clean \
        deps deps-build deps-system deps-test deps-test-nginx deps-test-nginx-apt deps-run \
        deps-bench deps-docker deps-deb deb test-deb build-for test-build-for \
        print-apt-packages print-apt-docker-packages docker-bases docker-build docker-smoke docker-test

# ---------------------------------------------------------------------------------------------
# dependencies

print-apt-packages:
	@echo $(APT_ALL)
print-apt-docker-packages:
	@echo $(APT_DOCKER)

deps:
	@$(call apt_ensure,$(APT_ALL))
deps-build:
	@$(call apt_ensure,$(APT_BUILD))
deps-system:
	@$(call apt_ensure,$(APT_BUILD) $(APT_SYSTEM))
deps-test:
	@$(call apt_ensure,$(APT_BUILD) $(APT_TEST))
deps-run:
	@$(call apt_ensure,$(APT_BUILD) $(APT_RUN))
deps-bench:
	@$(call apt_ensure,$(APT_BUILD) $(APT_BENCH))
deps-docker:
	@$(call apt_ensure,$(APT_DOCKER))
deps-deb:
	@$(call apt_ensure,$(APT_DEB))

# Test::Nginx::Socket for TEST_HARNESS=test-nginx: its dependencies from Debian, itself from CPAN
# (cpanm needs to reach CPAN; where it cannot, use a checkout with TEST_NGINX_LIB instead).
# (Two targets: apt_ensure ends its recipe with exit.)
deps-test-nginx-apt:
	@$(call apt_ensure,$(APT_TEST_NGINX))
deps-test-nginx: deps-test-nginx-apt
	if [ -z "$(TEST_NGINX_LIB)" ] && ! perl -MTest::Nginx::Socket -e1 2>/dev/null; then
	  echo "==> cpanm Test::Nginx"
	  cpanm --notest --quiet Test::Nginx
	fi

# ---------------------------------------------------------------------------------------------
# vendored build: nginx 1.28.3 from the nginx-src crate, compiled by nginx-sys's build script.
#
# build.rs records where that nginx was built (DEP_NGINX_BUILD_DIR) in
# target/release/nginx-build-dir; the nginx binary is <that dir>/nginx.

build: deps-build
	echo "==> cargo build --release (vendored nginx)"
	mkdir -p $(BUILD)
	env -u NGINX_BUILD_DIR -u NGINX_SOURCE_DIR $(CARGO) build --release $(CARGO_FLAGS)
	so=$(ROOT)/target/release/libngx_http_ratelimit.so
	objs=$$(cat $(ROOT)/target/release/nginx-build-dir)
	[ -x "$$objs/nginx" ] || { echo "error: vendored nginx binary not found in '$$objs'" >&2; exit 1; }
	install -m 0644 "$$so" $(MODULE)
	install -m 0755 "$$objs/nginx" $(NGINX)
	echo "==> $(MODULE)"
	echo "==> $(NGINX) ($$($(NGINX) -v 2>&1 | sed 's/.*: //'), from $$objs)"
	$(MAKE) smoke

# `nginx -t` that loads the module into build/nginx (catches version/signature mismatches).
smoke:
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT
	mkdir -p "$$tmp/logs"
	printf '%s\n' 'load_module $(MODULE);' 'error_log stderr notice;' 'pid nginx.pid;' \
	  'events {}' 'http { access_log off; server { listen 127.0.0.1:1; return 204; } }' > "$$tmp/nginx.conf"
	$(NGINX) -p "$$tmp/" -c "$$tmp/nginx.conf" -t -q
	echo "==> smoke: build/nginx loads build/ngx_http_ratelimit_module.so"

# ---------------------------------------------------------------------------------------------
# system build: Debian's nginx 1.22.1 (package nginx-dev ships the configured-by-Debian source
# and the configure flags in conf_flags; Debian's own module packages configure it the same
# way, see /usr/share/perl5/Debian/Debhelper/Buildsystem/nginx_mod.pm). Only `configure` is
# needed: nginx-sys reads objs/Makefile and objs/ngx_auto_config.h for bindgen.

build-system: deps-system
	[ -f $(SYS_SRC)/conf_flags ] || { echo "error: $(SYS_SRC)/conf_flags not found (package nginx-dev)" >&2; exit 1; }
	ver=$$(sed -n 's/^#define NGINX_VERSION *"\(.*\)"/\1/p' $(SYS_SRC)/src/core/nginx.h)
	tree=$(SYS_BUILD)/nginx-$$ver
	cflags="$$(dpkg-buildflags --get CFLAGS 2>/dev/null || echo '-g -O2') -fPIC $$(dpkg-buildflags --get CPPFLAGS 2>/dev/null || true)"
	ldflags="$$(dpkg-buildflags --get LDFLAGS 2>/dev/null || true) -fPIC"
	stamp="$$ver|$$(cat $(SYS_SRC)/conf_flags)|$$cflags|$$ldflags"
	if [ -f "$$tree/objs/ngx_auto_config.h" ] && [ "$$(cat "$$tree/.configured" 2>/dev/null)" = "$$stamp" ]; then
	  echo "==> $$tree already configured"
	else
	  echo "==> configuring nginx $$ver in $$tree with $(SYS_SRC)/conf_flags"
	  rm -rf "$$tree"; mkdir -p $(SYS_BUILD); cp -a $(SYS_SRC) "$$tree"
	  ( cd "$$tree" && . ./conf_flags && \
	    ./configure --with-cc-opt="$$cflags" --with-ld-opt="$$ldflags" "$${NGX_CONF_FLAGS[@]}" ) \
	    > "$$tree/configure.log" 2>&1 || { tail -n 30 "$$tree/configure.log"; exit 1; }
	  echo "$$stamp" > "$$tree/.configured"
	fi
	echo "==> cargo build --release against $$tree/objs (CARGO_TARGET_DIR=$(SYS_TARGET))"
	env -u NGINX_SOURCE_DIR CARGO_TARGET_DIR=$(SYS_TARGET) NGINX_BUILD_DIR="$$tree/objs" \
	  $(CARGO) build --release $(CARGO_FLAGS) --no-default-features --features export-modules
	install -m 0644 $(SYS_TARGET)/release/libngx_http_ratelimit.so $(SYS_MODULE)
	echo "==> $(SYS_MODULE) (for $(SYS_NGINX), nginx $$ver)"
	$(MAKE) smoke-system

# Load ndk + lua + our module into /usr/sbin/nginx, start it on a free loopback port and serve
# one static and one Lua request.
smoke-system:
	tmp=$$(mktemp -d); pidf="$$tmp/nginx.pid"
	cleanup() {
	  if [ -s "$$pidf" ]; then
	    pid=$$(cat "$$pidf"); kill "$$pid" 2>/dev/null || true
	    for i in $$(seq 1 50); do kill -0 "$$pid" 2>/dev/null || break; sleep 0.1; done
	  fi
	  rm -rf "$$tmp"
	}
	trap cleanup EXIT
	port=""; for p in $$(seq 18080 18180); do (exec 3<>/dev/tcp/127.0.0.1/$$p) 2>/dev/null || { port=$$p; break; }; done
	[ -n "$$port" ] || { echo "error: no free port" >&2; exit 1; }
	mkdir -p "$$tmp/html" "$$tmp/tmp"; echo static-ok > "$$tmp/html/index.html"
	cat > "$$tmp/nginx.conf" <<-EOF
	load_module $(SYS_MODDIR)/ndk_http_module.so;
	load_module $(SYS_MODDIR)/ngx_http_lua_module.so;
	load_module $(SYS_MODULE);
	error_log $$tmp/error.log notice;
	pid $$pidf;
	worker_processes 1;
	events { worker_connections 64; }
	http {
	    access_log off;
	    client_body_temp_path $$tmp/tmp/body; proxy_temp_path $$tmp/tmp/proxy;
	    fastcgi_temp_path $$tmp/tmp/fastcgi; uwsgi_temp_path $$tmp/tmp/uwsgi; scgi_temp_path $$tmp/tmp/scgi;
	    server {
	        listen 127.0.0.1:$$port;
	        root $$tmp/html;
	        location = /lua { content_by_lua_block { ngx.say("lua-ok") } }
	    }
	}
	EOF
	chmod -R a+rX "$$tmp"
	$(SYS_NGINX) -p "$$tmp/" -c "$$tmp/nginx.conf" -t -q
	$(SYS_NGINX) -p "$$tmp/" -c "$$tmp/nginx.conf"
	for i in $$(seq 1 50); do [ -s "$$pidf" ] && (exec 3<>/dev/tcp/127.0.0.1/$$port) 2>/dev/null && break; sleep 0.1; done
	a=$$(curl -sS --max-time 5 http://127.0.0.1:$$port/index.html)
	b=$$(curl -sS --max-time 5 http://127.0.0.1:$$port/lua)
	if [ "$$a" != static-ok ] || [ "$$b" != lua-ok ] || grep -E '\[(alert|crit|emerg)\]' "$$tmp/error.log"; then
	  echo "error: smoke-system failed: static='$$a' lua='$$b'" >&2; cat "$$tmp/error.log" >&2; exit 1
	fi
	echo "==> smoke-system: $(SYS_NGINX) loaded ndk + lua + ngx_http_ratelimit_module and served static + lua"

# ---------------------------------------------------------------------------------------------
# Any nginx: packaging/build-for.sh configures a copy of NGINX_SRC like NGINX_BIN (`nginx -V`)
# and checks that NGINX_BIN loads the result.

build-for: deps-build
	[ -n "$(NGINX_SRC)" ] && [ -n "$(NGINX_BIN)" ] || {
	  echo "usage: make build-for NGINX_SRC=/path/to/nginx-x.y.z[.tar.gz] NGINX_BIN=/path/to/sbin/nginx" >&2; exit 2; }
	packaging/build-for.sh "$(NGINX_SRC)" "$(NGINX_BIN)"

# Two nginx compiles (a few minutes each on 2 cores) on the first run; later runs reuse them.
test-build-for: deps-system deps-test
	packaging/test-build-for.sh

# ---------------------------------------------------------------------------------------------
# Debian package of the system build: packaging/debian/ (debhelper + dh_nginx), staged and built
# by packaging/build-deb.sh. The package depends on the nginx-abi-* that nginx-dev's sources
# declare, so apt refuses it for any other nginx build.

DEB_REVISION ?= 1
DEB_FILE = $(BUILD)/libnginx-mod-http-ratelimit_$(shell sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)-$(DEB_REVISION)_$(shell dpkg --print-architecture 2>/dev/null).deb

deb: deps-deb
	$(MAKE) build-system
	DEB_REVISION=$(DEB_REVISION) packaging/build-deb.sh $(SYS_MODULE) $(BUILD)

# Installs into the machine's nginx and purges again: not part of `make test`, which must not
# change the system; CI runs it.
test-deb: deps-deb deps-test
	$(MAKE) deb
	packaging/test-deb.sh $(DEB_FILE)

# ---------------------------------------------------------------------------------------------
# run: redis-server + nginx (foreground) with nginx/quickstart.conf on 127.0.0.1:$(PORT)

run: deps-run
	$(MAKE) build
	prefix=$(BUILD)/run
	rm -rf "$$prefix"; mkdir -p "$$prefix/logs" "$$prefix/html" "$$prefix/conf" "$$prefix/tmp"
	if (exec 3<>/dev/tcp/127.0.0.1/$(PORT)) 2>/dev/null; then
	  echo "error: 127.0.0.1:$(PORT) is in use; try: make run PORT=8081" >&2; exit 1
	fi
	rport=""; for p in $$(seq 6379 6479); do (exec 3<>/dev/tcp/127.0.0.1/$$p) 2>/dev/null || { rport=$$p; break; }; done
	[ -n "$$rport" ] || { echo "error: no free port for redis-server" >&2; exit 1; }
	echo '<h1>ngx_http_ratelimit quickstart</h1>' > "$$prefix/html/index.html"
	sed -e "s|@MODULE@|$(MODULE)|g" -e "s|@REDIS@|127.0.0.1:$$rport|g" \
	    -e "s|@LISTEN@|127.0.0.1:$(PORT)|g" -e "s|@ROOT@|$$prefix/html|g" \
	    nginx/quickstart.conf > "$$prefix/conf/nginx.conf"
	chmod -R a+rX "$$prefix"
	redis_pid=""
	cleanup() { if [ -n "$$redis_pid" ]; then kill "$$redis_pid" 2>/dev/null || true; wait "$$redis_pid" 2>/dev/null || true; fi; }
	trap cleanup EXIT
	trap 'exit 130' INT TERM
	redis-server --bind 127.0.0.1 --port "$$rport" --save '' --appendonly no --dir "$$prefix" \
	  --logfile "$$prefix/logs/redis.log" &
	redis_pid=$$!
	for i in $$(seq 1 50); do redis-cli -p "$$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
	redis-cli -p "$$rport" ping >/dev/null || { echo "error: redis-server did not start" >&2; cat "$$prefix/logs/redis.log" >&2; exit 1; }
	$(NGINX) -p "$$prefix/" -c "$$prefix/conf/nginx.conf" -t -q
	# (printf, not a here-document: make strips leading blanks and "-" from recipe lines)
	u=http://127.0.0.1:$(PORT)/
	printf '%s\n' "" \
	  "  redis-server on 127.0.0.1:$$rport (pid $$redis_pid); nginx on $$u (Ctrl-C stops both)" \
	  "  Limit: 5 requests per rolling 10 s per X-Consumer-Id (per client address without it)." \
	  "" \
	  "  Try, in another terminal:" \
	  "    for i in \$$(seq 1 7); do curl -s -o /dev/null -w '%{http_code}\n' -H 'X-Consumer-Id: alice' $$u; done" \
	  "        # -> 200 200 200 200 200 429 429" \
	  "    curl -i -H 'X-Consumer-Id: alice' $$u   # 429 with Retry-After and RateLimit-* headers" \
	  "    curl -i -H 'X-Consumer-Id: bob' $$u     # another consumer: 200, RateLimit-Remaining: 4" \
	  "    curl -i $$u                             # no header: keyed by the client address" \
	  "    redis-cli -p $$rport --scan                     # the sorted sets, rl:quickstart:<key>" \
	  "" \
	  "  The access log below shows \$$ratelimit_status, \$$ratelimit_remaining and \$$ratelimit_reset." \
	  ""
	$(NGINX) -p "$$prefix/" -c "$$prefix/conf/nginx.conf"

# ---------------------------------------------------------------------------------------------
# tests

# Relative links and #anchors of README.md and docs/*.md (python3, standard library only); first
# in `make test`: it needs no build and fails fast.
.PHONY: check-links check-configs check-layers deps-docs
deps-docs:
	@$(call apt_ensure,python3)
check-links: deps-docs
	echo "==> docs/check-links.py"
	python3 docs/check-links.py

# The layers of src/ (docs/layout.md): every file in a layer's folder, every import pointing
# down, no nginx bindings in the pure layers; needs no build either.
check-layers: deps-docs
	echo "==> docs/check-layers.py"
	python3 docs/check-layers.py

# nginx -t on every configuration README.md and docs/ show (fragments apart), as pasted but for
# the module's path; right after the build, which it needs, in well under a second.
check-configs: deps-docs
	[ -x $(NGINX) ] && [ -f $(MODULE) ] || { echo "error: run make build first" >&2; exit 1; }
	echo "==> docs/check-configs.py"
	NGINX=$(NGINX) MODULE=$(MODULE) python3 docs/check-configs.py

test: deps-test
	$(MAKE) check-links
	$(MAKE) check-layers
	$(MAKE) build
	rm -f $(TEST_LOGS)/prove-*.why
	rc=0
	$(MAKE) check-configs || rc=1
	$(MAKE) test-unit || rc=1
	$(MAKE) test-fuzz || rc=1
	$(MAKE) test-vendored || rc=1
	# Debian's nginx with OpenResty's Lua module: (re)built, since its suites are the ones that
	# prove the Lua compatibility; only a machine without Debian's nginx-dev and apt cannot.
	if [ "$(TEST_SYSTEM)" != 1 ]; then echo "==> skipping test-system (TEST_SYSTEM=0)"
	elif [ -f $(SYS_SRC)/conf_flags ] || { [ "$${SKIP_APT:-}" != 1 ] && command -v apt-get >/dev/null; }; then
	  { $(MAKE) build-system && $(MAKE) test-system; } || rc=1
	else echo "==> skipping test-system: no $(SYS_SRC)/conf_flags (Debian's nginx-dev) and no apt-get to install it"; fi
	if [ "$(TEST_VALGRIND)" = 1 ]; then $(MAKE) test-valgrind || rc=1
	else echo "==> skipping test-valgrind (TEST_VALGRIND=0)"; fi
	# Why prove failed, again: the passes that ran after it have pushed it out of the log's tail.
	if [ $$rc -ne 0 ]; then cat $(TEST_LOGS)/prove-*.why 2>/dev/null || true; fi
	exit $$rc

# Unit tests (pure Rust, no nginx symbols). --release reuses the vendored nginx of `make build`
# instead of compiling another one for the dev profile.
test-unit:
	echo "==> cargo test --release"
	env -u NGINX_BUILD_DIR -u NGINX_SOURCE_DIR $(CARGO) test --release $(CARGO_FLAGS)

# The RESP decoder against random, corrupted and cut replies, for a bounded time (FUZZ_SECONDS).
# `fuzz/run.sh 600 libfuzzer` runs coverage-guided libFuzzer instead (needs cargo-fuzz).
FUZZ_SECONDS ?= 60
test-fuzz:
	echo "==> fuzz/run.sh $(FUZZ_SECONDS) prop"
	fuzz/run.sh $(FUZZ_SECONDS) prop

# Every t/ suite once more with each nginx under valgrind memcheck; fails on any error record
# with a frame of the module (t/valgrind-check.pl). Timing assertions may fail under valgrind and
# are only reported. 2,000 instead of 100,000 distinct keys in 250-bad-input keeps it ~3 minutes.
test-valgrind: deps-test
	[ -x $(NGINX) ] && [ -f $(MODULE) ] || { echo "error: run make build first" >&2; exit 1; }
	echo "==> t/valgrind.sh   (every suite under valgrind memcheck)"
	TEST_RL_KEYS=$${TEST_RL_KEYS:-2000} VALGRIND_DIR=$${VALGRIND_DIR:-$(ROOT)/t/servroot-valgrind} \
	  t/valgrind.sh

# $(call prove_run,NAME,SUITES): prove, with its whole output (stdout and stderr) also kept in
# $(TEST_LOGS)/prove-NAME.log and each suite's stderr in prove-NAME.stderr/ (t/prove-exec.sh:
# under -j2 two suites share stderr). When it fails, the "#   Failed test" lines of each failed
# suite, with the "#" lines after them, are printed after prove's summary (t/prove-failures.sh)
# and kept in prove-NAME.why, which `make test` prints again at its end: the tail of a CI log is
# all there is. --failures: prove names each failed test under its suite. Failed suites are not
# run again: a flaky one must stay visible.
TEST_LOGS := $(BUILD)/test-logs
define prove_run
rm -rf $(TEST_LOGS)/prove-$(1).stderr $(TEST_LOGS)/prove-$(1).why
mkdir -p $(TEST_LOGS)/prove-$(1).stderr
prove_rc=0
PROVE_STDERR_DIR=$(TEST_LOGS)/prove-$(1).stderr $(PROVE) --exec $(ROOT)/t/prove-exec.sh --failures \
  $(PROVE_FLAGS) $(2) 2>&1 | tee $(TEST_LOGS)/prove-$(1).log || prove_rc=$$?
if [ $$prove_rc -ne 0 ]; then
	t/prove-failures.sh $(TEST_LOGS)/prove-$(1).log $(TEST_LOGS)/prove-$(1).stderr \
	  | tee $(TEST_LOGS)/prove-$(1).why || true
fi
exit $$prove_rc
endef

test-vendored:
	[ -x $(NGINX) ] && [ -f $(MODULE) ] || { echo "error: run make build first" >&2; exit 1; }
	echo "==> prove $(PROVE_FLAGS) t   (nginx: $(NGINX))"
	export TEST_NGINX_BINARY=$(NGINX) TEST_NGINX_MODULE=$(MODULE) TEST_NGINX_FLAVOR=vendored $(HARNESS_ENV)
	$(call prove_run,vendored,t)

test-system: deps-test
	[ -f $(SYS_MODULE) ] || { echo "error: run make build-system first" >&2; exit 1; }
	echo "==> prove $(PROVE_FLAGS) $(SYSTEM_SUITES)   (nginx: $(SYS_NGINX) + lua)"
	export TEST_NGINX_BINARY=$(SYS_NGINX) TEST_NGINX_MODULE=$(SYS_MODULE) TEST_NGINX_FLAVOR=system \
	TEST_NGINX_SERVROOT_BASE=$${TEST_NGINX_SERVROOT_BASE:-$(ROOT)/t/servroot-system} \
	TEST_NGINX_LOAD_LUA=1 $(HARNESS_ENV) \
	TEST_NGINX_LOAD_MODULES="$(SYS_MODDIR)/ndk_http_module.so $(SYS_MODDIR)/ngx_http_lua_module.so"
	$(call prove_run,system,$(SYSTEM_SUITES))

# ---------------------------------------------------------------------------------------------
# Docker (BuildKit: Docker 20.10 with DOCKER_BUILDKIT=1, or any current engine). The client is
# Debian's /usr/bin/docker when present: a newer client without the buildx plugin cannot use
# BuildKit. --network host: a daemon started by docker/dockerd.sh has no bridge.
# CA_BUNDLE: a PEM bundle of extra CA certificates to trust while fetching crates (a
# TLS-inspecting proxy); passed as the build secret ca_bundle, never stored in the image.

DOCKER       ?= $(shell [ -x /usr/bin/docker ] && echo /usr/bin/docker || echo docker)
IMAGE        ?= ngx-ratelimit
# The test target's image: IMAGE's name with the tag "test".
TEST_IMAGE   ?= $(firstword $(subst :, ,$(IMAGE))):test
CA_BUNDLE    ?=
comma        := ,
DOCKER_BUILD  = DOCKER_BUILDKIT=1 $(DOCKER) build --progress=plain --network host \
                $(if $(CA_BUNDLE),--secret id=ca_bundle$(comma)src=$(abspath $(CA_BUNDLE)))

# The FROM images from Debian's packages, where no registry can be reached (docker/make-bases.sh).
docker-bases: deps-docker
	DOCKER=$(DOCKER) docker/make-bases.sh

docker-build:
	$(DOCKER_BUILD) -t $(IMAGE) .
	$(DOCKER) image ls --format '==> {{.Repository}}:{{.Tag}} {{.Size}}' $(IMAGE)

docker-smoke:
	DOCKER=$(DOCKER) docker/smoke.sh $(IMAGE)

# make test inside an image that had only Debian and Rust; TEST_HARNESS=test-nginx runs the
# suites under Test::Nginx::Socket from CPAN.
docker-test:
	$(DOCKER_BUILD) --target test --build-arg TEST_HARNESS=$(TEST_HARNESS) -t $(TEST_IMAGE) .

# ---------------------------------------------------------------------------------------------

bench: deps-bench
	$(MAKE) build
	bench/run.sh

# No limiter vs the article's Lua block vs this module, on Debian's nginx (about 12 minutes).
bench-compare: deps-bench
	$(MAKE) build-system
	bench/compare.sh

# Builds of the module side by side in one run (about 5 minutes for two): a before/after of the
# code on one machine, where two bench-compare runs may be two machines. BUILDS="name=path.so ..."
# (each from make build-system, an older commit's in a worktree of its own).
.PHONY: bench-compare-builds
bench-compare-builds: deps-bench
	bench/compare-builds.sh

# One Redis over TCP vs a 3-primary Cluster vs TLS, the module's allow path (about 4 minutes).
bench-topology: deps-bench
	$(MAKE) build-system
	bench/topology.sh

# No limiter vs exact decisions vs lease=auto, on the vendored build (about 5 minutes).
.PHONY: bench-lease
bench-lease: deps-bench
	$(MAKE) build
	bench/lease.sh

# The worker's own instructions per request under callgrind: no limiter, limit_req, exact,
# lease=auto (also without headers), two and four leased zones, a deny-cache rejection (also without
# headers), limit_req rejecting; 3 runs each (about 20 minutes; INSTRUCTIONS_ARGS="--runs 1").
.PHONY: bench-instructions
bench-instructions: deps-bench
	$(MAKE) build
	bench/instructions.py $(INSTRUCTIONS_ARGS)

# Redis's instructions per decision of the script under callgrind, per algorithm, lease and
# batch size (bench/script-cost.md).
.PHONY: bench-script-cost
bench-script-cost: deps-bench
	bench/script-cost.py

# A burst of 1,000 requests into delay= and into settle=: the worker's instructions, Redis's
# calls and CPU per request, beside the same burst admitted at once (about 12 minutes).
.PHONY: bench-burst
bench-burst: deps-bench
	$(MAKE) build
	bench/burst.py $(BURST_ARGS)

# Several Redis backends (issue 34): a location with one zone per backend against the same two
# zones on one backend: wrk requests/s side by side, the worker's instructions per request
# (callgrind) and latency, a distant backend through a delaying proxy (about 12 minutes;
# BACKENDS_ARGS="--runs 1 --rounds 2").
.PHONY: bench-backends
bench-backends: deps-bench
	$(MAKE) build
	bench/backends.py $(BACKENDS_ARGS)

# Redis's cost of keeping concurrency slots renewed, by lease_time (about 3 minutes).
.PHONY: bench-concurrency
bench-concurrency: deps-bench
	$(MAKE) build
	bench/concurrency.sh

fmt:
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

# --release: shares the vendored nginx build with `make build`.
lint: fmt-check
	env -u NGINX_BUILD_DIR -u NGINX_SOURCE_DIR $(CARGO) clippy --release --all-targets $(CARGO_FLAGS) -- -D warnings

clean:
	rm -rf $(BUILD) t/servroot t/servroot-system
	$(CARGO) clean
