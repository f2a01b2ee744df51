#!/usr/bin/env bash
# The C++ code is formatted as .clang-format says: fails with the files clang-format would
# change (run `clang-format -i FILE...` on them). Skips (77) where clang-format is missing.
set -euo pipefail
root=${1:?usage: format.sh REPO_ROOT}
cd "$root"
command -v clang-format >/dev/null || { echo "SKIP: clang-format not installed (scripts/setup.sh)"; exit 77; }
mapfile -t files < <(git ls-files -- '*.cc' '*.h' 2>/dev/null || find src include tools tests python/src examples bench -name '*.cc' -o -name '*.h')
bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  clang-format --style=file --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -ne 0 ]; then
  printf '  %s\n' "${bad[@]}"
  echo "FAIL: ${#bad[@]} files are not formatted (clang-format -i them)"
  exit 1
fi
echo "ok: ${#files[@]} files formatted as .clang-format says"
