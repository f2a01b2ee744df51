#!/usr/bin/env bash
# device_check.sh: the GPU check of xfer, one prepared run on a lent GPU machine (an H100 or
# H200, 16 cores, CMake, Ninja, g++ and the CUDA toolkit, but no GoogleTest, CLI11 or
# nlohmann-json, no UCX, and no network: nothing can be installed there).
#
# 1. Here, on the development machine (which has the Debian packages and .venv):
#
#      bench/gpu/device_check.sh --prepare
#
#    copies the header-only / source dependencies into .deps/ in the repository (git-ignored):
#    GoogleTest's sources (/usr/src/googletest), CLI11 (/usr/include/CLI) and nlohmann-json
#    (/usr/include/nlohmann), and UCX 1.22 with CUDA from the libucx-cu13 wheel in .venv
#    (.deps/ucx: its libraries stripped of debug info, headers, CMake package and ucx_perftest;
#    about 13 MiB), and prints what to run on the GPU machine, with .deps/ copied along with
#    the working tree (the run tool's carry: ".deps"):
#
#      bash bench/gpu/device_check.sh      (from the repository root; about 8 minutes at most)
#
# 2. On the device (repository root, $OUT set by the run tool), the same script without
#    arguments: configures build-device/ against the carried UCX (-DXFER_UCX_ROOT; without it
#    -DXFER_WITH_UCX=OFF) with -DXFER_DEPS_DIR=$PWD/.deps (tests/CMakeLists.txt then builds
#    GoogleTest from .deps/googletest, tools/CMakeLists.txt takes CLI11 and nlohmann-json from
#    .deps/include), builds only what the checks need, and runs the stages below, most valuable
#    first, each recorded in $OUT/summary.txt (a failed stage does not stop the later ones):
#
#      env      nvidia-smi -L / nvidia-smi, nvcc, cmake, then xfer-info once built
#      cmake    configure                                   -> build.log
#      build    ninja -j$JOBS of what gputests, ucx, runs and table need   -> build.log
#      gputests ctest -R 'Cuda|Gpu|Staging' (unit + integration GPU and buffer-pool tests)
#                                                           -> gpu_tests.log
#      ucx      GPU memory over UCX between two host ids (serve + client, --transport ucx):
#               D2D, H2D, D2H, WRITE and READ, 1 and 8 MiB, --verify, under
#               UCX_TLS=tcp,cuda_copy, then D2D through the buffer pool over ucx, then the
#               cells again under tcp,cuda_copy,cuda_ipc; each cell beside ucx_perftest -e
#               with the same memory types and UCX_TLS      -> ucx.txt, ucx.json
#      runs     xfer-bench, every run with --verify where it moves data: first the buffer pool
#               both ways at once between two host ids (serve + client; host memory, then
#               cuda:0 both sides), then D2D/H2D/D2H WRITE/READ 16K..64M (cuda path), staged
#               over tcp (each beside host memory direct over tcp), D2D with checksums
#               (cuda path, staged over tcp), --mem register, bidirectional, latency
#                                                           -> runs.txt, runs.json
#      table    xfer-bench table -s 64K,1M,8M -D 0.2        -> table.txt, table.json
#      buildrest ninja of everything else (fault tests, examples: only the suite runs them) -> build.log
#      suite    the rest of ctest (GPU present: host memory gets pinned)   -> suite.log
#
#    Time: the whole run stays within XFER_CHECK_BUDGET_S (default 450 s; the machine's start
#    comes on top). Each stage gets at most its share of the budget (cmake 5%, build 33%,
#    gputests 14%, ucx 26%, runs 22%: together 100%; table 14%, buildrest and suite whatever
#    the others left), and never more than the budget left less 10 s (the kill grace of
#    `timeout -k 5` and the summary).
#    A stage cut by its limit is recorded "partial (budget)" or "partial (share)", one with under
#    15 s left "skipped (budget)": neither counts as a failure. What does count: a stage whose
#    command failed, a test that failed or hit its own ctest TIMEOUT, an xfer-bench run that
#    failed or did not end within its own limit (60 s; a run cut sooner by the stage's end is
#    "cut (budget)"), a ucx_perftest run that failed. Without a GPU the GPU tests skip
#    themselves, the cuda:N runs are refused by xfer-bench and ucx_perftest refuses cuda
#    memory: all are recorded as skipped (no GPU), not as failures.
#
#    Exit status: 0 nothing failed and the core (build, gputests) completed; 1 a stage failed;
#    3 nothing failed, but the budget cut the build or the GPU tests (nothing or little was
#    checked). A cut ucx, runs, table or suite leaves it 0.
#
#    $OUT gets at most these 10 flat files: summary.txt build.log gpu_tests.log suite.log
#    ucx.txt ucx.json table.txt table.json runs.txt runs.json.
#
# Elsewhere (no $OUT): results go to build-device/out/. Knobs: XFER_CHECK_BUDGET_S, JOBS
# (default: all cores), XFER_CHECK_CMAKE_ARGS (extra configure arguments), XFER_CHECK_RUN_MAX_S
# (the limit of one xfer-bench run, default 60). To simulate the device machine on a
# development machine (no system GoogleTest / CLI11 / nlohmann-json, so the .deps copies are
# used; no GPU there: the GPU tests and runs are skipped, and the exit status is still 0):
#
#   bench/gpu/device_check.sh --prepare
#   XFER_CHECK_BUDGET_S=1500 XFER_CHECK_CMAKE_ARGS="-DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON
#     -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON"
#     bash bench/gpu/device_check.sh
#
# (on 2 cores the build alone takes several minutes: hence the larger budget). The reference
# figures to read the results against: bench/reference/h200_copy_ceilings.tsv (cudaMemcpy
# ceilings on an H200) and hixl_a3_bandwidth.tsv.
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
  # UCX 1.22 with CUDA, from the libucx-cu13 wheel in .venv (scripts/setup.sh --test): its shared
  # libraries (debug info stripped), modules, headers, CMake package, ucx_perftest and ucx_info,
  # and the wheel's libcudart, in the wheel's layout (the build's XFER_UCX_ROOT: its lib/libucp.so.0 is loaded first): about 13 MiB.
  ucx_src=$(.venv/bin/python -c 'import libucx, os; print(os.path.dirname(libucx.__file__))' 2>/dev/null)
  if [ -n "$ucx_src" ] && [ -f "$ucx_src/lib/libucp.so.0" ]; then
    u=.deps/ucx/libucx
    mkdir -p "$u/lib/ucx" "$u/bin" || exit 1
    cp -a "$ucx_src/include" "$ucx_src/etc" "$u/" && cp -a "$ucx_src/lib/cmake" "$u/lib/" &&
      cp -a "$ucx_src/../libucx_cu13.libs" .deps/ucx/ && cp "$ucx_src/bin/ucx_perftest" "$ucx_src/bin/ucx_info" "$u/bin/" || exit 1
    for f in "$ucx_src"/lib/lib*.so.0 "$ucx_src"/lib/ucx/lib*.so.0; do
      rel=${f#"$ucx_src"/lib/}
      cp "$f" "$u/lib/$rel" && ln -sf "$(basename "$rel")" "$u/lib/${rel%.0}" || exit 1
    done
    strip --strip-debug "$u"/lib/*.so.0 "$u"/lib/ucx/*.so.0 "$u"/bin/* || exit 1
    echo "carried UCX $(cat "$ucx_src/UCX_WHEEL_VERSION.txt" 2>/dev/null || echo '?') with CUDA from $ucx_src into .deps/ucx"
  else
    echo "device_check.sh --prepare: warning: no libucx-cu13 in .venv (scripts/setup.sh --test): the ucx stage will be skipped" >&2
  fi
  if ! git check-ignore -q .deps/ 2>/dev/null; then
    echo "device_check.sh --prepare: warning: .deps/ is not git-ignored (add /.deps/ to .gitignore)" >&2
  fi
  echo "prepared .deps/ ($(du -sh .deps | cut -f1)): googletest sources, CLI11 and nlohmann-json headers, UCX"
  echo "now, on the GPU machine, from the repository root with .deps/ copied along:"
  echo
  echo '  bash bench/gpu/device_check.sh      (about 8 minutes at most; results under $OUT, or build-device/out/)'
  echo
  echo "results: summary.txt (stages, environment, headline rows), build.log, gpu_tests.log,"
  echo 'suite.log, table.txt/.json, runs.txt/.json under $OUT (without it: build-device/out/)'
  exit 0
fi

# ---------------------------------------------------------------------------------- --runs
# The xfer-bench runs of the 'runs' stage, called by the main script under its time bound, with
# STAGE_DEADLINE (epoch seconds) the end of that bound. Most valuable first. Each run gets at
# most RUN_MAX seconds and never past the deadline; its outcome follows its output in runs.txt:
#   === exit 0 | === FAILED: ... | === skipped (no GPU) | === cut (budget) ...
# Exit status: 1 if a run failed, else 0 (skipped and cut runs are not failures).
if [ "${1:-}" = "--runs" ]; then
  xb=$2 out=$3 set=${4:-main} ucx_prefix=${5:-}
  perf=$ucx_prefix/bin/ucx_perftest
  json=$out/runs.json
  [ "$set" = ucx ] && json=$out/ucx.json
  deadline=${STAGE_DEADLINE:-$(($(date +%s) + 600))}
  RUN_MAX=${XFER_CHECK_RUN_MAX_S:-60}
  tmp=$(mktemp) log1=$(mktemp)
  : >"$json"
  ok=0 fails=0 skipped=0 cut=0 last=0
  one() {
    local left lim rc
    left=$((deadline - $(date +%s) - 2))
    if [ "$left" -lt 5 ]; then
      echo "=== skipped (budget): xfer-bench $*"
      last=-1
      echo
      cut=$((cut + 1))
      return
    fi
    lim=$((left < RUN_MAX ? left : RUN_MAX))
    echo "=== xfer-bench $*"
    timeout -k 5 "$lim" "$xb" "$@" --json "$tmp" >"$log1" 2>&1
    rc=$?
    cat "$log1"
    last=$rc
    if [ "$rc" = 0 ]; then
      echo "=== exit 0"
      ok=$((ok + 1))
    elif { [ "$rc" = 2 ] || [ "$rc" = 1 ]; } && grep -qE "no GPU: |not built with CUDA" "$log1"; then
      # (exit 2: this side refused cuda:N; exit 1: the serve side did)
      echo "=== skipped (no GPU): xfer-bench refused cuda:N (exit $rc)"
      skipped=$((skipped + 1))
    elif { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && [ "$lim" -lt "$RUN_MAX" ]; then
      echo "=== cut (budget): the stage's time ran out after ${lim}s"
      cut=$((cut + 1))
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      echo "=== FAILED: no end within ${lim}s (hung?), killed (exit $rc)"
      fails=$((fails + 1))
    else
      echo "=== FAILED: exit $rc"
      fails=$((fails + 1))
    fi
    echo
    if [ -s "$tmp" ]; then cat "$tmp" >>"$json"; fi
    : >"$tmp"
  }
  # pair ARGS...: one xfer-bench run between two host ids, as two hosts would be: an `xfer-bench
  # serve` with host id xfer-check-target on 127.0.0.1, and the client, host id
  # xfer-check-client, with ARGS (which apply to both sides). Same-host transports (shm, cma,
  # cuda's IPC) are not used between them.
  pair() {
    local srvlog spid port
    srvlog=$(mktemp)
    "$xb" serve --listen 127.0.0.1:0 --once --host-id xfer-check-target >"$srvlog" 2>&1 &
    spid=$!
    port=
    for _ in $(seq 100); do
      port=$(sed -n 's/.*(port \([0-9][0-9]*\)).*/\1/p' "$srvlog" | head -1)
      [ -n "$port" ] && break
      kill -0 "$spid" 2>/dev/null || break
      sleep 0.1
    done
    if [ -z "$port" ]; then
      echo "=== xfer-bench serve --listen 127.0.0.1:0 --once --host-id xfer-check-target"
      cat "$srvlog"
      echo "=== FAILED: the serve side did not start"
      echo
      fails=$((fails + 1))
    else
      last=-1
      one "$@" --host-id xfer-check-client "127.0.0.1:$port"
    fi
    # --once: the server ends after its client (given a few seconds); a refused, failed or killed
    # client leaves it waiting, or hung with it.
    if [ "$last" = 0 ]; then
      for _ in $(seq 50); do
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.1
      done
    fi
    if kill -0 "$spid" 2>/dev/null; then
      kill "$spid" 2>/dev/null
      sleep 1
      kill -9 "$spid" 2>/dev/null
    fi
    wait "$spid" 2>/dev/null
    echo "--- its serve side (host id xfer-check-target):"
    sed 's/^/    /' "$srvlog"
    echo
    rm -f "$srvlog"
  }
  # The buffer pool both ways at once: every transfer staged (--buffer-pool), over tcp. Both
  # engines' outgoing batches and both tcp targets' staging draw on the pools at the same time:
  # a deadlock there ends in "FAILED: no end within 60s".
  pool_pair() { pair write_bw -s 1M,8M -D 0.2 --verify -b --transport tcp --buffer-pool "$@"; }
  main_runs() {
    pool_pair
    pool_pair "${D[@]}"
    # The cuda path (one host: CUDA IPC + copy engines), every direction, data checked.
    for t in write_bw read_bw; do
      one "$t" -s 16K:64M -D 0.1 --verify "${D[@]}"
      one "$t" -s 16K:64M -D 0.1 --verify --remote-mem cuda:0
      one "$t" -s 16K:64M -D 0.1 --verify --local-mem cuda:0
    done
    # Forced tcp: GPU memory staged through the buffer pools (ours, and the target's tcp threads),
    # each beside host memory direct over tcp at 1 and 8 MiB in the same run (issue 41's goal:
    # staged D2D >= 0.9x direct host-to-host tcp from 1 MiB).
    one write_bw -s 1M,8M -D 0.1 --verify --transport tcp
    one write_bw -s 64K:8M -D 0.1 --verify --transport tcp "${D[@]}"
    one read_bw -s 1M,8M -D 0.1 --verify --transport tcp
    one read_bw -s 64K:8M -D 0.1 --verify --transport tcp "${D[@]}"
    # End-to-end checksums of GPU memory (summed through host buffers, issue 43): D2D over the
    # cuda path and staged over tcp, beside the same runs above without them.
    one write_bw -s 1M,8M -D 0.1 --verify --set checksum=true "${D[@]}"
    one read_bw -s 1M,8M -D 0.1 --verify --set checksum=true "${D[@]}"
    one write_bw -s 1M,8M -D 0.1 --verify --transport tcp --set checksum=true "${D[@]}"
    # cudaMalloc + RegisterMem(kCuda) instead of AllocMem; both directions at once; latency.
    one write_bw -s 1M,8M -D 0.2 --verify --mem register "${D[@]}"
    one write_bw -s 1M,8M -D 0.2 --verify -b "${D[@]}"
    one write_lat -s 8,64K -n 2000 "${D[@]}"
    one read_lat -s 8,64K -n 2000 "${D[@]}"
    # Host memory through the pool, one way, with a GPU present (pinned staging buffers).
    one write_bw -s 1M,8M -D 0.2 --verify --buffer-pool --transport tcp
  }
  # ucx_perftest TEST MEMS: UCX's own benchmark between two processes of this machine, with
  # the UCX_TLS of the xfer-bench run before it, its memory types (-m local,remote) and its
  # sizes (1 MiB and 8 MiB): the baseline of the ucx cells. -e: endpoints with peer error
  # handling, as xfer's (a dead peer must fail requests, not hang them); over tcp that makes
  # UCX emulate RMA in software, which without -e it does by zero-copy (bench/RESULTS.md).
  # Its MB/s are MiB/s (2^20 B).
  perftest() {
    local t=$1 m=$2 size iters port=$((20000 + RANDOM % 20000)) srvlog spid rc
    for size in 1048576 8388608; do
      iters=$((size > 1048576 ? 100 : 400))
      echo "=== ucx_perftest -e -t $t -m $m -s $size -n $iters (UCX_TLS=$UCX_TLS)"
      if [ $(($(date +%s) + 25)) -gt "$deadline" ]; then
        echo "=== skipped (budget)"
        echo
        cut=$((cut + 1))
        continue
      fi
      if [ "${m#*cuda}" != "$m" ] && ! nvidia-smi -L >/dev/null 2>&1; then
        echo "=== skipped (no GPU): no nvidia-smi -L"
        echo
        skipped=$((skipped + 1))
        continue
      fi
      srvlog=$(mktemp)
      LD_LIBRARY_PATH=$ucx_prefix/lib timeout -k 2 20 "$perf" -p "$port" -e >"$srvlog" 2>&1 &
      spid=$!
      for _ in $(seq 40); do  # (until the server listens: /proc/net/tcp* has its port in LISTEN, 0A)
        grep -qiE ":$(printf '%04X' "$port") [0-9A-F:]+ 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null && break
        sleep 0.05
      done
      LD_LIBRARY_PATH=$ucx_prefix/lib timeout -k 2 20 "$perf" 127.0.0.1 -p "$port" -e -t "$t" -m "$m" \
        -s "$size" -n "$iters" >"$log1" 2>&1
      rc=$?
      # (The server ends with its client; after a failed client it would wait.)
      for _ in $(seq 20); do
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.1
      done
      kill "$spid" 2>/dev/null
      wait "$spid" 2>/dev/null
      grep -hE "^Final:|[Ee]rror:|nsupported" "$log1" "$srvlog" | head -5
      if [ "$rc" = 0 ]; then
        ok=$((ok + 1))
        echo "=== exit 0"
      else
        tail -5 "$log1"
        echo "=== FAILED: ucx_perftest exit $rc"
        fails=$((fails + 1))
      fi
      echo
      rm -f "$srvlog"
      port=$((port + 1))
    done
  }
  # GPU memory over UCX (UCX 1.22 with CUDA, carried in .deps/ucx) between two host ids.
  ucx_runs() {
    local cell op
    # Host memory first (UCX_TLS=tcp): the route and the baseline as they are without a GPU.
    export UCX_TLS=tcp
    pair write_bw -s 1M,8M -D 0.2 --verify --transport ucx
    perftest ucp_put_bw host,host
    # GPU memory as between hosts without GPUDirect (tcp,cuda_copy: UCX stages through host
    # memory itself), then through xfer's buffer pool over ucx, then with cuda_ipc (UCX may copy
    # GPU to GPU itself here, these two processes sharing the GPU).
    ucx_cells tcp,cuda_copy
    export UCX_TLS=tcp,cuda_copy
    pair write_bw -s 1M,8M -D 0.2 --verify --transport ucx --buffer-pool "${D[@]}"
    pair read_bw -s 1M,8M -D 0.2 --verify --transport ucx --buffer-pool "${D[@]}"
    ucx_cells tcp,cuda_copy,cuda_ipc
    unset UCX_TLS
  }
  # ucx_cells TLS: D2D, H2D, D2H, WRITE and READ, each xfer-bench cell (data checked) then
  # ucx_perftest's same cell.
  ucx_cells() {
    local cell op lm rm pm
    export UCX_TLS=$1
    for cell in "cuda:0 cuda:0 cuda,cuda" "host cuda:0 host,cuda" "cuda:0 host cuda,host"; do
      read -r lm rm pm <<<"$cell"
      for op in write read; do
        pair "${op}_bw" -s 1M,8M -D 0.2 --verify --transport ucx --local-mem "$lm" --remote-mem "$rm"
        perftest "$([ $op = write ] && echo ucp_put_bw || echo ucp_get)" "$pm"
      done
    done
  }
  D=(--local-mem cuda:0 --remote-mem cuda:0)
  if [ "$set" = ucx ]; then
    ucx_runs
  else
    main_runs
  fi
  echo "=== runs: $ok ok, $fails failed, $skipped skipped (no GPU), $cut cut or skipped (budget)"
  rm -f "$tmp" "$log1"
  [ "$fails" = 0 ] || exit 1
  exit 0
