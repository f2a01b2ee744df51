#!/usr/bin/env bash
# Side by side: xfer's cma transport (xfer-bench) against the raw process_vm_writev/readv loop
# (bench/raw_cma, one call per block) and memcpy, at the same block sizes and buffer pattern,
# WRITE and READ, plus 16 KiB blocks in batches of 1000 descriptors. Every measurement runs
# ROUNDS times, the tools alternating; a cell's GB/s is the median of its rounds and x/r the
# median of the rounds' xfer / raw (see "Rounds" in bench/lib.sh: this machine's cores are
# shared). Prints one table with the xfer/raw ratios and the acceptance targets. Then, once,
# the other baselines at the same sizes: a raw TCP socket pair on loopback (bench/raw_tcp)
# against xfer over tcp, and ucx_perftest (Debian's ucx-utils: ucp_put_bw / ucp_get over
# UCX_TLS=posix and UCX_TLS=tcp, UCT put_bw / get over cma) against xfer with --reuse
# (ucx_perftest reuses one buffer, so xfer does too there). Prints the tables and writes
# bench/RESULTS.md: its head, up to the sections that bench/compare_tcp.sh ("## tcp") and
# bench/compare_shm.sh ("## shm") write, which are kept. xfer runs with
# --mem register (mmap'd, registered memory, as the raw baselines use), so that same-host bytes
# go through cma; bench/compare_shm.sh measures AllocMem memory (shm).
#
#   bench/compare.sh [BUILD_DIR]            (default: build)
#   env: DURATION=0.3 (s per cell)  ROUNDS=5  SIZES=16K:8M  REUSE=1 (reuse buffers instead of
#        walking a 256 MiB span)  BATCH=1000  BATCH_SIZE=16K  RESULTS=bench/RESULTS.md
#        (RESULTS=- : do not write it)  NOTE="..." (a line for RESULTS.md, e.g. the load)
#        QUICK=1 (1 round, 0.1 s per cell, sizes 16K,256K,4M: about a minute)
#        UCX=0 (skip ucx_perftest)  TCP=0 (skip the tcp baselines)
set -euo pipefail
if [ "${QUICK:-0}" = 1 ]; then
  DURATION=${DURATION:-0.1}; ROUNDS=${ROUNDS:-1}; SIZES=${SIZES:-16K,256K,4M}
fi
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh
BUILD=${1:-build}
DURATION=${DURATION:-0.3}
ROUNDS=${ROUNDS:-5}
SIZES=${SIZES:-16K:8M}
BATCH=${BATCH:-1000}
BATCH_SIZE=${BATCH_SIZE:-16K}
RESULTS=${RESULTS:-bench/RESULTS.md}
PATTERN=()
PATTERN_NAME="walk (256 MiB span per side, larger than the CPU caches)"
if [ "${REUSE:-0}" = 1 ]; then
  PATTERN=(--reuse)
  PATTERN_NAME="reuse (the same buffers every request)"
fi

if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja >/dev/null
fi
cmake --build "$BUILD" --target xfer-bench xfer-info raw_cma raw_tcp >/dev/null
RAW="$BUILD/bench/raw_cma"
RAWTCP="$BUILD/bench/raw_tcp"
XB="$BUILD/tools/xfer-bench"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The commands, as run (and as written to RESULTS.md). The sweeps run one size at a time, the
# tools alternating (and which goes first alternating by round), so that both see the same
# moment of a shared machine: SIZE below is each size of $SIZES in turn.
cmd_raw=("$RAW" -s SIZE -D "$DURATION" "${PATTERN[@]}")
cmd_xfer=("$XB" -s SIZE -D "$DURATION" --transport cma --mem register "${PATTERN[@]}")
cmd_raw_batch=("$RAW" -s "$BATCH_SIZE" -D "$DURATION" --batch "$BATCH" --no-memcpy "${PATTERN[@]}")
cmd_xfer_batch=("$XB" -s "$BATCH_SIZE" -D "$DURATION" --batch "$BATCH" --transport cma --mem register "${PATTERN[@]}")
sizes=$("$RAW" -s "$SIZES" --print-sizes)

# raw_cma table -> "<round> <prefix><column> <bytes> <GB/s>" lines.
parse_raw() {
  awk -v pre="$1" '/^#bytes/ { for (i = 2; i <= NF; i++) { c = $i; sub(/\[GB\/s\]/, "", c); col[i] = c }; next }
       /^[0-9]/ { for (i = 2; i <= NF; i++) print pre col[i], $1, $i }' | in_round
}
# xfer-bench tables -> "<round> xfer_<write|read>[_bN] <bytes> <GB/s>" lines (_bN: batched).
parse_xfer() {
  local suffix=$1
  awk -v suf="$suffix" '/^## write_bw/ { op = "write"; next } /^## read_bw/ { op = "read"; next }
       /^[0-9]/ && op != "" { print "xfer_" op suf, $1, $3 }' | in_round
}
run_raw() { with_size "$2" "${cmd_raw[@]}" | tee -a "$tmp/raw_$1.txt" | parse_raw raw_ >>"$tmp/all.txt"; }
run_xfer() { with_size "$2" "${cmd_xfer[@]}" | tee -a "$tmp/xfer_$1.txt" | parse_xfer "" >>"$tmp/all.txt"; }

