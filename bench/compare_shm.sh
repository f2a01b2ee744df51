#!/usr/bin/env bash
# xfer's shm path (memory from Engine::AllocMem, which a same-host peer maps and moves with
# memcpy) against what a mapped copy can reach, measured in the same run at the same block sizes:
#  (a) --reuse (the same buffers every request, as ucx_perftest does): xfer-bench WRITE and READ
#      over shm against ucx_perftest ucp_put_bw / ucp_get over UCX_TLS=posix (UCX's own mapped
#      shared memory), a server and a client on loopback per size;
#  (b) walking a 256 MiB span per side (xfer-bench's default pattern, larger than the CPU
#      caches): xfer-bench WRITE and READ over shm against memcpy in one process over the same
#      pattern (bench/raw_cma's memcpy column; its process_vm_writev/readv columns are shown too,
#      as the raw cma loop).
# Every cell runs ROUNDS times, the tools alternating (and which goes first alternating by
# round); a cell's GB/s is the median of its rounds and a ratio the median of the rounds' ratios
# (see "Rounds" in bench/lib.sh: this machine's cores are shared). Prints the table and the
# shm targets, and writes them into bench/RESULTS.md as the section that starts with "## shm"
# (the rest of the file, which bench/compare.sh and bench/compare_tcp.sh write, is kept).
#
#   bench/compare_shm.sh [BUILD_DIR]        (default: build)
#   env: DURATION=0.3 (s per cell)  ROUNDS=5  SIZES=16K:8M  UCX_BYTES=1G (per ucx_perftest run)
#        RESULTS=bench/RESULTS.md (RESULTS=- : do not write it)  NOTE="..."  UCX=0 (skip UCX)
#        QUICK=1 (1 round, 0.1 s per cell, sizes 16K,64K,256K,1M,4M,8M, UCX_BYTES=256M: under a minute)
set -euo pipefail
if [ "${QUICK:-0}" = 1 ]; then
  DURATION=${DURATION:-0.1}; ROUNDS=${ROUNDS:-1}; SIZES=${SIZES:-16K,64K,256K,1M,4M,8M}; UCX_BYTES=${UCX_BYTES:-256M}
