#!/usr/bin/env bash
# Make the Dockerfile's FROM images locally, from Debian's packages only, for machines that
# cannot pull them (no image registry reachable, air-gapped sites):
#
#   debian:bookworm-slim  debootstrap --variant=minbase bookworm, trimmed like Debian's official
#                         slim image (no docs, man pages or locales; services never start
#                         during apt-get), then `docker import`
#   rust:1-bookworm       that image + Debian's rustc-web and cargo-web (Rust 1.85+ from
#                         bookworm or bookworm-security) + ca-certificates: nothing else, so
#                         that the Dockerfile's test target proves the Makefile's package
#                         lists complete
#
# They are tagged as the Dockerfile's FROM lines name them, so the Dockerfile is used unchanged.
# An image already present under a tag is kept (FORCE=1 rebuilds it). Needs root, debootstrap
# and a running Docker daemon (DOCKER_HOST is honoured). The Debian mirror is the one apt uses
# on this host (MIRROR= and SECURITY_MIRROR= override it). `make docker-bases` runs this.
set -euo pipefail

DOCKER=${DOCKER:-docker}
SUITE=bookworm
DEBIAN_TAG=${DEBIAN_TAG:-debian:bookworm-slim}
RUST_TAG=${RUST_TAG:-rust:1-bookworm}
FORCE=${FORCE:-0}

have() { [ "$FORCE" != 1 ] && $DOCKER image inspect "$1" >/dev/null 2>&1; }

# The first Debian archive (and security archive) among apt's sources, deb822 or one-line.
apt_uri() {
    local want=$1 f uri
    for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        while read -r uri; do
            case "$want:$uri" in
                sec:*/debian-security*) echo "$uri"; return 0 ;;
                main:*/debian-security*) ;;
                main:*/debian|main:*/debian/) echo "${uri%/}"; return 0 ;;
            esac
        done < <(sed -n -e 's/^URIs:[[:space:]]*//p' -e 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\).*/\2/p' "$f" | tr ' ' '\n')
    done
    return 1
}
MIRROR=${MIRROR:-$(apt_uri main || echo http://deb.debian.org/debian)}
SECURITY_MIRROR=${SECURITY_MIRROR:-$(apt_uri sec || echo http://deb.debian.org/debian-security)}

log() { echo "==> docker-bases: $*"; }

make_debian() {
    if have "$DEBIAN_TAG"; then log "$DEBIAN_TAG present, kept"; return; fi
    command -v debootstrap >/dev/null || { echo "error: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
    local root
    root=$(mktemp -d /var/tmp/rl-bases.XXXXXX)
    # shellcheck disable=SC2064
    trap "rm -rf '$root'" RETURN
    log "debootstrap --variant=minbase $SUITE from $MIRROR"
    debootstrap --variant=minbase "$SUITE" "$root/rootfs" "$MIRROR" > "$root/debootstrap.log" 2>&1 \
        || { tail -n 30 "$root/debootstrap.log" >&2; exit 1; }
    local r=$root/rootfs
    cat > "$r/etc/apt/sources.list" <<SRC
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
SRC
    # What Debian's official images do: no service starts inside a container build, no package
    # cache or docs kept, so that every later apt-get layer stays small.
    printf '#!/bin/sh\nexit 101\n' > "$r/usr/sbin/policy-rc.d"
    chmod 755 "$r/usr/sbin/policy-rc.d"
    cat > "$r/etc/apt/apt.conf.d/docker-clean" <<'CONF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::GzipIndexes "true";
Acquire::CompressionTypes::Order:: "gz";
APT::Install-Recommends "false";
CONF
    cat > "$r/etc/dpkg/dpkg.cfg.d/docker-slim" <<'CONF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
CONF
    find "$r/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    rm -rf "$r"/usr/share/{man,info,locale,groff,lintian,linda}/* "$r"/var/lib/apt/lists/* \
        "$r"/var/cache/apt/*.bin "$r"/var/cache/apt/archives/*.deb "$r"/var/log/*.log "$r"/tmp/*
    log "docker import -> $DEBIAN_TAG"
    tar --numeric-owner -C "$r" -c . | $DOCKER import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' - "$DEBIAN_TAG" >/dev/null
}

make_rust() {
    if have "$RUST_TAG"; then log "$RUST_TAG present, kept"; return; fi
    log "$DEBIAN_TAG + rustc-web cargo-web -> $RUST_TAG"
    # The host network: the daemon may run without a bridge (as .ci/run starts it).
    $DOCKER build --network host -t "$RUST_TAG" - <<DOCKERFILE
FROM $DEBIAN_TAG
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \\
 && apt-get install -y --no-install-recommends rustc-web cargo-web ca-certificates \\
 && rm -rf /var/lib/apt/lists/* \\
 && rustc --version && cargo --version
DOCKERFILE
}

make_debian
make_rust
$DOCKER image ls --format '{{.Repository}}:{{.Tag}}  {{.Size}}' | grep -E "^($DEBIAN_TAG|$RUST_TAG) " || true
