#!/usr/bin/env bash
# The engine core names no backend: src/core and src/control reach every backend through
# src/transport/backend.h, and only the registry (src/transport/backends.cc) lists them. Fails
# with each offending line (comments aside) when code there names a backend of the registry.
set -euo pipefail
root=${1:?usage: core_names_no_backend.sh REPO_ROOT}
names=$(grep '^#define XFER_BACKENDS(X)' "$root/src/transport/backends.cc" |
        grep -o 'X([A-Za-z]*)' | sed 's/^X(//; s/)$//' | tr 'A-Z' 'a-z')
[ -n "$names" ] || { echo "FAIL: no backends found in the registry"; exit 1; }
# A name as a word ("tcp", "shm::", "ucx_"), or capitalized at a word's start ("TcpTransport"),
# or quoted alone ("local"). ("local" is an everyday word too: only quoted, as local::, or in
# the local backend's class names.)
words=$(echo "$names" | grep -vx local | paste -sd'|')
caps=$(echo "$names" | grep -vx local | sed 's/^./\U&/' | paste -sd'|')
pattern="\\b($words)\\b|\\b($caps)[A-Z_a-z]*|\"($(echo "$names" | paste -sd'|'))\"|\\blocal::|\\bLocal(Transport|Backend|Link|Route)"
found=0
while IFS= read -r -d '' f; do
  # Strip // comments, then look for a backend's name as a word, in code or in a string.
  hits=$(sed 's://.*$::' "$f" | grep -nE "$pattern" || true)
  if [ -n "$hits" ]; then
    echo "$hits" | sed "s|^|${f#$root/}:|"
    found=1
  fi
done < <(find "$root/src/core" "$root/src/control" -type f -print0 | sort -z)
if [ "$found" -ne 0 ]; then
  echo "FAIL: the lines above name a backend ($(echo "$names" | paste -sd' ')) in the core"
  exit 1
fi
echo "ok: src/core and src/control name none of: $(echo "$names" | paste -sd' ')"