fi
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh
BUILD=${1:-build}
DURATION=${DURATION:-0.3}
ROUNDS=${ROUNDS:-5}
SIZES=${SIZES:-16K:8M}
RESULTS=${RESULTS:-bench/RESULTS.md}
[ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja >/dev/null
cmake --build "$BUILD" --target xfer-bench xfer-info raw_cma >/dev/null
XB="$BUILD/tools/xfer-bench"
RAW="$BUILD/bench/raw_cma"
shm_line=$("$BUILD/tools/xfer-info" --no-engine 2>/dev/null | grep -E '^  shm ' || true)
if ! grep -qE '^  shm +available' <<<"$shm_line"; then
  echo "compare_shm: shm is not available on this machine:${shm_line:- xfer-info has no shm line}" >&2
  exit 1
fi
have_ucx=0
if [ "${UCX:-1}" = 1 ] && command -v ucx_perftest >/dev/null; then have_ucx=1; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The commands, as run (and as written to RESULTS.md); SIZE is each size of $SIZES in turn.
cmd_reuse=("$XB" -s SIZE -D "$DURATION" --transport shm --mem alloc --reuse)
cmd_walk=("$XB" -s SIZE -D "$DURATION" --transport shm --mem alloc)
cmd_raw=("$RAW" -s SIZE -D "$DURATION")
ucx_cfgs=(
  "ucp_put|posix|-t ucp_put_bw"
  "ucp_get|posix|-t ucp_get"
)
sizes=$("$RAW" -s "$SIZES" --print-sizes)

# Each step appends "<round> <key> <bytes> <GB/s>" lines to all.txt, and for xfer
# "path_<key> <bytes> <shm %>" lines to path.txt.
xfer() {  # xfer NAME SIZE cmd...
  local name=$1 size=$2
  shift 2
  with_size "$size" "$@" | tee "$tmp/last_$name.txt" | xfer_rows "$name" |
    awk -v b="$size" -v pf="$tmp/path.txt" '$1 == "path" { print "path_" $2, b, $3 >>pf; next } { print }' | in_round >>"$tmp/all.txt"
}
raw() {  # memcpy and the raw cma loop over the walk pattern
  with_size "$1" "${cmd_raw[@]}" | tee "$tmp/last_raw.txt" |
    awk '/^#bytes/ { for (i = 2; i <= NF; i++) { c = $i; sub(/\[GB\/s\]/, "", c); col[i] = c }; next }
         /^[0-9]/ { for (i = 2; i <= NF; i++) { k = col[i]; if (k == "write") k = "rawcma_w"; if (k == "read") k = "rawcma_r"; print k, $1, $i } }' | in_round >>"$tmp/all.txt"
}
ucx() {
  local cfg name tls args
  [ $have_ucx = 1 ] || return 0
  for cfg in "${ucx_cfgs[@]}"; do
    IFS='|' read -r name tls args <<<"$cfg"
    # shellcheck disable=SC2086
    ucx_run "$name" "$tls" "$1" $args >"$tmp/ucx.txt"  # (not in a pipe: ucx_run counts ports)
    in_round <"$tmp/ucx.txt" >>"$tmp/all.txt"
  done
}
: >"$tmp/all.txt"
: >"$tmp/path.txt"

echo "compare_shm: $ROUNDS rounds, $DURATION s per cell, sizes $SIZES$([ $have_ucx = 1 ] || echo ", no ucx_perftest")" >&2
for r in $(seq 1 "$ROUNDS"); do
  ROUND=$r
  echo "  round $r/$ROUNDS" >&2
  for b in $sizes; do
    if [ $((r % 2)) = 1 ]; then
      xfer reuse "$b" "${cmd_reuse[@]}"; ucx "$b"; xfer walk "$b" "${cmd_walk[@]}"; raw "$b"
    else
      raw "$b"; xfer walk "$b" "${cmd_walk[@]}"; ucx "$b"; xfer reuse "$b" "${cmd_reuse[@]}"
    fi
  done
done
round_stats "$tmp/all.txt" "reuse_w/ucp_put reuse_r/ucp_get walk_w/memcpy walk_r/memcpy" >"$tmp/stats.txt"
# The least share of shm over the rounds, per (xfer cell, size).
awk '{ k = $1 " " $2; p = ($3 == "?") ? -1 : $3 + 0; if (!(k in v) || p < v[k]) v[k] = p } END { for (k in v) print k, v[k] }' \
  "$tmp/path.txt" >>"$tmp/stats.txt"

awk -v have_ucx=$have_ucx "$ROUND_TABLE_AWK"'
  $1 !~ /[\/]|^path_/ && !($2 in seen) { seen[$2] = 1; sizes[++n] = $2 }
  END {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (sizes[j] + 0 < sizes[i] + 0) { t = sizes[i]; sizes[i] = sizes[j]; sizes[j] = t }
    ok1 = ok2 = okp = 1
    print "| block | shm WRITE reuse | ucp_put posix | x/put | shm READ reuse | ucp_get posix | x/get | shm WRITE walk | shm READ walk | memcpy walk | W/memcpy | R/memcpy | raw cma W | raw cma R |"
    print "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= n; i++) {
      b = sizes[i]
      rw = g("reuse_w " b); rr = g("reuse_r " b); put = g("ucp_put " b); get = g("ucp_get " b)
      ww = g("walk_w " b); wr = g("walk_r " b); mc = g("memcpy " b)
      qp = g("reuse_w/ucp_put " b); qg = g("reuse_r/ucp_get " b); qw = g("walk_w/memcpy " b); qr = g("walk_r/memcpy " b)
      printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", b, f(rw), f(put), fr("reuse_w/ucp_put " b),
        f(rr), f(get), fr("reuse_r/ucp_get " b), f(ww), f(wr), f(mc), fr("walk_w/memcpy " b), fr("walk_r/memcpy " b), f(g("rawcma_w " b)), f(g("rawcma_r " b))
      if (have_ucx) {
        n1++
        if (qp < 1) { ok1 = 0; miss1 = miss1 sprintf(" WRITE@%s=%s", kib(b), qp < 0 ? "not measured" : fl(qp) "x") }
        if (qg < 1) { ok1 = 0; miss1 = miss1 sprintf(" READ@%s=%s", kib(b), qg < 0 ? "not measured" : fl(qg) "x") }
      }
      if (b >= 262144) {
        n2++
        if (qw < 0.9) { ok2 = 0; miss2 = miss2 sprintf(" WRITE@%s=%s", kib(b), qw < 0 ? "not measured" : fl(qw) "x") }
        if (qr < 0.9) { ok2 = 0; miss2 = miss2 sprintf(" READ@%s=%s", kib(b), qr < 0 ? "not measured" : fl(qr) "x") }
      }
      split("reuse_w reuse_r walk_w walk_r", cells, " ")
      for (c = 1; c <= 4; c++) {
        p = g("path_" cells[c] " " b)
        if (p != 100) { okp = 0; missp = missp sprintf(" %s@%s=%s", cells[c], kib(b), p < 0 ? "unknown" : p "%") }
      }
    }
    print ""
    print "GB/s (1e9 B/s): the median of the rounds. Ratios are taken within each round (the tools ran seconds apart); the table shows their median over the rounds (lowest-highest round in brackets), floored to 0.01. x/put, x/get: xfer over shm with --reuse / ucx_perftest over UCX_TLS=posix (ucp_put_bw, ucp_get; one buffer reused). W/memcpy, R/memcpy: xfer over shm walking 256 MiB per side / memcpy in one process over the same pattern. raw cma: process_vm_writev/readv, one call per block, same pattern (for reference). \"-\": not run."
    print ""
    printf "- target 1: shm WRITE and READ >= ucp_put_bw/ucp_get posix at every size 16K..8M (reuse): %s%s\n",
      !have_ucx ? "NOT CHECKED (no ucx_perftest)" : !n1 ? "NOT CHECKED (no sizes)" : ok1 ? "MET" : "NOT MET:", have_ucx ? miss1 : ""
    printf "- target 2: shm WRITE and READ >= 90%% of memcpy at >= 256 KiB (walk): %s%s\n",
      !n2 ? "NOT CHECKED (no size >= 256 KiB measured)" : ok2 ? "MET" : "NOT MET:", miss2
    printf "- every xfer cell moved 100%% of its bytes through shm (xfer-bench \"# path:\" lines): %s%s\n", okp ? "yes" : "NO:", missp
  }' "$tmp/stats.txt" >"$tmp/table.md"
