#!/usr/bin/env bash
# What EngineOptions::tcp.checksum costs: the same xfer-bench cells over tcp with and without
# --checksum (every batch carries its payload's XXH3-64 checksum, checked by the side that
# receives it), alternating within each round, so each ratio is paired (bench/lib.sh). WRITE and
# READ bandwidth at 64 KiB, 1 MiB and 8 MiB, direct and staged (--buffer-pool), and the 8-byte
# WRITE latency (t_typ, the median).
# Writes the section "## checksum" of bench/RESULTS.md and prints it.
#
#   bench/compare_checksum.sh      env: DURATION=0.5 (s per size)  ROUNDS=5
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
DURATION=${DURATION:-0.5}
ROUNDS=${ROUNDS:-5}
cmake --build build --target xfer-bench >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run KIND PATH: bandwidth rows "KIND_PATH_w|r <bytes> <GB/s>"; direct runs add "KIND_lat 8 <us>"
run() {
  local kind=$1 path=$2 flags=()
  [ "$kind" = sum ] && flags+=(--checksum)
  [ "$path" = staged ] && flags+=(--buffer-pool)
  build/tools/xfer-bench -s 64K,1M,8M --transport tcp --mem register -D "$DURATION" "${flags[@]}" \
      2>"$tmp/err.txt" | xfer_rows "${kind}_$path" | grep -v '^path' | in_round >>"$tmp/all.txt" ||
    { echo "compare_checksum: xfer-bench ${flags[*]} failed:" >&2; cat "$tmp/err.txt" >&2; exit 1; }
  if [ "$path" = direct ]; then
    build/tools/xfer-bench write_lat -s 8 --transport tcp --mem register -D "$DURATION" "${flags[@]}" 2>"$tmp/err.txt" |
      awk -v k="${kind}_lat" '/^[0-9]/ { print k, $1, $5; exit }' | in_round >>"$tmp/all.txt"
  fi
}
: >"$tmp/all.txt"
echo "compare_checksum: $ROUNDS rounds, $DURATION s per size" >&2
for r in $(seq 1 "$ROUNDS"); do
  ROUND=$r
  echo "  round $r/$ROUNDS" >&2
  for path in direct staged; do
    if [ $((r % 2)) = 1 ]; then run plain $path; run sum $path; else run sum $path; run plain $path; fi
  done
done
pairs="sum_lat/plain_lat"
for path in direct staged; do for op in w r; do pairs+=" sum_${path}_$op/plain_${path}_$op"; done; done
round_stats "$tmp/all.txt" "$pairs" >"$tmp/stats.txt"

awk "$ROUND_TABLE_AWK"'
  END {
    print "| path | size | WRITE GB/s: plain | --checksum | checksum/plain | READ GB/s: plain | --checksum | checksum/plain |"
    print "|---|---:|---:|---:|---:|---:|---:|---:|"
    split("direct staged", paths, " "); split("65536 1048576 8388608", sizes, " ")
    for (i = 1; i <= 2; i++) for (j = 1; j <= 3; j++) {
      p = paths[i]; b = sizes[j]
      printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", p, kib(b),
        f(g("plain_" p "_w " b)), f(g("sum_" p "_w " b)), fr("sum_" p "_w/plain_" p "_w " b),
        f(g("plain_" p "_r " b)), f(g("sum_" p "_r " b)), fr("sum_" p "_r/plain_" p "_r " b)
    }
    printf "\n8 B WRITE t_typ: %s us plain, %s us with --checksum (ratio %s).\n", f(g("plain_lat 8")), f(g("sum_lat 8")), fr("sum_lat/plain_lat 8")
  }' "$tmp/stats.txt" >"$tmp/table.md"

{
  echo "## checksum: what tcp.checksum costs"
  echo
  written_by bench/compare_checksum.sh
  echo
  echo "Command: \`bench/compare_checksum.sh\` (DURATION=$DURATION ROUNDS=$ROUNDS): per round and path, xfer-bench over tcp (\`--mem register\`, a target child process) without and with --checksum one after the other (which goes first alternating by round); staged: \`--buffer-pool\` on both sides. Ratios are medians of the per-round ratios (lowest-highest round)."
  echo
  cat "$tmp/table.md"
  echo
  results_plot checksum "$tmp/stats.txt" "tcp with --checksum and without, paired rounds" --curves '_[wr]$' --baseline '^plain'
} >"$tmp/section.md"
results_section bench/RESULTS.md checksum "$tmp/section.md"
cat "$tmp/section.md"