echo "compare: $ROUNDS rounds, $DURATION s per cell, pattern $PATTERN_NAME" >&2
for r in $(seq 1 "$ROUNDS"); do
  ROUND=$r
  echo "  round $r/$ROUNDS: sizes $SIZES, raw_cma and xfer-bench alternating" >&2
  for b in $sizes; do
    if [ $((r % 2)) = 1 ]; then run_raw "$r" "$b"; run_xfer "$r" "$b"
    else run_xfer "$r" "$b"; run_raw "$r" "$b"; fi
  done
  echo "  round $r/$ROUNDS: $BATCH_SIZE x $BATCH descriptors" >&2
  "${cmd_xfer_batch[@]}" | tee "$tmp/xferb_$r.txt" | parse_xfer "_b$BATCH" >>"$tmp/all.txt"
  # (rawb_: its own columns, one call per block and BATCH blocks per call, to pair with the
  # batched xfer run just before it)
  "${cmd_raw_batch[@]}" | tee "$tmp/rawb_$r.txt" | parse_raw rawb_ >>"$tmp/all.txt"
done

xb=_b$BATCH
round_stats "$tmp/all.txt" "xfer_write/raw_write xfer_read/raw_read xfer_write$xb/rawb_write xfer_read$xb/rawb_read" >"$tmp/stats.txt"

# One table, plus the acceptance verdicts.
awk -v xb="$xb" -v batch="$BATCH" -v bsize="$BATCH_SIZE" "$ROUND_TABLE_AWK"'
  $1 !~ /\/|^rawb_/ && !($2 in seen) { seen[$2] = 1; sizes[++n] = $2 }
  END {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (sizes[j] + 0 < sizes[i] + 0) { t = sizes[i]; sizes[i] = sizes[j]; sizes[j] = t }
    print "| block | memcpy | raw WRITE | xfer WRITE | WRITE x/r | raw READ | xfer READ | READ x/r |"
    print "|---|---:|---:|---:|---:|---:|---:|---:|"
    ok = 1
    for (i = 1; i <= n; i++) {
      b = sizes[i]
      xw = g("xfer_write " b); xr = g("xfer_read " b); qw = g("xfer_write/raw_write " b); qr = g("xfer_read/raw_read " b)
      if (xw < 0 && xr < 0) continue
      printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", b, f(g("raw_memcpy " b)), f(g("raw_write " b)), f(xw), fr("xfer_write/raw_write " b), f(g("raw_read " b)), f(xr), fr("xfer_read/raw_read " b)
      if (b >= 262144) {
        if (qw < 0.90) { ok = 0; miss = miss sprintf(" WRITE@%s=%s", b, qw < 0 ? "not measured" : fl(qw)) }
        if (qr < 0.90) { ok = 0; miss = miss sprintf(" READ@%s=%s", b, qr < 0 ? "not measured" : fl(qr)) }
      }
    }
    printf "\n"
    printf "| %s B x %s descriptors | raw 1 call/block | raw %s blocks/call (<=1024 iovecs) | xfer --batch %s | xfer / raw 1 call/block |\n", bsize, batch, batch, batch
    printf "|---|---:|---:|---:|---:|\n"
    bok = 1
    for (i = 1; i <= n; i++) {
      b = sizes[i]
      xw = g("xfer_write" xb " " b); if (xw < 0) continue
      xr = g("xfer_read" xb " " b)
      printf "| WRITE %s | %s | %s | %s | %s |\n", b, f(g("rawb_write " b)), f(g("rawb_write" xb " " b)), f(xw), fr("xfer_write" xb "/rawb_write " b)
      printf "| READ %s | %s | %s | %s | %s |\n", b, f(g("rawb_read " b)), f(g("rawb_read" xb " " b)), f(xr), fr("xfer_read" xb "/rawb_read " b)
      if (!(g("xfer_write" xb "/rawb_write " b) > 1) || !(g("xfer_read" xb "/rawb_read " b) > 1)) bok = 0
    }
    printf "\n"
    printf "GB/s: the median of the rounds. x/r: xfer / raw within each round (the two ran seconds apart), the median over the rounds (lowest-highest round in brackets), floored to 0.01\n\n"
    printf "- target 1: cma WRITE and READ at >= 256 KiB reach >= 90%% of the raw loop: %s%s\n", ok ? "MET" : "NOT MET:", miss
    printf "- target 2: %s B blocks in batches of %s beat the raw one-call-per-block loop: %s\n", bsize, batch, bok ? "MET" : "NOT MET"
  }' "$tmp/stats.txt" >"$tmp/table.md"

