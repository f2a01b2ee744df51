#!/usr/bin/env bash
# The buffer pool's cost on a CPU-only machine: every transfer staged through the engines'
# buffer pools (xfer-bench --buffer-pool: EngineOptions::staging = always, host memory standing
# in for GPU memory) against the same route unstaged, over ucx (UCX_TLS=tcp) and over tcp,
# WRITE and READ, per size in SIZES, one request at a time, in the same run. Staged, the
# initiator copies each batch into a staging buffer (WRITE) or out of one (READ) with memcpy on
# the same two cores that move the bytes; the target stages too (its staging = always): over tcp
# through its data connections' buffers, over ucx through the staging slots it lends (docs/gpu.md,
# "Staging at the target").
#
# Every cell runs ROUNDS times, direct and staged alternating (which goes first alternating by
# round); a ratio is staged / direct within each round, then the median over the rounds ("Rounds"
# in bench/lib.sh). Prints the table and the goal (staged >= 0.8x direct at 1-8 MiB), and writes
# them into bench/RESULTS.md as the section "## staged".
#
#   bench/compare_staged.sh [BUILD_DIR]        (default: build; it needs the ucx backend)
#   env: DURATION=0.3 (s per cell)  ROUNDS=5  SIZES=1M,2M,4M,8M  RESULTS=bench/RESULTS.md (- : do not write)
#        NOTE="..."  QUICK=1 (1 round, 0.1 s per cell: under a minute)
set -euo pipefail
if [ "${QUICK:-0}" = 1 ]; then
  DURATION=${DURATION:-0.1}; ROUNDS=${ROUNDS:-1}
fi
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh
BUILD=${1:-build}
DURATION=${DURATION:-0.3}
ROUNDS=${ROUNDS:-5}
SIZES=${SIZES:-1M,2M,4M,8M}
RESULTS=${RESULTS:-bench/RESULTS.md}
[ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja >/dev/null
cmake --build "$BUILD" --target xfer-bench >/dev/null
XB="$BUILD/tools/xfer-bench"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# cell NAME TRANSPORT [--buffer-pool]: WRITE and READ at every size, a local target child.
cell() {
  local name=$1 transport=$2
  shift 2
  local test
  for test in write_bw read_bw; do
    UCX_TLS=tcp "$XB" "$test" -s "$SIZES" -D "$DURATION" --transport "$transport" "$@" >"$tmp/out" 2>&1 ||
      { cat "$tmp/out" >&2; echo "compare_staged.sh: xfer-bench failed" >&2; exit 1; }
    xfer_rows "$name" <"$tmp/out" | grep -v '^path ' | in_round >>"$tmp/all.txt"
    if [ "$#" -gt 0 ] && ! grep -q "staged 100% ([0-9]* bytes via $transport)" "$tmp/out"; then
      cat "$tmp/out" >&2
      echo "compare_staged.sh: the staged bytes did not all go via $transport" >&2
      exit 1
    fi
  done
}
: >"$tmp/all.txt"
for ((r = 1; r <= ROUNDS; r++)); do
  ROUND=$r
  for t in ucx tcp; do
    if ((r % 2)); then
      cell "${t}D" "$t"
      cell "${t}S" "$t" --buffer-pool
    else
      cell "${t}S" "$t" --buffer-pool
      cell "${t}D" "$t"
    fi
  done
  echo "round $r of $ROUNDS done" >&2
done
round_stats "$tmp/all.txt" "ucxS_w/ucxD_w ucxS_r/ucxD_r tcpS_w/tcpD_w tcpS_r/tcpD_r" >"$tmp/stats.txt"

{
  echo "## staged: the buffer pool against the same route unstaged (CPU stand-in)"
  echo
  written_by bench/compare_staged.sh
  echo
  echo "Command: \`bench/compare_staged.sh\` (DURATION=$DURATION ROUNDS=$ROUNDS SIZES=$SIZES), per round, direct and staged alternating:"
  echo
  echo '```'
  echo "UCX_TLS=tcp $XB write_bw|read_bw -s $SIZES -D $DURATION --transport ucx|tcp [--buffer-pool]"
  echo '```'
  echo
  echo "| block | ucx W direct | staged | x | ucx R direct | staged | x | tcp W direct | staged | x | tcp R direct | staged | x |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  awk "$ROUND_TABLE_AWK"'
    { b[$2] = 1 }
    END {
      n = 0; for (x in b) { n++; s[n] = x + 0 }
      for (i = 2; i <= n; i++) { x = s[i]; for (j = i - 1; j >= 1 && s[j] > x; j--) s[j + 1] = s[j]; s[j + 1] = x }
      for (i = 1; i <= n; i++) {
        k = s[i]; line = "| " kib(k)
        split("ucx_w ucx_r tcp_w tcp_r", cs, " ")
        for (c = 1; c <= 4; c++) {
          split(cs[c], tw, "_"); d = tw[1] "D_" tw[2]; st = tw[1] "S_" tw[2]
          line = line " | " f(g(d " " k)) " | " f(g(st " " k)) " | " fr(st "/" d " " k)
        }
        print line " |"
      }
    }' "$tmp/stats.txt"
  echo
  echo "GB/s (1e9 B/s): the median of the rounds; one request of one descriptor at a time, a local target child (forced transport). x: staged / direct within each round, the median over the rounds (lowest-highest round in brackets), floored to 0.01. Staged: every byte through this side's staging buffers (memcpy), then the route, and the target stages too (tcp: its own pool's buffers; ucx: the slots it lends)."
  echo
  awk '$1 ~ /S_[wr]\/.*D_[wr]$/ && $2 >= 1048576 && $2 <= 8388608 { if ($3 < 0.8) miss = miss " " $1 "@" $2 "=" sprintf("%.2f", int($3 * 100) / 100) "x" }
    END { print "- goal: staged >= 0.8x the same route unstaged at 1-8 MiB (ucx and tcp, WRITE and READ): " (miss == "" ? "MET" : "NOT MET:" miss) }' "$tmp/stats.txt"
} >"$tmp/results.md"
cat "$tmp/results.md"
if [ "$RESULTS" != - ]; then
  results_section "$RESULTS" staged "$tmp/results.md"
  echo "(written into $RESULTS)" >&2
fi
