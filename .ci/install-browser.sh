#!/usr/bin/env bash
# What the browser test of GET /ui (tests/service/http/test_ui.py) needs on a fresh machine: Debian's
# Chromium and its WebDriver, so that `make test` runs it rather than skipping it.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
chromium --version
