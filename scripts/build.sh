#!/usr/bin/env bash
# Configures and builds xfer into build/ (or $1), RelWithDebInfo with Ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}; shift || true
cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
cmake --build "$dir"
