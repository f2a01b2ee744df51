#!/usr/bin/env bash
# device_check.sh: the GPU check of xfer, one prepared run on a lent GPU machine (an H200, 16
# cores, CMake, Ninja, g++ and the CUDA toolkit, but no GoogleTest, CLI11 or nlohmann-json, no
# UCX, and no network: nothing can be installed there).
#
# 1. Here, on the development machine (which has the Debian packages):
#
#      bench/gpu/device_check.sh --prepare
#
#    copies the header-only / source dependencies into .deps/ in the repository (git-ignored):
#    GoogleTest's sources (/usr/src/googletest), CLI11 (/usr/include/CLI) and nlohmann-json
#    (/usr/include/nlohmann), and prints the run call that carries them to the device:
#
#      run(command="bash bench/gpu/device_check.sh", carry=[".deps"], timeout_s=420)
#
# 2. On the device (repository root, $OUT set by the run tool), the same script without
#    arguments: configures build-device/ with -DXFER_WITH_UCX=OFF -DXFER_DEPS_DIR=$PWD/.deps
#    (tests/CMakeLists.txt then builds GoogleTest from .deps/googletest, tools/CMakeLists.txt
#    takes CLI11 and nlohmann-json from .deps/include), builds only what the checks need, and
#    runs, each stage bounded in time and recorded in $OUT/summary.txt whether it passed or not
#    (a failed stage does not stop the later ones):
#
#      env      nvidia-smi -L / nvidia-smi, nvcc, cmake, then xfer-info once built
#      cmake    configure                                   -> build.log
#      build    ninja -j$JOBS of the needed targets         -> build.log
#      gputests ctest -R 'Cuda|Gpu|Staging' (unit + integration GPU and buffer-pool tests)
#                                                           -> gpu_tests.log
#      table    xfer-bench table -s 64K,1M,8M -D 0.2        -> table.txt, table.json
#      runs     xfer-bench D2D/H2D/D2H WRITE/READ 16K..64M with --verify, staged over tcp,
#               --mem register, bidirectional, latency     -> runs.txt, runs.json
#      suite    the rest of ctest (GPU present: host memory gets pinned), while time remains
#                                                           -> suite.log
#
#    $OUT gets at most these 8 flat files: summary.txt build.log gpu_tests.log suite.log
#    table.txt table.json runs.txt runs.json. The whole run stays within XFER_CHECK_BUDGET_S
#    (default 360 s; the suite stage takes what the others leave; the machine's start comes on
#    top of that).
#
# Elsewhere (no $OUT): results go to build-device/out/. Knobs: XFER_CHECK_BUDGET_S, JOBS
# (default: all cores), XFER_CHECK_CMAKE_ARGS (extra configure arguments; e.g. the
# -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON ... that simulate the device machine on a development
# machine). The reference figures to read the results against: ../shared/reference/
# h200_copy_ceilings.tsv (cudaMemcpy ceilings on this GPU) and hixl_a3_bandwidth.tsv.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
self="$here/$(basename "${BASH_SOURCE[0]}")"

# ---------------------------------------------------------------------------------- --prepare
if [ "${1:-}" = "--prepare" ]; then
  cd "$root" || exit 1
  missing=()
  [ -f /usr/src/googletest/CMakeLists.txt ] || missing+=("/usr/src/googletest (apt-get install googletest)")
  [ -f /usr/include/CLI/CLI.hpp ] || missing+=("/usr/include/CLI (apt-get install libcli11-dev)")
  [ -f /usr/include/nlohmann/json.hpp ] || missing+=("/usr/include/nlohmann (apt-get install nlohmann-json3-dev)")
  if [ "${#missing[@]}" -gt 0 ]; then
    printf 'device_check.sh --prepare: missing here: %s\n' "${missing[@]}" >&2
    exit 1
  fi
  rm -rf .deps
  mkdir -p .deps/include || exit 1
  cp -a /usr/src/googletest .deps/googletest || exit 1
  rm -rf .deps/googletest/googletest/docs .deps/googletest/googletest/samples \
         .deps/googletest/googletest/test .deps/googletest/googlemock/test \
         .deps/googletest/googlemock/docs
  cp -a /usr/include/CLI .deps/include/CLI || exit 1
  cp -a /usr/include/nlohmann .deps/include/nlohmann || exit 1
  if ! git check-ignore -q .deps/ 2>/dev/null; then
    echo "device_check.sh --prepare: warning: .deps/ is not git-ignored (add /.deps/ to .gitignore)" >&2
  fi
  echo "prepared .deps/ ($(du -sh .deps | cut -f1)): googletest sources, CLI11 and nlohmann-json headers"
  echo "now run, from this session (device time counts from the machine's start):"
  echo
  echo '  run(command="bash bench/gpu/device_check.sh", carry=[".deps"], timeout_s=420)'
  echo
  echo "results: summary.txt (stages, environment, headline rows), build.log, gpu_tests.log,"
  echo "suite.log, table.txt/.json, runs.txt/.json under the run's files_at folder"
  exit 0