fi

# ---------------------------------------------------------------------------------- the check
cd "$root" || exit 1
OUT=${OUT:-$root/build-device/out}
BUDGET=${XFER_CHECK_BUDGET_S:-450}
JOBS=${JOBS:-$(nproc)}
BUILD=$root/build-device
DEPS=$root/.deps
T0=$(date +%s)
mkdir -p "$OUT" "$BUILD"
SUM=$OUT/summary.txt
: >"$SUM"
# The logs are appended to by their stages: none from an earlier run (outside the device's $OUT).
for f in build.log gpu_tests.log suite.log table.txt table.json runs.txt runs.json ucx.txt ucx.json; do rm -f "${OUT:?}/$f"; done

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

# Failures a stage's log shows even when the stage was cut afterwards: ctest's failed or timed
# out tests, the runs' FAILED lines.
failures_in() {
  grep -E '\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception|Exit code 0x|\(Failed\)$|\(Timeout\)$|^=== FAILED' "$1" 2>/dev/null
}

# stage NAME SHARE_PERCENT LOG COMMAND...: runs COMMAND under `timeout -k 5 LIMIT`, LIMIT being
# SHARE_PERCENT of the budget (0: no share, whatever is left) and never more than the budget
# left less 10 s; appends its output to LOG and records the outcome in summary.txt. The command
# sees STAGE_DEADLINE (epoch seconds). Sets STATUS[NAME] to ok, failed, partial or skipped.
declare -A STATUS
stage() {
  local name=$1 share=$2 log=$3
  shift 3
  local left lim why rc t1 verdict
  left=$((BUDGET - ($(date +%s) - T0) - 10))
  if [ "$left" -lt 15 ]; then
    printf 'stage %-9s skipped (budget: %s s of %s s spent)\n' "$name" "$(($(date +%s) - T0))" "$BUDGET" >>"$SUM"
    STATUS[$name]=skipped
    return 0
  fi
  lim=$left why=budget
  if [ "$share" -gt 0 ] && [ $((BUDGET * share / 100)) -lt "$lim" ]; then
    lim=$((BUDGET * share / 100)) why=share
  fi
  echo "=== stage $name (limit ${lim}s, ${why}): $*" >>"$log"
  t1=$(date +%s)
  STAGE_DEADLINE=$((t1 + lim)) timeout -k 5 "$lim" "$@" >>"$log" 2>&1
  rc=$?
  if [ "$rc" = 0 ]; then
    verdict=ok STATUS[$name]=ok
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    if failures_in "$log" >/dev/null; then
      verdict="FAILED (then cut at ${lim}s)" STATUS[$name]=failed
    else
      verdict="partial (${why}: cut at ${lim}s)" STATUS[$name]=partial
    fi
  else
    verdict=FAILED STATUS[$name]=failed
  fi
  printf 'stage %-9s rc=%-3s %4ss  %-30s %s\n' "$name" "$rc" "$(($(date +%s) - t1))" "$verdict" "$(basename "$log")" >>"$SUM"
  cap "$log"
  return 0
}

