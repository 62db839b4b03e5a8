#!/usr/bin/env bash
# make test-build-for: `make build-for` against two nginx versions from the package registries,
# neither of them the vendored build `make build` makes:
#   nginx 1.28.0 from the nginx-src crate (crates.io, through cargo): configured and compiled
#     here into an nginx binary (build/for-test/<version>/, reused while its source and
#     arguments are unchanged), as a user's own nginx would be;
#   nginx 1.22.1, Debian's /usr/sbin/nginx, with the source nginx-dev ships in
#     /usr/share/nginx/src (headers and configure only: enough for a module, not for a binary).
# For each: `packaging/build-for.sh SOURCE BINARY` (configured from `BINARY -V`; it checks that
# the binary loads the module), then t/010-basic.t against that binary and module. Last, each
# module is offered to the other nginx, which must refuse it with "version X instead of Y".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$root/build/for-test
mkdir -p "$work"

# nginx-src's version: <crate version>+<nginx version>; pinned, so that the tree is reused.
CRATE_VERSION=${NGINX_SRC_CRATE_VERSION:-1.28.0+1.28.0}

crate_source() {
    local proj=$work/nginx-src-crate manifest
    mkdir -p "$proj/src"
    : > "$proj/src/lib.rs"
    printf '%s\n' '[package]' 'name = "fetch-nginx-src"' 'version = "0.0.0"' 'edition = "2021"' \
        'publish = false' '[lib]' 'path = "src/lib.rs"' '[workspace]' '[dependencies]' \
        "nginx-src = \"=$CRATE_VERSION\"" > "$proj/Cargo.toml"
    cargo fetch --quiet --manifest-path "$proj/Cargo.toml" >&2
    manifest=$(cargo metadata --quiet --format-version 1 --manifest-path "$proj/Cargo.toml" |
        python3 -c 'import json, sys
print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "nginx-src"))')
    echo "$(dirname "$manifest")/nginx"
}

# build_nginx SOURCE DEST: an nginx binary from SOURCE, as a user's own build would be made
# (with --with-compat, as any nginx meant to load third-party modules should be).
build_nginx() {
    local src=$1 dest=$2 ver tree stamp conf
    ver=$(sed -n 's/^#define NGINX_VERSION *"\(.*\)"/\1/p' "$src/src/core/nginx.h")
    tree=$dest/nginx-$ver
    local args=(--prefix="$dest/prefix" --error-log-path=stderr --with-compat --with-threads
                --with-http_ssl_module --with-http_v2_module --with-http_realip_module
                --with-http_auth_request_module)
    stamp=$(printf '%s\n' "$src" "${args[@]}")
    if [ -x "$tree/objs/nginx" ] && [ "$(cat "$dest/.built" 2>/dev/null)" = "$stamp" ]; then
        echo "==> nginx $ver: $tree/objs/nginx (reused)" >&2
    else
        echo "==> nginx $ver: configure + make in $tree" >&2
        rm -rf "$dest"; mkdir -p "$dest"
        cp -a "$src" "$tree"
        conf=configure; [ -f "$tree/configure" ] || conf=auto/configure
        (cd "$tree" && sh "$conf" "${args[@]}" && make -j"${JOBS:-2}") > "$dest/build.log" 2>&1 ||
            { tail -n 30 "$dest/build.log" >&2; echo "error: nginx $ver build failed (log: $dest/build.log)" >&2; exit 1; }
        printf '%s\n' "$stamp" > "$dest/.built"
    fi
    echo "$tree/objs/nginx"
}

crate_src=$(crate_source)
crate_ver=$(sed -n 's/^#define NGINX_VERSION *"\(.*\)"/\1/p' "$crate_src/src/core/nginx.h")
crate_bin=$(build_nginx "$crate_src" "$work/$crate_ver")
pairs=("$crate_src" "$crate_bin" /usr/share/nginx/src /usr/sbin/nginx)
bins=()
mods=()
for ((k = 0; k < ${#pairs[@]}; k += 2)); do
    src=${pairs[$k]}
    bin=${pairs[$((k + 1))]}
    ver=$(sed -n 's/^#define NGINX_VERSION *"\(.*\)"/\1/p' "$src/src/core/nginx.h")
    echo "==> make build-for NGINX_SRC=$src NGINX_BIN=$bin"
    mod=$("$root/packaging/build-for.sh" "$src" "$bin" | tee -a /dev/stderr | tail -n1)
    echo "==> t/010-basic.t against nginx $ver + $mod"
    TEST_NGINX_BINARY=$bin TEST_NGINX_MODULE=$mod \
        TEST_NGINX_SERVROOT_BASE=$work/servroot-$ver prove "$root/t/010-basic.t"
    bins+=("$bin")
    mods+=("$mod")
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# build-for refuses a source whose version is not the binary's, before building anything.
if "$root/packaging/build-for.sh" "$crate_src" /usr/sbin/nginx > "$tmp/mismatch.log" 2>&1 ||
    ! grep -q 'nginx would refuse the module' "$tmp/mismatch.log"; then
    cat "$tmp/mismatch.log" >&2; echo "error: build-for accepted nginx $crate_ver source for /usr/sbin/nginx" >&2; exit 1
fi
echo "==> build-for with nginx $crate_ver source for /usr/sbin/nginx: $(head -n1 "$tmp/mismatch.log")"

# Cross-loading: what a user sees with a module built for another nginx.
for i in 0 1; do
    j=$((1 - i))
    printf 'load_module %s;\nerror_log stderr;\npid nginx.pid;\nevents {}\n' "${mods[$i]}" > "$tmp/nginx.conf"
    if "${bins[$j]}" -p "$tmp/" -c "$tmp/nginx.conf" -e stderr -t -q > "$tmp/t.log" 2>&1; then
        echo "error: ${bins[$j]} loaded a module built for another nginx version" >&2; exit 1
    fi
    grep -E 'module ".*" version [0-9]+ instead of [0-9]+' "$tmp/t.log" >&2 ||
        { cat "$tmp/t.log" >&2; echo "error: not the version refusal" >&2; exit 1; }
done
echo "==> test-build-for: modules for nginx $(for b in "${bins[@]}"; do "$b" -v 2>&1 | sed 's|.*/||'; done | paste -sd' ') built, loaded and tested; each refused by the other nginx"
