#!/usr/bin/env bash
# What a request costs from Python over the same request from C++ (bench/python_cost.py, paired
# rounds in one run, a shm target process); writes the section "## python" of bench/RESULTS.md.
#   ROUNDS=5 bench/compare_python.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-5}
[ -x .venv/bin/python ] && [ -x build/bench/request_cost ] || {
  echo "compare_python: run ./scripts/setup.sh --test && ./scripts/build.sh first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
.venv/bin/python bench/python_cost.py --rounds "$ROUNDS" --rounds-file "$tmp/rounds.txt" >"$tmp/table.md"
{
  echo "## python: what a request costs from Python"
  echo
  written_by bench/compare_python.sh "; $(.venv/bin/python --version)"
  echo
  echo "Command: \`bench/compare_python.sh\` (ROUNDS=$ROUNDS): per round, build/bench/request_cost (C++) and then the same requests from Python (bench/python_cost.py), to one target process serving alloc() memory (path shm), local buffers registered on both sides. Means per call over 200,000 calls (8 B) and 300 requests (10,000 descriptors of 64 B, given as three numpy arrays in Python and built from three arrays in C++)."
  echo
  cat "$tmp/table.md"
  echo
  round_stats "$tmp/rounds.txt" "py_sync8/cpp_sync8 py_descs/cpp_descs" >"$tmp/stats.txt" &&
    results_plot python "$tmp/stats.txt" "time per request, Python / C++, paired rounds"
} >"$tmp/section.md"
results_section bench/RESULTS.md python "$tmp/section.md"
cat "$tmp/section.md"
