#!/usr/bin/env bash
# The package as a user installs it: build the sdist and the wheel (the wheel from the sdist, as `python -m build`
# does), install the wheel with its [broker,console] extras into a fresh venv in a temporary directory outside the
# clone, and run .ci/wheel_smoke.py there with that venv's python: broker, worker, 300 documents, one label from
# the command line, a console page and one label from the console, `streamsemi tail`.
# PYTHON: an interpreter with `build` installed (default: the checkout's .venv, which has the test extra).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PY" -m build --outdir "$work/dist" . > "$work/build.log" 2>&1 || { tail -50 "$work/build.log"; exit 1; }
if grep -niE "deprecat|SetuptoolsWarning" "$work/build.log"; then
    echo "wheel smoke: the build printed packaging warnings (above)"; exit 1
fi
wheel="$(ls "$work"/dist/streamsemi-*.whl)"
ls "$work"/dist/streamsemi-*.tar.gz > /dev/null
"$PY" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "${wheel}[broker,console]" > "$work/pip.log" 2>&1 \
    || { tail -50 "$work/pip.log"; exit 1; }
cp .ci/wheel_smoke.py "$work/"
cd "$work"
env -u PYTHONPATH "$work/venv/bin/python" wheel_smoke.py
