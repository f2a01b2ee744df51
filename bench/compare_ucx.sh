#!/usr/bin/env bash
# xfer's ucx transport (UCP put/get) against ucx_perftest (Debian's ucx-utils), both over the same
# UCX transports (UCX_TLS, exported for every command; default tcp), measured in the same run:
#  (1) per block size: xfer-bench WRITE and READ with --transport ucx --mem register --reuse
#      (registered memory; the same buffers every request, as ucx_perftest reuses one buffer)
#      and DEPTH requests in flight (--depth: ucx_perftest keeps a window of puts in flight; one
#      thread posts them and drives the link) against ucx_perftest ucp_put_bw and ucp_get, a
#      server and a client on loopback per size; and, for reference, xfer with one request at
#      a time (--depth 1: each WRITE waits for its flush, a round trip, before the next starts);
#  (2) BATCH_SIZE blocks (default 4 KiB): one request of BATCH descriptors (--batch 1000) against
#      one request per block (--batch 1), and ucx_perftest ucp_put_bw at that size for reference
#      (not ucp_get: over tcp it waits ~1.1 ms per get there, seconds per run for nothing).
#
# ucx_perftest over tcp is erratic here: ucp_put_bw with its default window (-O 0, no limit) fell
# to ~30 MB/s at 1-8 MiB in some runs and reached ~0.3 GB/s with -O 1, and ucp_get ran ~1.1 ms
# per get with -O 0 or 1 (~50 MB/s at 64 KiB) but ~0.8 GB/s with -O 64. The baseline is
# ucx_perftest's defaults; PERFTEST_ARGS="-O N" tries another window (written into RESULTS.md).
# Every cell runs ROUNDS times, the tools alternating (which goes first alternating by round); a
# cell's GB/s is the median of its rounds and a ratio the median of the rounds' ratios (see
# "Rounds" in bench/lib.sh: this machine's cores are shared). Prints the tables and the ucx targets,
# and writes them into bench/RESULTS.md as the section that starts with "## ucx" (the rest of the
# file, which bench/compare.sh, bench/compare_tcp.sh and bench/compare_shm.sh write, is kept).
#
# Without an RDMA device UCX moves put/get over its tcp transport (emulated: ~0.5-1 GB/s here), and
# xfer offers ucx only when forced (--transport ucx, on both sides: the local target child gets the
# client's options). UCX_TLS must let UCX reach the peer with active messages, put/get AND peer
# failure detection (xfer needs UCP_ERR_HANDLING_MODE_PEER): UCX_TLS=sm, posix, sysv or cma alone
# do NOT work with xfer (UCX: "no active messages transport ...: sysv/memory - no peer failure
# handler, posix/memory - no peer failure handler, cma/memory - no am bcopy"; xfer-bench:
# "Connect(...): UNSUPPORTED: no transport reaches peer ..."), and the script stops with that error.
# Name tcp or an RDMA transport too (UCX_TLS=tcp,sm runs).
#
#   bench/compare_ucx.sh [BUILD_DIR]        (default: build)
#   env: UCX_TLS=tcp  DURATION=0.3 (s per xfer cell)  ROUNDS=5  SIZES=64K:8M  DEPTH=8  BATCH=1000  BATCH_SIZE=4K
#        UCX_TCP_BYTES=64M (bytes per ucx_perftest run when UCX_TLS=tcp; UCX_BYTES=1G otherwise)
#        PERFTEST_ARGS="" (extra ucx_perftest arguments for both sides, e.g. "-O 4")
#        RESULTS=bench/RESULTS.md (RESULTS=- : do not write it)  NOTE="..."  UCX=0 (skip ucx_perftest)
#        QUICK=1 (1 round, 0.1 s per cell, sizes 64K,1M,4M, UCX_TCP_BYTES=32M: under a minute)
set -euo pipefail
if [ "${QUICK:-0}" = 1 ]; then
  DURATION=${DURATION:-0.1}; ROUNDS=${ROUNDS:-1}; SIZES=${SIZES:-64K,1M,4M}; UCX_TCP_BYTES=${UCX_TCP_BYTES:-32M}
