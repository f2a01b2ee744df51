#!/usr/bin/env bash
# The peers' own Python test suites, unedited, on their released wheels and on xfer's drop-ins
# (issue 44: they are the drop-ins' specification). Each suite runs from a checkout of the
# peer's public repository; the wheels install from PyPI into their own virtual environments
# (build/mooncake-venv, build/nixl-venv, as the compare scripts make them). The drop-ins are
# switched in the documented way only: a `mooncake.engine` module that is `xfer.mooncake`, and
# `xfer.nixl.install()` before the suite imports nixl. Prints one row per test and run, and
# writes the section "## suites" of bench/RESULTS.md.
# The wheels' versions: MOONCAKE_VERSION, NIXL_VERSION (default: PyPI's newest, once: a venv
# that has one keeps it).
#   RUNS=2 NIXL_VERSION=1.5.1 bench/peer_suites.sh --mooncake ~/src/Mooncake --nixl ~/src/nixl
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
RUNS=${RUNS:-2}
mooncake_src="" nixl_src=""
while [ $# -gt 0 ]; do
  case $1 in
    --mooncake) mooncake_src=$(realpath "$2"); shift 2 ;;
    --nixl) nixl_src=$(realpath "$2"); shift 2 ;;
    *) echo "usage: bench/peer_suites.sh [--mooncake CHECKOUT] [--nixl CHECKOUT]" >&2; exit 2 ;;
  esac
done
[ -n "$mooncake_src$nixl_src" ] || { echo "peer_suites: give --mooncake and/or --nixl (checkouts of the peers' repositories)" >&2; exit 2; }
[ -x .venv/bin/python ] || { echo "peer_suites: run ./scripts/setup.sh --test && ./scripts/build.sh first" >&2; exit 1; }
tmp=$PWD/build/peer-suites  # (the runs' logs, kept until the next run)
rm -rf "$tmp"
mkdir -p "$tmp"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT
results="$tmp/results.txt"  # "<suite> <test> <impl> <run> <ok|FAIL>"
: >"$results"

ROOT=$PWD
free_port() { "$ROOT/.venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# wait_port PORT: until something listens on 127.0.0.1:PORT (10 s at most).
wait_port() {
  local _
  for _ in $(seq 100); do
    (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "peer_suites: nothing listens on port $1" >&2
  return 1
}

# start_etcd: an etcd on free loopback ports; sets ETCD_ENDPOINT (host:port).
start_etcd() {
  local client peer
  client=$(free_port) peer=$(free_port)
  etcd --name suites --data-dir "$tmp/etcd.$client" --listen-client-urls "http://127.0.0.1:$client" \
    --advertise-client-urls "http://127.0.0.1:$client" --listen-peer-urls "http://127.0.0.1:$peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer" --initial-cluster "suites=http://127.0.0.1:$peer" \
    >"$tmp/etcd.$client.log" 2>&1 &
  ETCD_PID=$!
  pids+=("$ETCD_PID")
  ETCD_ENDPOINT=127.0.0.1:$client
  wait_port "$client"
}
stop_etcd() { kill "$ETCD_PID" 2>/dev/null || true; wait "$ETCD_PID" 2>/dev/null || true; }

# record SUITE IMPL RUN FILE: FILE's "<test> ok|FAIL" lines into $results.
record() {
  [ -s "$4" ] || { echo "peer_suites: $1 on $2 reported no test (the logs: $tmp)" >&2; return 0; }
  awk -v suite="$1" -v impl="$2" -v run="$3" '{ print suite, $1, impl, run, $2 }' "$4" >>"$results"
}

# ---- Mooncake: mooncake-wheel/tests/transfer_engine_{target,initiator_test}.py, as
# scripts/run_tests.sh runs them (MC_FORCE_TCP), with each metadata mode.
mooncake_suite() {  # IMPL RUN MODE
  local impl=$1 run=$2 mode=$3 py meta server_pid="" target_pid tport iport
  local dir="$mooncake_src/mooncake-wheel/tests"
  if [ "$impl" = wheel ]; then py=$PWD/$MC_VENV/bin/python; else py=$PWD/.venv/bin/python; fi
  case $mode in
    http)
      local port
      port=$(free_port)
      "$MC_VENV/bin/mooncake_http_metadata_server" --port "$port" >"$tmp/mds.log" 2>&1 &
      server_pid=$!
      pids+=("$server_pid")
      wait_port "$port"
      meta=http://127.0.0.1:$port/metadata ;;
    etcd) start_etcd; meta=$ETCD_ENDPOINT ;;
    p2p) meta=P2PHANDSHAKE ;;
  esac
  tport=$(free_port) iport=$(free_port)
  local env=(MC_METADATA_SERVER="$meta" MC_FORCE_TCP=true TARGET_SERVER_NAME="127.0.0.1:$tport"
             INITIATOR_SERVER_NAME="127.0.0.1:$iport" CIRCLE=1000)
  [ "$impl" = xfer ] && env+=(PYTHONPATH="$tmp/mooncake-shim")
  (cd "$dir" && exec env "${env[@]}" timeout 120 "$py" transfer_engine_target.py >"$tmp/target.log" 2>&1) &
  target_pid=$!  # (timeout's: it passes the kill below on to the target)
  sleep 3  # (as run_tests.sh: the target publishes itself, then waits)
  local out="$tmp/mooncake-$mode.$impl.$run"
  env "${env[@]}" timeout 300 "$py" bench/unittest_results.py "$dir/transfer_engine_initiator_test.py" "$out" \
    >>"$tmp/mooncake.log" 2>&1 || true
  record "mooncake-$mode" "$impl" "$run" "$out"
  kill "$target_pid" 2>/dev/null || true
  wait "$target_pid" 2>/dev/null || true
  [ -z "$server_pid" ] || { kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; }
  [ "$mode" != etcd ] || stop_etcd
}

