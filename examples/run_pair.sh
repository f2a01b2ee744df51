#!/usr/bin/env bash
# Runs an example's two processes as a user would: the target (ROLE1) on a free port in the
# background, then the initiator (ROLE2) at the address the target printed; both must exit 0
# within 60 s.   run_pair.sh PROGRAM ROLE1 ROLE2
set -euo pipefail
prog=$1 target=$2 initiator=$3
out=$(mktemp)
trap 'rm -f "$out"' EXIT
timeout 60 "$prog" "$target" 127.0.0.1:0 >"$out" &
pid=$!
addr=""
for _ in $(seq 300); do  # until it has its pool and says where it listens
  addr=$(grep -o '127\.0\.0\.1:[0-9]*' "$out" | head -n 1 || true)
  [ -n "$addr" ] && break
  sleep 0.1
done
[ -n "$addr" ] || { echo "run_pair: the $target side printed no address" >&2; cat "$out" >&2; exit 1; }
timeout 60 "$prog" "$initiator" "$addr"
wait "$pid"
cat "$out"
