#!/usr/bin/env bash
# One NIC against two: an `xfer-bench serve` in one network namespace and clients in another,
# joined by two veth pairs ("two NICs", as tests/fault/multinic_test.cc builds them). Per round,
# size and op, a client that names one NIC (--nics c0) and one that names both (--nics c0,c1)
# run one after the other (which goes first alternating by round); the serve names both. Two
# settings:
#   - NIC-bound: each NIC limited to RATE both ways (tc tbf), far below what this machine's
#     cores move over veth, as a real NIC is the limit between hosts. Goal: two NICs >= 1.7x one.
#   - unlimited: veth as fast as the cores copy (the machine's limit: both NICs share its cores).
# Also records the split of the two-NIC runs (the second NIC's share of the bytes, from the
# client's "# nics:" line). Writes the section "## multinic" of bench/RESULTS.md and prints it.
# Needs root (ip netns, tc); creates and removes its namespaces; sends nothing elsewhere.
#
#   bench/compare_multinic.sh [BUILD_DIR]   (default: build)
#   env: DURATION=0.5  ROUNDS=5  SIZES="64K 1M 8M"  RATE=1gbit  LINKS=4  DEPTH=8 (requests in flight)
#        RESULTS=bench/RESULTS.md (RESULTS=- : do not write it)  NOTE="..."
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh
BUILD=${1:-build}
DURATION=${DURATION:-0.5}
ROUNDS=${ROUNDS:-5}
SIZES=${SIZES:-64K 1M 8M}
RATE=${RATE:-1gbit}
LINKS=${LINKS:-4}
DEPTH=${DEPTH:-8}
RESULTS=${RESULTS:-bench/RESULTS.md}
[ "$(id -u)" = 0 ] || { echo "compare_multinic: needs root (network namespaces, tc)" >&2; exit 2; }
[ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja >/dev/null
cmake --build "$BUILD" --target xfer-bench >/dev/null
XB=$(realpath "$BUILD/tools/xfer-bench")
tmp=$(mktemp -d)
S=xbms$$ C=xbmc$$
net() { echo "10.$((236 + $1)).$(($$ % 250))"; }  # net N: NIC N's /30 (.1 serve, .2 client)
srv_pid=""
cleanup() {
  [ -z "$srv_pid" ] || { kill "$srv_pid" 2>/dev/null; wait "$srv_pid" 2>/dev/null || true; }
  ip netns del "$S" 2>/dev/null || true
  ip netns del "$C" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

ip netns add "$S"
ip netns add "$C"
for n in 0 1; do
  ip link add "s$n-$$" netns "$S" type veth peer name "c$n-$$" netns "$C"
  ip -n "$S" addr add "$(net $n).1/30" dev "s$n-$$"
  ip -n "$C" addr add "$(net $n).2/30" dev "c$n-$$"
  ip -n "$S" link set "s$n-$$" up
  ip -n "$C" link set "c$n-$$" up
done
ip -n "$S" link set lo up
ip -n "$C" link set lo up
# (A veth runs a moment after it is up; engines refuse one that does not.)
running() {
  [ "$( { ip netns exec "$C" cat /sys/class/net/c{0,1}-$$/operstate; ip netns exec "$S" cat /sys/class/net/s{0,1}-$$/operstate; } | sort -u)" = up ]
}
for _ in $(seq 50); do running && break; sleep 0.1; done
running || { echo "compare_multinic: the veth pairs did not come up within 5 s" >&2; exit 1; }
# limit RATE|none: both NICs, both directions.
limit() {
  local n ns dev
  for n in 0 1; do
    for ns in "$S" "$C"; do
      dev=s$n-$$; [ "$ns" = "$C" ] && dev=c$n-$$
      if [ "$1" = none ]; then
        ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
      else
        ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$1" burst 256kb latency 100ms
      fi
    done
  done
}
SRV="$(net 0).1:18515"
ip netns exec "$S" "$XB" serve --listen "$SRV" --nics "s0-$$,s1-$$" >"$tmp/srv.txt" 2>&1 &
srv_pid=$!

common=(-D "$DURATION" --depth "$DEPTH" --span 64M --transport tcp --host-id client --links "$LINKS" --connect-timeout 20)
# run SETTING NICS(1|2) OP SIZE: "<round> <setting>_<nics>_<op> <bytes> <GB/s>" into all.txt, and
# for two NICs the second NIC's share ("share_<setting>_<op> <bytes> <percent>").
run() {
  local setting=$1 nics=$2 op=$3 size=$4 list="c0-$$" out=$tmp/out.txt
  [ "$nics" = 2 ] && list="c0-$$,c1-$$"
  if ! ip netns exec "$C" "$XB" "${op}_bw" -s "$size" --nics "$list" "${common[@]}" "$SRV" >"$out" 2>&1; then
    echo "compare_multinic: xfer-bench ${op}_bw -s $size --nics $list failed:" >&2
    cat "$out" "$tmp/srv.txt" >&2
    exit 1
  fi
  # (GB/s from the Gb/s column, which keeps a digit more: 0.96 Gb/s, where GB/s reads 0.12)
  awk -v k="${setting}_${nics}_$op" '/^[0-9]/ { printf "%s %s %.5f\n", k, $1, $4 / 8; exit }' "$out" | in_round >>"$tmp/all.txt"
  if [ "$nics" = 2 ]; then
    # "# nics: c0 (A) -> B:port 70% (n bytes), c1 (C) -> D:port 30% (m bytes)": NIC 1's share.
    awk -v k="share_${setting}_$op" -v b="$(to_bytes "$size")" -v net1="($(net 1)." '
      /^# nics: / { sub(/^# nics: /, ""); n = split($0, p, ", "); all = one = 0
        for (i = 1; i <= n; i++) if (match(p[i], /\([0-9]+ bytes\)/)) {
          x = substr(p[i], RSTART + 1, RLENGTH - 8) + 0; all += x; if (index(p[i], net1)) one += x }
        if (all > 0) printf "%s %s %.1f\n", k, b, 100 * one / all }' \
      "$out" | in_round >>"$tmp/all.txt"
  fi
}

: >"$tmp/all.txt"
echo "compare_multinic: $ROUNDS rounds, $DURATION s per cell, sizes $SIZES, NIC-bound at $RATE each, and unlimited" >&2
for r in $(seq 1 "$ROUNDS"); do
  ROUND=$r
  echo "  round $r/$ROUNDS" >&2
  for setting in bound free; do
    if [ "$setting" = bound ]; then limit "$RATE"; else limit none; fi
    for size in $SIZES; do
      for op in write read; do
        if [ $((r % 2)) = 1 ]; then run $setting 1 $op "$size"; run $setting 2 $op "$size"
        else run $setting 2 $op "$size"; run $setting 1 $op "$size"; fi
      done
    done
  done
done
pairs="bound_2_write/bound_1_write bound_2_read/bound_1_read free_2_write/free_1_write free_2_read/free_1_read"
round_stats "$tmp/all.txt" "$pairs" >"$tmp/stats.txt"

awk -v sizes="$SIZES" -v rate="$RATE" "$ROUND_TABLE_AWK"'
  function b(s) { return s ~ /K$/ ? s * 1024 : s ~ /M$/ ? s * 1048576 : s }
  function f3(x) { return x < 0 ? "-" : sprintf("%.3f", x) }
  function share(k) { return (k in v) ? sprintf("%.0f%%", v[k]) : "-" }
  function check(k, x) { if (!(k in v) || v[k] < 1.7) { ok = 0; miss = miss sprintf(" %s=%s", x, (k in v) ? fl(v[k]) : "not measured") } }
  END {
    n = split(sizes, s, " "); ok = 1
    print "| setting | block | op | 1 NIC GB/s | 2 NICs GB/s | 2 NICs / 1 | NIC 1 share (2 NICs) |"
    print "|---|---:|---|---:|---:|---:|---:|"
    for (st = 1; st <= 2; st++) {
      set = st == 1 ? "bound" : "free"; name = st == 1 ? "NIC-bound (" rate " each)" : "unlimited"
      for (i = 1; i <= n; i++) for (o = 1; o <= 2; o++) {
        op = o == 1 ? "write" : "read"; k = b(s[i])
        printf "| %s | %s | %s | %s | %s | %s | %s |\n", name, s[i], toupper(op),
          f3(g(set "_1_" op " " k)), f3(g(set "_2_" op " " k)), fr(set "_2_" op "/" set "_1_" op " " k), share("share_" set "_" op " " k)
        if (set == "bound") check(set "_2_" op "/" set "_1_" op " " k, toupper(op) "@" s[i])
      }
    }
    print ""
    print "GB/s (1e9 B/s): the median of the rounds. 2 NICs / 1: the ratio within each round (the two runs seconds apart), the median over the rounds (lowest-highest round), floored to 0.01. NIC 1 share: the second NIC pair'"'"'s part of the two-NIC runs'"'"' bytes (xfer-bench'"'"'s `# nics:` line), the median of the rounds."
    print ""
    printf "- goal: NIC-bound, two NICs >= 1.7x one at every size, WRITE and READ: %s%s\n", ok ? "MET" : "NOT MET:", miss
  }' "$tmp/stats.txt" >"$tmp/table.md"
echo
cat "$tmp/table.md"

if [ "$RESULTS" != "-" ]; then
  {
    echo "## multinic: one NIC against two"
    echo
    written_by bench/compare_multinic.sh
    echo
    echo "Command: \`bench/compare_multinic.sh${1:+ $1}\` (DURATION=$DURATION ROUNDS=$ROUNDS SIZES=\"$SIZES\" RATE=$RATE LINKS=$LINKS DEPTH=$DEPTH): two network namespaces joined by two veth pairs; \`xfer-bench serve --nics s0,s1\` in one, and in the other, alternating within each round:"
    echo
    echo '```'
    for nics in c0 c0,c1; do echo "$(q "$BUILD/tools/xfer-bench") TEST -s SIZE --nics $nics $(q "${common[@]}" "$SRV")"; done
    echo '```'
    echo
    echo "NIC-bound: each NIC limited to $RATE both ways with \`tc qdisc ... tbf\`, as a real NIC limits a link between hosts. Unlimited: veth moves what the cores copy, so both NICs share the same $(nproc) cores: the machine is the limit."
    echo
    cat "$tmp/table.md"
  } >"$tmp/section.md"
  results_section "$RESULTS" multinic "$tmp/section.md"
fi