if [ -n "$mooncake_src" ]; then
  MC_VENV=build/mooncake-venv
  mc_version=$(peer_venv "$MC_VENV" mooncake.engine "mooncake-transfer-engine-non-cuda${MOONCAKE_VERSION:+==$MOONCAKE_VERSION}")
  mkdir -p "$tmp/mooncake-shim/mooncake"
  : >"$tmp/mooncake-shim/mooncake/__init__.py"
  printf 'import sys\nimport xfer.mooncake\nsys.modules[__name__] = xfer.mooncake\n' \
    >"$tmp/mooncake-shim/mooncake/engine.py"
  for run in $(seq "$RUNS"); do
    for mode in http etcd p2p; do
      for impl in wheel xfer; do
        echo "run $run: mooncake $mode on $impl" >&2
        mooncake_suite "$impl" "$run" "$mode"
      done
    done
  done
fi

# ---- NIXL: test/python (pytest) and the example scripts of .gitlab/test_python.sh, as that
# script runs them, with etcd in the environment as NIXL's CI sets it.
junit_results() {  # junit_results XML OUT: pytest's report -> "<test> ok|FAIL|skip" lines
  "$ROOT/.venv/bin/python" - "$1" >"$2" <<'PY'
import sys
import xml.etree.ElementTree as ET
for case in ET.parse(sys.argv[1]).iter("testcase"):
    kinds = {child.tag for child in case}
    outcome = "FAIL" if kinds & {"failure", "error"} else "skip" if "skipped" in kinds else "ok"
    print(f"{case.get('classname').rpartition('.')[2]}::{case.get('name')} {outcome}")
PY
}

# item NAME OUT LOG PATTERN RC: one example's outcome (its exit code and the line it prints
# when its checks passed: the examples exit 0 when a check fails too).
item() {
  if [ "$5" = 0 ] && grep -aq "$4" "$3"; then echo "$1 ok" >>"$2"; else echo "$1 FAIL" >>"$2"; fi
}

