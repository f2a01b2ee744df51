#!/usr/bin/env bash
# The differential check against NIXL's own Python agent: one NIXL-style program
# (bench/nixl_style.py: the listener's metadata exchange, then vLLM's prepped flow, READs of
# up to 1,000 blocks per request at several block sizes) runs on nixl._api (PyPI's `nixl`
# wheel, with UCX inside, in its own virtual environment build/nixl-venv; DRAM only) and on
# xfer.nixl (.venv), each choosing its route (one host: UCX's shared memory, xfer's cma) and
# again over tcp (UCX_TLS=tcp,self against XFER_NIXL_TRANSPORT=tcp); and through the
# xfer.nixl agent's own engine directly (the layer's cost). Every round runs them all, in an
# order that rotates by round. Every READ must bring the target's bytes; the section "## nixl"
# of bench/RESULTS.md gets the median GB/s of each.
#   ROUNDS=3 BYTES=256M bench/compare_nixl.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-3}
BYTES=$(to_bytes "${BYTES:-256M}")
NIXL_VENV=build/nixl-venv
[ -x .venv/bin/python ] || { echo "compare_nixl: run ./scripts/setup.sh --test && ./scripts/build.sh first" >&2; exit 1; }
nixl_version=$(peer_venv "$NIXL_VENV" nixl._api nixl)
tmp=$(mktemp -d)
trap 'status=$?; [ $status -eq 0 ] || tail -20 "$tmp/log.txt" >&2; rm -rf "$tmp"' EXIT

run() {  # run NAME ROUND
  case $1 in
    nixl) "$NIXL_VENV/bin/python" bench/nixl_style.py --impl nixl --bytes "$BYTES" ;;
    nixl_tcp) UCX_TLS=tcp,self "$NIXL_VENV/bin/python" bench/nixl_style.py --impl nixl --bytes "$BYTES" ;;
    xfer) XFER_NIXL_HOST=127.0.0.1 .venv/bin/python bench/nixl_style.py --impl xfer --bytes "$BYTES" ;;
    xfer_tcp) XFER_NIXL_HOST=127.0.0.1 XFER_NIXL_TRANSPORT=tcp .venv/bin/python bench/nixl_style.py --impl xfer --bytes "$BYTES" ;;
    direct) XFER_NIXL_HOST=127.0.0.1 .venv/bin/python bench/nixl_style.py --impl direct --bytes "$BYTES" ;;
  esac 2>>"$tmp/log.txt" | grep '^{"impl"' >"$tmp/$1.$2.json"
}
rotate "$ROUNDS" nixl xfer direct nixl_tcp xfer_tcp

status=0
.venv/bin/python - "$tmp" "$ROUNDS" >"$tmp/table.md" <<'PY' || status=$?
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
names = ["nixl", "xfer", "direct", "nixl_tcp", "xfer_tcp"]
runs = {n: [json.load(open(f"{tmp}/{n}.{r}.json"))["steps"] for r in range(1, rounds + 1)] for n in names}
with open(f"{tmp}/rounds.txt", "w") as f:  # (round_stats' input: the plot's)
    for n in names:
        for r, run in enumerate(runs[n], 1):
            for s in run:
                f.write(f"{r} {n} {s['size']} {s['gbps']}\n")
equal = all(s["data_equal"] for n in names for run in runs[n] for s in run)
print(f"Every READ brought the target's bytes, on both agents in every round: **{'yes' if equal else 'NO'}**.\n")
print("| block | blocks per request | NIXL GB/s | xfer.nixl GB/s | xfer.nixl / NIXL | xfer direct GB/s | xfer.nixl / direct | tcp: NIXL GB/s | tcp: xfer.nixl GB/s | tcp: xfer.nixl / NIXL |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for i, step in enumerate(runs["nixl"][0]):
    g = {n: statistics.median(run[i]["gbps"] for run in runs[n]) for n in names}
    size = step["size"]
    block = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
    print(f"| {block} | {step['blocks']} | {g['nixl']:.3f} | {g['xfer']:.3f} | {g['xfer'] / g['nixl']:.2f} | "
          f"{g['direct']:.3f} | {g['xfer'] / g['direct']:.2f} | {g['nixl_tcp']:.3f} | {g['xfer_tcp']:.3f} | "
          f"{g['xfer_tcp'] / g['nixl_tcp']:.2f} |")
sys.exit(0 if equal else 1)
PY
{
  echo "## nixl: xfer.nixl against NIXL's own agent"
  echo
  written_by bench/compare_nixl.sh "; nixl $nixl_version (PyPI, UCX inside)"
  echo
  echo "Command: \`bench/compare_nixl.sh\` (ROUNDS=$ROUNDS BYTES=$BYTES): bench/nixl_style.py on each agent, a target process each, on loopback: the metadata through the listener, then READs by make_prepped_xfer of up to 1,000 blocks per request, one request at a time, each polled with check_xfer_state until DONE. Each agent chooses its route (one host), then both over tcp (UCX_TLS=tcp,self; XFER_NIXL_TRANSPORT=tcp); \"direct\" moves the same blocks with the xfer.nixl agent's engine, posted and polled the same way (read_async, then done() until it is). GB/s = 1e9 B/s, the median of the rounds; about $BYTES bytes per block size, after two untimed requests."
  echo
  cat "$tmp/table.md"
  echo
  round_stats "$tmp/rounds.txt" "xfer/nixl xfer_tcp/nixl_tcp xfer/direct" >"$tmp/stats.txt" &&
    results_plot nixl "$tmp/stats.txt" "xfer.nixl against NIXL's agent, paired rounds" --baseline '^(nixl|direct)' \
      --name nixl="NIXL" --name xfer="xfer.nixl" --name nixl_tcp="NIXL, tcp" --name xfer_tcp="xfer.nixl, tcp" \
      --name direct="xfer, direct"
} >"$tmp/section.md"
results_section bench/RESULTS.md nixl "$tmp/section.md"
cat "$tmp/section.md"
exit $status