# A stage that cannot run: what it needs was not built.
not_run() {
  printf 'stage %-9s skipped (%s)\n' "$1" "$2" >>"$SUM"
  STATUS[$1]=skipped
}

{
  echo "# xfer device check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -n), $(nproc) cores, budget ${BUDGET} s"
  echo "# commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') + working tree ($(git status --porcelain 2>/dev/null | wc -l) changed paths)"
  echo "== environment"
  if command -v nvidia-smi >/dev/null; then
    { timeout -k 2 10 nvidia-smi -L; timeout -k 2 10 nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv; } 2>&1 | head -20
  else
    echo "nvidia-smi: not found"
  fi
  { command -v nvcc >/dev/null && nvcc --version | tail -2; } 2>&1 || echo "nvcc: not on PATH"
  cmake --version 2>&1 | head -1
  echo "deps: $( [ -d "$DEPS/googletest" ] && echo "googletest carried" || echo "NO .deps/googletest (run --prepare and carry .deps)"), $( [ -f "$DEPS/include/CLI/CLI.hpp" ] && echo "CLI11 carried" || echo "no CLI11 in .deps")"
  echo "== stages"
} >>"$SUM" 2>&1

# UCX 1.22 with CUDA where --prepare carried it; else no ucx backend.
UCX_PREFIX=$DEPS/ucx/libucx
if [ -f "$UCX_PREFIX/lib/cmake/ucx/ucx-config.cmake" ]; then
  ucx_args=(-DXFER_WITH_UCX=ON -DXFER_UCX_ROOT="$UCX_PREFIX")
