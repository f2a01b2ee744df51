#!/usr/bin/env bash
# Small transfers: what xfer spends around the copy, against what the copy alone reaches, in
# the cells of issue 23, every cell measured in each round (the tools alternating, which goes
# first alternating by round; see "Rounds" in bench/lib.sh):
#   d1     shm, 16 KiB WRITE and READ, one request at a time, --reuse (in cache)
#   d8     the same, 8 requests in flight (TransferAsync)
#          against ucx_perftest ucp_put_bw / ucp_get over UCX_TLS=posix, 16 KiB
#   b64    shm, 64 B x 1000 descriptors per request, --reuse; against ucp_put_bw / ucp_get,
#          64 B (UCX's message rate; the same bytes per message, so GB/s ratios are rate ratios)
#   cma    cma, 64 B x 1000 descriptors per request, --reuse; against bench/raw_cma, the same
#          1000 blocks per process_vm_writev/readv call (the syscall's own ceiling)
#   local  the engine's own memory (no peer process), 16 KiB, --reuse; against a memcpy loop
#          over the same buffers (bench/raw_cma's memcpy column)
#   walk   shm, 16 KiB, 256 KiB and 8 MiB walking 256 MiB per side (cold memory); against
#          memcpy over the same pattern
#   p64, pcma, pd1  the b64, cma and d1 cells over prepared lists (xfer-bench --prepared:
#          requests by index; the same request again reuses its plan)
#   share  the sharing rule (docs/transports.md, shm): shm one at a time, 16..128 KiB, --reuse
#          and walking, as the engine runs by default (from 16 KiB, a spinning stream copies
#          half of a copy where the engine measures that to be faster) against --spin 0 (the
#          caller copies it all)
# With BEFORE=DIR (a build of an earlier revision, with its tools/xfer-bench), the cells above
# but share also run from that build in the same rounds, and the table adds after/before.
# Prints the table and the goals, and writes them into bench/RESULTS.md as the section
# "## small" (the rest of the file is kept), with its plot in bench/img/small.png.
#
#   bench/compare_small.sh [BUILD_DIR]        (default: build)
#   env: DURATION=0.3 (s per cell)  ROUNDS=5  BEFORE=DIR  UCX=0 (skip UCX)
#        RESULTS=bench/RESULTS.md (RESULTS=- : do not write it)  NOTE="..."
#        QUICK=1 (1 round, 0.1 s per cell)
set -euo pipefail
if [ "${QUICK:-0}" = 1 ]; then DURATION=${DURATION:-0.1}; ROUNDS=${ROUNDS:-1}; fi
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh
BUILD=${1:-build}
DURATION=${DURATION:-0.3}
ROUNDS=${ROUNDS:-5}
BEFORE=${BEFORE:-}
RESULTS=${RESULTS:-bench/RESULTS.md}
UCX_BYTES=${UCX_BYTES:-1G}
UCX_MAX_N=${UCX_MAX_N:-5000000}  # (64 B messages: 200,000 of them last a few ms)
[ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja >/dev/null
cmake --build "$BUILD" --target xfer-bench raw_cma >/dev/null
if [ -n "$BEFORE" ] && [ ! -x "$BEFORE/tools/xfer-bench" ]; then
  echo "compare_small: no $BEFORE/tools/xfer-bench (build the earlier revision there first)" >&2
  exit 1
fi
have_ucx=0
if [ "${UCX:-1}" = 1 ] && command -v ucx_perftest >/dev/null; then have_ucx=1; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# cell NAME: the xfer-bench arguments of that cell (after the binary).
cell_args() {
  case $1 in
    d1) echo "-s 16K --transport shm --mem alloc --reuse" ;;
    d8) echo "-s 16K --transport shm --mem alloc --reuse --depth 8" ;;
    b64) echo "-s 64 --batch 1000 --transport shm --mem alloc --reuse" ;;
    cma) echo "-s 64 --batch 1000 --transport cma --mem register --reuse" ;;
    local) echo "-s 16K --transport local --reuse" ;;
    p64) echo "-s 64 --batch 1000 --transport shm --mem alloc --reuse --prepared" ;;
    pcma) echo "-s 64 --batch 1000 --transport cma --mem register --reuse --prepared" ;;
    pd1) echo "-s 16K --transport shm --mem alloc --reuse --prepared" ;;
    walk) echo "-s 16K,256K,8M --transport shm --mem alloc" ;;
    share_reuse) echo "-s 16K,32K,64K,128K --transport shm --mem alloc --reuse" ;;
    alone_reuse) echo "-s 16K,32K,64K,128K --transport shm --mem alloc --reuse --spin 0" ;;
    share_walk) echo "-s 16K,32K,64K,128K --transport shm --mem alloc" ;;
    alone_walk) echo "-s 16K,32K,64K,128K --transport shm --mem alloc --spin 0" ;;
  esac
}
CELLS="d1 d8 b64 cma local p64 pcma pd1 walk share_reuse alone_reuse share_walk alone_walk"
BEFORE_CELLS="d1 d8 b64 cma local walk"  # (an earlier build runs these too)
# Baselines: NAME|command (SIZE replaced), each printing "<key> <bytes> <GB/s>" lines.
raw() {  # raw KEY_PREFIX ARGS...: bench/raw_cma's columns as "<prefix>_<column> <bytes> <GB/s>"
  local prefix=$1
  shift
  "$BUILD/bench/raw_cma" -D "$DURATION" "$@" |
    awk -v p="$prefix" '/^#bytes/ { for (i = 2; i <= NF; i++) { c = $i; sub(/\[GB\/s\]/, "", c); col[i] = c }; next }
         /^[0-9]/ { for (i = 2; i <= NF; i++) print p "_" col[i], $1, $i }'
}
baselines() {
  raw reuse -s 16K --reuse --op write    # reuse_memcpy 16384 (the local cell's memcpy)
  raw batch -s 64 --batch 1000 --reuse --no-memcpy |   # batch_write, batch_read 64 (1000 iovecs a call)
    awk '$1 ~ /_b1000$/ { sub(/_b1000$/, "", $1); print }'
  raw walk -s 16K,256K,8M --op write      # walk_memcpy
  if [ $have_ucx = 1 ]; then
    local s
    for s in 16384 64; do
      ucx_run ucp_put posix "$s" -t ucp_put_bw
      ucx_run ucp_get posix "$s" -t ucp_get
    done
  fi
}
# xfer WHICH BUILD CELL: "<which>_<cell>_w|_r <bytes> <GB/s>" lines
xfer() {
  local which=$1 build=$2 cell=$3
  # shellcheck disable=SC2046
  "$build/tools/xfer-bench" $(cell_args "$cell") -D "$DURATION" 2>"$tmp/err.txt" |
    xfer_rows "${which}_$cell" | awk '$1 != "path"' ||
    { echo "compare_small: $build/tools/xfer-bench $(cell_args "$cell") failed:" >&2; cat "$tmp/err.txt" >&2; exit 1; }
}
round() {
  local c
  for c in $CELLS; do
    xfer x "$BUILD" "$c"
    if [ -n "$BEFORE" ] && [[ " $BEFORE_CELLS " == *" $c "* ]]; then xfer before "$BEFORE" "$c"; fi
  done
}
: >"$tmp/all.txt"
echo "compare_small: $ROUNDS rounds, $DURATION s per cell$([ $have_ucx = 1 ] || echo ", no ucx_perftest")${BEFORE:+, before: $BEFORE}" >&2
for r in $(seq 1 "$ROUNDS"); do
  ROUND=$r
  echo "  round $r/$ROUNDS" >&2
  if [ $((r % 2)) = 1 ]; then
    { round; baselines; } | in_round >>"$tmp/all.txt"
  else
    { baselines; round; } | in_round >>"$tmp/all.txt"
  fi
