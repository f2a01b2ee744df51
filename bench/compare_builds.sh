#!/usr/bin/env bash
# xfer against itself: the same xfer-bench cells from two builds (before and after a change),
# alternating within each round, so each cell's after/before ratio is paired (bench/lib.sh) and
# the median over the rounds says whether the change cost anything. Cells: shm (AllocMem memory,
# one host), cma (registered memory, one host), tcp (forced, one and two links), each WRITE and
# READ at a few sizes, plus 16 KiB x 1000-descriptor batches over tcp and cma, and 8-byte shm
# messages.
# Writes the section "## builds" of bench/RESULTS.md and prints it.
#
#   bench/compare_builds.sh BEFORE_BUILD_DIR [AFTER_BUILD_DIR]   (after: default build)
#   env: DURATION=0.3 (s per size)  ROUNDS=11  CELLS="shm cma tcp tcp2 batch cbatch msg"
#        (also: nshm ncma ntcp nucx, 16 KiB requests that each carry a notification;
#        kshm kcma ktcp kucx kstaged, 1 and 4 MiB WRITEs, for AFTER_ARGS="--set checksum=true";
#        stcp sucx, 1-8 MiB through the buffer pools over tcp and ucx: xfer-bench --buffer-pool)
#        AFTER_ARGS="..." (more xfer-bench arguments for the after side alone: with the same
#        build twice, what an option costs, e.g. AFTER_ARGS="--set notify.outcomes=true")
#        BEFORE_ARGS="..." (the same for the before side: what both sides share)
#        QUICK=1 (1 round, 0.1 s per size)
# BEFORE_BUILD_DIR is a build of the other revision (e.g. a git worktree's build/), with
# xfer-bench built.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
if [ "${QUICK:-0}" = 1 ]; then DURATION=${DURATION:-0.1}; ROUNDS=${ROUNDS:-1}; fi
BEFORE=${1:?usage: bench/compare_builds.sh BEFORE_BUILD_DIR [AFTER_BUILD_DIR]}
AFTER=${2:-build}
DURATION=${DURATION:-0.3}
ROUNDS=${ROUNDS:-11}
CELLS=${CELLS:-shm cma tcp tcp2 batch cbatch msg}
for b in "$BEFORE" "$AFTER"; do
  [ -x "$b/tools/xfer-bench" ] || { echo "compare_builds: no $b/tools/xfer-bench (build it first)" >&2; exit 1; }
done
[ "$AFTER" != build ] || cmake --build build --target xfer-bench >/dev/null
rev_of() { git -C "$(dirname "$(cd "$1" && pwd)")" rev-parse --short HEAD 2>/dev/null || echo "?"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# cell NAME: the xfer-bench arguments of that cell.
cell_args() {
  case $1 in
    shm) echo "-s 16K,256K,4M --transport shm --mem alloc" ;;
    cma) echo "-s 16K,256K,4M --transport cma --mem register" ;;
    tcp) echo "-s 1M,4M --transport tcp --mem register --links 1" ;;
    tcp2) echo "-s 1M,4M --transport tcp --mem register --links 2" ;;
    batch) echo "-s 16K --batch 1000 --transport tcp --mem register" ;;
    cbatch) echo "-s 16K --batch 1000 --transport cma --mem register" ;;
    msg) echo "-s 8 --transport shm --mem alloc --reuse" ;;
    nshm | ncma | ntcp | nucx)  # notified 16 KiB requests (--notify), 8 in flight
      local t=${1#n}
      echo "-s 16K --depth 8 --notify --transport $t --mem $([ "$t" = shm ] && echo alloc || echo register)" ;;
    kshm) echo "-s 1M,4M --transport shm --mem alloc" ;;
    kcma | ktcp | kucx) echo "-s 1M,4M --transport ${1#k} --mem register" ;;
    kstaged) echo "-s 1M,4M --transport tcp --mem register --set staging=always" ;;
    stcp | sucx) echo "-s 1M,2M,4M,8M --transport ${1#s} --buffer-pool" ;;
    *) echo "compare_builds: unknown cell $1" >&2; exit 1 ;;
  esac
}
AFTER_ARGS=${AFTER_ARGS:-}
BEFORE_ARGS=${BEFORE_ARGS:-}
run() {  # run WHICH BUILD CELL: "<round> WHICH_CELL_w <bytes> <GB/s>" lines into all.txt
  local which=$1 build=$2 cell=$3 more=""
  if [ "$which" = after ]; then more=$AFTER_ARGS; else more=$BEFORE_ARGS; fi
  # shellcheck disable=SC2046,SC2086
  "$build/tools/xfer-bench" $(cell_args "$cell") -D "$DURATION" $more 2>"$tmp/err.txt" |
    xfer_rows "${which}_$cell" | awk '$1 != "path"' | in_round >>"$tmp/all.txt" ||
    { echo "compare_builds: $build/tools/xfer-bench $(cell_args "$cell") failed:" >&2; cat "$tmp/err.txt" >&2; exit 1; }
}
: >"$tmp/all.txt"
echo "compare_builds: $ROUNDS rounds, $DURATION s per size, cells $CELLS; before $BEFORE ($(rev_of "$BEFORE")), after $AFTER ($(rev_of "$AFTER"))" >&2
for r in $(seq 1 "$ROUNDS"); do
  ROUND=$r
  echo "  round $r/$ROUNDS" >&2
  for c in $CELLS; do
    if [ $((r % 2)) = 1 ]; then run before "$BEFORE" "$c"; run after "$AFTER" "$c"
    else run after "$AFTER" "$c"; run before "$BEFORE" "$c"; fi
  done