else
  ucx_args=(-DXFER_WITH_UCX=OFF)
fi
# shellcheck disable=SC2086  # XFER_CHECK_CMAKE_ARGS is a word list on purpose
stage cmake 5 "$OUT/build.log" cmake -S "$root" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DXFER_BUILD_TESTS=ON \
  "${ucx_args[@]}" -DXFER_DEPS_DIR="$DEPS" ${XFER_CHECK_CMAKE_ARGS:-}
grep -E "xfer: (cuda|ucx) transport|GoogleTest from|xfer-bench is not built" "$OUT/build.log" | sed 's/^/  /' >>"$SUM"

if [ "${STATUS[cmake]}" = failed ] || [ ! -f "$BUILD/build.ninja" ]; then
  not_run build "not configured"
else
  # What the GPU tests and the runs need; the fault tests (suite only) come later, in the tail.
  stage build 33 "$OUT/build.log" ninja -C "$BUILD" -j "$JOBS" xfer_unit_tests xfer_integration_tests \
    xfer_test_peer xfer-info xfer-bench
  grep -E "error|FAILED" "$OUT/build.log" | head -5 | sed 's/^/  /' >>"$SUM"
fi

if [ -x "$BUILD/tools/xfer-info" ]; then
  # The transports section: each transport, and for cuda the runtime, driver and each device.
  { echo "  xfer-info:"; timeout -k 2 10 "$BUILD/tools/xfer-info" --no-engine 2>&1 |
      awk '/^defaults/{exit} /^transports:/{t=1; next} t' | sed 's/^/  /'; } >>"$SUM"
