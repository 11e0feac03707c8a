#!/usr/bin/env bash
# Install the Prometheus server and promtool (Debian package `prometheus`) for
# tests/test_services.py and tests/test_prometheus_integration.py. The package enables a
# systemd unit; in containers and CI nothing starts it, and the tests run their own server
# on a free port.
set -euo pipefail
exec bash "$(dirname "$0")/install_debian.sh" "command -v prometheus && command -v promtool" prometheus
