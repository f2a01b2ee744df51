#!/usr/bin/env bash
# Usage: scripts/build.sh [--tests] [DIR [CMAKE_ARGS...]]
# Configures and builds xfer into DIR (build/), RelWithDebInfo with Ninja: the library, the
# tools and the examples, and with --tests the test suite too (it needs what
# `scripts/setup.sh --test` installs). The default build (build/, no CMake arguments) then
# installs the Python package into .venv/, linking the library it just built
# (scripts/build_python.sh): the C++ code compiles once.
set -euo pipefail
cd "$(dirname "$0")/.."
tests=()  # (without --tests: as DIR was configured before; off in a new one)
if [ "${1:-}" = --tests ]; then tests=(-DXFER_BUILD_TESTS=ON); shift; fi
dir=${1:-build}; shift || true
cmake -S . -B "$dir" -G Ninja "${tests[@]}" "$@" >/dev/null
cmake --build "$dir"
if [ "$dir" = build ] && [ $# -eq 0 ]; then
  ./scripts/build_python.sh build
fi
