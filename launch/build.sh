#!/usr/bin/env bash
# Configures and builds gpt2-dist into build/ (Release). Extra arguments go to CMake's configure,
# e.g. launch/build.sh -DTorch_DIR=/opt/libtorch/share/cmake/Torch. BUILD_DIR overrides build/.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
generator=()
command -v ninja >/dev/null && [ ! -f "$build/Makefile" ] && generator=(-G Ninja)
mkdir -p "$build"
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "$@" >"$build/configure.log" 2>&1 \
  || { cat "$build/configure.log"; exit 1; }
grep -E "gpt2-dist:|LibTorch" "$build/configure.log" || true
cmake --build "$build" -j "${JOBS:-$(nproc)}"
