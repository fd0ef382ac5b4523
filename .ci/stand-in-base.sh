#!/usr/bin/env bash
# A stand-in for python:3.12-slim, for building the images where no container registry answers
# (this machine, CI). No Debian release ships Python 3.12: trixie's 3.13 stands in for it (vaeserve
# needs 3.12 or newer; the locks hold wheels for both). Made from Debian's packages with debootstrap and imported into buildah's
# storage; prints its name, which goes to `make image BASE=...`.
#
#   .ci/stand-in-base.sh          # build it once (about 80-110 s), later calls print the cached name
#
# Like the real base it has `python` and `pip` on PATH and lets pip install into the system Python
# (Debian's EXTERNALLY-MANAGED marker removed). Unlike it, it carries this build host's CA bundle
# and PIP_CERT pointing at it, because this host reaches the package index through a TLS proxy:
# pip inside a build must trust what pip here trusts. That is a property of the build host, so it
# lives in the stand-in, never in the Dockerfile or the image users pull.
#
# Needs root, buildah and debootstrap (.ci/install-image-tools.sh). The image is kept in buildah's
# storage under a name that hashes this script and the CA bundle, so a change to either builds a
# new one; STORAGE_DRIVER (vfs here) chooses where buildah keeps it.
set -euo pipefail

SUITE=trixie
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The bundle pip on this host uses: PIP_CERT, else pip's configured `cert`, else the system's.
CA_BUNDLE=${PIP_CERT:-$(python3 -m pip config list 2>/dev/null | sed -n "s/^global\.cert='\(.*\)'$/\1/p" | head -n 1)}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
IN_IMAGE_BUNDLE=/etc/ssl/certs/build-host-ca-bundle.pem

key=$(cat "$0" "$CA_BUNDLE" | sha256sum | cut -c1-12)
name=localhost/vaeserve-stand-in-python:3-$SUITE-$key

if buildah inspect --type image "$name" >/dev/null 2>&1; then
    echo "$name"
    exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/stand-in-base.XXXXXX")
container=""
cleanup() {
    [ -n "$container" ] && buildah rm "$container" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

echo "stand-in base: debootstrap $SUITE (python3, pip, venv) into $work/rootfs" >&2
debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
    "$SUITE" "$work/rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 || {
    tail -n 30 "$work/debootstrap.log" >&2
    exit 1
}
root=$work/rootfs
ln -sf python3 "$root/usr/bin/python"
rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
install -m 0644 "$CA_BUNDLE" "$root$IN_IMAGE_BUNDLE"
# What python:3.12-slim leaves out too: downloaded packages, package lists, docs.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
    "$root"/usr/share/man/* "$root"/usr/share/info/*

echo "stand-in base: importing $(du -sh "$root" | cut -f1) as $name" >&2
tar -C "$root" -cf "$work/rootfs.tar" .
container=$(buildah from scratch)
buildah add "$container" "$work/rootfs.tar" / >/dev/null
buildah config \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 \
    --env PIP_CERT="$IN_IMAGE_BUNDLE" \
    --cmd python3 \
    --label org.opencontainers.image.description="stand-in for python:3.12-slim built on this host (Debian $SUITE packages)" \
    "$container"
buildah commit --quiet --rm "$container" "$name" >/dev/null
container=""
echo "$name"
