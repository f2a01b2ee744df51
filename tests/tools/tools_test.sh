#!/usr/bin/env bash
# Tests of xfer-bench and xfer-info as users run them. One case per invocation:
#   tools_test.sh <case> XFER_BENCH XFER_INFO     (or the binaries in $XFER_BENCH, $XFER_INFO)
# Exit 0 = pass, 77 = skipped (the reason on one line), anything else = fail.
set -uo pipefail
XB=${2:-${XFER_BENCH:?give the xfer-bench binary}}
XI=${3:-${XFER_INFO:-}}
case_name=${1:?usage: tools_test.sh <case>}
tmp=$(mktemp -d)
pids=()
cleanup_extra=()
cleanup() {
  local p c
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  for c in "${cleanup_extra[@]}"; do eval "$c" >/dev/null 2>&1; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
# Small buffers keep every run short (also under ASan).
SMALL=(--span 4M --connect-timeout 20)

# expect_exit CODE PATTERN cmd...: the command exits CODE and its stderr matches PATTERN.
expect_exit() {
  local want=$1 pat=$2 rc
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ "$rc" = "$want" ] || { cat "$tmp/out" "$tmp/err" >&2; fail "'$*' exited $rc, want $want"; }
  grep -qiE -- "$pat" "$tmp/err" || { cat "$tmp/err" >&2; fail "'$*': stderr does not say /$pat/"; }
}

# A data row of the table: starts with the byte count.
has_row() { grep -qE "^(-> +|<- +|sum +)?$1 +[0-9]+ +[0-9.]+" "$2"; }
# has_path FILE PATTERN: a "# path:" line (after a test's rows) matches PATTERN.
has_path() { grep -qE "^# path( ->| <-)?: $2" "$1" || { cat "$1" >&2; fail "no '# path: $2' line"; }; }
# Whether xfer-info --no-engine prints a line matching PATTERN. (grep reads it all: with -q it
# would stop at the first match and end xfer-info, and the pipe, with SIGPIPE.)
info_has() { [ -n "$XI" ] && "$XI" --no-engine 2>/dev/null | grep -E "$1" >/dev/null; }
# Whether this machine offers shm (pidfd_getfd), as an engine here starts it.
shm_ok() { info_has '^  shm +available'; }
# Whether GPU memory is usable here (a CUDA build and a GPU), as an engine here starts it.
gpu_ok() { info_has '^  cuda +available'; }

# two_hosts N: namespaces $S (server side) and $C (client side), removed at exit, joined by N
# veth pairs: pair n is xh$$s$n in $S and xh$$c$n in $C, in a /30 of its own (host_ip). Returns
# once every end runs (an engine refuses an interface that is up but not yet running). Skips
# where this machine cannot (not root, no iproute2, no veth).
two_hosts() {
  local n ns
  [ "$(id -u)" = 0 ] || skip "netns test needs root (ip netns add)"
  command -v ip >/dev/null || skip "ip (iproute2) not installed"
  S=xhs$$ C=xhc$$
  ip netns add "$S" 2>"$tmp/e" || skip "ip netns add failed: $(head -1 "$tmp/e")"
  cleanup_extra+=("ip netns del $S")
  ip netns add "$C" || fail "ip netns add $C"
  cleanup_extra+=("ip netns del $C")
  for ((n = 0; n < $1; n++)); do
    ip link add "xh$$s$n" netns "$S" type veth peer name "xh$$c$n" netns "$C" 2>"$tmp/e" \
      || skip "veth not available: $(head -1 "$tmp/e")"
    ip -n "$S" addr add "$(host_ip $n 1)/30" dev "xh$$s$n" || fail "addr"
    ip -n "$C" addr add "$(host_ip $n 2)/30" dev "xh$$c$n" || fail "addr"
    { ip -n "$S" link set "xh$$s$n" up && ip -n "$C" link set "xh$$c$n" up; } || fail "link up"
  done
  for ns in "$S" "$C"; do ip -n "$ns" link set lo up; done
  for _ in $(seq 50); do running "$1" && return; sleep 0.1; done
  fail "the veth pairs did not come up within 5 s"
}
# host_ip N K: pair N's address in $S (K=1) or in $C (K=2).
host_ip() { echo "10.$((233 + $1)).0.$(($$ % 64 * 4 + $2))"; }
# running N: every end of the N pairs runs.
running() {
  local n
  for ((n = 0; n < $1; n++)); do
    ip netns exec "$S" cat "/sys/class/net/xh$$s$n/operstate"
    ip netns exec "$C" cat "/sys/class/net/xh$$c$n/operstate"
  done | { ! grep -qv '^up$'; }
}