echo
cat "$tmp/table.md"
transport=$(awk '/^# peer:/ { for (i = 1; i <= NF; i++) if ($i == "transport") { t = $(i + 1); sub(/;$/, "", t); print t; exit } }' "$tmp/xfer_1.txt")
echo "(xfer transport: ${transport:-unknown}; $ROUNDS rounds; GB/s = 1e9 B/s)"


# ---- The other baselines, once: raw TCP, xfer over tcp, ucx_perftest, xfer --reuse over cma ----
have_tcp=0
if [ "${TCP:-1}" = 1 ] && "$BUILD/tools/xfer-info" --no-engine 2>/dev/null | grep -E '^  tcp +available' >/dev/null; then have_tcp=1; fi
have_ucx=0
if [ "${UCX:-1}" = 1 ] && command -v ucx_perftest >/dev/null; then have_ucx=1; fi
cmd_rawtcp=("$RAWTCP" -s "$SIZES" -D "$DURATION" "${PATTERN[@]}")
cmd_xfer_tcp=("$XB" -s "$SIZES" -D "$DURATION" --transport tcp --mem register "${PATTERN[@]}")
cmd_xfer_reuse=("$XB" -s "$SIZES" -D "$DURATION" --transport cma --mem register --reuse)
: >"$tmp/other.txt"
if [ "${TCP:-1}" = 1 ]; then
  echo "  raw tcp: $SIZES" >&2
  "${cmd_rawtcp[@]}" | tee "$tmp/rawtcp.txt" | awk '/^[0-9]/ { print "rawtcp", $1, $3 }' >>"$tmp/other.txt"
fi
if [ $have_tcp = 1 ]; then
  echo "  xfer over tcp: $SIZES" >&2
  "${cmd_xfer_tcp[@]}" | tee "$tmp/xfertcp.txt" | awk '/^## write_bw/ { op = "w"; next } /^## read_bw/ { op = "r"; next }
       /^[0-9]/ && op != "" { print "xfertcp_" op, $1, $3 }' >>"$tmp/other.txt"
fi
# ucx_perftest (ucx_run in bench/lib.sh): a server and a client on loopback per (test, size);
# bandwidth "overall" in MB/s (2^20 B/s), converted to GB/s (1e9 B/s). Iterations: about
# UCX_BYTES (UCX_TCP_BYTES over tcp).
ucx_cfgs=(
  "ucp_put_posix|posix|-t ucp_put_bw"
  "ucp_get_posix|posix|-t ucp_get"
  "ucp_put_tcp|tcp|-t ucp_put_bw"
  "ucp_get_tcp|tcp|-t ucp_get"
  "uct_put_cma|cma|-t put_bw -x cma -d memory -D zcopy"
  "uct_get_cma|cma|-t get -x cma -d memory -D zcopy"
)
if [ $have_ucx = 1 ]; then
  echo "  ucx_perftest: ${#ucx_cfgs[@]} tests x sizes $SIZES" >&2
  for cfg in "${ucx_cfgs[@]}"; do
    IFS='|' read -r name tls args <<<"$cfg"
    for b in $sizes; do
      # shellcheck disable=SC2086
      ucx_run "$name" "$tls" "$b" $args >>"$tmp/other.txt"
    done
  done
  echo "  xfer --reuse over cma: $SIZES" >&2
  "${cmd_xfer_reuse[@]}" | tee "$tmp/xferreuse.txt" | awk '/^## write_bw/ { op = "w"; next } /^## read_bw/ { op = "r"; next }
       /^[0-9]/ && op != "" { print "xfercma_reuse_" op, $1, $3 }' >>"$tmp/other.txt"
