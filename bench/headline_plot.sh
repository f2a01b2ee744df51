#!/usr/bin/env bash
# The README's headline plot: WRITE and READ bandwidth against block size over each same-host
# route (shm, cma) and tcp, one xfer-bench run each on this machine, drawn by bench/plot.py into
# docs/img/headline.png. Records when and where in bench/RESULTS.md ("## plot").
#
#   bench/headline_plot.sh      env: DURATION=0.3 (s per size)  SIZES=4K:8M
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
DURATION=${DURATION:-0.3}
SIZES=${SIZES:-4K:8M}
/usr/bin/python3 -c "import matplotlib" 2>/dev/null || { echo "headline_plot: needs python3-matplotlib" >&2; exit 1; }
cmake --build build --target xfer-bench >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() {  # NAME ARGS...: both ops, into $tmp/NAME.json
  local name=$1
  shift
  echo "headline_plot: $name" >&2
  build/tools/xfer-bench -s "$SIZES" -D "$DURATION" "$@" --json "$tmp/$name.json" >/dev/null
}
run shm --mem alloc
run cma --mem register
run tcp --transport tcp --mem register
/usr/bin/python3 bench/plot.py -o docs/img/headline --title "xfer on one 2-core VM: WRITE and READ, two processes" \
  "$tmp/shm.json=" "$tmp/cma.json=" "$tmp/tcp.json=" >&2
rm -f docs/img/headline.svg  # (the README shows the PNG)
out=$tmp/section.md
{
  echo "## plot: the README's headline plot"
  echo
  written_by bench/headline_plot.sh
  echo
  echo "Command: \`bench/headline_plot.sh\` (DURATION=$DURATION SIZES=$SIZES): xfer-bench's main job (WRITE, then READ, a target child process) once per route: shm (--mem alloc), cma (--mem register), tcp (--transport tcp). One run each, not rounds: a picture of the shape, not a comparison (the sections above hold those). Drawn by bench/plot.py into docs/img/headline.png."
} >"$out"
results_section bench/RESULTS.md plot "$out"
cat "$out"
