#!/usr/bin/env bash
# make deb: stage the system build's module with packaging/debian/ and the docs, then build the
# binary package with dpkg-buildpackage (debhelper + dh_nginx from nginx-dev).
#   packaging/build-deb.sh MODULE_SO OUT_DIR
# -> OUT_DIR/libnginx-mod-http-ratelimit_<version>_<arch>.deb (the path is printed last)
set -euo pipefail

so=$1
out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
pkg=libnginx-mod-http-ratelimit

[ -f "$so" ] || { echo "error: $so not found (make build-system)" >&2; exit 1; }
upstream=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)
# -1: the first Debian revision of that upstream version; DEB_REVISION=2 ... for a rebuild of
# the same version (against a newer nginx ABI, say).
version="$upstream-${DEB_REVISION:-1}"
maintainer=${DEB_MAINTAINER:-$(git -C "$root" log -1 --format='%an <%ae>' 2>/dev/null || true)}
[ -n "$maintainer" ] || maintainer="ngx-ratelimit maintainers <ngx-ratelimit@localhost.invalid>"
# Reproducible: dates and timestamps come from the last commit, not from now.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || date +%s)}

work="$out/deb"
stage="$work/$pkg-$upstream"
rm -rf "$work"
mkdir -p "$stage/docs"
cp -a "$root/packaging/debian" "$stage/debian"
sed -i "s|@MAINTAINER@|$maintainer|" "$stage/debian/control"
{
    echo "$pkg ($version) unstable; urgency=medium"
    echo
    echo "  * Build of ngx-ratelimit $upstream$(git -C "$root" describe --always --dirty 2>/dev/null | sed 's/^/ (git /; s/$/)/')."
    echo
    echo " -- $maintainer  $(date -R -u -d "@$SOURCE_DATE_EPOCH")"
} > "$stage/debian/changelog"
install -m 0644 "$so" "$stage/ngx_http_ratelimit_module.so"
install -m 0644 "$root/README.md" "$stage/README.md"
install -m 0644 "$root"/docs/*.md "$stage/docs/"

echo "==> dpkg-buildpackage -b in $stage"
(cd "$stage" && dpkg-buildpackage -b -us -uc) > "$work/build.log" 2>&1 || {
    tail -n 40 "$work/build.log" >&2; echo "error: dpkg-buildpackage failed (log: $work/build.log)" >&2; exit 1
}
deb=$(ls "$work/${pkg}_${version}_"*.deb)
cp "$deb" "$out/"
echo "$out/$(basename "$deb")"
