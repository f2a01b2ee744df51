# Shell helpers shared by bench/compare.sh, bench/compare_tcp.sh, bench/compare_shm.sh and
# bench/compare_ucx.sh.
# Sourced, not run: `. "$(dirname "$0")/lib.sh"`. Needs bash; works under `set -euo pipefail`.
# shellcheck shell=bash

# with_size SIZE cmd...: runs cmd with its SIZE placeholder replaced by SIZE.
with_size() {
  local size=$1 a out=()
  shift
  for a in "$@"; do [ "$a" = SIZE ] && out+=("$size") || out+=("$a"); done
  "${out[@]}"
}

# q ARGS...: the arguments as one shell-quoted command line (for RESULTS.md).
q() {
  local s="" a
  for a in "$@"; do s+="${s:+ }$(printf '%q' "$a")"; done
  printf '%s' "$s"
}

# to_bytes 1G|64M|4096: bytes.
to_bytes() {
  case $1 in
    *G) echo $(( ${1%G} << 30 )) ;;
    *M) echo $(( ${1%M} << 20 )) ;;
    *K) echo $(( ${1%K} << 10 )) ;;
    *) echo "$1" ;;
  esac
}

# xfer_rows NAME: xfer-bench's tables on stdin -> "NAME_w <bytes> <GB/s>" and "NAME_r ..." lines
# (write_bw and read_bw), and for each test's "# path:" line "path NAME_w <shm %>" (the share of
# bytes that went through shm; "?" when the line is missing).
xfer_rows() {
  awk -v n="$1" '/^## write_bw/ { op = "w"; next } /^## read_bw/ { op = "r"; next }
    /^# path: / && op != "" { p = "?"; if (match($0, /shm [0-9]+%/)) { p = substr($0, RSTART + 4, RLENGTH - 5) } print "path", n "_" op, p; next }
    /^[0-9]/ && op != "" { print n "_" op, $1, $3 }'
}

# Rounds. A compare script runs every cell ROUNDS times, the tools alternating within a round
# (and which goes first alternating by round), and records each measurement as
# "<round> <key> <bytes> <GB/s>" (in_round prefixes $ROUND). Ratios are paired: xfer / baseline
# within each round, where the two ran seconds apart, and then the median over the rounds. This
# machine's cores are shared and a tool's throughput swings by 30 % between seconds; a ratio of
# two tools' best (or median) rounds compares two different moments, and one lucky round of the
# baseline decides it.
ROUND=0
in_round() { awk -v r="$ROUND" '{ print r, $0 }'; }