case "$case_name" in
args)
  expect_exit 2 "bad size" "$XB" write_bw -s 12Q
  expect_exit 2 "bad size range" "$XB" write_bw -s 8M:16K
  expect_exit 2 "unknown transport" "$XB" read_bw --transport carrier-pigeon
  expect_exit 2 "depth" "$XB" write_bw --depth 0
  expect_exit 2 "threads" "$XB" write_bw --threads 0
  if ! gpu_ok; then  # GPU memory without a usable GPU: refused up front, with the reason
    expect_exit 2 "local-mem cuda:0: (no GPU|not built with CUDA)" "$XB" write_bw --local-mem cuda:0
    expect_exit 2 "remote-mem cuda:1.*(no GPU|not built with CUDA)" "$XB" read_bw --remote-mem cuda:1
    expect_exit 2 "transport cuda: (no GPU|not built with CUDA)" "$XB" write_bw --transport cuda
  fi
  expect_exit 2 "bad value" "$XB" write_bw --local-mem gpu
  expect_exit 2 "bad value" "$XB" write_bw --remote-mem cuda:x
  expect_exit 2 "buffer-pool does not apply to the table" "$XB" table --buffer-pool
  expect_exit 2 "expect-bw" "$XB" write_bw --expect-bw fast
  expect_exit 2 "not expected|extra|arguments" "$XB" write_bw 127.0.0.1:1 extra-arg
  expect_exit 2 "subcommand|not expected|extra|arguments" "$XB" no_such_test
  expect_exit 2 "duration" "$XB" write_bw -D 0
  expect_exit 2 "bidirectional does not apply" "$XB" table -b
  expect_exit 2 "listen.*bad address" "$XB" serve --listen nonsense
  expect_exit 2 "mem.*bad value" "$XB" write_bw --mem heap
  expect_exit 2 "huge-pages applies to --mem alloc" "$XB" write_bw --mem register --huge-pages
  expect_exit 2 "unknown option 'tcp.linx'.*tcp.links" "$XB" write_bw --set tcp.linx=4
  expect_exit 2 "streams: 'four' is not a whole number" "$XB" write_bw --set streams=four
  expect_exit 2 "KEY=VALUE" "$XB" write_bw --set tcp.links
  # (--set takes one value: the peer after it stays the peer, here one nothing listens at.)
  expect_exit 1 "cannot reach xfer-bench serve at 127.0.0.1:1" "$XB" write_bw --set tcp.links=3 127.0.0.1:1 --connect-timeout 2
  ;;
run)
  "$XB" write_bw -s 64K -n 50 "${SMALL[@]}" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err"; fail "write_bw exited $?"; }
  has_row 65536 "$tmp/out" || { cat "$tmp/out"; fail "no row for 65536 B"; }
  grep -q "^# rerun:" "$tmp/out" || fail "no rerun line"
  grep -qE "^# peer: .*transport (cma|local)" "$tmp/out" || fail "no transport in the header"
  grep -q "links n/a for transport" "$tmp/out" || fail "the header does not say what --links does"
  "$XB" read_lat -s 4K,64K -n 100 --threads 2 "${SMALL[@]}" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err"; fail "read_lat exited"; }
  { has_row 4096 "$tmp/out" && has_row 65536 "$tmp/out"; } || { cat "$tmp/out"; fail "read_lat rows"; }
  grep -q "t_typ" "$tmp/out" || fail "latency columns missing"
  # --links before the engine has it for cma: accepted and reported, not ignored.
  "$XB" write_bw -s 64K -n 20 --links 4 --transport cma "${SMALL[@]}" >"$tmp/out" 2>&1 || fail "--links run"
  grep -q "links 4 requested: n/a for transport cma" "$tmp/out" || { cat "$tmp/out"; fail "--links not reported"; }
  ;;
options)
  # The remaining knobs: each accepted, each visible in the header's rerun line.
  "$XB" write_lat -s 4K,8K -n 30 --reuse -w 2 --batch 4 --streams 1 --slice-bytes 64K \
    --batch-bytes 128K --spin 10 "${SMALL[@]}" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err"; fail "write_lat with knobs"; }
  { has_row 4096 "$tmp/out" && has_row 8192 "$tmp/out"; } || { cat "$tmp/out"; fail "rows"; }
  grep -q "^# buffers:   --reuse" "$tmp/out" || fail "the header does not say --reuse"
  grep -qE "^# rerun: .*-w 2 --batch 4 .*--streams 1.*--reuse" "$tmp/out" || { cat "$tmp/out"; fail "rerun line misses options"; }
  # tcp with several links, forced between two processes of this host.
  "$XB" read_bw -s 1M -n 20 --transport tcp --links 3 --verify "${SMALL[@]}" >"$tmp/out" 2>"$tmp/err" \
    || { cat "$tmp/err"; fail "read_bw over tcp"; }
  grep -qE "^# peer: .*transport tcp" "$tmp/out" || { cat "$tmp/out"; fail "tcp not used"; }
  grep -qE "links 3" "$tmp/out" || { cat "$tmp/out"; fail "links not reported"; }
  grep -q "# verify" "$tmp/out" && { cat "$tmp/out"; fail "verify failed"; }
  has_row 1048576 "$tmp/out" || fail "tcp row"
  # --buffer-pool: EngineOptions::staging = always on both sides; every byte is staged.
  "$XB" write_bw -s 64K,1M -n 20 --buffer-pool --verify "${SMALL[@]}" >"$tmp/out" 2>"$tmp/err" \
    || { cat "$tmp/out" "$tmp/err"; fail "--buffer-pool run"; }
  grep -qE "^# memory: .*--buffer-pool: every transfer staged" "$tmp/out" || { cat "$tmp/out"; fail "header does not say --buffer-pool"; }
  grep -qE "^# rerun: .*--buffer-pool" "$tmp/out" || fail "rerun line misses --buffer-pool"
  has_path "$tmp/out" "shm 0% \(0 bytes\), cma 0% \(0 bytes\), cuda 0% \(0 bytes\), staged 100%"
  grep -q "# verify" "$tmp/out" && { cat "$tmp/out"; fail "verify failed through the buffer pool"; }
  # --set: any option by name, both sides; staging=always stages every byte, as --buffer-pool.
  "$XB" write_bw -s 64K -n 20 --set staging=always --set staging_buffer_bytes=128K --verify "${SMALL[@]}" \
    >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/out" "$tmp/err"; fail "--set run"; }
  grep -qE "^# rerun: .*--set '?staging=always'? --set '?staging_buffer_bytes=128K'?" "$tmp/out" \
    || { cat "$tmp/out"; fail "rerun line misses --set"; }
  has_path "$tmp/out" "shm 0% \(0 bytes\), cma 0% \(0 bytes\), cuda 0% \(0 bytes\), staged 100%"
  grep -q "# verify" "$tmp/out" && { cat "$tmp/out"; fail "verify failed with --set staging=always"; }
  ;;
