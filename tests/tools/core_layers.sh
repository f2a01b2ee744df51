#!/usr/bin/env bash
# The engine's layers, as an include graph: every `#include "dir/..."` edge between the parts of
# src/ below must be allowed here. Allowed edges go one way (each part's list holds all it may
# reach, so no chain of includes climbs back up):
#   core/<service>/: peers -> stage, regions; stage -> regions; datapath -> peers, regions;
#                    notify, verify -> peers, regions;
#                    each of them -> metrics and core/local_engine.h; metrics -> none of them;
#   core/engine_impl.* (the wiring) -> every service; only src/api includes engine_impl.h;
#   control, transport, metadata, util: never core or api; transport never control (whose
#   wire records carry the backends' blobs: transport/remote_region.h);
#   transport/<backend>/ -> transport's own headers and transport/common/, never a sibling
#   backend; transport/common/ -> no backend.
# Fails with each edge that breaks a rule.
set -euo pipefail
root=${1:?usage: core_layers.sh REPO_ROOT}
cd "$root/src"

# The part of src/ a file or an include path belongs to: core/<service>, core/base (the files
# at core/'s top but engine_impl), core/engine_impl, or the top folder (api, control, ...).
part_of() {
  case $1 in
    core/engine_impl.*) echo core/engine_impl ;;
    core/*/*) echo "core/$(echo "$1" | cut -d/ -f2)" ;;
    core/*) echo core/base ;;
    transport/*/*) echo "transport/$(echo "$1" | cut -d/ -f2)" ;;
    *) echo "${1%%/*}" ;;
  esac
}
# The parts a part may include (besides itself, util/ and the public xfer/ headers). The core
# reaches backends only through transport's own headers and common/ (no backend's folder).
T="transport transport/common"
allowed() {
  case $1 in
    api) echo "core/engine_impl core/base control $T metadata" ;;
    core/engine_impl) echo "core/peers core/regions core/datapath core/notify core/verify core/stage core/metrics core/base control $T metadata" ;;
    core/peers) echo "core/stage core/regions core/metrics core/base control $T metadata" ;;
    core/stage) echo "core/regions core/metrics core/base control $T" ;;
    core/regions) echo "core/metrics core/base control $T" ;;
    core/datapath) echo "core/peers core/regions core/metrics core/base control $T" ;;
    core/notify) echo "core/peers core/regions core/metrics core/base control $T" ;;
    core/verify) echo "core/peers core/regions core/metrics core/base control $T" ;;
    core/metrics) echo "core/base" ;;
    core/base) echo "" ;;
    control) echo "transport/remote_region.h" ;;
    transport) echo "transport/common" ;;
    transport/common) echo "transport" ;;
    transport/*) echo "transport transport/common" ;;
    metadata) echo "" ;;
    util) echo "" ;;
    *) echo "?" ;;
  esac
}

bad=0
edges=0
while IFS= read -r -d '' f; do
  from=$(part_of "$f")
  ok=" $(allowed "$from") "
  if [ "$ok" = " ? " ]; then
    echo "$f: not in any layer of this check (add its folder to tests/tools/core_layers.sh)"
    bad=1
    continue
  fi
  while IFS= read -r inc; do
    [ -n "$inc" ] || continue
    edges=$((edges + 1))
    case $inc in xfer/* | util/*) continue ;; esac
    to=$(part_of "$inc")
    [ "$to" = "$from" ] && continue
    case $ok in *" $to "* | *" $inc "*) continue ;; esac
    echo "$f: includes $inc ($from may not include $to)"
    bad=1
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
done < <(find api core control transport metadata util -type f \( -name '*.h' -o -name '*.cc' \) -print0 | sort -z)

if [ "$bad" -ne 0 ]; then
  echo "FAIL: the includes above climb the layers (tests/tools/core_layers.sh has them)"
  exit 1
fi
echo "ok: $edges include edges in src/ follow the layers"
