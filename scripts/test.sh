#!/usr/bin/env bash
# The whole test suite: installs what the tests need (scripts/setup.sh --test), a normal build
# (C++ with its tests, and the Python package) and its tests (the install and its consumer
# projects among them), the Python tests, the self-contained wheel in a fresh virtual
# environment, the ucx tests against UCX 1.22, the C++ suite under ASan+UBSan, and short
# libFuzzer runs (the wire decoder; a live engine driven through its ports). Exits non-zero
# when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
start=$SECONDS

echo "== setup for the tests =="
./scripts/setup.sh --test
echo "== build (RelWithDebInfo) =="
./scripts/build.sh --tests
echo "== tests =="
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 300

echo "== Python tests =="
.venv/bin/python -m pytest -q python/tests

echo "== the wheel (scripts/wheel.sh), installed in a fresh virtual environment =="
./scripts/wheel.sh build/dist
tests/wheel/wheel_test.sh build/dist/xfer-*.whl

# The ucx backend against UCX 1.22 with CUDA (the libucx-cu13 wheel that scripts/setup.sh --test
# puts in .venv), as well as against Debian's 1.13 above: the same binaries (UCX is loaded at
# run time), its unit, conformance and integration tests.
echo "== ucx tests against UCX 1.22 (libucx-cu13) =="
ucx_lib=$(.venv/bin/python -c 'import libucx, os; print(os.path.join(os.path.dirname(libucx.__file__), "lib", "libucp.so.0"))')
grep -q "UCX 1\.22" <<<"$(XFER_UCX_LIB="$ucx_lib" ./build/tools/xfer-info --no-engine)" ||
  { echo "test: XFER_UCX_LIB=$ucx_lib did not load UCX 1.22" >&2; exit 1; }
XFER_UCX_LIB="$ucx_lib" ctest --test-dir build --output-on-failure -j "$jobs" --timeout 300 -R '[Uu]cx'

# The GPU check builds the ucx backend against that UCX's headers (XFER_UCX_ROOT): it compiles.
echo "== the ucx backend against UCX 1.22's headers (XFER_UCX_ROOT) =="
ucx_root=$(dirname "$(dirname "$ucx_lib")")
cmake -S . -B build-ucx -G Ninja -DXFER_UCX_ROOT="$ucx_root" -DXFER_BUILD_TOOLS=OFF >/dev/null
cmake --build build-ucx --target $(for f in ucx_library ucx_transport ucx_link ucx_backend; do
  echo "CMakeFiles/xfer.dir/src/transport/ucx/$f.cc.o"; done)

echo "== build (ASan+UBSan) =="
./scripts/build.sh --tests build-asan -DXFER_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
echo "== tests under ASan+UBSan =="
# intercept_tls_get_addr=0: GCC 12's sanitizer runtime takes a dynamic TLS block (UCX's, now
# that it is dlopen'd) whose address is 16 past a page boundary for a pre-2.25 glibc header,
# reads a range from the words before it, and LeakSanitizer's tracer then faults scanning it at
# exit ("Tracer caught signal 11") in whichever test the heap's layout lands it. Without the
# interceptor those blocks are plain heap blocks, reachable through glibc's own pointers.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:intercept_tls_get_addr=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 600

echo "== fuzz the wire decoder (30 s), then a live engine's sessions (30 s) =="
CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DXFER_FUZZ=ON -DXFER_BUILD_TESTS=OFF \
  -DXFER_BUILD_TOOLS=OFF >/dev/null
cmake --build build-fuzz --target wire_fuzzer session_fuzzer
mkdir -p build-fuzz/corpus build-fuzz/session_corpus
./build-fuzz/tests/fuzz/wire_fuzzer -max_total_time=30 -seed=1 build-fuzz/corpus tests/fuzz/corpus 2>&1 | tail -n 3
./build-fuzz/tests/fuzz/session_fuzzer -max_total_time=30 -seed=1 -timeout=20 \
  build-fuzz/session_corpus tests/fuzz/session_corpus 2>&1 | tail -n 3

echo "== all test stages passed in $((SECONDS - start)) s =="