done
pairs=""
for c in $CELLS; do pairs+=" after_${c}_w/before_${c}_w after_${c}_r/before_${c}_r"; done
round_stats "$tmp/all.txt" "$pairs" >"$tmp/stats.txt"

awk -v cells="$CELLS" "$ROUND_TABLE_AWK"'
  function g3(x) { return x < 0 ? "-" : sprintf("%.3g", x) }
  $1 ~ /^before_/ && !($1 " " $2 in seen) { seen[$1 " " $2] = 1; key = substr($1, 8); rows[++n] = key " " $2 }
  END {
    print "| cell | op | block | before GB/s | after GB/s | after/before (rounds lo-hi) |"
    print "|---|---|---:|---:|---:|---:|"
    nc = split(cells, cl, " ")
    for (c = 1; c <= nc; c++) for (o = 1; o <= 2; o++) {
      op = o == 1 ? "w" : "r"
      # sizes of this cell and op, ascending
      m = 0
      for (i = 1; i <= n; i++) { split(rows[i], kb, " "); if (kb[1] == cl[c] "_" op) s[++m] = kb[2] + 0 }
      for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (s[j] < s[i]) { t = s[i]; s[i] = s[j]; s[j] = t }
      for (i = 1; i <= m; i++) {
        b = s[i]; k = cl[c] "_" op
        printf "| %s | %s | %s | %s | %s | %s |\n", cl[c], op == "w" ? "WRITE" : "READ", b < 1024 ? b " B" : kib(b),
          g3(g("before_" k " " b)), g3(g("after_" k " " b)), fr("after_" k "/before_" k " " b)
      }
    }
  }' "$tmp/stats.txt" >"$tmp/table.md"

{
  echo "## builds: xfer against an earlier build of itself"
  echo
  written_by bench/compare_builds.sh "; before: $BEFORE at $(rev_of "$BEFORE"), after: $AFTER at $(rev_of "$AFTER")"
  echo
  echo "Command: \`bench/compare_builds.sh $BEFORE $AFTER\` (DURATION=$DURATION ROUNDS=$ROUNDS CELLS=\"$CELLS\"${BEFORE_ARGS:+ BEFORE_ARGS=\"$BEFORE_ARGS\"}${AFTER_ARGS:+ AFTER_ARGS=\"$AFTER_ARGS\"}): per round and cell, xfer-bench of both builds one after the other (which goes first alternating by round), with a target child process each. after/before is the median of the per-round ratios, with the lowest and highest round; 1.00 = no change. GB/s columns are the medians of the rounds."
  echo
  cat "$tmp/table.md"
  echo
  results_plot builds "$tmp/stats.txt" "this build (after) against $BEFORE (before)" --baseline '^before'
} >"$tmp/section.md"
results_section bench/RESULTS.md builds "$tmp/section.md"
cat "$tmp/section.md"
