#!/usr/bin/env bash
# Builds the Python package xfer and installs it into .venv/ (scripts/setup.sh makes it), the
# way a user's `pip install .` does, but reusing the build tree build/python between runs.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  echo "build_python: no .venv: run ./scripts/setup.sh first" >&2
  exit 1
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation .
