#!/usr/bin/env bash
# What a notification costs: the same xfer-bench cells with and without --notify (every request
# carries a 16-byte notification and completes once the target has queued it), alternating
# within each round, so each ratio is paired (bench/lib.sh). Per transport: requests/s of
# 16 KiB WRITEs (8 in flight), 16 KiB x 1000-descriptor WRITE bandwidth, and the 8-byte WRITE
# latency (t_typ, the median), against the engine's control round trip measured in the same
# rounds (bench/control_rtt: GetRemoteRegions' Sync round trip, p50).
# Writes the section "## notify" of bench/RESULTS.md and prints it.
#
#   bench/compare_notify.sh      env: DURATION=0.5 (s per cell)  BATCH_DURATION=2 (s for the 16 MiB
#                                requests of the batch cell: 0.5 s holds only a few dozen over ucx)
#                                ROUNDS=5  TRANSPORTS="shm cma tcp ucx"
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
DURATION=${DURATION:-0.5}
BATCH_DURATION=${BATCH_DURATION:-2}
ROUNDS=${ROUNDS:-5}
TRANSPORTS=${TRANSPORTS:-shm cma tcp ucx}
cmake --build build --target xfer-bench control_rtt >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export UCX_TLS=${UCX_TLS:-tcp}  # (no RDMA device here: UCX over its tcp transport)

mem_of() { [ "$1" = shm ] && echo alloc || echo register; }
# measure KIND TRANSPORT CELL: "<key> <bytes> <value>" (value: GB/s for rate and batch, us for lat)
measure() {
  local kind=$1 t=$2 cell=$3 args col seconds=$DURATION
  case $cell in
    rate) args="write_bw -s 16K --depth 8"; col=3 ;;
    batch) args="write_bw -s 16K --batch 1000 --depth 2"; col=3; seconds=$BATCH_DURATION ;;
    lat) args="write_lat -s 8"; col=5 ;;
  esac
  # shellcheck disable=SC2086
  build/tools/xfer-bench $args --transport "$t" --mem "$(mem_of "$t")" -D "$seconds" \
      $([ "$kind" = notify ] && echo --notify) 2>"$tmp/err.txt" |
    awk -v k="${kind}_${t}_$cell" -v c="$col" '/^[0-9]/ { print k, $1, $c; print k "_srvcpu", $1, $11; exit }' |
    in_round >>"$tmp/all.txt" ||
    { echo "compare_notify: xfer-bench $args --transport $t failed:" >&2; cat "$tmp/err.txt" >&2; exit 1; }
}
: >"$tmp/all.txt"
echo "compare_notify: $ROUNDS rounds, $DURATION s per cell ($BATCH_DURATION s the batch cell), transports $TRANSPORTS" >&2
for r in $(seq 1 "$ROUNDS"); do
  ROUND=$r
  echo "  round $r/$ROUNDS" >&2
  build/bench/control_rtt 3000 | awk '{ print "ctl_" $1, 0, $2 }' | in_round >>"$tmp/all.txt"
  for t in $TRANSPORTS; do
    for cell in rate batch lat; do
      if [ $((r % 2)) = 1 ]; then measure plain "$t" $cell; measure notify "$t" $cell
      else measure notify "$t" $cell; measure plain "$t" $cell; fi
    done
  done
done
pairs=""
for t in $TRANSPORTS; do for cell in rate batch lat; do pairs+=" notify_${t}_$cell/plain_${t}_$cell"; done; done
round_stats "$tmp/all.txt" "$pairs" >"$tmp/stats.txt"

awk -v ts="$TRANSPORTS" "$ROUND_TABLE_AWK"'
  function one(k,   b) { for (b in seen) if ((k " " b) in v) return k " " b; return "" }
  { split($1, p, "/"); if (p[2] == "") seen[$2] = 1 }
  END {
    rtt = g("ctl_sync 0")
    printf "Control round trip (bench/control_rtt, p50, median of the rounds): %.1f us (SendNotify alone: %.1f us).\n\n", rtt, g("ctl_notify 0")
    print "| transport | 16 KiB WRITE requests/s: plain | with --notify | notify/plain | 16 KiB x 1000 WRITE GB/s: plain | with --notify | notify/plain | target CPU %: plain | with --notify | 8 B WRITE t_typ us: plain | with --notify | extra us | extra / round trip |"
    print "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    n = split(ts, t, " ")
    for (i = 1; i <= n; i++) {
      rp = g("plain_" t[i] "_rate 16384"); rn = g("notify_" t[i] "_rate 16384")
      bp = g("plain_" t[i] "_batch 16384"); bn = g("notify_" t[i] "_batch 16384")
      cp = g("plain_" t[i] "_batch_srvcpu 16384"); cn = g("notify_" t[i] "_batch_srvcpu 16384")
      lp = g("plain_" t[i] "_lat 8"); ln = g("notify_" t[i] "_lat 8")
      printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", t[i],
        rp < 0 ? "-" : sprintf("%.0f", rp * 1e9 / 16384), rn < 0 ? "-" : sprintf("%.0f", rn * 1e9 / 16384),
        fr("notify_" t[i] "_rate/plain_" t[i] "_rate 16384"), f(bp), f(bn),
        fr("notify_" t[i] "_batch/plain_" t[i] "_batch 16384"), cp < 0 ? "-" : cp, cn < 0 ? "-" : cn, f(lp), f(ln), (lp < 0 || ln < 0) ? "-" : sprintf("%.1f", ln - lp),
        (lp < 0 || ln < 0 || rtt <= 0) ? "-" : sprintf("%.2f", (ln - lp) / rtt)
    }
  }' "$tmp/stats.txt" >"$tmp/table.md"

{
  echo "## notify: what a notification costs"
  echo
  written_by bench/compare_notify.sh "; UCX_TLS=$UCX_TLS"
  echo
  echo "Command: \`bench/compare_notify.sh\` (DURATION=$DURATION BATCH_DURATION=$BATCH_DURATION ROUNDS=$ROUNDS TRANSPORTS=\"$TRANSPORTS\"): per round, transport and cell, xfer-bench without and with --notify one after the other (which goes first alternating by round), a target child process each. Ratios are medians of the per-round ratios (lowest-highest round); latencies are medians of the rounds' t_typ; target CPU: the target process's CPU time in the batch cell (xfer-bench's srvCPU%, 100 = one core), the median of the rounds."
  echo
  cat "$tmp/table.md"
  echo
  results_plot notify "$tmp/stats.txt" "with --notify / without, paired rounds"
} >"$tmp/section.md"
results_section bench/RESULTS.md notify "$tmp/section.md"
cat "$tmp/section.md"