done
pairs="x_d1_w/ucp_put x_d1_r/ucp_get x_d8_w/ucp_put x_d8_r/ucp_get x_b64_w/ucp_put x_b64_r/ucp_get"
pairs+=" x_cma_w/batch_write x_cma_r/batch_read x_local_w/reuse_memcpy x_local_r/reuse_memcpy"
pairs+=" x_walk_w/walk_memcpy x_walk_r/walk_memcpy"
pairs+=" x_p64_w/ucp_put x_p64_r/ucp_get x_pcma_w/batch_write x_pcma_r/batch_read x_pd1_w/ucp_put x_pd1_r/ucp_get"
pairs+=" x_p64_w/x_b64_w x_p64_r/x_b64_r x_pcma_w/x_cma_w x_pcma_r/x_cma_r x_pd1_w/x_d1_w x_pd1_r/x_d1_r"
for p in reuse walk; do pairs+=" x_share_${p}_w/x_alone_${p}_w x_share_${p}_r/x_alone_${p}_r"; done
if [ -n "$BEFORE" ]; then
  for c in $BEFORE_CELLS; do pairs+=" x_${c}_w/before_${c}_w x_${c}_r/before_${c}_r"; done
fi
round_stats "$tmp/all.txt" "$pairs" >"$tmp/stats.txt"