# two_peers SCRIPT TAG OUT ENV...: as the CI's run_two_peers: the target on port 0, its port read
# from its log at NIXL_LOG_LEVEL=INFO, then the initiator with ENV.
two_peers() {
  local script=$1 tag=$2 out=$3 port="" rc trc target_pid
  shift 3
  NIXL_LOG_LEVEL=INFO timeout 120 "$PY" "$script" --mode=target --ip=127.0.0.1 --port=0 \
    >"$tmp/$tag.target.out" 2>"$tmp/$tag.target.err" &
  target_pid=$!
  for _ in $(seq 30); do
    port=$(awk '/MD listener is listening on port/ { print $NF; exit }' "$tmp/$tag.target.err")
    [ -n "$port" ] && break
    sleep 1
  done
  if [ -z "$port" ]; then
    kill "$target_pid" 2>/dev/null || true
    wait "$target_pid" 2>/dev/null || true
    echo "$tag FAIL" >>"$out"
    return
  fi
  rc=0 trc=0
  env "$@" timeout 120 "$PY" "$script" --mode=initiator --ip=127.0.0.1 --port="$port" >"$tmp/$tag.initiator.log" 2>&1 || rc=$?
  wait "$target_pid" || trc=$?
  grep -aq "Test Complete." "$tmp/$tag.target.out" || trc=1
  item "$tag" "$out" "$tmp/$tag.initiator.log" "Test Complete." "$((rc + trc))"
}

nixl_suite() {  # IMPL RUN
  local impl=$1 run=$2 out="$tmp/nixl.$1.$2" rc tele="$tmp/telemetry.$1.$2"
  PY=$PWD/.venv/bin/python
  local path="$tmp/nixl-shim:$PWD/build/suite-extra"
  [ "$impl" = wheel ] && PY=$PWD/$NIXL_VENV/bin/python path=""
  : >"$out"
  start_etcd
  (
    export NIXL_ETCD_ENDPOINTS="http://$ETCD_ENDPOINT" NIXL_ETCD_NAMESPACE="/nixl/suites/$impl$run"
    export PYTHONPATH=$path
    cd "$nixl_src"
    rc=0
    timeout 600 "$PY" -m pytest -s test/python -p no:cacheprovider --junitxml="$out.junit.xml" \
      >"$out.pytest.log" 2>&1 || rc=$?
    # (pytest's rc is 1 when a test failed, which its report says; past that, it did not finish.)
    if [ -s "$out.junit.xml" ] && [ "$rc" -le 1 ]; then
      junit_results "$out.junit.xml" "$out.pytest" && cat "$out.pytest" >>"$out"
    else
      echo "pytest_test/python FAIL" >>"$out"
    fi
    for mode in list array; do
      rc=0
      timeout 120 "$PY" test/python/prep_xfer_perf.py "$mode" >"$tmp/prep.log" 2>&1 || rc=$?
      echo "prep_xfer_perf.py_$mode $([ $rc = 0 ] && echo ok || echo FAIL)" >>"$out"
    done
    cd examples/python
    rc=0
    timeout 120 "$PY" partial_md_example.py --init-port "$(free_port)" --target-port "$(free_port)" \
      >"$tmp/partial.log" 2>&1 || rc=$?
    item partial_md_example.py_socket "$out" "$tmp/partial.log" "Test Complete." $rc
    rc=0
    timeout 120 "$PY" partial_md_example.py --etcd >"$tmp/partial_etcd.log" 2>&1 || rc=$?
    item partial_md_example.py_etcd "$out" "$tmp/partial_etcd.log" "Test Complete." $rc
    rc=0
    timeout 120 "$PY" query_mem_example.py >"$tmp/query.log" 2>&1 || rc=$?
    item query_mem_example.py "$out" "$tmp/query.log" "Example completed successfully" $rc
    # (The two-peer examples call torch.set_default_device, torch 2's: torch-compat gives this
    # machine's torch 1.13 a stand-in that accepts only "cpu", its default. Both sides get it.)
    export PYTHONPATH=$tmp/torch-compat${path:+:$path}
    two_peers basic_two_peers.py basic_two_peers.py "$out"
    mkdir -p "$tele"
    two_peers expanded_two_peers.py expanded_two_peers.py_telemetry "$out" NIXL_TELEMETRY_ENABLE=y NIXL_TELEMETRY_DIR="$tele"
    "$PY" telemetry_reader.py --telemetry_path "$tele/initiator" >"$tmp/reader.log" 2>&1 &
    local reader=$!
    sleep 15
    kill -INT "$reader" 2>/dev/null || true
    rc=0
    wait "$reader" || rc=$?
    grep -aq "Event: agent_" "$tmp/reader.log" || rc=1
    item telemetry_reader.py "$out" "$tmp/reader.log" "Total events read" $rc
  )
  stop_etcd
  record nixl "$impl" "$run" "$out"
}