echo
cat "$tmp/table.md"

if [ "$RESULTS" != "-" ]; then
  ucx_version=$(ucx_version)
  {
    echo "## shm (AllocMem memory, mapped) vs ucx_perftest posix and memcpy"
    echo
    written_by bench/compare_shm.sh "${ucx_version:+; UCX: $ucx_version}"
    echo
    echo "Command: \`bench/compare_shm.sh${1:+ $1}\` (DURATION=$DURATION ROUNDS=$ROUNDS SIZES=$SIZES UCX_BYTES=$UCX_BYTES), which runs, per SIZE in ${sizes//$'\n'/ }, alternating:"
    echo
    echo '```'
    q "${cmd_reuse[@]}"; echo
    if [ $have_ucx = 1 ]; then
      echo "# a server (ucx_perftest -p PORT ARGS -s SIZE -n N -w N/10) and a client, N = $UCX_BYTES / SIZE:"
      for cfg in "${ucx_cfgs[@]}"; do IFS='|' read -r name tls args <<<"$cfg"; echo "UCX_TLS=$tls ucx_perftest 127.0.0.1 -p PORT $args -s SIZE -n N -w N/10 -f   # $name"; done
    fi
    q "${cmd_walk[@]}"; echo
    q "${cmd_raw[@]}"; echo "   # memcpy column, and the raw cma loop"
    echo '```'
    echo
    cat "$tmp/table.md"
    echo
    results_plot shm "$tmp/stats.txt" "shm against ucx_perftest (posix) and memcpy, paired rounds" \
      --baseline '^(ucp|memcpy|rawcma)' --reference 'hixl_a3_bandwidth.tsv:scenario=single_machine,op=write,transport=RDMA,direction=H2H,path=direct@HIXL on Ascend A3: WRITE H2H over RDMA, one machine'
  } >"$tmp/results.md"
  results_section "$RESULTS" shm "$tmp/results.md"
  echo "wrote the shm section of $RESULTS"
fi
