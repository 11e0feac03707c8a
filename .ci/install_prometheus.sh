#!/usr/bin/env bash
# Install the Prometheus server and promtool (Debian package `prometheus`) for
# tests/test_services.py and tests/test_prometheus_integration.py. Idempotent: exits 0
# at once when both are already on PATH. Needs root (CI runs as root) or sudo.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    echo "prometheus already installed: $(promtool --version 2>&1 | head -n 1)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install_prometheus.sh: need root or sudo to apt-get install prometheus" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# --no-install-recommends: the server and promtool only, no node exporter.
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# The package enables a systemd unit; in containers and CI nothing starts it, and the
# tests run their own server on a free port.
command -v prometheus >/dev/null && command -v promtool >/dev/null
echo "installed: $(promtool --version 2>&1 | head -n 1)"