fi

# The GPU tests: unit (CudaApi, CudaGpu), integration (IntegrationCuda*), the buffer pool
# (IntegrationStaging*). Each skips with "no GPU: ..." where no GPU is usable: counted below.
if [ -x "$BUILD/tests/unit/xfer_unit_tests" ] || [ -x "$BUILD/tests/integration/xfer_integration_tests" ]; then
  stage gputests 14 "$OUT/gpu_tests.log" bash -c "cd '$BUILD' && ctest -R 'Cuda|Gpu|Staging' --timeout 60 --output-on-failure -j 4"
  {
    grep -E "tests passed|tests failed|Total Test time" "$OUT/gpu_tests.log" | tail -3 | sed 's/^/  /'
    echo "  skipped (no GPU here, see xfer-info above): $(grep -c '(Skipped)$' "$OUT/gpu_tests.log")"
    failures_in "$OUT/gpu_tests.log" | head -20 | sed 's/^/  /'
  } >>"$SUM" 2>/dev/null
else
  not_run gputests "no test binaries built"
fi

XB=$BUILD/tools/xfer-bench
# GPU memory over UCX, each cell beside ucx_perftest's (the summary: every 8 MiB row and
# perftest's 8 MiB line, with its UCX_TLS).
if [ -x "$XB" ] && grep -q "ucx transport on" "$OUT/build.log"; then
  stage ucx 26 "$OUT/ucx.txt" bash "$self" --runs "$XB" "$OUT" ucx "$UCX_PREFIX"
  awk '/^=== xfer-bench/ {cmd = substr($0, 5)} /^=== ucx_perftest/ {cmd = substr($0, 5)}
       /^(sum +)?8388608 +[0-9]/ {print "  " cmd; print "    " $0} /^# path/ {print "    " $0}
       /^Final:/ && cmd ~ /-s 8388608/ {print "  " cmd; print "    " $0}
       /^# verify/ {print "  VERIFY: " $0} /^=== skipped \(budget\): / {print "  " substr($0, 5); next}
       /^=== skipped \(budget\)$/ {print "  " cmd ": skipped (budget)"; next}
       /^=== (FAILED|skipped|cut)/ {print "  " cmd ": " substr($0, 5)} /^=== runs:/ {print "  " substr($0, 5)}' \
    "$OUT/ucx.txt" >>"$SUM"