awk -v have_ucx=$have_ucx -v before="$BEFORE" "$ROUND_TABLE_AWK"'
  function rate(k, b, per,   x) { x = g(k " " b); return x < 0 ? "-" : sprintf("%.2f", x * 1e9 / b / per) }
  function row(what, cell, op, b, base, bname,   k) {
    k = "x_" cell "_" op
    printf "| %s | %s | %s | %s | %s |%s\n", what, f(g(k " " b)), bname, f(g(base " " b)), fr(k "/" base " " b),
      before == "" ? "" : " " fr(k "/before_" cell "_" op " " b) " |"
  }
  function prow(what, cell, plain, op, b, base, bname,   k) {
    k = "x_" cell "_" op
    printf "| %s | %s | %s | %s | %s | %s |\n", what, f(g(k " " b)), bname, f(g(base " " b)), fr(k "/" base " " b),
      fr(k "/x_" plain "_" op " " b)
  }
  function goal(text, key, b, min,   q) {
    q = g(key " " b)
    printf "- %s: %s\n", text, q < 0 ? "NOT CHECKED (not measured)" : (q >= min ? "MET" : "NOT MET") " (" fl(q) "x)"
  }
  END {
    print "| cell | xfer GB/s | baseline | baseline GB/s | xfer/baseline |" (before == "" ? "" : " after/before |")
    print "|---|---:|---|---:|---:|" (before == "" ? "" : "---:|")
    row("shm 16 KiB WRITE, one at a time", "d1", "w", 16384, "ucp_put", "ucp_put_bw posix")
    row("shm 16 KiB READ, one at a time", "d1", "r", 16384, "ucp_get", "ucp_get posix")
    row("shm 16 KiB WRITE, 8 in flight", "d8", "w", 16384, "ucp_put", "ucp_put_bw posix")
    row("shm 16 KiB READ, 8 in flight", "d8", "r", 16384, "ucp_get", "ucp_get posix")
    row("shm 64 B x 1000 WRITE", "b64", "w", 64, "ucp_put", "ucp_put_bw posix, 64 B")
    row("shm 64 B x 1000 READ", "b64", "r", 64, "ucp_get", "ucp_get posix, 64 B")
    row("cma 64 B x 1000 WRITE", "cma", "w", 64, "batch_write", "process_vm_writev, 1000 iovecs")
    row("cma 64 B x 1000 READ", "cma", "r", 64, "batch_read", "process_vm_readv, 1000 iovecs")
    row("local 16 KiB WRITE", "local", "w", 16384, "reuse_memcpy", "memcpy loop")
    row("local 16 KiB READ", "local", "r", 16384, "reuse_memcpy", "memcpy loop")
    split("16384 262144 8388608", ws, " ")
    for (i = 1; i <= 3; i++) {
      row("shm " kib(ws[i]) " WRITE, walking 256 MiB", "walk", "w", ws[i], "walk_memcpy", "memcpy, same walk")
      row("shm " kib(ws[i]) " READ, walking 256 MiB", "walk", "r", ws[i], "walk_memcpy", "memcpy, same walk")
    }
    print ""
    print "Over prepared lists (xfer-bench --prepared), against the same baselines and against the same cell with descriptors:"
    print ""
    print "| cell | xfer GB/s | baseline | baseline GB/s | xfer/baseline | prepared/descriptors |"
    print "|---|---:|---|---:|---:|---:|"
    prow("shm 64 B x 1000 WRITE, prepared", "p64", "b64", "w", 64, "ucp_put", "ucp_put_bw posix, 64 B")
    prow("shm 64 B x 1000 READ, prepared", "p64", "b64", "r", 64, "ucp_get", "ucp_get posix, 64 B")
    prow("cma 64 B x 1000 WRITE, prepared", "pcma", "cma", "w", 64, "batch_write", "process_vm_writev, 1000 iovecs")
    prow("cma 64 B x 1000 READ, prepared", "pcma", "cma", "r", 64, "batch_read", "process_vm_readv, 1000 iovecs")
    prow("shm 16 KiB WRITE one at a time, prepared", "pd1", "d1", "w", 16384, "ucp_put", "ucp_put_bw posix")
    prow("shm 16 KiB READ one at a time, prepared", "pd1", "d1", "r", 16384, "ucp_get", "ucp_get posix")
    print ""
    print "The sharing rule: shm, one request at a time, as the engine runs by default (from 16 KiB a spinning stream copies half of a copy where the engine measures that to be faster) / with --spin 0 (the caller copies it all):"
    print ""
    print "| block | WRITE, in cache (--reuse) | READ, in cache | WRITE, walking 256 MiB | READ, walking 256 MiB |"
    print "|---|---:|---:|---:|---:|"
    split("16384 32768 65536 131072", ss, " ")
    for (i = 1; i <= 4; i++) {
      b = ss[i]
      printf "| %s | %s | %s | %s | %s |\n", kib(b), fr("x_share_reuse_w/x_alone_reuse_w " b), fr("x_share_reuse_r/x_alone_reuse_r " b),
        fr("x_share_walk_w/x_alone_walk_w " b), fr("x_share_walk_r/x_alone_walk_r " b)
    }
    print ""
    printf "Rates: 64 B cells %s M descriptors/s (xfer WRITE, shm; %s prepared), %s M messages/s (ucp_put_bw); cma %s M descriptors/s (WRITE; %s prepared), %s M (process_vm_writev).\n",
      rate("x_b64_w", 64, 1e6), rate("x_p64_w", 64, 1e6), rate("ucp_put", 64, 1e6), rate("x_cma_w", 64, 1e6),
      rate("x_pcma_w", 64, 1e6), rate("batch_write", 64, 1e6)
    print ""
    print "GB/s (1e9 B/s): medians of the rounds. Ratios: medians of the per-round ratios (lowest-highest round), floored to 0.01. \"-\": not run."
    print ""
    if (have_ucx) {
      goal("shm 16 KiB WRITE one at a time >= 0.9x ucp_put_bw", "x_d1_w/ucp_put", 16384, 0.9)
      goal("shm 16 KiB READ one at a time >= 0.9x ucp_get", "x_d1_r/ucp_get", 16384, 0.9)
      goal("shm 16 KiB WRITE 8 in flight >= 0.9x ucp_put_bw", "x_d8_w/ucp_put", 16384, 0.9)
      goal("shm 16 KiB READ 8 in flight >= 0.9x ucp_get", "x_d8_r/ucp_get", 16384, 0.9)
      goal("shm 64 B x 1000 WRITE >= 0.9x ucp_put_bw 64 B message rate", "x_b64_w/ucp_put", 64, 0.9)
      goal("shm 64 B x 1000 WRITE over prepared lists >= 0.9x ucp_put_bw 64 B message rate", "x_p64_w/ucp_put", 64, 0.9)
    } else {
      print "- the goals against ucx_perftest: NOT CHECKED (no ucx_perftest)"
    }
    goal("local 16 KiB WRITE within 1.5x of memcpy (>= 0.67x)", "x_local_w/reuse_memcpy", 16384, 0.667)
    if (before != "") {
      goal("cma 64 B x 1000 WRITE >= 2x the earlier build", "x_cma_w/before_cma_w", 64, 2)
      for (i = 1; i <= 3; i++) {
        goal("shm " kib(ws[i]) " WRITE walking: no regression (>= 0.95x the earlier build)", "x_walk_w/before_walk_w", ws[i], 0.95)
        goal("shm " kib(ws[i]) " READ walking: no regression (>= 0.95x the earlier build)", "x_walk_r/before_walk_r", ws[i], 0.95)
      }
    } else {
      print "- cma 2x and walking without regression, against an earlier build: NOT CHECKED (no BEFORE=DIR)"
    }
  }' "$tmp/stats.txt" >"$tmp/table.md"
