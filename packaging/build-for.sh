#!/usr/bin/env bash
# make build-for: the module for any nginx, from that nginx's source and its binary.
#   packaging/build-for.sh NGINX_SRC NGINX_BIN [OUT_DIR]
#     NGINX_SRC  the nginx source tree (or a .tar.gz of it) of the same version as NGINX_BIN:
#                nginx.org's tarball, `apt-get source nginx`, /usr/share/nginx/src (nginx-dev)
#     NGINX_BIN  the nginx binary the module is for; its `nginx -V` gives the configure arguments
#     OUT_DIR    default build/for/nginx-<version>-<hash of source and arguments>
# -> OUT_DIR/ngx_http_ratelimit_module.so, checked by loading it into NGINX_BIN (`nginx -t`);
#    the path is printed last.
#
# A module loads only into an nginx of the same version and the same module signature; the
# signature follows the configure arguments, which `nginx -V` prints, plus --with-compat (which
# fixes the layout of the structures a dynamic module sees). The arguments that only add other
# modules (--add-module, --add-dynamic-module, --with-*=dynamic) are dropped: their sources are
# the binary builder's, and they do not change that signature. A tree is configured once per
# source and argument set; later runs reuse it and cargo's target/for/<same name>.
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: $0 NGINX_SRC NGINX_BIN [OUT_DIR]" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
src=$(realpath "$1")
bin=$2
command -v "$bin" >/dev/null || { echo "error: NGINX_BIN '$bin' is not an executable" >&2; exit 1; }
bin=$(realpath "$(command -v "$bin")")

# The binary's version and configure arguments.
vline=$("$bin" -V 2>&1) || { echo "error: '$bin -V' failed: $vline" >&2; exit 1; }
bin_ver=$(printf '%s\n' "$vline" | sed -n 's|^nginx version: [^/]*/\([0-9.]*\).*|\1|p')
conf_line=$(printf '%s\n' "$vline" | sed -n 's/^configure arguments: //p')
[ -n "$bin_ver" ] || { echo "error: no version in '$bin -V'" >&2; exit 1; }

# A tarball is unpacked once, next to the other trees.
work_base=$root/build/for
if [ -f "$src" ]; then
    unpacked="$work_base/src-$(sha1sum "$src" | cut -c1-12)"
    if [ ! -d "$unpacked" ]; then
        mkdir -p "$unpacked.tmp"
        tar -xf "$src" -C "$unpacked.tmp"
        mv "$unpacked.tmp" "$unpacked"
    fi
    header=$(find "$unpacked" -maxdepth 5 -path '*/src/core/nginx.h' | head -n1)
    [ -n "$header" ] || { echo "error: no nginx source tree (src/core/nginx.h) in $1" >&2; exit 1; }
    src=${header%/src/core/nginx.h}
fi
[ -f "$src/src/core/nginx.h" ] || { echo "error: $src is not an nginx source tree (no src/core/nginx.h)" >&2; exit 1; }
src_ver=$(sed -n 's/^#define NGINX_VERSION *"\(.*\)"/\1/p' "$src/src/core/nginx.h")
if [ "$src_ver" != "$bin_ver" ]; then
    echo "error: $src is nginx $src_ver but $bin is nginx $bin_ver: nginx would refuse the module" >&2
    echo "       (\"module ... version ... instead of ...\"); use the source of $bin's version" >&2
    exit 1
fi

# `nginx -V` prints the arguments shell-quoted, as they were typed.
mapfile -d '' -t all_args < <(python3 -c 'import shlex, sys
for a in shlex.split(sys.argv[1]): sys.stdout.write(a + "\0")' "$conf_line")
args=()
dropped=()
for a in "${all_args[@]}"; do
    case "$a" in
        --add-module=*|--add-dynamic-module=*|--with-*=dynamic|--builddir=*) dropped+=("$a") ;;
        *) args+=("$a") ;;
    esac
done
case " ${args[*]} " in *" --with-compat "*) ;; *) args+=(--with-compat) ;; esac
[ ${#dropped[@]} -eq 0 ] || echo "==> not needed for the module (other modules): ${dropped[*]}"

name="nginx-$src_ver-$(printf '%s\n' "$src" "${args[@]}" | sha1sum | cut -c1-8)"
out=${3:-$work_base/$name}
tree="$out/nginx-$src_ver"
mkdir -p "$out"
stamp=$(printf '%s\n' "$src" "$(stat -c %Y "$src/src/core/nginx.h")" "${args[@]}")
if [ -f "$tree/objs/ngx_auto_config.h" ] && [ "$(cat "$tree/.configured" 2>/dev/null)" = "$stamp" ]; then
    echo "==> $tree already configured"
else
    echo "==> configuring nginx $src_ver in $tree: ${args[*]}"
    rm -rf "$tree"
    cp -a "$src" "$tree"
    # nginx.org tarballs have ./configure; the source repository (and the nginx-src crate) auto/configure.
    conf=configure
    [ -f "$tree/configure" ] || conf=auto/configure
    (cd "$tree" && sh "$conf" "${args[@]}") > "$out/configure.log" 2>&1 ||
        { tail -n 30 "$out/configure.log" >&2; echo "error: configure failed (log: $out/configure.log)" >&2; exit 1; }
    printf '%s\n' "$stamp" > "$tree/.configured"
fi

target="$root/target/for/$(basename "$out")"
echo "==> cargo build --release against $tree/objs (CARGO_TARGET_DIR=$target)"
(cd "$root" && env -u NGINX_SOURCE_DIR CARGO_TARGET_DIR="$target" NGINX_BUILD_DIR="$tree/objs" \
    cargo build --release --no-default-features --features export-modules)
so="$out/ngx_http_ratelimit_module.so"
install -m 0644 "$target/release/libngx_http_ratelimit.so" "$so"

# The proof: the binary loads it. -e (nginx >= 1.19.5) keeps -t away from the compiled-in error
# log path, which may not be writable.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'load_module %s;\nerror_log stderr;\npid nginx.pid;\nevents {}\n' "$so" > "$tmp/nginx.conf"
elog=()
"$bin" -h 2>&1 | grep -q -- '^ *-e ' && elog=(-e stderr)
if ! "$bin" -p "$tmp/" -c "$tmp/nginx.conf" "${elog[@]}" -t -q >"$tmp/t.log" 2>&1; then
    cat "$tmp/t.log" >&2
    echo "error: $bin does not load $so (built without --with-compat? then rebuild it with it)" >&2
    exit 1
fi
echo "==> $bin (nginx $bin_ver) loads $so"
echo "$so"
