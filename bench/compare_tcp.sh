#!/usr/bin/env bash
# xfer's tcp transport against a raw TCP socket pair on loopback (bench/raw_tcp: one connection,
# blocks sent back to back), measured in the same run at the same block sizes and buffer
# pattern. xfer runs with one link and with LINKS links, WRITE and READ, plus 16 KiB blocks in
# batches of 1000. Every cell runs ROUNDS times, the tools alternating, and the best round
# counts (this machine's cores are shared). Prints the table with the tcp targets and writes it
# into bench/RESULTS.md as the section that starts with "## tcp" (the rest of the file, which
# bench/compare.sh and bench/compare_shm.sh write, is kept). xfer runs with --mem register
# (mmap'd memory, as the raw socket pair uses).
#
#   bench/compare_tcp.sh [BUILD_DIR]        (default: build)
#   env: DURATION=0.3  ROUNDS=5  SIZES=1M:8M  LINKS=2  BATCH=1000  BATCH_SIZE=16K
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

# "<column> <bytes> <GB/s>" lines from raw_tcp and xfer-bench tables.
raw() { with_size "$1" "${cmd_raw[@]}" | awk '/^[0-9]/ { print "raw", $1, $3 }' >>"$tmp/all.txt"; }
xfer() {  # xfer NAME SIZE cmd...
  local name=$1 size=$2
  shift 2
  with_size "$size" "$@" | tee "$tmp/last_$name.txt" | xfer_rows "$name" | awk '$1 != "path"' >>"$tmp/all.txt"
}

echo "compare_tcp: $ROUNDS rounds, $DURATION s per cell, sizes $SIZES, links 1 and $LINKS" >&2
for r in $(seq 1 "$ROUNDS"); do
  echo "  round $r/$ROUNDS" >&2
  for b in $sizes $batch_bytes; do
    if [ $((r % 2)) = 1 ]; then raw "$b"; fi
    [ "$b" = "$batch_bytes" ] || { xfer x1 "$b" "${cmd_x1[@]}"; xfer xn "$b" "${cmd_xn[@]}"; }
    if [ $((r % 2)) = 0 ]; then raw "$b"; fi
  done
  xfer xb "$batch_bytes" "${cmd_xb[@]}"
done

awk -v links="$LINKS" -v batch="$BATCH" -v bb="$batch_bytes" '
  { k = $1 " " $2; if (!(k in v) || $3 > v[k]) v[k] = $3; if (!($2 in seen) && $2 != bb) { seen[$2] = 1; sizes[++n] = $2 } }
  function g(k) { return (k in v) ? v[k] : -1 }
  function f(x) { return x < 0 ? "-" : sprintf("%.2f", x) }
  function r(a, b) { return (a < 0 || b <= 0) ? -1 : a / b }
  function check(name, x, want) { if (x < 0 || x < want) { ok[name] = 0; miss[name] = miss[name] sprintf(" %s", f(x)) } }
  END {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (sizes[j] + 0 < sizes[i] + 0) { t = sizes[i]; sizes[i] = sizes[j]; sizes[j] = t }
    ok[1] = ok[2] = ok[3] = 1
    printf "| block | raw tcp | WRITE 1 link | x/r | READ 1 link | x/r | WRITE %s links | x/r | READ %s links | x/r |\n", links, links
    print "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= n; i++) {
      b = sizes[i]; raw = g("raw " b)
      w1 = g("x1_w " b); r1 = g("x1_r " b); wn = g("xn_w " b); rn = g("xn_r " b)
      printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", b, f(raw), f(w1), f(r(w1, raw)), f(r1), f(r(r1, raw)), f(wn), f(r(wn, raw)), f(rn), f(r(rn, raw))
      check(1, r(w1, raw), 0.85); check(1, r(r1, raw), 0.85); check(2, r(wn, raw), 1.0); check(2, r(rn, raw), 1.0)
    }
    raw = g("raw " bb); xw = g("xb_w " bb); xr = g("xb_r " bb)
    printf "| %s x %s | %s | | | | | %s | %s | %s | %s |\n", bb, batch, f(raw), f(xw), f(r(xw, raw)), f(xr), f(r(xr, raw))
    check(3, r(xw, raw), 0.70); check(3, r(xr, raw), 0.70)
    print ""
    print "GB/s (1e9 B/s), best of the rounds; x/r = xfer / raw tcp at the same block size."
    print ""
    printf "- target 1: WRITE and READ with one link reach >= 85%% of raw: %s%s\n", ok[1] ? "MET" : "NOT MET:", miss[1]
    printf "- target 2: WRITE and READ with %s links reach >= raw: %s%s\n", links, ok[2] ? "MET" : "NOT MET:", miss[2]
    printf "- target 3: %s B x %s descriptors reach >= 70%% of raw at %s B: %s%s\n", bb, batch, bb, ok[3] ? "MET" : "NOT MET:", miss[3]
  }' "$tmp/all.txt" >"$tmp/table.md"
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
    q "${cmd_x1[@]}"; echo
    q "${cmd_xn[@]}"; echo
    q "${cmd_xb[@]}"; echo
    echo '```'
    echo
    cat "$tmp/table.md"
  } >"$tmp/results.md"
  results_section "$RESULTS" tcp "$tmp/results.md"
  echo "wrote the tcp section of $RESULTS"
fi
