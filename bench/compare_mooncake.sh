#!/usr/bin/env bash
# The differential check against the real Mooncake Transfer Engine: one Mooncake-style program
# (bench/mooncake_style.py: sync, batched, async; several block sizes) runs against
# mooncake.engine.TransferEngine (PyPI's CPU build, mooncake-transfer-engine-non-cuda, in its own
# virtual environment build/mooncake-venv) and against xfer.mooncake.TransferEngine (.venv),
# over tcp on loopback (xfer forced to its tcp transport, like for like) and, for reference,
# xfer choosing its route (shm on one host). Every round runs the three, in an order that
# rotates by round. The results (return codes, data read back) must be the same; the section
# "## mooncake" of bench/RESULTS.md gets the median GB/s of each step.
#   ROUNDS=3 BYTES=64M bench/compare_mooncake.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-3}
BYTES=$(to_bytes "${BYTES:-64M}")
MC_VENV=build/mooncake-venv
[ -x .venv/bin/python ] || { echo "compare_mooncake: run ./scripts/setup.sh --test && ./scripts/build.sh first" >&2; exit 1; }
mc_version=$(peer_venv "$MC_VENV" mooncake.engine mooncake-transfer-engine-non-cuda)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() {  # run NAME ROUND
  case $1 in
    mooncake) "$MC_VENV/bin/python" bench/mooncake_style.py --impl mooncake --bytes "$BYTES" ;;
    xfer_tcp) XFER_MOONCAKE_TRANSPORT=tcp .venv/bin/python bench/mooncake_style.py --impl xfer --bytes "$BYTES" ;;
    xfer_best) .venv/bin/python bench/mooncake_style.py --impl xfer --bytes "$BYTES" ;;
  esac >"$tmp/$1.$2.json" 2>>"$tmp/log.txt"
}
rotate "$ROUNDS" mooncake xfer_tcp xfer_best

status=0
.venv/bin/python - "$tmp" "$ROUNDS" >"$tmp/table.md" <<'PY' || status=$?
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
names = ["mooncake", "xfer_tcp", "xfer_best"]
runs = {n: [json.load(open(f"{tmp}/{n}.{r}.json"))["steps"] for r in range(1, rounds + 1)] for n in names}
with open(f"{tmp}/rounds.txt", "w") as f:  # (round_stats' input: the plot's)
    for n in names:
        for r, run in enumerate(runs[n], 1):
            for s in run:
                if "gbps" in s and s.get("size"):
                    f.write(f"{r} {n}_{s['step']} {s['size']} {s['gbps']}\n")
def key(s): return (s["step"], s.get("size"))
def outcome(s): return {k: s[k] for k in ("rc", "target_rc", "remote_nonzero", "local_nonzero", "data_equal", "sha") if k in s}
same, rows = True, []
for i, step in enumerate(runs["mooncake"][0]):
    outcomes = {n: [outcome(run[i]) for run in runs[n]] for n in names}
    agree = all(o == outcomes["mooncake"][0] for n in names for o in outcomes[n])
    same &= agree
    gbps = {n: statistics.median(run[i]["gbps"] for run in runs[n]) if "gbps" in step else None for n in names}
    rows.append((step, outcomes["mooncake"][0], agree, gbps))
print(f"Results (return codes, data read back) the same for all three in every round: **{'yes' if same else 'NO'}**.\n")
print("| step | block | result | same | Mooncake GB/s | xfer.mooncake tcp GB/s | tcp: xfer / Mooncake | xfer.mooncake, best route GB/s |")
print("|---|---:|---|---|---:|---:|---:|---:|")
for step, o, agree, g in rows:
    result = f"rc {o['rc']}" + (", data equal" if o.get("data_equal") else ", data DIFFERS" if "data_equal" in o else "")
    size = step.get("size")
    block = "" if size is None else (f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB")
    cell = lambda v: "" if v is None else f"{v:.3f}"
    ratio = "" if g["mooncake"] in (None, 0) else f"{g['xfer_tcp'] / g['mooncake']:.2f}"
    print(f"| {step['step']} | {block} | {result} | {'yes' if agree else 'NO'} | {cell(g['mooncake'])} | {cell(g['xfer_tcp'])} | {ratio} | {cell(g['xfer_best'])} |")
sys.exit(0 if same else 1)
PY
{
  echo "## mooncake: xfer.mooncake against Mooncake's own engine"
  echo
  written_by bench/compare_mooncake.sh "; mooncake-transfer-engine-non-cuda $mc_version"
  echo
  echo "Command: \`bench/compare_mooncake.sh\` (ROUNDS=$ROUNDS BYTES=$BYTES): bench/mooncake_style.py against each engine, a target process each, both on loopback with protocol \"tcp\"; xfer.mooncake once forced to its tcp transport (XFER_MOONCAKE_TRANSPORT=tcp) and once choosing its route (shm: one host). GB/s = 1e9 B/s, the median of the rounds; about $BYTES bytes per step and block size (single-block steps: a quarter, at most 4096 calls), after a few untimed calls."
  echo
  cat "$tmp/table.md"
  echo
  steps=$(awk '$2 ~ /^mooncake_/ { sub(/^mooncake_/, "", $2); print $2 }' "$tmp/rounds.txt" | sort -u)
  pairs=$(for s in $steps; do printf ' xfer_tcp_%s/mooncake_%s' "$s" "$s"; done)
  round_stats "$tmp/rounds.txt" "$pairs" >"$tmp/stats.txt" &&
    results_plot mooncake "$tmp/stats.txt" "xfer.mooncake against Mooncake's engine (tcp), paired rounds" --baseline '^mooncake_'
} >"$tmp/section.md"
results_section bench/RESULTS.md mooncake "$tmp/section.md"
cat "$tmp/section.md"
exit $status