fi

# ---------------------------------------------------------------------------------- --runs
# The xfer-bench runs of the 'runs' stage (called by the main script under its time bound).
if [ "${1:-}" = "--runs" ]; then
  xb=$2 out=$3
  tmp=$(mktemp)
  : >"$out/runs.json"
  fails=0
  one() {
    echo "=== xfer-bench $*"
    "$xb" "$@" --json "$tmp"
    local rc=$?
    echo "=== exit $rc"
    echo
    if [ -s "$tmp" ]; then cat "$tmp" >>"$out/runs.json"; fi
    : >"$tmp"
    [ "$rc" = 0 ] || fails=$((fails + 1))
  }
  D=(--local-mem cuda:0 --remote-mem cuda:0)
  # The cuda path (one host: CUDA IPC + copy engines), every direction, data checked.
  for t in write_bw read_bw; do
    one "$t" -s 16K:64M -D 0.1 --verify "${D[@]}"
    one "$t" -s 16K:64M -D 0.1 --verify --remote-mem cuda:0
    one "$t" -s 16K:64M -D 0.1 --verify --local-mem cuda:0
  done
  # Forced tcp: GPU memory staged through the buffer pools (ours, and the target's tcp threads).
  one write_bw -s 64K:8M -D 0.1 --verify --transport tcp "${D[@]}"
  one read_bw -s 64K:8M -D 0.1 --verify --transport tcp "${D[@]}"
  # cudaMalloc + RegisterMem(kCuda) instead of AllocMem; both directions at once; latency.
  one write_bw -s 1M,8M -D 0.2 --verify --mem register "${D[@]}"
  one write_bw -s 1M,8M -D 0.2 --verify -b "${D[@]}"
  one write_lat -s 8,64K -n 2000 "${D[@]}"
  one read_lat -s 8,64K -n 2000 "${D[@]}"
  # Host memory through the pool, with a GPU present (pinned staging buffers).
  one write_bw -s 1M,8M -D 0.2 --verify --buffer-pool --transport tcp
  rm -f "$tmp"
  exit "$fails"
fi

# ---------------------------------------------------------------------------------- the check
cd "$root" || exit 1
OUT=${OUT:-$root/build-device/out}
BUDGET=${XFER_CHECK_BUDGET_S:-360}
JOBS=${JOBS:-$(nproc)}
BUILD=$root/build-device
DEPS=$root/.deps
T0=$(date +%s)
mkdir -p "$OUT" "$BUILD"
SUM=$OUT/summary.txt
: >"$SUM"

# Logs are kept to ~1 MiB each (head and tail) so that they come back.
cap() {
  local f=$1 n
  [ -f "$f" ] || return 0
  n=$(stat -c %s "$f")
  if [ "$n" -gt 1048576 ]; then
    { head -c 262144 "$f"; printf '\n[... %s bytes cut ...]\n' "$((n - 1048576))"; tail -c 786432 "$f"; } >"$f.cap"
    mv "$f.cap" "$f"
  fi
}

# stage NAME MAX_SECONDS LOG COMMAND...: runs COMMAND under `timeout` (at most MAX_SECONDS, and
# never past the budget), appends its output to LOG, records the outcome in summary.txt.
# Returns the command's status; a stage with no time left is recorded as skipped.
stage() {
  local name=$1 max=$2 log=$3
  shift 3
  local left t rc t1
  left=$((BUDGET - ($(date +%s) - T0)))
  if [ "$left" -lt 15 ]; then
    printf 'stage %-9s SKIPPED (budget of %s s spent)\n' "$name" "$BUDGET" >>"$SUM"
    return 125
  fi
  t=$((max < left - 5 ? max : left - 5))
  echo "=== stage $name (limit ${t}s): $*" >>"$log"
  t1=$(date +%s)
  timeout -k 10 "$t" "$@" >>"$log" 2>&1
  rc=$?
  local verdict=ok
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then verdict="TIMEOUT (limit ${t}s)"
  elif [ "$rc" != 0 ]; then verdict="FAILED"
  fi
  printf 'stage %-9s rc=%-3s %4ss  %-20s %s\n' "$name" "$rc" "$(($(date +%s) - t1))" "$verdict" "$(basename "$log")" >>"$SUM"
  cap "$log"
  return "$rc"
}