else
  not_run ucx "no ucx backend built (bench/gpu/device_check.sh --prepare carries UCX in .deps/ucx)"
fi
if [ -x "$XB" ]; then
  stage runs 22 "$OUT/runs.txt" bash "$self" --runs "$XB" "$OUT"
  # Headline rows: every run's 8 MiB (bandwidth) and 8 B (latency) row, after its command; the
  # verdict of each run that did not simply pass.
  awk '/^=== xfer-bench/ {cmd = substr($0, 5)} /^(sum +)?(8388608|8) +[0-9]/ {print "  " cmd; print "    " $0}
       /^# path/ {print "    " $0} /^# verify/ {print "  VERIFY: " $0}
       /^=== skipped \(budget\)/ {print "  " substr($0, 5); next}
       /^=== (FAILED|skipped|cut)/ {print "  " cmd ": " substr($0, 5)} /^=== runs:/ {print "  " substr($0, 5)}' \
    "$OUT/runs.txt" >>"$SUM"
  stage table 14 "$OUT/table.txt" "$XB" table -s 64K,1M,8M -D 0.2 --span 64M --json "$OUT/table.json"
  grep -E "^# (gpu|measured)|^# path" "$OUT/table.txt" | sed 's/^/  /' >>"$SUM"
else
  not_run runs "no xfer-bench built"
  not_run table "no xfer-bench built"
