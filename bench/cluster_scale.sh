#!/usr/bin/env bash
# Many engines on this host registered in a real etcd (bench/cluster_scale.cc): what a peer
# costs an engine (resident memory, threads, file descriptors), and how long it takes to start
# them and to connect all of them by name. Writes the section "## scale" of bench/RESULTS.md
# and prints it; docs/scaling.md draws its cost model from it.
#
#   bench/cluster_scale.sh      env: ENGINES=64  PEERS=8  TRANSPORT=tcp  ROUNDS=3
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ENGINES=${ENGINES:-64}
PEERS=${PEERS:-8}
TRANSPORT=${TRANSPORT:-tcp}
ROUNDS=${ROUNDS:-3}
cmake --build build --target cluster_scale >/dev/null
tmp=$(mktemp -d)
trap '[ -f "$tmp/etcd.pid" ] && kill "$(cat "$tmp/etcd.pid")" 2>/dev/null; rm -rf "$tmp"' EXIT
endpoint=$(etcd_start "$tmp")
: >"$tmp/all.jsonl"
for r in $(seq "$ROUNDS"); do
  echo "cluster_scale: round $r/$ROUNDS: $ENGINES engines, $PEERS peers each, $TRANSPORT" >&2
  build/bench/cluster_scale "etcd://$endpoint/scale$r" "$ENGINES" "$PEERS" "$TRANSPORT" >"$tmp/round.jsonl" ||
    { cat "$tmp/round.jsonl" >&2; echo "cluster_scale: round $r failed" >&2; exit 1; }
  jq -c --argjson r "$r" '. + {round: $r}' "$tmp/round.jsonl" >>"$tmp/all.jsonl"
done

# Per engine: it holds 2 x PEERS sessions (those it opened and those opened to it); the cost of
# a peer is what the process grew by from its start (engine up, 1 MiB registered) to then,
# divided by that. Medians over every engine of every round.
stats=$(jq -rs --argjson k "$PEERS" '
  def median: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  [.[] | select(.engine != null)] as $e | [.[] | select(.summary)] as $s |
  {
    engines: ($e | length),
    bad: ([$e[] | select(.connected != $k or .read_ok != $k)] | length),
    rss_before: ([$e[].before.rss_mib] | median),
    threads_before: ([$e[].before.threads] | median),
    fds_before: ([$e[].before.fds] | median),
    rss_peer_kib: ([$e[] | (.after.rss_mib - .before.rss_mib) * 1024 / (2 * $k)] | median),
    threads_after: ([$e[].after.threads] | median),
    threads_max: ([$e[].after.threads] | max),
    threads_idle: ([$e[].idle.threads] | median),
    rss_idle_peer_kib: ([$e[] | (.idle.rss_mib - .before.rss_mib) * 1024 / (2 * $k)] | median),
    fds_peer: ([$e[] | (.after.fds - .before.fds) / (2 * $k)] | median),
    connect_p50: ([$e[].connect_s] | median),
    connect_max: ([$e[].connect_s] | max),
    start_s: ([$s[].start_s] | median),
    all_s: ([$s[].all_connected_s] | median)
  } | to_entries | map("\(.key)=\(.value)") | .[]' "$tmp/all.jsonl")
eval "$stats"
[ "$bad" = 0 ] || { echo "cluster_scale: $bad engines did not connect to or read from every peer" >&2; exit 1; }

out=$tmp/section.md
{
  echo "## scale: many engines in one etcd"
  echo
  written_by bench/cluster_scale.sh "; etcd $(etcd --version 2>/dev/null | awk '/etcd Version/ { print $3 }')"
  echo
  echo "Command: \`bench/cluster_scale.sh\` (ENGINES=$ENGINES PEERS=$PEERS TRANSPORT=$TRANSPORT ROUNDS=$ROUNDS): per round, $ENGINES engine processes on this host publish themselves in a real etcd (loopback), then all at once each connects by cluster name (ConnectAsync) to the next $PEERS and READs 64 KiB from each (checked), transport $TRANSPORT. A peer's cost: what an engine's process grew by from its start (engine up, 1 MiB registered) to holding its $((2 * PEERS)) sessions (those it opened and those opened to it), divided by them. Medians over the $engines engines of all rounds; times: medians of the rounds (connects: over engines)."
  echo
  echo "| what | value |"
  echo "|---|---:|"
  printf '| an engine at start: resident memory, threads, open descriptors | %.1f MiB, %s, %s |\n' "$rss_before" "$threads_before" "$fds_before"
  printf '| per peer session: resident memory | %.0f KiB |\n' "$rss_peer_kib"
  printf '| per peer session: open descriptors | %.2f |\n' "$fds_peer"
  printf '| threads with %s sessions, just after the READs (median, most) | %s, %s |\n' "$((2 * PEERS))" "$threads_after" "$threads_max"
  printf '| threads with %s sessions, idle for 2 s | %s |\n' "$((2 * PEERS))" "$threads_idle"
  printf '| per peer session, idle for 2 s: resident memory | %.0f KiB |\n' "$rss_idle_peer_kib"
  printf '| starting %s engines, each published in etcd | %.2f s |\n' "$ENGINES" "$start_s"
  printf '| one engine connecting to its %s peers by name (median, slowest) | %.3f s, %.3f s |\n' "$PEERS" "$connect_p50" "$connect_max"
  printf '| all %s engines connected and each READ done | %.2f s |\n' "$ENGINES" "$all_s"
} >"$out"
results_section bench/RESULTS.md scale "$out"
cat "$out"
