#!/usr/bin/env bash
# What `make test-images` needs on a fresh machine: buildah (builds and runs images without a
# daemon) and debootstrap (the stand-in base, .ci/stand-in-base.sh), from Debian's packages.
set -euo pipefail
if command -v buildah >/dev/null && command -v debootstrap >/dev/null; then
    exit 0
fi
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq buildah debootstrap >/dev/null
buildah --version
