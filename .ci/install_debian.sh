#!/usr/bin/env bash
# Install Debian packages the tests need and pip cannot provide. Idempotent: exits 0 at once
# when CHECK (a shell command) already succeeds. Needs root (CI runs as root) or sudo.
#
#   install_debian.sh CHECK PACKAGE...
#
# Packages are installed with --no-install-recommends (no desktop extras, no exporters).
set -euo pipefail

if [ "$#" -lt 2 ]; then
    echo "usage: install_debian.sh CHECK PACKAGE..." >&2
    exit 2
fi
check="$1"
shift

if bash -c "$check" >/dev/null 2>&1; then
    echo "already installed: $*"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install_debian.sh: need root or sudo to apt-get install $*" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
if ! bash -c "$check" >/dev/null 2>&1; then
    echo "install_debian.sh: installed $* but the check still fails: $check" >&2
    exit 1
fi
echo "installed: $*"
