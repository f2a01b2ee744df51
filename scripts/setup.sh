#!/usr/bin/env bash
# Installs every Debian package that xfer's build, tests and benchmarks need.
# Safe to run twice: apt-get skips what is already installed.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-dev          # libFuzzer target for the wire decoder
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev
  iproute2 procps                 # network namespaces for two-host tests; ps/kill for fault tests
  ucx-utils                       # ucx_perftest: a baseline in bench/compare.sh
  libucx-dev                      # the ucx transport (UCP headers and libraries; found by pkg-config)
  jq                              # tests/tools: checks xfer-bench --json
)
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
