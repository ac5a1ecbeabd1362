#!/usr/bin/env bash
# The GPU suite in one go, on the GPU machine: build into build-gpu (Release, the machine's
# LibTorch), run every ctest labelled `gpu` (they skip on machines without a GPU), and print a
# summary: each test's result and the numbers the tests measured ([ measured ] lines).
#   source .device-deps/gpu-env.sh && bash tests/run_gpu_suite.sh      (logs under $OUT, or /tmp/out)
# FORTUNES_DIR points the 124m check at the corpus where the fortunes package is not installed; it
# defaults to .device-deps/corpus/fortunes (bench/time_to_loss.sh --prepare) when that exists.
# GPU_SUITE_FILTER (a ctest -R regex) runs part of it, GPU_SUITE_EXCLUDE (-E) leaves part out, when
# a session's device time is short.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh  # bench_build: build-gpu, Release, the machine's LibTorch; $out
[ -z "${FORTUNES_DIR:-}" ] && [ ! -d /usr/share/games/fortunes ] && [ -d .device-deps/corpus/fortunes ] &&
  export FORTUNES_DIR="$PWD/.device-deps/corpus/fortunes"
bench_build || exit 1
ctest --test-dir build-gpu -L gpu ${GPU_SUITE_FILTER:+-R "$GPU_SUITE_FILTER"} ${GPU_SUITE_EXCLUDE:+-E "$GPU_SUITE_EXCLUDE"} -V -j "${GPU_SUITE_JOBS:-3}" --timeout 900 \
  >"$out/gpu-suite.log" 2>&1
status=$?
{
  echo "== GPU suite summary ($(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
  grep -E "^ *[0-9]+/[0-9]+ Test +#" "$out/gpu-suite.log" | sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: //'
  grep -E "tests passed|tests failed" "$out/gpu-suite.log"
  echo "== measured"
  # ctest -V prefixes each test's lines with its number: keep each test's lines together, in order.
  grep -hE "^[0-9]+: .*\[ measured \]" "$out/gpu-suite.log" | sort -s -n -t: -k1,1 | sed -E 's/^([0-9]+): .*\[ measured \]/\1:/' 
} | tee "$out/gpu-suite-summary.txt"
exit $status
