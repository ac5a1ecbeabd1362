#!/usr/bin/env bash
# Every tracked C++ and CUDA source follows .clang-format: prints the files that do not, with the
# first lines clang-format would change, and exits 1. The tree is formatted with clang-format 14
# (Debian 12's, which launch/install-deps.sh installs); other major versions format some
# constructs differently, so they skip (77) rather than fail.
#   bash tests/lint/check_format.sh [ROOT]       fix with: clang-format -i FILE
set -uo pipefail
root="${1:-$(cd "$(dirname "$0")/../.." && pwd)}"
cd "$root" || exit 2
cf="${CLANG_FORMAT:-clang-format}"
if ! command -v "$cf" >/dev/null; then
  echo "check_format: no $cf (launch/install-deps.sh installs it)"
  exit 77
fi
major=$("$cf" --version | sed -E 's/.*version ([0-9]+).*/\1/')
if [ "$major" != 14 ]; then
  echo "check_format: $cf is version $major; the tree follows clang-format 14"
  exit 77
fi
mapfile -t sources < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' 2>/dev/null || find src optim parallel data tests bench -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh')
bad=0
for f in "${sources[@]}"; do
  if ! diff -q "$f" <("$cf" --style=file "$f") >/dev/null; then
    echo "$f: not formatted (clang-format -i $f):"
    diff "$f" <("$cf" --style=file "$f") | head -6 | sed 's/^/    /'
    bad=$((bad + 1))
  fi
done
echo "format: ${#sources[@]} files, $bad not formatted"
[ "$bad" -eq 0 ]