json)
  command -v jq >/dev/null || skip "jq not installed (scripts/setup.sh installs it)"
  "$XB" read_bw -s 16K,64K -n 40 --depth 4 --json "$tmp/r.json" --csv "$tmp/r.csv" "${SMALL[@]}" >"$tmp/out" 2>"$tmp/err" \
    || { cat "$tmp/err"; fail "read_bw --json exited"; }
  jq -e '.schema == "xfer-bench" and (.schema_version | type == "number")' "$tmp/r.json" >/dev/null || fail "schema name/version"
  jq -e '.rows | length == 2' "$tmp/r.json" >/dev/null || fail "want 2 rows"
  jq -e '[.rows[].bytes] == [16384, 65536]' "$tmp/r.json" >/dev/null || fail "row sizes"
  jq -e 'all(.rows[]; .bw_avg_GBps > 0 and .iters == 40 and .lat_us.p99 > 0 and .op == "READ")' "$tmp/r.json" >/dev/null || fail "row fields"
  jq -e '.config.depth == 4 and (.peer.transport | length > 0) and (.command | length > 0)' "$tmp/r.json" >/dev/null || fail "config/peer"
  # (.peer.cuda: the peer is reached by the cuda transport, as where xfer-info finds a GPU)
  want_cuda=$(gpu_ok && echo true || echo false)
  jq -e --argjson cuda "$want_cuda" '.config.staging == "auto" and .peer.cuda == $cuda
         and all(.rows[]; .cuda_bytes == 0 and .staged_bytes == 0 and .direction == "H2H" and .path == "direct")
         and all(.paths[]; .cuda_bytes == 0 and .staged_bytes == 0)' "$tmp/r.json" >/dev/null || fail "cuda/staged fields"
  [ "$(wc -l <"$tmp/r.csv")" = 3 ] || fail "csv: want a header and 2 rows"
  head -1 "$tmp/r.csv" | grep -q ",cuda_bytes,staged_bytes$" || fail "csv: no cuda_bytes/staged_bytes columns"
  ;;
expect)
  expect_exit 3 "expect-bw.*65536" "$XB" write_bw -s 64K -n 20 --expect-bw 100000 "${SMALL[@]}"
  expect_exit 3 "expect-p99" "$XB" write_lat -s 4K -n 20 --expect-p99 0 "${SMALL[@]}"
  "$XB" write_bw -s 64K -n 20 --expect-bw 0.000001 "${SMALL[@]}" >/dev/null 2>&1 || fail "a met --expect-bw must exit 0"
  ;;
notify)
  # Every request notified, both ways at once (each side drains its queue), over tcp and cma.
  for t in tcp cma; do
    "$XB" write_bw -s 4K -n 2000 --depth 8 -b --notify --transport $t --mem register "${SMALL[@]}" >"$tmp/out" 2>"$tmp/err" \
      || { cat "$tmp/out" "$tmp/err"; fail "--notify over $t exited"; }
    grep -qE "^sum +4096 " "$tmp/out" || { cat "$tmp/out"; fail "--notify over $t: no sum row"; }
    grep -q "^# rerun: .* --notify" "$tmp/out" || fail "the rerun line lacks --notify"
  done
  ;;
secret)
  # --secret-file on both sides (the local target child gets it) over tcp; XFER_SECRET_FILE
  # alike; a secret too short is refused with the reason. (A build without libsodium refuses
  # every secret: CMake sets XFER_TEST_SODIUM=0 for it.)
  [ "${XFER_TEST_SODIUM:-1}" = 0 ] && skip "built without libsodium: every secret is refused"
  head -c 32 /dev/urandom >"$tmp/secret"
  "$XB" write_bw -s 64K -n 50 --transport tcp --secret-file "$tmp/secret" "${SMALL[@]}" >"$tmp/out" 2>"$tmp/err" \
    || { cat "$tmp/out" "$tmp/err"; fail "--secret-file over tcp exited"; }
  grep -qE "^65536 " "$tmp/out" || { cat "$tmp/out"; fail "--secret-file: no row"; }
  XFER_SECRET_FILE="$tmp/secret" "$XB" read_bw -s 64K -n 50 --transport tcp "${SMALL[@]}" >"$tmp/out" 2>"$tmp/err" \
    || { cat "$tmp/out" "$tmp/err"; fail "XFER_SECRET_FILE over tcp exited"; }
  printf short >"$tmp/short"
  "$XB" write_bw -s 64K -n 5 --secret-file "$tmp/short" "${SMALL[@]}" >"$tmp/out" 2>&1 && fail "a short secret was taken"
  grep -q "at least 16 bytes" "$tmp/out" || { cat "$tmp/out"; fail "no reason given for the short secret"; }
  ;;
