#!/usr/bin/env bash
# What counting metrics costs: the same xfer-bench cells with metrics on (the default) and with
# --no-metrics (EngineOptions::metrics = false), alternating within each round, so each ratio
# is paired (bench/lib.sh). Per transport: 16 KiB WRITEs one at a time (--reuse: in cache, where
# the engine's own cost shows most), the same with --spin 0 (no stream spins to take half of an
# shm copy: the copy stays on the caller, and the cell is steady), 16 KiB WRITEs 8 in flight, and
# 8-byte WRITEs one at a time.
# Writes the section "## metrics" of bench/RESULTS.md and prints it.
#
#   bench/compare_metrics.sh     env: DURATION=0.5 (s per cell)  ROUNDS=7  TRANSPORTS="shm cma tcp"
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
DURATION=${DURATION:-0.5}
ROUNDS=${ROUNDS:-7}
TRANSPORTS=${TRANSPORTS:-shm cma tcp}
cmake --build build --target xfer-bench >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mem_of() { [ "$1" = shm ] && echo alloc || echo register; }
# measure KIND TRANSPORT CELL: "<key> <bytes> <M requests/s>" (xfer-bench's MsgRate column)
measure() {
  local kind=$1 t=$2 cell=$3 args
  case $cell in
    one) args="write_bw -s 16K --reuse" ;;
    caller) args="write_bw -s 16K --reuse --spin 0" ;;
    depth8) args="write_bw -s 16K --reuse --depth 8" ;;
    small) args="write_bw -s 8 --reuse" ;;
  esac
  # shellcheck disable=SC2086
  build/tools/xfer-bench $args --transport "$t" --mem "$(mem_of "$t")" -D "$DURATION" \
      $([ "$kind" = off ] && echo --no-metrics) 2>"$tmp/err.txt" |
    awk -v k="${kind}_${t}_$cell" '/^[0-9]/ { print k, $1, $6; exit }' | in_round >>"$tmp/all.txt" ||
    { echo "compare_metrics: xfer-bench $args --transport $t failed:" >&2; cat "$tmp/err.txt" >&2; exit 1; }
}
CELLS="one caller depth8 small"
: >"$tmp/all.txt"
echo "compare_metrics: $ROUNDS rounds, $DURATION s per cell, transports $TRANSPORTS" >&2
for r in $(seq 1 "$ROUNDS"); do
  ROUND=$r
  echo "  round $r/$ROUNDS" >&2
  for t in $TRANSPORTS; do
    for cell in $CELLS; do
      if [ $((r % 2)) = 1 ]; then measure on "$t" "$cell"; measure off "$t" "$cell"
      else measure off "$t" "$cell"; measure on "$t" "$cell"; fi
    done
  done
done
pairs=""
for t in $TRANSPORTS; do for cell in $CELLS; do pairs+=" on_${t}_$cell/off_${t}_$cell"; done; done
round_stats "$tmp/all.txt" "$pairs" >"$tmp/stats.txt"

awk -v ts="$TRANSPORTS" "$ROUND_TABLE_AWK"'
  function rate(k, b,   x) { x = g(k " " b); return x < 0 ? "-" : sprintf("%.2f", x) }
  function row(t, cell, b, what) {
    printf "| %s | %s | %s | %s | %s |\n", t, what, rate("off_" t "_" cell, b), rate("on_" t "_" cell, b),
      fr("on_" t "_" cell "/off_" t "_" cell " " b)
  }
  END {
    print "| transport | cell | M requests/s, metrics off | metrics on | on/off |"
    print "|---|---|---:|---:|---:|"
    n = split(ts, t, " ")
    for (i = 1; i <= n; i++) {
      row(t[i], "one", 16384, "16 KiB WRITE, one at a time")
      row(t[i], "caller", 16384, "16 KiB WRITE, one at a time, --spin 0")
      row(t[i], "depth8", 16384, "16 KiB WRITE, 8 in flight")
      row(t[i], "small", 8, "8 B WRITE, one at a time")
    }
  }' "$tmp/stats.txt" >"$tmp/table.md"

{
  echo "## metrics: what counting costs"
  echo
  written_by bench/compare_metrics.sh
  echo
  echo "Command: \`bench/compare_metrics.sh\` (DURATION=$DURATION ROUNDS=$ROUNDS TRANSPORTS=\"$TRANSPORTS\"): per round, transport and cell, xfer-bench with --no-metrics and without (metrics on, the default) one after the other (which goes first alternating by round), --reuse, a target child process each. Ratios are medians of the per-round ratios (lowest-highest round); rates are medians of the rounds."
  echo
  cat "$tmp/table.md"
  echo
  results_plot metrics "$tmp/stats.txt" "metrics on / off, paired rounds"
} >"$tmp/section.md"
results_section bench/RESULTS.md metrics "$tmp/section.md"
cat "$tmp/section.md"
