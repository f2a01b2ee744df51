#!/usr/bin/env bash
# The engine core moves no bytes itself: copies are the backends' and transport/common's
# (host_copy.h). The one exception is the notification ring, whose records the core writes
# and encodes (src/core/notify/notify_ring.cc, ring_record.cc). Fails with each line of src/core (comments aside) that calls
# memcpy or memmove elsewhere.
set -euo pipefail
root=${1:?usage: core_moves_no_bytes.sh REPO_ROOT}
found=0
while IFS= read -r -d '' f; do
  case $f in */core/notify/notify_ring.cc | */core/notify/ring_record.cc) continue ;; esac
  hits=$(sed 's://.*$::' "$f" | grep -nE '\b(std::)?(memcpy|memmove)[[:space:]]*\(' || true)
  if [ -n "$hits" ]; then
    echo "$hits" | sed "s|^|${f#$root/}:|"
    found=1
  fi
done < <(find "$root/src/core" -type f -print0 | sort -z)
if [ "$found" -ne 0 ]; then
  echo "FAIL: the lines above copy bytes in the core (use transport::CopyHost, or a backend's link)"
  exit 1
fi
echo "ok: src/core copies no bytes outside the notification ring"
