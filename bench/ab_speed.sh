#!/usr/bin/env bash
# A/B speed of this tree against one or more others on the GPU machine, in one call: builds this
# tree (build-gpu/) and each DIR (another checkout of gpt2-dist, e.g. `git archive REV | tar -x -C
# DIR`, carried to the machine), then runs gpt2-124m B=32 bf16 on each in turn, ROUNDS times
# (default 3), so drift on the machine hits all alike. Prints one RESULT line per run (labelled
# this, or the DIR's last path component) and each tree's mean with this/tree.
# AB=decode instead times the batch-1 decode step of each tree (`kernel_bench decode_step`: bf16 and
# int8, gpt2-124m and gpt2-1558m, from a CUDA graph), alternating the same way. A build directory a
# tree, because a tree carried again onto a warm machine keeps older mtimes than the objects built
# from the last one, so ninja would not rebuild it.
#   source .device-deps/gpu-env.sh && bash bench/ab_speed.sh before-move
#   source .device-deps/gpu-env.sh && AB=decode ROUNDS=2 bash bench/ab_speed.sh before-change only-widening
set -uo pipefail
source bench/common.sh
[ $# -ge 1 ] || { echo "usage: [AB=decode] [ROUNDS=N] bench/ab_speed.sh DIR [DIR ...]"; exit 2; }
mode="${AB:-train}" target=gpt2-train
[ "$mode" = decode ] && target=kernel_bench
[ -x build-gpu/bin/$target ] || bench_build || exit 1
declare -A bin=([this]=build-gpu/bin/$target)
labels=(this)
for other in "$@"; do
  label=$(basename "$other")
  [ -z "${bin[$label]:-}" ] || { echo "two trees named $label: give them different last path components"; exit 2; }
  t0=$(date +%s)
  cmake -S "$other" -B "$other/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPT2_PYTHON="$(command -v python3)" \
    -DGPT2_BUILD_TESTS=OFF >"$out/${label}_configure.log" 2>&1 || { tail -20 "$out/${label}_configure.log"; exit 1; }
  cmake --build "$other/build-gpu" -j "$(nproc)" --target $target >"$out/${label}_build.log" 2>&1 \
    || { grep -E "error|FAILED" "$out/${label}_build.log" | head -20; exit 1; }
  echo "build of $other: $(( $(date +%s) - t0 )) s"
  bin[$label]="$other/build-gpu/bin/$target"
  labels+=("$label")
done
if [ "$mode" = decode ]; then
  for r in $(seq 1 "${ROUNDS:-3}"); do
    for label in "${labels[@]}"; do
      "${bin[$label]}" decode_step 2>&1 | grep "decode step of" | sed "s/^/RESULT ${label}_r$r /"
    done
  done | tee "$out/ab_decode.txt"
  exit 0
fi
[ -f "$out/tok/train.h5" ] || bench_data

run() {  # run NAME BINARY: 30 steps of gpt2-124m, mean over steps >= 10
  "$2" --config configs/gpt2-124m.ini --precision.fp8=false --data.train="$out/tok/train.h5" --data.val=none --train.micro_batch=32 \
    --train.batch_tokens=32768 --train.max_steps=30 --train.warmup_steps=5 --train.sample_tokens=0 --log.every=5 \
    --log.metrics="$out/$1.jsonl" --checkpoint.resume=none >"$out/$1.log" 2>&1 || { tail -5 "$out/$1.log"; return; }
  python3 - "$1" "$out/$1.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l]
last = [r for r in rows if r["step"] >= 10]
tok = sum(r["tokens_per_sec"] for r in last) / len(last)
print(f"RESULT {sys.argv[1]} tok/s={tok:,.0f} ms/step={sum(r['ms_per_step'] for r in last) / len(last):.1f} "
      f"peakGiB={rows[-1]['peak_mem_gib']:.2f} loss={rows[-1]['loss']:.4f}", flush=True)
PY
}
for r in $(seq 1 "${ROUNDS:-3}"); do
  for label in "${labels[@]}"; do run "${label}_r$r" "${bin[$label]}"; done
done | tee "$out/ab.txt"
python3 - "$out/ab.txt" "${labels[@]}" <<'PY'
import re, sys
labels = sys.argv[2:]
tok = {label: [] for label in labels}
for line in open(sys.argv[1]):
    m = re.match(r"RESULT (.+)_r\d+ tok/s=([\d,]+)", line)
    if m and m[1] in tok: tok[m[1]].append(float(m[2].replace(",", "")))
mean = {label: sum(v) / len(v) for label, v in tok.items() if v}
for label in labels[1:]:
    if "this" in mean and label in mean:
        print(f"mean tok/s: this {mean['this']:,.0f}, {label} {mean[label]:,.0f}; this/{label} = {mean['this'] / mean[label]:.4f}")
PY