fi
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh
BUILD=${1:-build}
DURATION=${DURATION:-0.3}
ROUNDS=${ROUNDS:-5}
SIZES=${SIZES:-64K:8M}
DEPTH=${DEPTH:-8}
BATCH=${BATCH:-1000}
BATCH_SIZE=${BATCH_SIZE:-4K}
PERFTEST_ARGS=${PERFTEST_ARGS:-}
RESULTS=${RESULTS:-bench/RESULTS.md}
export UCX_TLS=${UCX_TLS:-tcp}
[ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja >/dev/null
cmake --build "$BUILD" --target xfer-bench raw_tcp >/dev/null
XB="$BUILD/tools/xfer-bench"
have_ucx=0
if [ "${UCX:-1}" = 1 ] && command -v ucx_perftest >/dev/null; then have_ucx=1; fi
ucx_budget=$UCX_BYTES; [ "$UCX_TLS" = tcp ] && ucx_budget=$UCX_TCP_BYTES   # as ucx_run chooses
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The commands, as run (and as written to RESULTS.md); SIZE is each size of $SIZES in turn.
cmd_x=("$XB" -s SIZE -D "$DURATION" --transport ucx --mem register --reuse --depth "$DEPTH")
cmd_xd1=("$XB" -s SIZE -D "$DURATION" --transport ucx --mem register --reuse --depth 1)
cmd_xb=("$XB" -s "$BATCH_SIZE" -D "$DURATION" --transport ucx --mem register --reuse --batch "$BATCH")
cmd_x1=("$XB" -s "$BATCH_SIZE" -D "$DURATION" --transport ucx --mem register --reuse --batch 1)
ucx_cfgs=(
  "put|-t ucp_put_bw"
  "get|-t ucp_get"
)
sizes=$("$BUILD/bench/raw_tcp" -s "$SIZES" --print-sizes)
batch_bytes=$("$BUILD/bench/raw_tcp" -s "$BATCH_SIZE" --print-sizes)

# Each step appends "<round> <key> <bytes> <GB/s>" lines to all.txt. xfer's figures come from
# its --csv file (full precision; the table rounds to 0.01 GB/s), and "ucx_<key> <bytes> 0|1"
# lines go to path.txt: 1 when the row's transport is ucx and bytes moved through it.
xfer() {  # xfer NAME SIZE cmd...
  local name=$1 size=$2 rc=0
  shift 2
  rm -f "$tmp/x.csv"
  with_size "$size" "$@" --csv "$tmp/x.csv" >"$tmp/last_$name.txt" 2>&1 || rc=$?
  if [ $rc != 0 ] || [ ! -s "$tmp/x.csv" ]; then
    echo "compare_ucx: xfer-bench failed (exit $rc, UCX_TLS=$UCX_TLS): $(with_size "$size" q "$@")" >&2
    grep -v '^#' "$tmp/last_$name.txt" | tail -n 6 >&2
    exit 1
  fi
  awk -F, -v n="$name" -v r="$ROUND" -v pf="$tmp/path.txt" '
    NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    {
      op = ($c["op"] == "READ") ? "r" : "w"
      print r, n "_" op, $c["bytes"], $c["bw_avg_GBps"]
      print "ucx_" n "_" op, $c["bytes"], ($c["transport"] == "ucx" && $c["transport_bytes"] > 0 && $c["shm_bytes"] == 0) ? 1 : 0 >>pf
    }' "$tmp/x.csv" >>"$tmp/all.txt"
}
ucx() {  # ucx SIZE [NAME]: ucp_put_bw and ucp_get at SIZE (only the test NAME if given)
  local cfg name args
  [ $have_ucx = 1 ] || return 0
  for cfg in "${ucx_cfgs[@]}"; do
    IFS='|' read -r name args <<<"$cfg"
    [ -z "${2:-}" ] || [ "$name" = "$2" ] || continue
    # shellcheck disable=SC2086
    ucx_run "$name" "$UCX_TLS" "$1" $args $PERFTEST_ARGS >"$tmp/ucx.txt"  # (not in a pipe: ucx_run counts ports)
    in_round <"$tmp/ucx.txt" >>"$tmp/all.txt"
  done
}
: >"$tmp/all.txt"
: >"$tmp/path.txt"

echo "compare_ucx: UCX_TLS=$UCX_TLS, $ROUNDS rounds, $DURATION s per cell, sizes $SIZES, $batch_bytes B x $BATCH$([ $have_ucx = 1 ] || echo ", no ucx_perftest")" >&2
for r in $(seq 1 "$ROUNDS"); do
  ROUND=$r
  echo "  round $r/$ROUNDS" >&2
  for b in $sizes; do
    if [ $((r % 2)) = 1 ]; then
      xfer x "$b" "${cmd_x[@]}"; ucx "$b"; xfer xd1 "$b" "${cmd_xd1[@]}"
    else
      xfer xd1 "$b" "${cmd_xd1[@]}"; ucx "$b"; xfer x "$b" "${cmd_x[@]}"
    fi
  done
  if [ $((r % 2)) = 1 ]; then
    xfer xb "$batch_bytes" "${cmd_xb[@]}"; xfer x1 "$batch_bytes" "${cmd_x1[@]}"; ucx "$batch_bytes" put
  else
    ucx "$batch_bytes" put; xfer x1 "$batch_bytes" "${cmd_x1[@]}"; xfer xb "$batch_bytes" "${cmd_xb[@]}"
  fi
done
round_stats "$tmp/all.txt" "x_w/put x_r/get xb_w/x1_w xb_r/x1_r" >"$tmp/stats.txt"
# The worst round per (xfer cell, size): 0 if any round did not run over ucx.
awk '{ k = $1 " " $2; if (!(k in v) || $3 + 0 < v[k]) v[k] = $3 + 0 } END { for (k in v) print k, v[k] }' \
  "$tmp/path.txt" >>"$tmp/stats.txt"

awk -v have_ucx=$have_ucx -v bb="$batch_bytes" -v batch="$BATCH" -v depth="$DEPTH" -v tls="$UCX_TLS" -v sizes_s="${sizes//$'\n'/ }" "$ROUND_TABLE_AWK"'
  function rate(gbs, b) { return gbs < 0 ? "-" : sprintf("%.1f", gbs * 1e6 / b) }   # k descriptors/s
  END {
    n = split(sizes_s, sizes, " ")
    ok1 = okp = 1
    printf "| block | xfer ucx WRITE | ucp_put_bw | x/put | WRITE, depth 1 | xfer ucx READ | ucp_get | x/get | READ, depth 1 |\n"
    print "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= n; i++) {
      b = sizes[i]
      xw = g("x_w " b); xr = g("x_r " b); put = g("put " b); get = g("get " b); rw = g("x_w/put " b); rr = g("x_r/get " b)
      printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", b, f(xw), f(put), fr("x_w/put " b), f(g("xd1_w " b)),
        f(xr), f(get), fr("x_r/get " b), f(g("xd1_r " b))
      if (have_ucx && b >= 65536) {
        n1++
        if (rw < 0.9) { ok1 = 0; miss1 = miss1 sprintf(" WRITE@%s=%s", kib(b), xw < 0 ? "xfer not measured" : rw < 0 ? "no ucp_put_bw figure" : fl(rw) "x") }
        if (rr < 0.9) { ok1 = 0; miss1 = miss1 sprintf(" READ@%s=%s", kib(b), xr < 0 ? "xfer not measured" : rr < 0 ? "no ucp_get figure" : fl(rr) "x") }
      }
      for (c = 1; c <= 4; c++) { k = "ucx_" (c <= 2 ? "x_" : "xd1_") (c % 2 ? "w" : "r") " " b; if (g(k) != 1) { okp = 0; missp = missp sprintf(" %s%s@%s", c % 2 ? "WRITE" : "READ", c <= 2 ? "" : "(depth 1)", kib(b)) } }
    }
    print ""
    printf "GB/s (1e9 B/s): the median of the rounds, UCX_TLS=%s for both. xfer ucx WRITE, READ: %s requests in flight (--depth %s), as ucx_perftest keeps puts in flight; depth 1: one request at a time, for reference. x/put, x/get: xfer over ucx with --reuse / ucx_perftest ucp_put_bw, ucp_get (one buffer reused) within each round (the two ran seconds apart), the median over the rounds (lowest-highest round in brackets), floored to 0.01. \"-\": not run.\n", tls, depth, depth
    print ""
    bw = g("xb_w " bb); br = g("xb_r " bb); ow = g("x1_w " bb); or_ = g("x1_r " bb); put = g("put " bb); qw = g("xb_w/x1_w " bb); qr = g("xb_r/x1_r " bb)
    printf "| %s B blocks | WRITE GB/s | WRITE k desc/s | READ GB/s | READ k desc/s |\n", bb
    print "|---|---:|---:|---:|---:|"
    printf "| xfer, %s descriptors per request | %s | %s | %s | %s |\n", batch, f(bw), rate(bw, bb), f(br), rate(br, bb)
    printf "| xfer, one request per block | %s | %s | %s | %s |\n", f(ow), rate(ow, bb), f(or_), rate(or_, bb)
    printf "| batched / one-by-one (median of the rounds) | %s | | %s | |\n", fl(qw) (qw < 0 ? "" : "x"), fl(qr) (qr < 0 ? "" : "x")
    printf "| ucx_perftest ucp_put_bw (reference) | %s | %s | | |\n", f(put), rate(put, bb)
    print ""
    print "k desc/s: thousands of descriptors (blocks) moved per second. ucx_perftest keeps many puts in flight from one buffer; xfer one-by-one waits for each request (depth 1)."
    print ""
    printf "- target 1: xfer ucx WRITE and READ (depth %s) >= 90%% of ucx_perftest (ucp_put_bw, ucp_get) at every block size from 64 KiB up: %s%s\n", depth,
      !have_ucx ? "NOT CHECKED (no ucx_perftest)" : !n1 ? "NOT CHECKED (no size >= 64 KiB measured)" : ok1 ? "MET" : "NOT MET:", have_ucx ? miss1 : ""
    ok2 = (qw >= 2 && qr >= 2)
    miss2 = ""
    if (qw < 2) miss2 = miss2 sprintf(" WRITE=%s", qw < 0 ? "not measured" : fl(qw) "x")
    if (qr < 2) miss2 = miss2 sprintf(" READ=%s", qr < 0 ? "not measured" : fl(qr) "x")
    printf "- target 2: %s B x %s descriptors in one request >= 2x one request per %s B block (WRITE and READ): %s%s\n", bb, batch, bb, ok2 ? "MET" : "NOT MET:", miss2
    for (c = 1; c <= 4; c++) { k = "ucx_" (c <= 2 ? "xb_" : "x1_") (c % 2 ? "w" : "r") " " bb; if (g(k) != 1) { okp = 0; missp = missp sprintf(" %s", k) } }
    printf "- every xfer cell moved its bytes through ucx (xfer-bench --csv transport column): %s%s\n", okp ? "yes" : "NO:", missp
  }' "$tmp/stats.txt" >"$tmp/table.md"