bidir)
  "$XB" write_bw -s 64K -n 60 -b --threads 2 --depth 2 --verify "${SMALL[@]}" >"$tmp/out" 2>"$tmp/err" \
    || { cat "$tmp/out" "$tmp/err"; fail "bidirectional run exited"; }
  for d in '->' '<-' sum; do grep -qE "^$d +65536 " "$tmp/out" || { cat "$tmp/out"; fail "no $d row"; }; done
  grep -q "FAILED" "$tmp/out" && fail "verify failed"
  # In-process target (local transport), bidirectional too.
  "$XB" read_bw -s 16K -n 40 -b --transport local "${SMALL[@]}" >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "local -b"; }
  grep -qE "^sum +16384 " "$tmp/out" || fail "local -b: no sum row"
  ;;
table)
  "$XB" table -s 64K -n 20 "${SMALL[@]}" --json "$tmp/t.json" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err"; fail "table exited"; }
  grep -qP "^scenario\top\tblock\ttransport\tdirection\tpath\tGBps" "$tmp/out" || fail "no TSV header"
  grep -qP "^single_machine\twrite\t64K\tcma\tH2H\tdirect\t[0-9.]+\t" "$tmp/out" || { cat "$tmp/out"; fail "no cma H2H cell"; }
  grep -qP "^single_machine\tread\t64K\tlocal\tH2H\tdirect\t[0-9.]+\t" "$tmp/out" || fail "no local H2H cell"
  grep -qP "^single_machine\twrite\t64K\tcma\tD2D\tdirect\tn/a\t\[[0-9]+\]" "$tmp/out" || fail "cma D2D not marked n/a"
  grep -qP "^single_machine\twrite\t64K\tcma\tH2H\tbufferpool\tn/a\t" "$tmp/out" || fail "cma bufferpool not marked n/a"
  grep -qE "^# \[[0-9]+\] n/a: .*GPU" "$tmp/out" || fail "no GPU footnote"
  # The buffer pool: measured under tcp (staging = always, different host ids), every byte staged.
  grep -qP "^single_machine\t(write|read)\t64K\ttcp\tH2H\tbufferpool\t[0-9.]+\t" "$tmp/out" || { cat "$tmp/out"; fail "no tcp H2H bufferpool cell"; }
  grep -qE "^# path tcp H2H bufferpool: .*staged 100%" "$tmp/out" || { cat "$tmp/out"; fail "bufferpool cells not staged"; }
  if gpu_ok; then
    grep -qP "^single_machine\twrite\t64K\tcuda\tD2D\tdirect\t[0-9.]+\t" "$tmp/out" || { cat "$tmp/out"; fail "no cuda D2D cell"; }
    grep -qE "^# path cuda D2D direct: .*cuda 100%" "$tmp/out" || { cat "$tmp/out"; fail "cuda cells not through cuda"; }
  else
    grep -qP "^single_machine\twrite\t64K\tcuda\tD2D\tdirect\tn/a\t\[[0-9]+\]" "$tmp/out" || fail "cuda D2D not n/a without a GPU"
    grep -qP "^single_machine\tread\t64K\ttcp\tD2H\tbufferpool\tn/a\t\[[0-9]+\]" "$tmp/out" || fail "tcp D2H bufferpool not n/a without a GPU"
    grep -qE "^# \[[0-9]+\] n/a: (no GPU|not built with CUDA)" "$tmp/out" || fail "no 'no GPU' footnote"
  fi
  # A transport this build lacks is a footnote, not an error.
  if info_has '^  (tcp|shm|ucx) +unavailable +[a-z]+: this build has no'; then
    grep -qE "^# \[[0-9]+\] n/a: [a-z]+: transport not built" "$tmp/out" || fail "no transport footnote"
  fi
  # 2 ops x 1 size x 6 transports x 4 directions x 2 paths
  [ "$(grep -cP '^single_machine\t' "$tmp/out")" = 96 ] || fail "want 96 cells"
  grep -qE "^# path cma: shm 0% \(0 bytes\), cma 100%" "$tmp/out" || { cat "$tmp/out"; fail "cma cells did not go through cma"; }
  if shm_ok; then
    grep -qP "^single_machine\twrite\t64K\tshm\tH2H\tdirect\t[0-9.]+\t" "$tmp/out" || { cat "$tmp/out"; fail "no shm H2H cell"; }
    grep -qP "^single_machine\tread\t64K\tshm\tH2H\tdirect\t[0-9.]+\t" "$tmp/out" || fail "no shm H2H read cell"
    grep -qE "^# path shm: shm 100%" "$tmp/out" || { cat "$tmp/out"; fail "shm cells did not go through shm"; }
  fi
  # Registered memory: the shm cells are n/a, with the reason.
  "$XB" table -s 64K -n 10 --mem register "${SMALL[@]}" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err"; fail "table --mem register exited"; }
  grep -qP "^single_machine\twrite\t64K\tshm\tH2H\tdirect\tn/a\t\[[0-9]+\]" "$tmp/out" || { cat "$tmp/out"; fail "shm not n/a with --mem register"; }
  grep -qE "^# \[[0-9]+\] n/a: shm: moves only Engine::AllocMem memory" "$tmp/out" || fail "no shm footnote"
  ;;
