#!/usr/bin/env bash
# Configures and builds xfer into build/ (or $1), RelWithDebInfo with Ninja. The default build
# also builds the Python package into .venv/ (scripts/build_python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}; shift || true
cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
cmake --build "$dir"
if [ "$dir" = build ] && [ $# -eq 0 ]; then
  ./scripts/build_python.sh
fi
