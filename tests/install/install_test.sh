#!/usr/bin/env bash
# Usage: install_test.sh BUILD_DIR
# `cmake --install` of a build into a fresh prefix, then two programs of a user's built against
# that prefix alone: one with find_package(xfer), one with pkg-config. Each runs a two-process
# transfer (consumer/main.cc). Also checks the installed layout: libxfer.so's SONAME, that it
# needs no UCX at load time, the headers, the tools, one version everywhere. Exits 77 (skip)
# after the find_package consumer where pkg-config is missing (the GPU machine).
set -euo pipefail
build=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
version=$(sed -n 's/^project(xfer VERSION \([0-9.]*\).*/\1/p' "$here/../../CMakeLists.txt")
lib=$(find "$prefix" -name 'libxfer.so' | head -n 1)
[ -n "$lib" ] || fail "no libxfer.so under $prefix"
libdir=$(dirname "$lib")
[ -f "$libdir/cmake/xfer/xferConfig.cmake" ] || fail "no lib/cmake/xfer/xferConfig.cmake"
want=$(sed -n 's/^set(xfer_SONAME "\(.*\)")$/\1/p' "$libdir/cmake/xfer/xferConfig.cmake")
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ -n "$soname" ] && [ "$soname" = "$want" ] || fail "SONAME is '$soname'; xferConfig.cmake says '$want'"
[ -e "$libdir/$soname" ] || fail "$soname is not installed"
if readelf -d "$libdir/libxfer.so" | grep -E 'NEEDED.*lib(ucp|uct|ucs|ucm)'; then
  fail "libxfer.so needs UCX at load time (it must load it at run time)"
fi
for h in engine.h options.h status.h types.h metrics.h version.h; do
  [ -f "$prefix/include/xfer/$h" ] || fail "include/xfer/$h is not installed"
done
[ -f "$libdir/pkgconfig/xfer.pc" ] || fail "no lib/pkgconfig/xfer.pc"
"$prefix/bin/xfer-info" --version | grep -qx "xfer-info $version" || fail "xfer-info does not say $version"
[ -x "$prefix/bin/xfer-bench" ] || fail "xfer-bench is not installed"

echo "== find_package(xfer) =="
cmake -S "$here/consumer" -B "$work/cmake-consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake-consumer" >/dev/null
timeout 60 "$work/cmake-consumer/consumer" || fail "the find_package consumer's transfer failed"

echo "== pkg-config xfer =="
command -v pkg-config >/dev/null || { echo "SKIP: the pkg-config consumer: pkg-config is not installed"; exit 77; }
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[ "$(pkg-config --modversion xfer)" = "$version" ] || fail "pkg-config says $(pkg-config --modversion xfer)"
# shellcheck disable=SC2046  # (pkg-config's flags are words)
g++ -o "$work/pc-consumer" "$here/consumer/main.cc" $(pkg-config --cflags --libs xfer) -Wl,-rpath,"$libdir"
timeout 60 "$work/pc-consumer" || fail "the pkg-config consumer's transfer failed"
# The consumer needs libxfer alone of xfer's libraries: the rest are libxfer's own.
needed=$(readelf -d "$work/pc-consumer" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
case "$needed" in *"$soname"*) ;; *) fail "the consumer does not need libxfer: $needed" ;; esac
if echo "$needed" | grep -qE 'sodium|curl|xxhash|ucp'; then fail "xfer's dependencies leaked to its user: $needed"; fi
echo "install: prefix, find_package and pkg-config consumers all pass (xfer $version)"
