#!/usr/bin/env bash
# xfer's tcp transport against a raw TCP socket pair on loopback (bench/raw_tcp: one connection,
# blocks sent back to back), measured in the same run at the same block sizes and buffer
# pattern. xfer runs with one link and with LINKS links, WRITE and READ, plus 16 KiB blocks in
# batches of 1000. Every cell runs ROUNDS times, the tools alternating; a cell's GB/s is the
# median of its rounds and x/r the median of the rounds' xfer / raw (see "Rounds" in
# bench/lib.sh: this machine's cores are shared). Prints the table with the tcp targets and
# writes it into bench/RESULTS.md as the section that starts with "## tcp" (the rest of the
# file, which the other compare scripts write, is kept). xfer runs with --mem register (mmap'd
# memory, as the raw socket pair uses).
#
#   bench/compare_tcp.sh [BUILD_DIR]        (default: build)
#   env: DURATION=0.5  ROUNDS=21  SIZES=1M:8M  LINKS=2  BATCH=1000  BATCH_SIZE=16K
#        RESULTS=bench/RESULTS.md (RESULTS=- : do not write it)  NOTE="..."
#        QUICK=1 (1 round, 0.1 s per cell)
set -euo pipefail
if [ "${QUICK:-0}" = 1 ]; then DURATION=${DURATION:-0.1}; ROUNDS=${ROUNDS:-1}; fi
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh
BUILD=${1:-build}
DURATION=${DURATION:-0.5}
# 21 rounds: single rounds of one cell ranged 0.4-1.6 of raw here (1 MiB READ, one link, 122
# paired rounds), so the median of 11 still moved by about +-10 % from run to run.
ROUNDS=${ROUNDS:-21}
SIZES=${SIZES:-1M:8M}
LINKS=${LINKS:-2}
BATCH=${BATCH:-1000}
BATCH_SIZE=${BATCH_SIZE:-16K}
RESULTS=${RESULTS:-bench/RESULTS.md}
[ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja >/dev/null
cmake --build "$BUILD" --target xfer-bench raw_tcp >/dev/null
RAW="$BUILD/bench/raw_tcp"
XB="$BUILD/tools/xfer-bench"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cmd_raw=("$RAW" -s SIZE -D "$DURATION")
cmd_x1=("$XB" -s SIZE -D "$DURATION" --transport tcp --mem register --links 1)
cmd_xn=("$XB" -s SIZE -D "$DURATION" --transport tcp --mem register --links "$LINKS")
cmd_xb=("$XB" -s "$BATCH_SIZE" -D "$DURATION" --transport tcp --mem register --links "$LINKS" --batch "$BATCH")
sizes=$("$RAW" -s "$SIZES" --print-sizes)
batch_bytes=$("$RAW" -s "$BATCH_SIZE" --print-sizes)

# "<round> <column> <bytes> <GB/s>" lines from raw_tcp and xfer-bench tables. xfer-bench runs
# write_bw and read_bw as two invocations, each a fresh pair of processes as raw_tcp's is (READ
# right after WRITE in one invocation measured 5-12 % lower, in two sets of 6 paired rounds at
# 4 MiB; why, I did not find).
raw() { with_size "$1" "${cmd_raw[@]}" | awk '/^[0-9]/ { print "raw", $1, $3 }' | in_round >>"$tmp/all.txt"; }
xfer() {  # xfer NAME SIZE xfer-bench ARGS...
  local name=$1 size=$2 bin=$3 test
  shift 3
  for test in write_bw read_bw; do
    with_size "$size" "$bin" "$test" "$@" | tee "$tmp/last_${name}_$test.txt" |
      awk -v k="${name}_${test:0:1}" '/^[0-9]/ { print k, $1, $3 }' | in_round >>"$tmp/all.txt"
  done
}

echo "compare_tcp: $ROUNDS rounds, $DURATION s per cell, sizes $SIZES, links 1 and $LINKS" >&2
for r in $(seq 1 "$ROUNDS"); do
  ROUND=$r
  echo "  round $r/$ROUNDS" >&2
  for b in $sizes $batch_bytes; do
    if [ $((r % 2)) = 1 ]; then raw "$b"; fi
    [ "$b" = "$batch_bytes" ] || { xfer x1 "$b" "${cmd_x1[@]}"; xfer xn "$b" "${cmd_xn[@]}"; }
    if [ $((r % 2)) = 0 ]; then raw "$b"; fi
  done
  xfer xb "$batch_bytes" "${cmd_xb[@]}"
done

round_stats "$tmp/all.txt" "x1_w/raw x1_r/raw xn_w/raw xn_r/raw xb_w/raw xb_r/raw" >"$tmp/stats.txt"
awk -v links="$LINKS" -v batch="$BATCH" -v bb="$batch_bytes" "$ROUND_TABLE_AWK"'
  $1 == "raw" && $2 != bb { sizes[++n] = $2 }
  function xr(x, b) { return fr(x "/raw " b) }
  function check(name, x, b, want,   k) { k = x "/raw " b; if (!(k in v) || v[k] < want) { ok[name] = 0; miss[name] = miss[name] sprintf(" %s@%s=%s", x, b, (k in v) ? fl(v[k]) : "not measured") } }
  END {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (sizes[j] + 0 < sizes[i] + 0) { t = sizes[i]; sizes[i] = sizes[j]; sizes[j] = t }
    ok[1] = ok[2] = ok[3] = 1
    printf "| block | raw tcp | WRITE 1 link | x/r | READ 1 link | x/r | WRITE %s links | x/r | READ %s links | x/r |\n", links, links
    print "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= n; i++) {
      b = sizes[i]
      printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", b, f(g("raw " b)), f(g("x1_w " b)), xr("x1_w", b), f(g("x1_r " b)), xr("x1_r", b), f(g("xn_w " b)), xr("xn_w", b), f(g("xn_r " b)), xr("xn_r", b)
      check(1, "x1_w", b, 0.85); check(1, "x1_r", b, 0.85); check(2, "xn_w", b, 1.0); check(2, "xn_r", b, 1.0)
    }
    printf "| %s x %s | %s | | | | | %s | %s | %s | %s |\n", bb, batch, f(g("raw " bb)), f(g("xb_w " bb)), xr("xb_w", bb), f(g("xb_r " bb)), xr("xb_r", bb)
    check(3, "xb_w", bb, 0.70); check(3, "xb_r", bb, 0.70)
    print ""
    print "GB/s (1e9 B/s): the median of the rounds. x/r: xfer / raw tcp at the same block size within each round (the two ran seconds apart), the median over the rounds (lowest-highest round in brackets), floored to 0.01. x1: one link, xn: " links " links, xb: batches."
    print ""
    printf "- target 1: WRITE and READ with one link reach >= 85%% of raw: %s%s\n", ok[1] ? "MET" : "NOT MET:", miss[1]
    printf "- target 2: WRITE and READ with %s links reach >= raw: %s%s\n", links, ok[2] ? "MET" : "NOT MET:", miss[2]
    printf "- target 3: %s B x %s descriptors reach >= 70%% of raw at %s B: %s%s\n", bb, batch, bb, ok[3] ? "MET" : "NOT MET:", miss[3]
  }' "$tmp/stats.txt" >"$tmp/table.md"
