#!/usr/bin/env bash
# The t/ suites with every nginx under valgrind memcheck, then t/valgrind-check.pl
# on the logs: fails if any memcheck error record has a frame of the module.
#
#   t/valgrind.sh                      all of t/
#   t/valgrind.sh t/010-basic.t ...    some suites
#
# Environment:
#   VALGRIND_DIR     work directory (default /tmp/vg): the copied binaries and
#                    servroot/<suite>/ with the valgrind.*.log files
#   JOBS             prove -j (default 2)
#   VALGRIND_PALLOC  1 (default): relink the vendored nginx with NGX_DEBUG_PALLOC=1,
#                    so that every pool allocation is its own malloc() and memcheck
#                    sees overruns and stale pointers inside pools (the module's
#                    request context, its strings); 0: the build/nginx binary as is.
#                    Falls back to build/nginx when its objs/ are not there.
#   TEST_NGINX_BINARY / TEST_NGINX_MODULE   what to copy (default build/)
#   TEST_NGINX_VALGRIND_OPTS                more valgrind options (--track-origins=yes)
#   VALGRIND_STRICT  1: also fail when a test fails (default: tests are reported only;
#                    under valgrind everything is 20-50x slower and some timing
#                    assertions do not hold)
#
# The binaries are copied first, so a `make build` meanwhile does not change what runs.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DIR=${VALGRIND_DIR:-/tmp/vg}
JOBS=${JOBS:-2}
T0=$(date +%s)

command -v valgrind >/dev/null || { echo "valgrind.sh: valgrind is not installed (apt-get install valgrind)" >&2; exit 2; }
bin=${TEST_NGINX_BINARY:-$ROOT/build/nginx}
mod=${TEST_NGINX_MODULE:-$ROOT/build/ngx_http_ratelimit_module.so}
[ -x "$bin" ] && [ -f "$mod" ] || { echo "valgrind.sh: $bin or $mod missing (make build)" >&2; exit 2; }
mkdir -p "$DIR"
rm -rf "$DIR/servroot"
cp "$bin" "$DIR/nginx"
cp "$mod" "$DIR/ngx_http_ratelimit_module.so"
nginx="$DIR/nginx"

# NGX_DEBUG_PALLOC only changes ngx_palloc.c (no structure layout), so the module built
# for build/nginx loads into the relinked binary. Only ngx_palloc.o is recompiled, in a copy of
# the objs/ directory build/nginx was built in (its -V names it: --builddir).
if [ "${VALGRIND_PALLOC:-1}" = 1 ] && [ -z "${TEST_NGINX_BINARY:-}" ]; then
    objs=$("$bin" -V 2>&1 | sed -n 's/.*--builddir=\([^ ]*\).*/\1/p')
    src=$(sed -n 's/^"\([^"]*\)".*/\1/p' "$objs/last-build-info" 2>/dev/null || true)
    if [ -f "$objs/Makefile" ] && [ -f "$src/src/core/ngx_palloc.c" ]; then
        rm -rf "$DIR/objs"
        cp -a "$objs" "$DIR/objs"
        sed -i "s#$objs#$DIR/objs#g" "$DIR/objs/Makefile"
        rm -f "$DIR/objs/src/core/ngx_palloc.o" "$DIR/objs/nginx"
        cflags="$(sed -n 's/^CFLAGS = *//p' "$DIR/objs/Makefile") -DNGX_DEBUG_PALLOC=1"
        if (cd "$src" && make -s -f "$DIR/objs/Makefile" CFLAGS="$cflags" "$DIR/objs/nginx") >"$DIR/palloc-build.log" 2>&1; then
            cp "$DIR/objs/nginx" "$DIR/nginx-palloc"
            nginx="$DIR/nginx-palloc"
            echo "valgrind.sh: nginx relinked with NGX_DEBUG_PALLOC=1: $nginx"
        else
            echo "valgrind.sh: NGX_DEBUG_PALLOC relink failed (see $DIR/palloc-build.log); using build/nginx"
        fi
    else
        echo "valgrind.sh: objs/ of build/nginx not found; using it without NGX_DEBUG_PALLOC"
    fi
fi

suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(t)
echo "valgrind.sh: prove -j$JOBS -r ${suites[*]} under valgrind ($nginx), logs in $DIR/servroot"
TEST_NGINX_VALGRIND=1 TEST_NGINX_BINARY="$nginx" TEST_NGINX_MODULE="$DIR/ngx_http_ratelimit_module.so" \
TEST_NGINX_SERVROOT_BASE="$DIR/servroot" \
    prove -j"$JOBS" -r --timer "${suites[@]}" 2>&1 | tee "$DIR/prove.log"
prove_rc=${PIPESTATUS[0]}
T1=$(date +%s)

perl "$ROOT/t/valgrind-check.pl" -v "$DIR/servroot" | tee "$DIR/check.log"
check_rc=${PIPESTATUS[0]}

echo "valgrind.sh: prove exit $prove_rc, check exit $check_rc; tests $((T1 - T0))s, total $(( $(date +%s) - T0 ))s"
[ "$check_rc" -eq 0 ] || exit "$check_rc"
[ "${VALGRIND_STRICT:-0}" = 1 ] && [ "$prove_rc" -ne 0 ] && exit "$prove_rc"
exit 0
