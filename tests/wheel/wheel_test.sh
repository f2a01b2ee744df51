#!/usr/bin/env bash
# Usage: wheel_test.sh WHEEL
# Installs the self-contained wheel (scripts/wheel.sh) into a fresh virtual environment of a
# Python that does not see Debian's packages (the first python3 on PATH other than Debian's,
# when its version matches the wheel's tag; else Debian's, without its site-packages), with no
# index: the wheel needs nothing else. Then: `python -m xfer.info` says what this machine
# offers, and two processes move bytes over shm, cma and tcp (transfer_pair.py), and over ucx
# where this machine has a UCX for the wheel to load.
set -euo pipefail
wheel=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

tag=$(basename "$wheel" | sed -n 's/^xfer-[^-]*-\(cp[0-9]*\)-.*/\1/p')
py=""
for candidate in $(which -a python3 2>/dev/null | grep -v -E '^(/usr)?/bin/') /usr/bin/python3; do
  v=$("$candidate" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")' 2>/dev/null) || continue
  if [ "$v" = "$tag" ]; then py=$candidate; break; fi
done
[ -n "$py" ] || fail "no python3 here is $tag, the wheel's tag"
echo "wheel: $(basename "$wheel") into a fresh venv of $py ($("$py" --version))"
"$py" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index "$wheel"
cd "$work"  # (not the source tree: its python/xfer must not shadow the installed package)

# Every library the extension needs is in the wheel or the system's base (libc, libstdc++...).
ext=$(find "$work/venv" -name '_xfer*.so' | head -n 1)
if grep -q "not found" <<<"$(ldd "$ext")"; then ldd "$ext"; fail "the installed extension misses a library"; fi

info=$("$work/venv/bin/python" -m xfer.info)
echo "$info"
for t in shm cma tcp; do
  grep -qE "^  $t +available" <<<"$info" || fail "python -m xfer.info does not offer $t"
done
grep -qE "^  ucx " <<<"$info" || fail "python -m xfer.info says nothing of ucx"

for t in shm cma tcp; do
  timeout 120 "$work/venv/bin/python" "$here/transfer_pair.py" "$t" || fail "the two-process transfer over $t failed"
done
# UCX is not in the wheel: the machine's is loaded at run time, where it has one.
if "$work/venv/bin/python" -c 'import ctypes; ctypes.CDLL("libucp.so.0")' 2>/dev/null; then
  grep -E "^  ucx +available" <<<"$("$work/venv/bin/python" -m xfer.info ucx_mode=on)" ||
    fail "python -m xfer.info ucx_mode=on: ucx is not available with this machine's UCX"
  UCX_TLS=tcp timeout 120 "$work/venv/bin/python" "$here/transfer_pair.py" ucx ||
    fail "the two-process transfer over ucx (this machine's UCX) failed"
  also=", and ucx through this machine's UCX"
else
  grep -E "^  ucx +unavailable .*not found" <<<"$("$work/venv/bin/python" -m xfer.info ucx_mode=on)" ||
    fail "without a UCX here, xfer.info does not say ucx is unavailable for want of one"
  also=" (no UCX on this machine: ucx unavailable, and says why)"
fi
echo "wheel: import, xfer.info and two-process transfers over shm, cma and tcp pass$also"