shm)
  shm_ok || skip "shm not available here (xfer-info: $("$XI" --no-engine 2>/dev/null | grep -E '^  shm' | sed 's/  */ /g'))"
  # The default (no test named): buffers from AllocMem, so the bytes go through shm.
  "$XB" -s 64K -n 30 "${SMALL[@]}" --json "$tmp/d.json" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/out" "$tmp/err"; fail "default run exited"; }
  has_row 65536 "$tmp/out" || { cat "$tmp/out"; fail "default run: no row"; }
  grep -qE "^# memory: .*--mem alloc" "$tmp/out" || { cat "$tmp/out"; fail "the header does not say --mem alloc"; }
  grep -qE "^# peer: .*; bytes over shm \(the peer's AllocMem memory is mapped here\); transport " "$tmp/out" \
    || { cat "$tmp/out"; fail "the header does not say the bytes go over shm"; }
  [ "$(grep -cE '^# path: shm 100% \([0-9]+ bytes\), cma 0%' "$tmp/out")" = 2 ] || { cat "$tmp/out"; fail "default run: want WRITE and READ through shm"; }
  if command -v jq >/dev/null; then
    jq -e '.config.mem == "alloc" and .peer.shm == true and (.paths | length == 2)
           and all(.paths[]; .shm_pct == 100 and .shm_bytes == .moved_bytes and .transport_bytes == 0)
           and all(.rows[]; .shm_bytes > 0 and .transport_bytes == 0)' "$tmp/d.json" >/dev/null \
      || { cat "$tmp/d.json"; fail "json: path fields"; }
  fi
  # Registered memory goes through the peer's transport: cma on one host.
  "$XB" write_bw -s 64K -n 30 --mem register "${SMALL[@]}" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/out" "$tmp/err"; fail "--mem register exited"; }
  has_path "$tmp/out" "shm 0% \(0 bytes\), cma 100%"
  grep -qE "^# rerun: .*--mem register" "$tmp/out" || fail "rerun line misses --mem register"
  # shm forced: only AllocMem memory; registered memory is refused up front, with the reason.
  expect_exit 2 "transport shm.*AllocMem" "$XB" write_bw -s 64K -n 10 --transport shm --mem register "${SMALL[@]}"
  "$XB" read_bw -s 64K -n 30 --transport shm --verify "${SMALL[@]}" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/out" "$tmp/err"; fail "--transport shm exited"; }
  grep -qE "^# peer: .*transport shm \(forced\)" "$tmp/out" || { cat "$tmp/out"; fail "shm not forced"; }
  has_path "$tmp/out" "shm 100%"
  grep -q "# verify" "$tmp/out" && { cat "$tmp/out"; fail "verify failed over shm"; }
  # Forcing cma disables shm, even for AllocMem memory.
  "$XB" write_bw -s 64K -n 30 --transport cma "${SMALL[@]}" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/out" "$tmp/err"; fail "--transport cma exited"; }
  has_path "$tmp/out" "shm 0% \(0 bytes\), cma 100%"
  # --huge-pages is accepted; where the kernel has none the engine falls back (the header says so).
  "$XB" write_bw -s 64K -n 20 --huge-pages "${SMALL[@]}" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/out" "$tmp/err"; fail "--huge-pages exited"; }
  grep -qE "^# memory: .*--huge-pages: page size here [0-9]+ kB" "$tmp/out" || { cat "$tmp/out"; fail "--huge-pages not reported"; }
  has_path "$tmp/out" "shm 100%"
  # Two processes through serve/client on 127.0.0.1: the client's --mem travels to the server.
  port=$((20000 + ($$ + 7919) % 12000))  # below the kernel's ephemeral ports (32768 up)
  "$XB" serve --listen 127.0.0.1:$port >"$tmp/srv" 2>&1 &
  pids+=("$!")
  "$XB" write_bw -s 64K -n 30 --mem alloc -b "${SMALL[@]}" 127.0.0.1:$port >"$tmp/cli" 2>&1 || { cat "$tmp/cli" "$tmp/srv"; fail "serve/client alloc"; }
  grep -qE "^sum +65536 " "$tmp/cli" || { cat "$tmp/cli"; fail "serve/client: no row"; }
  [ "$(grep -cE '^# path (->|<-): shm 100%' "$tmp/cli")" = 2 ] || { cat "$tmp/cli"; fail "serve/client alloc: want shm both ways"; }
  "$XB" read_bw -s 64K -n 30 --mem register "${SMALL[@]}" 127.0.0.1:$port >"$tmp/cli" 2>&1 || { cat "$tmp/cli" "$tmp/srv"; fail "serve/client register"; }
  has_path "$tmp/cli" "shm 0% \(0 bytes\), cma 100%"
  grep -q "4M registered" "$tmp/srv" || { cat "$tmp/srv"; fail "the server did not honour --mem register"; }
  grep -q "4M allocated (AllocMem)" "$tmp/srv" || { cat "$tmp/srv"; fail "the server did not honour --mem alloc"; }
  ;;
serve)
  # Below the kernel's ephemeral ports (32768 up by default): no outgoing connection of another
  # process, or of the client's own retries, can hold it when the server binds.
  port=$((20000 + $$ % 10000))
  # Start order must not matter: the client first, the server a second later.
  "$XB" write_bw -s 64K -n 50 "${SMALL[@]}" -b 127.0.0.1:$port >"$tmp/cli" 2>&1 &
  cli=$!
  pids+=("$cli")
  sleep 1
  "$XB" serve --listen 127.0.0.1:$port >"$tmp/srv" 2>&1 &
  pids+=("$!")
  wait "$cli" || { cat "$tmp/cli" "$tmp/srv"; fail "client exited $?"; }
  grep -qE "^sum +65536 " "$tmp/cli" || { cat "$tmp/cli"; fail "no row"; }
  grep -q "xfer-bench serve at 127.0.0.1:$port" "$tmp/cli" || fail "header does not name the server"
  # The server waits for the next client, which sends other options.
  "$XB" read_lat -s 4K -n 30 "${SMALL[@]}" 127.0.0.1:$port >"$tmp/cli2" 2>&1 || { cat "$tmp/cli2" "$tmp/srv"; fail "second client"; }
  has_row 4096 "$tmp/cli2" || fail "second client: no row"
  ;;
