#!/usr/bin/env bash
# Install Debian's chromium for the console's browser tests (tests/test_console_browser.py: Playwright
# drives /usr/bin/chromium; no browser download). Idempotent: exits 0 at once when it is installed.
# Needs root (CI runs as root) or sudo.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
    echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null | head -n 1)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install_chromium.sh: need root or sudo to apt-get install chromium" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# --no-install-recommends: the browser and the libraries it links, no desktop extras; fonts-liberation
# so that the screenshots the tests save show text.
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
test -x /usr/bin/chromium
echo "installed: $(/usr/bin/chromium --version 2>/dev/null | head -n 1)"
