#!/usr/bin/env bash
# The peers' own Python test suites, unedited, on their released wheels and on xfer's drop-ins
# (issue 44: they are the drop-ins' specification). Each suite runs from a checkout of the
# peer's public repository; the wheels install from PyPI into their own virtual environments
# (build/mooncake-venv, build/nixl-venv, as the compare scripts make them). The drop-ins are
# switched in the documented way only: a `mooncake.engine` module that is `xfer.mooncake`, and
# `xfer.nixl.install()` before the suite imports nixl. Prints one row per test and run, and
# writes the section "## suites" of bench/RESULTS.md.
#   RUNS=2 bench/peer_suites.sh --mooncake ~/src/Mooncake --nixl ~/src/nixl
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
tmp=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"' EXIT
results="$tmp/results.txt"  # "<suite> <test> <impl> <run> <ok|FAIL>"
: >"$results"

free_port() { .venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

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
  [ -s "$4" ] || { echo "peer_suites: $1 on $2 reported no test (its log: $tmp)" >&2; return 0; }
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
  (cd "$dir" && env "${env[@]}" timeout 120 "$py" transfer_engine_target.py >"$tmp/target.log" 2>&1) &
  target_pid=$!
  sleep 3  # (as run_tests.sh: the target publishes itself, then waits)
  local out="$tmp/mooncake-$mode.$impl.$run"
  env "${env[@]}" timeout 300 "$py" bench/unittest_results.py "$dir/transfer_engine_initiator_test.py" "$out" \
    >>"$tmp/mooncake.log" 2>&1 || true
  record "mooncake-$mode" "$impl" "$run" "$out"
  kill "$target_pid" 2>/dev/null || true
  pkill -P "$target_pid" 2>/dev/null || true
  wait "$target_pid" 2>/dev/null || true
  [ -z "$server_pid" ] || { kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; }
  [ "$mode" != etcd ] || stop_etcd
}

if [ -n "$mooncake_src" ]; then
  MC_VENV=build/mooncake-venv
  mc_version=$(peer_venv "$MC_VENV" mooncake.engine mooncake-transfer-engine-non-cuda)
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

# ---- NIXL: (added below)

.venv/bin/python - "$results" >"$tmp/table.md" <<'PY'
import collections, sys
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    suite, test, impl, run, outcome = line.split()
    rows[(suite, test)][impl].append(outcome)
def cell(outcomes):
    return " ".join(outcomes) if outcomes else "not run"
totals = collections.Counter()
print("| suite | test | wheel, each run | drop-in, each run |")
print("|---|---|---|---|")
for (suite, test), by in sorted(rows.items()):
    print(f"| {suite} | {test} | {cell(by['wheel'])} | {cell(by['xfer'])} |")
    for impl in ("wheel", "xfer"):
        totals[impl, all(o == "ok" for o in by[impl]) and by[impl] != []] += 1
print(f"\nPassed in every run: wheel {totals['wheel', True]} of {len(rows)}, "
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