serve_idle)
  # Ten idle connections and one of garbage sit on the server's port first; a real client
  # behind them is served at once (before, it waited until each idle one timed out: 60 s).
  port=$((20000 + ($$ + 5000) % 10000))
  "$XB" serve --listen 127.0.0.1:$port >"$tmp/srv" 2>&1 &
  pids+=("$!")
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
  for i in $(seq 10); do exec {fd}<>/dev/tcp/127.0.0.1/$port; idle+=("$fd"); done
  exec {junk}<>/dev/tcp/127.0.0.1/$port
  printf 'GET / HTTP/1.0\r\n\r\n' >&"$junk"
  timeout 20 "$XB" write_bw -s 64K -n 20 "${SMALL[@]}" 127.0.0.1:$port >"$tmp/cli" 2>&1 \
    || { cat "$tmp/cli" "$tmp/srv"; fail "a client behind idle connections was not served within 20 s"; }
  has_row 65536 "$tmp/cli" || { cat "$tmp/cli"; fail "no row"; }
  for fd in "${idle[@]}" "$junk"; do exec {fd}>&-; done
  ;;
plot)
  # bench/plot.py draws what xfer-bench --json wrote, and refuses what it did not.
  plot=$(dirname "$0")/../../bench/plot.py
  /usr/bin/python3 -c "import matplotlib" 2>/dev/null || skip "matplotlib is not installed (apt-get install python3-matplotlib)"
  "$XB" write_bw -s 16K,256K -n 20 "${SMALL[@]}" --json "$tmp/w.json" >/dev/null 2>&1 || fail "xfer-bench --json"
  "$XB" read_lat -s 4K,64K -n 20 "${SMALL[@]}" --json "$tmp/l.json" >/dev/null 2>&1 || fail "xfer-bench --json (latency)"
  /usr/bin/python3 "$plot" -o "$tmp/out" --latency "$tmp/w.json=now" --dashed "$tmp/l.json" >"$tmp/plot.txt" 2>&1 \
    || { cat "$tmp/plot.txt"; fail "plot.py failed"; }
  [ "$(head -c 8 "$tmp/out.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "out.png is not a PNG"
  grep -q "now WRITE" "$tmp/out.svg" || fail "out.svg has no line named after its label"
  [ "$(stat -c %s "$tmp/out.png")" -gt 10000 ] || fail "out.png is nearly empty"
  expect_exit 1 "is not an xfer-bench --json file" /usr/bin/python3 "$plot" -o "$tmp/bad" "$tmp/plot.txt"
  # -o with an extension: that one file, as named.
  /usr/bin/python3 "$plot" -o "$tmp/one.svg" "$tmp/w.json" >"$tmp/plot.txt" 2>&1 || { cat "$tmp/plot.txt"; fail "plot.py -o one.svg"; }
  [ -s "$tmp/one.svg" ] && [ ! -e "$tmp/one.svg.svg" ] && [ ! -e "$tmp/one.svg.png" ] || fail "-o one.svg did not write one.svg alone"
  # --stats: what a compare script's round_stats wrote: lines per block size, ratios as bars,
  # a reference table's matching rows dashed.
  . "$(dirname "$0")/../../bench/lib.sh"
  printf '%s\n' "1 raw 1048576 3.0" "1 x 1048576 2.7" "1 raw 4194304 3.5" "1 x 4194304 3.6" \
    "2 raw 1048576 3.2" "2 x 1048576 3.0" "2 raw 4194304 3.4" "2 x 4194304 3.3" >"$tmp/rounds.txt"
  round_stats "$tmp/rounds.txt" "x/raw" >"$tmp/stats.txt" || fail "round_stats"
  /usr/bin/python3 "$plot" --stats "$tmp/stats.txt" -o "$tmp/st" --baseline '^raw$' --name x="xfer here" \
    --reference 'perftest_roce100g.tsv:test=write_bw,qps=1@perftest one QP' >"$tmp/plot.txt" 2>&1 \
    || { cat "$tmp/plot.txt"; fail "plot.py --stats failed"; }
  for want in "xfer here" "x/raw @ 1M" "x/raw @ 4M" "perftest one QP (reference)"; do
    grep -q "$want" "$tmp/st.svg" || fail "the --stats plot lacks '$want'"
  done
  expect_exit 1 "is not round_stats output" /usr/bin/python3 "$plot" --stats "$tmp/plot.txt" -o "$tmp/bad"
  expect_exit 1 "no row matches" /usr/bin/python3 "$plot" --stats "$tmp/stats.txt" -o "$tmp/bad" \
    --reference 'perftest_roce100g.tsv:test=no_such_test'
  # --grid: xfer-bench table's cells in HIXL's layout, HIXL's own figures beside them.
  "$XB" table -s 16K,64K -D 0.05 --span 4M --json "$tmp/table.json" >"$tmp/table.txt" 2>&1 \
    || { cat "$tmp/table.txt"; fail "xfer-bench table --json"; }
  /usr/bin/python3 "$plot" --grid "$tmp/table.json" -o "$tmp/grid" >"$tmp/plot.txt" 2>&1 \
    || { cat "$tmp/plot.txt"; fail "plot.py --grid failed"; }
  for want in "WRITE H2H" "READ D2D" "HIXL A3 RDMA direct" "tcp direct"; do
    grep -q "$want" "$tmp/grid.svg" || fail "the grid lacks '$want'"
  done
  ;;
serve_etcd)
  # A serve published in a real etcd under a cluster name; the client finds it by that name.
  [ -x /usr/bin/etcd ] || skip "etcd is not installed (apt-get install etcd-server)"
  . "$(dirname "$0")/../../bench/lib.sh"  # etcd_start: the same launcher as the benchmarks'
  endpoint=$(etcd_start "$tmp") || fail "etcd did not start"
  pids+=("$(cat "$tmp/etcd.pid")")
  url=etcd://$endpoint/tools
  expect_exit 2 "together" "$XB" serve --listen 127.0.0.1:0 --name lonely
  "$XB" serve --listen 127.0.0.1:0 --metadata "$url" --name bench-target >"$tmp/srv" 2>&1 &
  pids+=("$!")
  for _ in $(seq 100); do grep -q "waiting for clients" "$tmp/srv" && break; sleep 0.1; done
  grep -q "published as 'bench-target'" "$tmp/srv" || { cat "$tmp/srv"; grep -q "UNSUPPORTED" "$tmp/srv" && skip "no libcurl in this build"; fail "serve did not publish itself"; }
  "$XB" write_bw -s 64K -n 30 "${SMALL[@]}" --metadata "$url" bench-target >"$tmp/cli" 2>&1 \
    || { cat "$tmp/cli" "$tmp/srv"; fail "the client did not run against the serve it found by name"; }
  has_row 65536 "$tmp/cli" || { cat "$tmp/cli"; fail "no row"; }
  expect_exit 1 "no engine named 'nobody'" "$XB" write_bw -n 1 --metadata "$url" nobody
  expect_exit 2 "needs the name of a serve" "$XB" write_bw -n 1 --metadata "$url"
  ;;