echo
cat "$tmp/table.md"

if [ "$RESULTS" != "-" ]; then
  ucx_version=$(ucx_version)
  {
    echo "## small: what a small transfer costs around its copy"
    echo
    written_by bench/compare_small.sh "${ucx_version:+; UCX: $ucx_version}"
    echo
    echo "Command: \`bench/compare_small.sh${1:+ $1}\` (DURATION=$DURATION ROUNDS=$ROUNDS${BEFORE:+ BEFORE=$BEFORE ($(git -C "$BEFORE/.." rev-parse --short HEAD 2>/dev/null || echo "?"))}), which runs, per round:"
    echo
    echo '```'
    for c in $CELLS; do echo "$BUILD/tools/xfer-bench $(cell_args "$c") -D $DURATION"; done
    echo "$BUILD/bench/raw_cma -D $DURATION -s 16K --reuse --op write   # memcpy loop"
    echo "$BUILD/bench/raw_cma -D $DURATION -s 64 --batch 1000 --reuse --no-memcpy"
    echo "$BUILD/bench/raw_cma -D $DURATION -s 16K,256K,8M --op write   # memcpy, walking"
    [ $have_ucx = 1 ] && echo "UCX_TLS=posix ucx_perftest 127.0.0.1 -p PORT -t ucp_put_bw|ucp_get -s 16384|64 -n N -w N/10 -f   # N = min($UCX_BYTES / SIZE, $UCX_MAX_N), with its server"
    echo '```'
    echo
    cat "$tmp/table.md"
    echo
    results_plot small "$tmp/stats.txt" "small transfers: xfer against ucx_perftest (posix), process_vm_writev and memcpy" \
      --baseline '^(ucp|batch_|reuse_|walk_memcpy|before)'
  } >"$tmp/results.md"
  results_section "$RESULTS" small "$tmp/results.md"
  echo "wrote the small section of $RESULTS"
fi