fi
ucx_version=$(ucx_version)
awk '
  { v[$1 " " $2] = $3; if (!($2 in seen)) { seen[$2] = 1; sizes[++n] = $2 } }
  function g(k) { return (k in v) ? v[k] : -1 }
  function f(x) { return x < 0 ? "-" : sprintf("%.2f", x) }
  function fr(x, base) { return (x < 0 || base <= 0) ? f(base) : sprintf("%.2f (x%.2f)", base, x / base) }
  END {
    if (n == 0) exit
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (sizes[j] + 0 < sizes[i] + 0) { t = sizes[i]; sizes[i] = sizes[j]; sizes[j] = t }
    print "| block | xfer tcp W | xfer tcp R | raw tcp | ucp_put tcp | ucp_get tcp | xfer cma W reuse | xfer cma R reuse | ucp_put posix | ucp_get posix | uct put cma | uct get cma |"
    print "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= n; i++) {
      b = sizes[i]
      xtw = g("xfertcp_w " b); xtr = g("xfertcp_r " b); xcw = g("xfercma_reuse_w " b); xcr = g("xfercma_reuse_r " b)
      printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", b, f(xtw), f(xtr),
        fr(xtw, g("rawtcp " b)), fr(xtw, g("ucp_put_tcp " b)), fr(xtr, g("ucp_get_tcp " b)),
        f(xcw), f(xcr), fr(xcw, g("ucp_put_posix " b)), fr(xcr, g("ucp_get_posix " b)),
        fr(xcw, g("uct_put_cma " b)), fr(xcr, g("uct_get_cma " b))
    }
    print ""
    print "GB/s (1e9 B/s), one run each. Baseline cells: GB/s (x ratio of xfer to it: WRITE against raw tcp and puts, READ against gets; tcp columns against xfer over tcp, posix and cma columns against xfer over cma with --reuse). \"-\": not run (no tcp transport in this build, or no ucx_perftest)."
  }' "$tmp/other.txt" >"$tmp/other.md"
if [ -s "$tmp/other.md" ]; then
  echo
  cat "$tmp/other.md"
fi

if [ "$RESULTS" != "-" ]; then
  {
    echo "# xfer vs raw baselines (cma)"
    echo
    echo "Written by \`bench/compare.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC')."
    echo
    echo "- machine: $(machine_line)"
    echo "- xfer $(xfer_revision), transport ${transport:-unknown} (--mem register: mmap'd memory registered with RegisterMem, as the raw loop uses)"
    echo "- pattern: $PATTERN_NAME; remote blocks pair-swapped so no two descriptors coalesce"
    echo "- each cell: $DURATION s timed after a warm-up pass; $ROUNDS rounds, tools alternating; the median round, and the median of the rounds' ratios"
    echo "- GB/s = 1e9 bytes/s; x/r = xfer / raw one-call-per-block loop"
    echo "- load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) (the cores are shared with other tenants of this VM, so single cells can lose to a neighbour)"
    if [ -n "${NOTE:-}" ]; then echo "- note: $NOTE"; fi
    echo
    echo "Command: \`bench/compare.sh${1:+ $1}\` (DURATION=$DURATION ROUNDS=$ROUNDS SIZES=$SIZES BATCH=$BATCH BATCH_SIZE=$BATCH_SIZE${REUSE:+ REUSE=$REUSE}), which runs:"
    echo
    echo '```'
    echo "# for SIZE in ${sizes//$'\n'/ }, alternating:"
    q "${cmd_raw[@]}"; echo
    q "${cmd_xfer[@]}"; echo
    echo "# then:"
    q "${cmd_xfer_batch[@]}"; echo
    q "${cmd_raw_batch[@]}"; echo
    echo '```'
    echo
    cat "$tmp/table.md"
    echo
    results_plot compare "$tmp/stats.txt" "xfer against raw system calls, paired rounds" --baseline '^raw'
    if [ -s "$tmp/other.md" ]; then
      echo
      echo "## Other baselines: raw TCP on loopback, ucx_perftest${ucx_version:+ ($ucx_version)}"
      echo
      echo "Run once each, after the rounds above:"
      echo
      echo '```'
      q "${cmd_rawtcp[@]}"; echo
      [ $have_tcp = 1 ] && { q "${cmd_xfer_tcp[@]}"; echo; }
      if [ $have_ucx = 1 ]; then
        q "${cmd_xfer_reuse[@]}"; echo
        echo "# per size B, a server (ucx_perftest -p PORT ARGS -s B -n N -w N/10) and a client:"
        for cfg in "${ucx_cfgs[@]}"; do IFS='|' read -r name tls args <<<"$cfg"; echo "UCX_TLS=$tls ucx_perftest 127.0.0.1 -p PORT $args -s B -n N -w N/10 -f   # $name"; done
        echo "# N = $UCX_BYTES / B ($UCX_TCP_BYTES / B over tcp), at least 20"
      fi
      echo '```'
      echo
      cat "$tmp/other.md"
    fi
    echo
    echo "## Last round, as the tools printed it (repeated headers dropped)"
    echo
    echo '```'
    awk '/^# rerun|^# invoked|^# command/ { next } /^# (peer|sizes|pattern):/ && seen[$2]++ { next }
         /^#/ && seen[$0]++ { next } /^$/ { next } { print }' \
      "$tmp/xfer_$ROUNDS.txt" "$tmp/raw_$ROUNDS.txt" "$tmp/xferb_$ROUNDS.txt" "$tmp/rawb_$ROUNDS.txt"
    echo '```'
  } >"$tmp/results.md"
  # The sections of bench/compare_tcp.sh and bench/compare_shm.sh stay.
  results_section "$RESULTS" "" "$tmp/results.md"
  echo "wrote the head of $RESULTS"
fi