metrics)
  # --metrics serves the engines' metrics while they run: the client's and the serve's.
  . "$(dirname "$0")/../../bench/lib.sh"  # free_port
  # scrape PORT: the body of GET /metrics on 127.0.0.1:PORT (empty when nothing answers).
  scrape() {
    { exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n' >&3 &&
      timeout 5 cat <&3; } 2>/dev/null | tr -d '\r' | sed '1,/^$/d'
  }
  cport=$(free_port) && sport=$(free_port) || fail "no free port"
  [ "$cport" != "$sport" ] || sport=$(free_port) || fail "no free port"
  if ! "$XB" write_bw -s 4K -n 5 "${SMALL[@]}" --metrics 127.0.0.1:0 >"$tmp/cli" 2>&1; then
    grep -q "UNSUPPORTED" "$tmp/cli" && skip "no metrics endpoint in this build (libcpp-httplib-dev)"
    cat "$tmp/cli"; fail "--metrics 127.0.0.1:0"
  fi
  "$XB" serve --listen 127.0.0.1:0 --metrics "127.0.0.1:$sport" --once >"$tmp/srv" 2>&1 &
  pids+=("$!")
  for _ in $(seq 100); do grep -q "waiting for clients" "$tmp/srv" && break; sleep 0.1; done
  port=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$tmp/srv")
  [ -n "$port" ] || { cat "$tmp/srv"; fail "serve did not start"; }
  "$XB" write_bw -s 1M -D 3 "${SMALL[@]}" --transport tcp --metrics "127.0.0.1:$cport" "127.0.0.1:$port" >"$tmp/cli" 2>&1 &
  cli=$!
  pids+=("$cli")
  moved=0 served=""
  for _ in $(seq 50); do
    sleep 0.1
    moved=$(scrape "$cport" | awk '/^xfer_transferred_bytes_total\{op="write",backend="tcp"/ { s += $2 } END { print s + 0 }')
    [ -z "$served" ] && served=$(scrape "$sport" | grep -E '^xfer_sessions 1$')
    [ "$moved" != 0 ] && [ -n "$served" ] && break
  done
  wait "$cli" || { cat "$tmp/cli" "$tmp/srv"; fail "the client failed"; }
  has_row 1048576 "$tmp/cli" || { cat "$tmp/cli"; fail "no row"; }
  [ "$moved" != 0 ] || fail "the client's /metrics never showed bytes moved while it ran"
  [ -n "$served" ] || { cat "$tmp/srv"; fail "the serve side's /metrics never showed the client's session"; }
  expect_exit 1 "metrics_listen" "$XB" write_bw -n 1 --metrics nonsense
  "$XB" write_bw -s 64K -n 20 "${SMALL[@]}" --no-metrics >"$tmp/cli" 2>&1 || { cat "$tmp/cli"; fail "--no-metrics"; }
  grep -q -- "--no-metrics" "$tmp/cli" || { cat "$tmp/cli"; fail "the rerun command lacks --no-metrics"; }
  ;;
netns)
  two_hosts 1
  SRV=$(host_ip 0 1):18515
  # Same host id (one kernel): the engines pick cma across the namespaces (same pid namespace).
  ip netns exec "$C" "$XB" write_bw -s 64K -n 50 "${SMALL[@]}" "$SRV" >"$tmp/cli" 2>&1 &
  cli=$!
  pids+=("$cli")
  sleep 0.5
  ip netns exec "$S" "$XB" serve --listen "$SRV" >"$tmp/srv" 2>&1 &
  pids+=("$!")
  wait "$cli" || { cat "$tmp/cli" "$tmp/srv"; fail "client in $C exited"; }
  has_row 65536 "$tmp/cli" || { cat "$tmp/cli"; fail "no row"; }
  # Distinct host ids, as two machines: only a network transport reaches the peer.
  if info_has '^  tcp +available'; then
    ip netns exec "$C" "$XB" read_bw -s 64K -n 50 --host-id host-a "${SMALL[@]}" "$SRV" >"$tmp/cli2" 2>&1 \
      || { cat "$tmp/cli2" "$tmp/srv"; fail "tcp client exited"; }
    has_row 65536 "$tmp/cli2" || fail "tcp: no row"
    # tcp, or ucx in builds that have it (it ranks above tcp between hosts).
    grep -qE "^# peer: .*transport (tcp|ucx)" "$tmp/cli2" || { cat "$tmp/cli2"; fail "tcp: wrong transport"; }
    has_path "$tmp/cli2" "shm 0% \(0 bytes\), (tcp|ucx) 100%"
  else
    echo "note: no tcp transport in this build; distinct host ids not tested"
  fi
  ;;
