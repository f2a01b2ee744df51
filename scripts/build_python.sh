#!/usr/bin/env bash
# Usage: scripts/build_python.sh [BUILD_DIR]
# Builds the Python package xfer and installs it into .venv/ (scripts/setup.sh makes it), the
# way a user's `pip install .` does, reusing the build tree build/python between runs. With
# BUILD_DIR (a build of this tree, e.g. build/), the extension links that build's libxfer.so
# and the package carries a copy of it; without, pip compiles the library as well.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  echo "build_python: no .venv: run ./scripts/setup.sh first" >&2
  exit 1
fi
if [ $# -gt 0 ]; then
  [ -f "$1/xferConfig.cmake" ] || { echo "build_python: $1 is not a build of xfer (no xferConfig.cmake)" >&2; exit 1; }
  export SKBUILD_CMAKE_DEFINE="XFER_PREBUILT=$(cd "$1" && pwd)"
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation .
