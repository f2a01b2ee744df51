#!/usr/bin/env bash
# bench/lib.sh's round statistics, on measurements whose right answer is known by hand.
#   bench_lib_test.sh PATH/TO/bench/lib.sh
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# in_round prefixes the current round.
ROUND=3
[ "$(echo "x 16 1.5" | in_round)" = "3 x 16 1.5" ] || fail "in_round"

# Three rounds of a tool x and its baseline r at one size, and r alone at another. Round 2 was
# a lucky moment for r: the best rounds give x/r = 2.0/4.0 = 0.5, the medians 2.0/2.2, but within
# every round x ran at 0.9..1.0 of r, and the paired median is 0.95.
cat >"$tmp/all.txt" <<'D'
1 r 1024 2.0
1 x 1024 1.9
2 r 1024 4.0
2 x 1024 3.6
3 r 1024 2.2
3 x 1024 2.2
1 r 2048 7
2 r 2048 5
D
round_stats "$tmp/all.txt" "x/r" | sort >"$tmp/got.txt"
cat >"$tmp/want.txt" <<'D'
r 1024 2.2
r 2048 6
x 1024 2.2
x/r 1024 0.95 0.9 1
D
diff "$tmp/want.txt" "$tmp/got.txt" || fail "round_stats: medians and the paired ratio"

# A round where only one of the pair ran does not count; without any, no ratio line.
printf '1 r 1024 2\n2 x 1024 9\n3 r 1024 4\n3 x 1024 1\n' >"$tmp/all.txt"
[ "$(round_stats "$tmp/all.txt" "x/r" | grep '^x/r')" = "x/r 1024 0.25 0.25 0.25" ] || fail "unpaired rounds"
printf '1 r 1024 2\n2 x 1024 9\n' >"$tmp/all.txt"
[ -z "$(round_stats "$tmp/all.txt" "x/r" | grep '^x/r' || true)" ] || fail "no paired round"
# A key measured twice in one round has no single partner: refused, with the reason.
printf '1 r 1024 2\n1 x 1024 1\n1 r 1024 3\n' >"$tmp/all.txt"
if round_stats "$tmp/all.txt" "x/r" >/dev/null 2>"$tmp/err.txt"; then fail "a duplicate was accepted"; fi
grep -q "r 1024 measured twice in round 1" "$tmp/err.txt" || fail "duplicate: $(cat "$tmp/err.txt")"
# The tables' prelude reads round_stats lines; a ratio shows floored, with its rounds' range.
printf 'x/r 1024 0.8499 0.51 1.239\nr 1024 2.5\n' >"$tmp/stats.txt"
got=$(awk "$ROUND_TABLE_AWK"'END { print fr("x/r 1024"), f(g("r 1024")), f(g("r 2048")), fr("y/r 1024"), kib(1024), kib(2097152) }' "$tmp/stats.txt")
[ "$got" = "0.84 (0.51-1.23) 2.50 - - 1K 2M" ] || fail "ROUND_TABLE_AWK: $got"
echo "bench/lib.sh: ok"
