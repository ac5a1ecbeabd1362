#!/usr/bin/env bash
# Builds the libFuzzer targets (outside the main CMake build: clang++, -fsanitize=fuzzer,address,
# undefined, against the sources they test and the system HDF5) and runs each for N seconds.
#   tests/fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     targets: token_file json bin_shard
# env: FUZZ_OUT (build dir, corpora and crash artifacts; default build-fuzz/ in the repo),
#      CXX_FUZZ (default clang++), FUZZ_JOBS (parallel fuzz processes per target, default 1).
# Fork mode (-fork, -ignore_crashes=1): a child that crashes, hangs or runs out of memory leaves
# its input in artifacts/ and the run goes on. Every new artifact is then replayed and blamed on
# the first stack frame that is neither sanitizer, libFuzzer nor libc: a frame in libhdf5 is a
# libhdf5 bug on a malformed file (listed, not fatal: tests/fuzz/README.md); any other frame is
# ours and fails the run. Huge mallocs are allowed to fail as they do natively (libhdf5 mallocs
# whatever size a damaged header claims, then reports an error): malloc_limit_mb is 1 TiB and
# ASan returns NULL above its own limit; only memory really used (rss_limit_mb) is an OOM.
# Exit: 0 when no target found a crash in our code, 1 when one did (reproducer in FUZZ_OUT/artifacts/),
# 77 when clang++ with libFuzzer is not available (CTest counts that as skipped).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${FUZZ_OUT:-$root/build-fuzz}"
secs="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(token_file json bin_shard)
cxx="${CXX_FUZZ:-clang++}"
jobs="${FUZZ_JOBS:-1}"

mkdir -p "$out/obj" "$out/artifacts"
# libFuzzer present? (Debian: apt-get install clang libclang-rt-14-dev)
probe="$out/obj/probe.cpp"
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe"
if ! command -v "$cxx" >/dev/null || ! "$cxx" -fsanitize=fuzzer "$probe" -o "$out/obj/probe" 2>/dev/null; then
  echo "[fuzz] skipped: $cxx with libFuzzer not available (apt-get install clang libclang-rt-14-dev)"
  exit 77
fi

hdf5_cflags="$(pkg-config --cflags hdf5 2>/dev/null || echo -I/usr/include/hdf5/serial)"
hdf5_libs="$(pkg-config --libs hdf5 2>/dev/null || echo "-L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5")"
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
cxxflags="-std=c++17 -O1 -g -fno-omit-frame-pointer -I$root $hdf5_cflags"

# Compiles $1 (a repo-relative source) into an object with the fuzzer's coverage hooks, when stale.
compile() {
  local src="$1" obj="$out/obj/$(echo "$1" | tr / _).o"
  if [ ! -f "$obj" ] || [ "$root/$src" -nt "$obj" ] || [ -n "$(find "$root/data" "$root/src/base" "$root/tests/fuzz" -name '*.h' -newer "$obj" -print -quit)" ]; then
    "$cxx" $cxxflags $san -fsanitize=fuzzer-no-link -c "$root/$src" -o "$obj"
  fi
  echo "$obj"
}

declare -A sources=(
  [token_file]="tests/fuzz/fuzz_token_file.cpp data/token_file.cpp src/base/errors.cpp src/base/files.cpp"
  [json]="tests/fuzz/fuzz_json.cpp src/base/json.cpp data/jsonl.cpp src/base/errors.cpp"
  [bin_shard]="tests/fuzz/fuzz_bin_shard.cpp data/bin_shard.cpp src/base/errors.cpp"
)

# Seeds: valid files written by our own writer, and a few near-misses.
if [ ! -x "$out/make_seeds" ] || [ "$root/tests/fuzz/make_seeds.cpp" -nt "$out/make_seeds" ] || [ "$root/data/token_file.cpp" -nt "$out/make_seeds" ]; then
  "$cxx" $cxxflags "$root/tests/fuzz/make_seeds.cpp" "$root/data/token_file.cpp" "$root/src/base/errors.cpp" \
    "$root/src/base/files.cpp" $hdf5_libs -o "$out/make_seeds"
