#!/usr/bin/env bash
# The code's checks beyond the tests: clang-format (.clang-format; also a ctest, format) and
# clang-tidy's small set of checks (.clang-tidy) over every translation unit of the library,
# the tools and the Python module, with build-tidy/'s compile commands. Exits non-zero when
# either finds something. About ten minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/tools/format.sh .
cmake -S . -B build-tidy -G Ninja -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DXFER_BUILD_TESTS=OFF >/dev/null
command -v run-clang-tidy >/dev/null || { echo "lint: run-clang-tidy not installed (scripts/setup.sh)"; exit 1; }
# (Every unit the build compiles under src/ and tools/; the regex selects them.)
run-clang-tidy -quiet -p build-tidy -j "$(nproc)" "$PWD/(src|tools)/" >build-tidy/tidy.raw 2>&1 || true
grep -v -e '^[0-9]* warnings\? generated' -e '^clang-tidy' -e '^Running clang-tidy' build-tidy/tidy.raw \
  >build-tidy/tidy.log || true
cat build-tidy/tidy.log
if grep -qE '(warning|error): ' build-tidy/tidy.log; then
  echo "lint: clang-tidy found the above (.clang-tidy)"
  exit 1
fi
echo "lint: clean"
