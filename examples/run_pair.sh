#!/usr/bin/env bash
# Runs an example's two processes as a user would: the target (ROLE1) in the background, then
# the initiator (ROLE2); both must exit 0 within 60 s.   run_pair.sh PROGRAM ROLE1 ROLE2
set -euo pipefail
prog=$1 target=$2 initiator=$3
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timeout 60 "$prog" "$target" "127.0.0.1:$port" &
pid=$!
for _ in $(seq 100); do  # until it listens
  [ -n "$(ss -Hltn "sport = :$port")" ] && break
  sleep 0.1
done
timeout 60 "$prog" "$initiator" "127.0.0.1:$port"
wait "$pid"