fi
"$out/make_seeds" "$out/seeds" >/dev/null

# max_allocation_size_mb: above it malloc returns NULL (as a native malloc does past overcommit),
# instead of ASan touching gigabytes of shadow for a size read from a damaged header.
export ASAN_OPTIONS="${ASAN_OPTIONS:-allocator_may_return_null=1:max_allocation_size_mb=4096:detect_stack_use_after_return=1}"
export LSAN_OPTIONS="suppressions=$root/tests/fuzz/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

# Prints "ours", "libhdf5", "contained" or "not-reproduced" for artifact $2 of binary $1: the first
# stack frame that is in libhdf5 or in a source file of this repo decides. "contained": the report
# came from the child process TokenFile::open reads HDF5 metadata in (Note [libhdf5 in a child
# process]; libFuzzer's crash handler, inherited by the child, saved the input) and the fuzz target
# itself went on and exited 0, i.e. the user got an error, not a crash.
blame() {
  local report frame rc=0
  report="$(timeout 120 "$1" -runs=1 -timeout=20 -rss_limit_mb=2048 -malloc_limit_mb=1048576 "$2" 2>&1)" || rc=$?
  frame="$(echo "$report" | grep -E '^ +#[0-9]+ 0x' | grep -E "libhdf5|$root/(data|src|tests)/[^ ]*:[0-9]+" | head -1 || true)"
  if [ -n "$frame" ] && [ "$rc" -eq 0 ]; then
    echo contained
  elif [ -z "$frame" ]; then
    echo not-reproduced
  elif echo "$frame" | grep -q libhdf5; then
    echo libhdf5
  else
    echo ours
  fi
}

status=0
for t in "${targets[@]}"; do
  [ -n "${sources[$t]:-}" ] || { echo "[fuzz] unknown target $t (token_file, json, bin_shard)"; exit 2; }
  objs=()
  for s in ${sources[$t]}; do objs+=("$(compile "$s")"); done
  bin="$out/fuzz_$t"
  "$cxx" $san -fsanitize=fuzzer "${objs[@]}" $hdf5_libs -o "$bin"
  corpus="$out/corpus/$t"
  mkdir -p "$corpus" "$out/artifacts/$t"
  echo "[fuzz] $t: ${secs}s, corpus $corpus"
  log="$out/fuzz_$t.log"
  marker="$out/artifacts/$t/.start"
  touch "$marker"
  "$bin" "$corpus" "$out/seeds/$t" -max_total_time="$secs" -max_len=16384 -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=1048576 -print_final_stats=1 -artifact_prefix="$out/artifacts/$t/" -fork="$jobs" \
    -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 >"$log" 2>&1 || true
  # Fork mode's progress lines: "#<execs>: cov: .. ft: .. corp: .. exec/s .. oom/timeout/crash: a/b/c time: .."
  grep -E "^#[0-9]+: " "$log" | tail -1 || true
  ours=0 hdf5=0 contained=0 other=0
  while IFS= read -r a; do
    case "$(blame "$bin" "$a")" in
      ours) ours=$((ours + 1)); echo "[fuzz] $t: crash in our code: $a" ;;
      libhdf5) hdf5=$((hdf5 + 1)); echo "[fuzz] $t: libhdf5 crashed the fuzz target itself: $a" ;;
      contained) contained=$((contained + 1)) ;;
      *) other=$((other + 1)); echo "[fuzz] $t: not reproduced on replay (a slow input?): $a" ;;
    esac
  done < <(find "$out/artifacts/$t" -type f -newer "$marker" ! -name '.start' | sort)
  echo "[fuzz] $t: new findings: $ours in our code, $hdf5 inside libhdf5 that reached the target," \
    "$contained inside libhdf5 contained by the reading child (each became a UserError), $other not reproduced"
  if [ "$ours" -gt 0 ] || [ "$hdf5" -gt 0 ]; then
    echo "[fuzz] $t FAILED: replay one with $bin <artifact>"
    status=1
  fi
done
exit $status
