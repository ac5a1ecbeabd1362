#!/usr/bin/env bash
# The test command: install dependencies, build, run every test (CTest: unit, MPI and Python
# reference tests, slow ones included). Arguments go to ctest, e.g. launch/test.sh -L unit.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
launch/install-deps.sh
launch/build.sh
cd build
ctest --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 900 "$@"