echo
cat "$tmp/table.md"

if [ "$RESULTS" != "-" ]; then
  {
    echo "## tcp transport vs a raw TCP socket on loopback"
    echo
    written_by bench/compare_tcp.sh
    echo
    echo "Command: \`bench/compare_tcp.sh${1:+ $1}\` (DURATION=$DURATION ROUNDS=$ROUNDS SIZES=$SIZES LINKS=$LINKS), which runs, per SIZE in ${sizes//$'\n'/ } and $batch_bytes, alternating:"
    echo
    echo '```'
    q "${cmd_raw[@]}"; echo
    echo "# TEST: write_bw, then read_bw (two runs)"
    for c in cmd_x1 cmd_xn cmd_xb; do
      declare -n cmd=$c
      q "${cmd[0]}" TEST "${cmd[@]:1}"; echo
    done
    echo '```'
    echo
    cat "$tmp/table.md"
    echo
    results_plot tcp "$tmp/stats.txt" "tcp against a raw TCP socket, paired rounds" --baseline '^raw' \
      --name raw="raw TCP socket" --name x1_w="WRITE, 1 link" --name x1_r="READ, 1 link" \
      --name xn_w="WRITE, $LINKS links" --name xn_r="READ, $LINKS links" \
      --reference 'perftest_roce100g.tsv:test=write_bw,qps=1@perftest ib_write_bw, 100G RoCE, 1 QP'
  } >"$tmp/results.md"
  results_section "$RESULTS" tcp "$tmp/results.md"
  echo "wrote the tcp section of $RESULTS"
fi