{
  echo "# xfer device check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -n), $(nproc) cores, budget ${BUDGET} s"
  echo "# commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') + working tree ($(git status --porcelain 2>/dev/null | wc -l) changed paths)"
  echo "== environment"
  if command -v nvidia-smi >/dev/null; then
    { timeout 30 nvidia-smi -L; timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv; } 2>&1 | head -20
  else
    echo "nvidia-smi: not found"
  fi
  { command -v nvcc >/dev/null && nvcc --version | tail -2; } 2>&1 || echo "nvcc: not on PATH"
  cmake --version 2>&1 | head -1
  echo "deps: $( [ -d "$DEPS/googletest" ] && echo "googletest carried" || echo "NO .deps/googletest (run --prepare and carry .deps)"), $( [ -f "$DEPS/include/CLI/CLI.hpp" ] && echo "CLI11 carried" || echo "no CLI11 in .deps")"
  echo "== stages"
} >>"$SUM" 2>&1

# shellcheck disable=SC2086  # XFER_CHECK_CMAKE_ARGS is a word list on purpose
stage cmake 120 "$OUT/build.log" cmake -S "$root" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DXFER_WITH_UCX=OFF -DXFER_DEPS_DIR="$DEPS" ${XFER_CHECK_CMAKE_ARGS:-}
grep -E "xfer: (cuda|ucx) transport|GoogleTest from|xfer-bench is not built" "$OUT/build.log" | sed 's/^/  /' >>"$SUM"

stage build 270 "$OUT/build.log" ninja -C "$BUILD" -j "$JOBS" xfer-bench xfer-info xfer_test_peer \
  xfer_integration_tests xfer_unit_tests xfer_fault_tests
grep -E "error|FAILED" "$OUT/build.log" | head -5 | sed 's/^/  /' >>"$SUM"

if [ -x "$BUILD/tools/xfer-info" ]; then
  # The transports section: each transport, and for cuda the runtime, driver and each device.
  { echo "  xfer-info:"; timeout 30 "$BUILD/tools/xfer-info" --no-engine 2>&1 |
      awk '/^defaults/{exit} /^transports:/{t=1; next} t' | sed 's/^/  /'; } >>"$SUM"
fi

# The GPU tests: unit (CudaApi, CudaGpu), integration (IntegrationCuda*), the buffer pool
# (IntegrationStaging*). Each skips with "no GPU: ..." where no GPU is usable: counted below.
stage gputests 180 "$OUT/gpu_tests.log" bash -c "cd '$BUILD' && ctest -R 'Cuda|Gpu|Staging' --timeout 120 --output-on-failure -j 4"
{
  grep -E "tests passed|tests failed|Total Test time" "$OUT/gpu_tests.log" | tail -3 | sed 's/^/  /'
  echo "  skipped (no GPU here, see xfer-info above): $(grep -c '(Skipped)$' "$OUT/gpu_tests.log")"
  grep -E "\(Failed\)|\(Timeout\)|\*\*\*Failed|\*\*\*Timeout" "$OUT/gpu_tests.log" | head -20 | sed 's/^/  /'
} >>"$SUM" 2>/dev/null

XB=$BUILD/tools/xfer-bench
if [ -x "$XB" ]; then
  stage table 150 "$OUT/table.txt" "$XB" table -s 64K,1M,8M -D 0.2 --span 64M --json "$OUT/table.json"
  grep -E "^# (gpu|measured)|^# path" "$OUT/table.txt" | sed 's/^/  /' >>"$SUM"
  stage runs 150 "$OUT/runs.txt" bash "$self" --runs "$XB" "$OUT"
  # Headline rows: every run's 8 MiB (bandwidth) and 8 B (latency) row, after its command.
  awk '/^=== xfer-bench/ {cmd = substr($0, 5)} /^(8388608|8) +[0-9]/ {print "  " cmd; print "    " $0}
       /^# path/ {print "    " $0} /^# verify|FAILED/ {print "  VERIFY: " $0}' "$OUT/runs.txt" >>"$SUM"
else
  printf 'stage %-9s SKIPPED (no xfer-bench built)\n' table runs >>"$SUM"
fi

# Everything else, while the budget lasts: with a GPU present, registered host memory is pinned
# (cudaHostRegister), which the host-only tests then exercise too.
stage suite 240 "$OUT/suite.log" bash -c "cd '$BUILD' && ctest -E 'Cuda|Gpu|Staging|tools_netns' --timeout 60 -j 8"
{
  grep -E "tests passed|tests failed" "$OUT/suite.log" | tail -1 | sed 's/^/  /'
  grep -E "\(Failed\)|\(Timeout\)" "$OUT/suite.log" | head -20 | sed 's/^/  /'
  echo "== done in $(($(date +%s) - T0)) s; files: $(find "$OUT" -maxdepth 1 -type f -printf '%f ')"
} >>"$SUM"
cat "$SUM"
# The stages' outcomes are in summary.txt; the exit status says whether any failed.
if grep -qE "FAILED|TIMEOUT|SKIPPED" "$SUM"; then exit 1; fi
exit 0