if [ -n "$nixl_src" ]; then
  NIXL_VENV=build/nixl-venv
  nixl_version=$(peer_venv "$NIXL_VENV" nixl._api "nixl${NIXL_VERSION:+==$NIXL_VERSION}")
  "$NIXL_VENV/bin/python" -c "import zmq, pytest_timeout" 2>/dev/null ||
    "$NIXL_VENV/bin/python" -m pip install -q --disable-pip-version-check pyzmq pytest-timeout >&2
  # NIXL's CI installs these for its tests: for the drop-in's run, beside .venv, not in it.
  PYTHONPATH=build/suite-extra .venv/bin/python -c "import zmq, pytest_timeout" 2>/dev/null ||
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --target build/suite-extra \
      pyzmq pytest-timeout >&2
  mkdir -p "$tmp/nixl-shim/nixl" "$tmp/torch-compat"
  printf 'import xfer.nixl\n\nxfer.nixl.install()\n' >"$tmp/nixl-shim/nixl/__init__.py"
  cat >"$tmp/torch-compat/sitecustomize.py" <<'PY'
import torch

if not hasattr(torch, "set_default_device"):
    def set_default_device(device):
        if str(device) != "cpu":
            raise RuntimeError(f"torch {torch.__version__} cannot set the default device {device!r}")
    torch.set_default_device = set_default_device
PY
  for run in $(seq "$RUNS"); do
    for impl in wheel xfer; do
      echo "run $run: nixl on $impl" >&2
      nixl_suite "$impl" "$run"
    done
  done
fi

.venv/bin/python - "$results" "$RUNS" >"$tmp/table.md" <<'PY'
import collections, sys
runs = int(sys.argv[2])
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    suite, test, impl, run, outcome = line.split()
    rows[(suite, test)][impl].append(outcome)
def cell(outcomes):
    return " ".join(outcomes) if outcomes else "not run"
def passed(outcomes):  # in every run (a test its suite skips counts: "as on the wheel")
    return len(outcomes) == runs and all(o in ("ok", "skip") for o in outcomes)
totals = collections.Counter()
print("| suite | test | wheel, each run | drop-in, each run |")
print("|---|---|---|---|")
for (suite, test), by in sorted(rows.items()):
    print(f"| {suite} | {test} | {cell(by['wheel'])} | {cell(by['xfer'])} |")
    for impl in ("wheel", "xfer"):
        totals[impl, passed(by[impl])] += 1
print(f"\nPassed (or skipped by the suite) in every run: wheel {totals['wheel', True]} of {len(rows)}, "
      f"drop-in {totals['xfer', True]} of {len(rows)}.")
PY
{
  echo "## suites: the peers' own test suites on their wheels and on the drop-ins"
  echo
  written_by bench/peer_suites.sh "${mc_version:+; mooncake-transfer-engine-non-cuda $mc_version}${nixl_version:+; nixl $nixl_version}"
  echo
  echo "Command: \`RUNS=$RUNS bench/peer_suites.sh\`${mooncake_src:+ --mooncake (Mooncake at $(git -C "$mooncake_src" rev-parse --short HEAD))}${nixl_src:+ --nixl (NIXL at $(git -C "$nixl_src" rev-parse --short HEAD))}. The tests that need a GPU, RDMA hardware, a storage backend or Mooncake Store are not run (docs/python.md lists them)."
  echo
  cat "$tmp/table.md"
} >"$tmp/section.md"
results_section bench/RESULTS.md suites "$tmp/section.md"
cat "$tmp/section.md"