# round_stats FILE PAIRS: FILE's "<round> <key> <bytes> <value>" lines -> "<key> <bytes> <median>"
# per (key, bytes), and per pair "A/B" in PAIRS (space-separated keys) and bytes where both ran
# in a round: "A/B <bytes> <median> <min> <max>" of A/B over those rounds. A key measured twice
# in one round cannot be paired: round_stats says so on stderr and fails.
round_stats() {
  awk -v pairs="$2" '
    BEGIN { CONVFMT = "%.17g" }   # ratios kept whole in the lists below, not rounded to 6 digits
    function median(l,   a, n, i, j, x) {
      n = split(substr(l, 2), a, " ")
      for (i = 2; i <= n; i++) { x = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
      return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    {
      k = $1 " " $2 " " $3
      if (k in val) { printf "round_stats: %s measured twice in round %s\n", $2 " " $3, $1 >"/dev/stderr"; bad = 1; exit 1 }
      val[k] = $4; list[$2 " " $3] = list[$2 " " $3] " " $4; rounds[$1] = 1; bytes[$3] = 1
    }
    END {
      if (bad) exit 1
      for (k in list) printf "%s %.9g\n", k, median(list[k])
      np = split(pairs, p, " ")
      for (i = 1; i <= np; i++) {
        split(p[i], ab, "/")
        for (b in bytes) {
          l = ""; lo = hi = -1
          for (r in rounds) {
            ka = r " " ab[1] " " b; kb = r " " ab[2] " " b
            if (!(ka in val) || !(kb in val) || val[kb] <= 0) continue
            x = val[ka] / val[kb]; l = l " " x
            if (lo < 0 || x < lo) lo = x
            if (x > hi) hi = x
          }
          if (l != "") printf "%s %s %.9g %.9g %.9g\n", p[i], b, median(l), lo, hi
        }
      }
    }' "$1"
}

# ROUND_TABLE_AWK: the start of an awk program that builds a table from round_stats' output
# (awk "$ROUND_TABLE_AWK"'...'): v, lo and hi per "<key> <bytes>"; g(k): the value or -1;
# f(x): 2 decimals or "-"; fl(x): floored to 0.01, so that a miss never reads as its target;
# fr(k): a ratio with its rounds' range, "med (lo-hi)"; kib(b): 16K, 1M.
# shellcheck disable=SC2016
ROUND_TABLE_AWK='
  { v[$1 " " $2] = $3; lo[$1 " " $2] = $4; hi[$1 " " $2] = $5 }
  function g(k) { return (k in v) ? v[k] : -1 }
  function f(x) { return x < 0 ? "-" : sprintf("%.2f", x) }
  function fl(x) { return x < 0 ? "-" : sprintf("%.2f", int(x * 100) / 100) }
  function fr(k) { return (k in v) ? sprintf("%s (%s-%s)", fl(v[k]), fl(lo[k]), fl(hi[k])) : "-" }
  function kib(b) { return b >= 1048576 ? (b / 1048576) "M" : (b / 1024) "K" }
'

# ucx_run NAME TLS SIZE ARGS...: one ucx_perftest server and client on loopback (UCX_TLS=TLS),
# ARGS the test (e.g. -t ucp_put_bw); prints "NAME SIZE <GB/s>" from the client's "overall"
# bandwidth (MB/s = 2^20 B/s, converted to 1e9 B/s), nothing when it did not run. Iterations:
# about $UCX_BYTES per run ($UCX_TCP_BYTES over tcp), at least 20, at most $UCX_MAX_N (200000).
UCX_BYTES=${UCX_BYTES:-1G}
UCX_TCP_BYTES=${UCX_TCP_BYTES:-64M}
ucx_port=${ucx_port:-$((13500 + RANDOM % 1000))}
ucx_run() {
  local name=$1 tls=$2 size=$3 budget n w out srv
  shift 3
  budget=$(to_bytes "$UCX_BYTES"); [ "$tls" = tcp ] && budget=$(to_bytes "$UCX_TCP_BYTES")
  n=$(( budget / size )); [ $n -lt 20 ] && n=20; [ $n -gt "${UCX_MAX_N:-200000}" ] && n=${UCX_MAX_N:-200000}
  w=$(( n / 10 )); [ $w -lt 5 ] && w=5
  ucx_port=$((ucx_port + 1))
  UCX_TLS=$tls timeout 60 ucx_perftest -p $ucx_port "$@" -s "$size" -n $n -w $w >/dev/null 2>&1 &
  srv=$!
  out=""
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 0.2
    out=$(UCX_TLS=$tls timeout 60 ucx_perftest 127.0.0.1 -p $ucx_port "$@" -s "$size" -n $n -w $w -f 2>/dev/null | tail -n 1) && break
  done
  kill $srv 2>/dev/null || true
  wait $srv 2>/dev/null || true
  echo "$out" | awk -v name="$name" -v size="$size" 'NF >= 8 && $1 ~ /^[0-9]+$/ { printf "%s %s %.4f\n", name, size, $6 * 1048576 / 1e9 }'
}

# The sections of bench/RESULTS.md, one per script: compare.sh writes the head (from the top of
# the file to the first of the sections below), compare_tcp.sh the section "## tcp ...",
# compare_shm.sh "## shm ...", compare_ucx.sh "## ucx ...", compare_builds.sh "## builds ...".
# A new script adds its name here.
RESULTS_SECTIONS="tcp shm ucx staged small builds notify multinic python mooncake nixl suites checksum scale plot metrics GPU first"  # GPU, first: written by hand (bench/gpu/device_check.sh results; the first command, timed)

# results_section FILE NAME CONTENT: writes the file CONTENT into FILE as the section NAME (""
# for the head), replacing that section from its "## NAME" line up to the next line that starts
# another script's section, and keeping every other section as it is; a section FILE does not
# have yet is appended (the head goes first). "## " lines inside ``` blocks never start a
# section. Sections are separated by one blank line.
# results_plot NAME STATS TITLE [plot.py options...]: draws round_stats output STATS into
# bench/img/NAME.png, beside RESULTS.md (bench/plot.py --stats: a line per key measured at
# several block sizes, the pairs' ratios as bars with their rounds' range), and prints the
# Markdown line that shows it in the section; where matplotlib is missing, prints nothing and
# says so on stderr. Run from the repository's root, as the compare scripts are.
results_plot() {
  local name=$1 stats=$2 title=$3
  shift 3
  mkdir -p bench/img
  if /usr/bin/python3 bench/plot.py --stats "$stats" --title "$title" -o "bench/img/$name" "$@" >/dev/null; then
    rm -f "bench/img/$name.svg"  # (RESULTS.md shows the PNG)
    echo "![$title](img/$name.png)"
  else
    echo "results_plot: no plot for the $name section" >&2
  fi
}

# peer_venv DIR MODULE PACKAGE: a virtual environment in DIR (it sees Debian's packages, e.g.
# numpy) with a peer's released wheel PACKAGE from PyPI (a name, or name==version), installed
# unless MODULE imports already; prints the version installed. (The differential checks against
# Mooncake and NIXL.)
peer_venv() {
  local dir=$1 module=$2 package=$3
  [ -x "$dir/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$dir"
  "$dir/bin/python" -c "import $module" 2>/dev/null ||
    "$dir/bin/python" -m pip install -q --disable-pip-version-check "$package" >&2 || return 1
  "$dir/bin/python" -m pip show "${package%%==*}" 2>/dev/null | awk '/^Version/ { print $2 }'
}

# rotate ROUNDS NAME...: calls the script's `run NAME ROUND` for every name in every round, in
# an order that rotates by round (no one always runs first, on a cold or a warm machine).
rotate() {
  local rounds=$1 r k name
  shift
  for r in $(seq "$rounds"); do
    for k in $(seq 0 $(($# - 1))); do
      name=${@:$(( (k + r) % $# + 1 )):1}
      echo "round $r: $name" >&2
      run "$name" "$r"
    done
  done
}

results_section() {
  local file=$1 name=$2 content=$3 tmpf
  [ -f "$file" ] || : >"$file"
  tmpf=$(mktemp "${file}.XXXXXX")
  awk -v want="$name" -v names="$RESULTS_SECTIONS" -v cfile="$content" '
    BEGIN {
      nk = split(names, known, " ")
      while ((getline line < cfile) > 0) new = new line "\n"
      np = 1; pname[1] = ""; ptext[1] = ""
    }
    function starts(line,   i, n, c) {   # the section this line starts, or "-"
      if (line !~ /^## /) return "-"
      for (i = 1; i <= nk; i++) {
        n = known[i]
        if (index(line, "## " n) != 1) continue
        c = substr(line, length(n) + 4, 1)
        if (c == "" || c == " " || c == ":") return n
      }
      return "-"
    }
    {
      if (!fence) { s = starts($0); if (s != "-") { np++; pname[np] = s; ptext[np] = "" } }
      if ($0 ~ /^```/) fence = !fence
      ptext[np] = ptext[np] $0 "\n"
    }
    function trim(t) {   # without leading and trailing blank lines
      sub(/^(\n|[ \t]*\n)+/, "", t); sub(/[ \t\n]*$/, "", t); return t
    }
    END {
      done = 0; out = ""
      for (i = 1; i <= np; i++) {
        if (pname[i] == want) {
          if (done) continue   # a duplicate of the section: dropped
          t = new; done = 1
        } else {
          t = ptext[i]
        }
        t = trim(t)
        if (t != "") out = out (out == "" ? "" : "\n\n") t
      }
      if (!done) {
        t = trim(new)
        out = (want == "") ? t (out == "" ? "" : "\n\n") out : out (out == "" ? "" : "\n\n") t
      }
      printf "%s\n", out
    }' "$file" >"$tmpf" || { rm -f "$tmpf"; return 1; }
  mv "$tmpf" "$file"
}

# machine_line: "2 CPUs, <model>, kernel <release>, <N> GiB RAM".
# written_by SCRIPT [EXTRA]: the provenance lines of a RESULTS.md section (when, which tree,
# which machine, how loaded; EXTRA is appended, e.g. "; UCX: ..."), then NOTE if set.
written_by() {
  echo "Written by \`$1\` on $(date -u '+%Y-%m-%d %H:%M UTC'): xfer $(xfer_revision), $(machine_line); load average at the end $(cut -d' ' -f1-3 /proc/loadavg)${2:-}."
  [ -z "${NOTE:-}" ] || echo "Note: $NOTE"
}

machine_line() {
  echo "$(nproc) CPUs, $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo), kernel $(uname -r), $(awk '/MemTotal/ { printf "%.0f GiB RAM", $2 / 1048576 }' /proc/meminfo)"
}

# ucx_version: the version ucx_info -v reports (e.g. 1.13.1), or nothing when UCX's tools are missing.
ucx_version() {
  (ucx_info -v 2>/dev/null || true) | awk '/[Vv]ersion/ { sub(/^# *[Vv]ersion */, ""); print; exit }'
}

# xfer_revision: the git revision of this tree; "-dirty" when a file other than bench/RESULTS.md
# (which the scripts themselves write) differs from it.
xfer_revision() {
  local rev
  rev=$(git rev-parse --short HEAD 2>/dev/null) || { echo "(no git revision)"; return; }
  git diff --quiet HEAD -- . ':!bench/RESULTS.md' 2>/dev/null || rev+=-dirty
  echo "$rev"
}

# etcd_start DIR: a real etcd (Debian's etcd-server) on free loopback ports, its data and log
# in DIR; prints its client endpoint (127.0.0.1:PORT) once it serves clients, and writes its pid
# to DIR/etcd.pid (called as $(etcd_start DIR), it runs in a subshell): the caller kills it
# ("kill $(cat DIR/etcd.pid)").
etcd_start() {
  local dir=$1 client peer pid try
  command -v etcd >/dev/null || { echo "etcd is not installed (apt-get install etcd-server)" >&2; return 1; }
  for try in 1 2 3; do  # (a port free when chosen can be taken before etcd binds it: again)
    client=$(free_port) && peer=$(free_port) || return 1
    [ "$client" != "$peer" ] || continue
    etcd --name bench --data-dir "$dir/data" --listen-client-urls "http://127.0.0.1:$client" \
      --advertise-client-urls "http://127.0.0.1:$client" --listen-peer-urls "http://127.0.0.1:$peer" \
      --initial-advertise-peer-urls "http://127.0.0.1:$peer" --initial-cluster "bench=http://127.0.0.1:$peer" \
      >"$dir/etcd.log" 2>&1 &
    pid=$!
    echo "$pid" >"$dir/etcd.pid"
    for _ in $(seq 200); do
      grep -q "serving insecure client requests" "$dir/etcd.log" && { echo "127.0.0.1:$client"; return 0; }
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && break  # (running, but not serving: not a port clash)
    grep -q "address already in use" "$dir/etcd.log" || break
    rm -rf "$dir/data"
  done
  echo "etcd did not start: $(tail -3 "$dir/etcd.log")" >&2
  return 1
}
# free_port: a loopback TCP port nothing listens on now.
# Below the kernel's ephemeral range (ip_local_port_range), so that no outgoing connection's
# local port takes it between the choice and the bind.
free_port() {
  local p low=32768
  read -r low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  [ "$low" -gt 12000 ] || low=32768
  for _ in $(seq 50); do
    p=$((10000 + RANDOM % (low - 10000)))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
  return 1
}
