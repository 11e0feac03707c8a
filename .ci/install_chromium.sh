#!/usr/bin/env bash
# Install Debian's chromium for the console's browser tests (tests/test_console_browser.py: Playwright
# drives /usr/bin/chromium; no browser download); fonts-liberation so that the screenshots the
# tests save show text.
set -euo pipefail
exec bash "$(dirname "$0")/install_debian.sh" "test -x /usr/bin/chromium" chromium fonts-liberation