netns_staged)
  # Two hosts (namespaces, distinct host ids), ucx over UCX's tcp transport, every transfer
  # staged through the buffer pools (--buffer-pool: host memory standing in for GPU memory):
  # sizes from 1 B to 64 MiB (odd ones among them), WRITE and READ, data checked, the staged
  # bytes via ucx.
  info_has 'RDMA through UCX: not built' && skip "no ucx in this build"
  two_hosts 1
  SRV=$(host_ip 0 1):18515
  export UCX_TLS=tcp
  ip netns exec "$S" "$XB" serve --listen "$SRV" >"$tmp/srv" 2>&1 &
  pids+=("$!")
  for t in write_bw read_bw; do
    ip netns exec "$C" "$XB" "$t" -s 1,7,4096,65537,1048579,16M,64M -n 3 --verify --buffer-pool --transport ucx --host-id host-a \
      --span 64M --connect-timeout 20 "$SRV" >"$tmp/$t" 2>&1 || { cat "$tmp/$t" "$tmp/srv"; fail "$t in $C exited"; }
    for size in 1 7 65537 1048579 67108864; do has_row "$size" "$tmp/$t" || { cat "$tmp/$t"; fail "$t: no $size row"; }; done
    has_path "$tmp/$t" "shm 0% \(0 bytes\), ucx 0% \(0 bytes\), cuda 0% \(0 bytes\), staged 100% \([0-9]+ bytes via ucx\)"
  done
  ;;
netns_nics)
  # Two namespaces joined by two veth pairs ("two NICs"): serve names its NICs, the client
  # its own, and a WRITE's bytes go over both pairs (the "# nics:" line).
  info_has '^  tcp +available' || skip "no tcp transport in this build"
  two_hosts 2
  # xfer-info names the interfaces that may be named, and why the others may not.
  ip link add "xh$$c2" netns "$C" type veth peer name "xh$$c3" netns "$C" || fail "veth"
  ip netns exec "$C" "$XI" --no-engine >"$tmp/info" 2>&1 || { cat "$tmp/info"; fail "xfer-info in $C exited"; }
  for pat in "xh$$c0 $(host_ip 0 2)/30, virtual;" "xh$$c1 $(host_ip 1 2)/30, virtual;" "xh$$c2 \(no IPv4 address: refused\)"; do
    grep -E "^  tcp\.nics " "$tmp/info" | grep -qE "$pat" || { grep "tcp.nics" "$tmp/info"; fail "xfer-info: no /$pat/"; }
  done
  SRV=$(host_ip 0 1):18515
  ip netns exec "$S" "$XB" serve --listen "$SRV" --nics "xh$$s0,xh$$s1" >"$tmp/srv" 2>&1 &
  pids+=("$!")
  ip netns exec "$C" "$XB" write_bw -s 1M -n 64 --host-id host-a --transport tcp --nics "xh$$c0,xh$$c1" \
      "${SMALL[@]}" "$SRV" >"$tmp/cli" 2>&1 || { cat "$tmp/cli" "$tmp/srv"; fail "client in $C exited"; }
  has_row 1048576 "$tmp/cli" || { cat "$tmp/cli"; fail "no row"; }
  grep -E "^# nics: " "$tmp/cli" >"$tmp/nics" || { cat "$tmp/cli"; fail "no '# nics:' line"; }
  for n in 0 1; do
    grep -qE "$(host_ip $n 2)[^,]*->[^,]*$(host_ip $n 1)[^,]* [1-9][0-9]*%" "$tmp/nics" \
      || { cat "$tmp/cli" "$tmp/srv"; fail "NIC pair $n carried nothing"; }
  done
  ;;
info)
  [ -n "$XI" ] || skip "XFER_INFO not set"
  "$XI" >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "xfer-info exited"; }
  for pat in '^xfer ' '^host id:' '^  local +available' '^  cma +(available|unavailable)' '^  cuda +(available|unavailable)' \
             '^  shm +(available|unavailable)' '^  ucx ' '^defaults' '^  streams +2 \[1\.\.256\]' \
             '^  notify\.queue_bytes +64 MiB \[4 KiB\.\.16 GiB\]' '^  tcp\.links +2' 'engine check: two engines'; do
    grep -qE "$pat" "$tmp/out" || { cat "$tmp/out"; fail "xfer-info: no /$pat/"; }
  done
  # With UCX, started or not: what becomes of GPU memory to other hosts with it, and why.
  if ! grep -q 'RDMA through UCX: not built' "$tmp/out"; then
    grep -qE '^ +GPU memory to other hosts: (direct through UCX|through the buffer pool \(UCX [0-9.]+ has no CUDA memory support)' \
      "$tmp/out" || { cat "$tmp/out"; fail "xfer-info: no GPU verdict under ucx"; }
  fi
  expect_exit 2 "unknown argument" "$XI" --bogus
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
echo "PASS: $case_name"