fi

# Everything else, while the budget lasts: with a GPU present, registered host memory is pinned
# (cudaHostRegister), which the host-only tests then exercise too. First the build of the rest
# (the fault tests, the examples and the bench programs that the suite runs).
if [ -f "$BUILD/build.ninja" ] && [ "${STATUS[cmake]}" != failed ]; then
  stage buildrest 0 "$OUT/build.log" ninja -C "$BUILD" -j "$JOBS"
else
  not_run buildrest "not configured"
fi
if [ -x "$BUILD/tests/unit/xfer_unit_tests" ]; then
  # Test binaries the budget left unbuilt are not failures (a build that failed is one already).
  skip='Cuda|Gpu|Staging|tools_netns'
  if [ "${STATUS[build]}" != ok ] || [ "${STATUS[buildrest]}" != ok ]; then skip="$skip|_NOT_BUILT"; fi
  stage suite 0 "$OUT/suite.log" bash -c "cd '$BUILD' && ctest -E '$skip' --timeout 60 -j 8 --output-on-failure"
  {
    if [ "${STATUS[suite]}" != skipped ] && [ "${skip%_NOT_BUILT}" != "$skip" ]; then
      echo "  (tests whose binary the budget left unbuilt were left out)"
    fi
    grep -E "tests passed|tests failed" "$OUT/suite.log" | tail -1 | sed 's/^/  /'
    failures_in "$OUT/suite.log" | head -20 | sed 's/^/  /'
  } >>"$SUM" 2>/dev/null
else
  not_run suite "no test binaries built"
fi

# The stages' outcomes are in summary.txt; the exit status says whether any failed (1), or, with
# none failed, whether the budget cut the core of the check (3).
rc=0
for st in "${STATUS[@]}"; do
  if [ "$st" = failed ]; then rc=1; fi
done
if [ "$rc" = 0 ] && { [ "${STATUS[build]:-skipped}" != ok ] || [ "${STATUS[gputests]:-skipped}" != ok ]; }; then
  rc=3
fi
{
  case $rc in
    0) echo "== verdict: nothing failed (exit 0)" ;;
    1) echo "== verdict: FAILED: $(for k in "${!STATUS[@]}"; do [ "${STATUS[$k]}" = failed ] && printf '%s ' "$k"; done)(exit 1)" ;;
    3) echo "== verdict: nothing failed, but the budget cut the build or the GPU tests (exit 3)" ;;
  esac
  echo "== done in $(($(date +%s) - T0)) s; files: $(find "$OUT" -maxdepth 1 -type f -printf '%f ')"
} >>"$SUM"
cat "$SUM"
exit "$rc"