echo
cat "$tmp/table.md"

if [ "$RESULTS" != "-" ]; then
  ucx_version=$(ucx_version)
  {
    echo "## ucx transport vs ucx_perftest (UCX_TLS=$UCX_TLS)"
    echo
    written_by bench/compare_ucx.sh "${ucx_version:+; UCX: $ucx_version}"
    echo
    echo "Command: \`bench/compare_ucx.sh${1:+ $1}\` (UCX_TLS=$UCX_TLS DURATION=$DURATION ROUNDS=$ROUNDS SIZES=$SIZES DEPTH=$DEPTH BATCH=$BATCH BATCH_SIZE=$BATCH_SIZE UCX budget $ucx_budget${PERFTEST_ARGS:+ PERFTEST_ARGS=\"$PERFTEST_ARGS\"}), which runs, with UCX_TLS=$UCX_TLS exported and the tools alternating, per SIZE in ${sizes//$'\n'/ } the xfer-bench -s SIZE commands and the ucx_perftest pairs, then the two --batch commands and ucp_put_bw with SIZE=$batch_bytes:"
    echo
    echo '```'
    echo "export UCX_TLS=$UCX_TLS"
    q "${cmd_x[@]}"; echo
    q "${cmd_xd1[@]}"; echo
    if [ $have_ucx = 1 ]; then
      echo "# a server (ucx_perftest -p PORT ARGS -s SIZE -n N -w N/10) and a client, N = $ucx_budget / SIZE (20..200000):"
      for cfg in "${ucx_cfgs[@]}"; do
        IFS='|' read -r name args <<<"$cfg"
        echo "ucx_perftest 127.0.0.1 -p PORT $args${PERFTEST_ARGS:+ $PERFTEST_ARGS} -s SIZE -n N -w N/10 -f   # $name"
      done
    fi
    q "${cmd_xb[@]}"; echo
    q "${cmd_x1[@]}"; echo
    echo '```'
    echo
    cat "$tmp/table.md"
    echo
    results_plot ucx "$tmp/stats.txt" "ucx against ucx_perftest, paired rounds" --baseline '^(put|get)$' \
      --reference 'perftest_roce100g.tsv:test=write_bw,qps=1@perftest ib_write_bw, 100G RoCE, 1 QP'
  } >"$tmp/results.md"
  results_section "$RESULTS" ucx "$tmp/results.md"
  echo "wrote the ucx section of $RESULTS"
fi
