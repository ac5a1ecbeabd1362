#!/usr/bin/env bash
# A/B speed of two trees on the GPU machine, in one call: builds this tree (build-gpu/) and the one
# in DIR (another checkout of gpt2-dist, e.g. `git archive REV | tar -x -C DIR`, carried to the
# machine), then runs gpt2-124m B=32 bf16 on each in turn, ROUNDS times (default 3), so drift on
# the machine hits both alike. Prints one RESULT line per run and the mean ratio this/DIR.
# AB=decode instead times the batch-1 decode step of each tree (`kernel_bench decode_step`: bf16 and
# int8, gpt2-124m and gpt2-1558m, from a CUDA graph), alternating the same way. Two build
# directories, because a tree carried again onto a warm machine keeps older mtimes than the objects
# built from the last one, so ninja would not rebuild it.
#   source .device-deps/gpu-env.sh && bash bench/ab_speed.sh before-move
#   source .device-deps/gpu-env.sh && AB=decode ROUNDS=2 bash bench/ab_speed.sh before-change
set -uo pipefail
source bench/common.sh
other="${1:?usage: [AB=decode] bench/ab_speed.sh DIR}"
mode="${AB:-train}" target=gpt2-train
[ "$mode" = decode ] && target=kernel_bench
[ -x build-gpu/bin/$target ] || bench_build || exit 1
t0=$(date +%s)
cmake -S "$other" -B "$other/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPT2_PYTHON="$(command -v python3)" \
  -DGPT2_BUILD_TESTS=OFF >"$out/other_configure.log" 2>&1 || { tail -20 "$out/other_configure.log"; exit 1; }
cmake --build "$other/build-gpu" -j "$(nproc)" --target $target >"$out/other_build.log" 2>&1 \
  || { grep -E "error|FAILED" "$out/other_build.log" | head -20; exit 1; }
echo "build of $other: $(( $(date +%s) - t0 )) s"
if [ "$mode" = decode ]; then
  for r in $(seq 1 "${ROUNDS:-3}"); do
    for side in this other; do
      bin=build-gpu/bin/kernel_bench
      [ $side = other ] && bin="$other/build-gpu/bin/kernel_bench"
      "$bin" decode_step 2>&1 | grep "decode step of" | sed "s/^/RESULT ${side}_r$r /"
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
  run "this_r$r" build-gpu/bin/gpt2-train
  run "other_r$r" "$other/build-gpu/bin/gpt2-train"
done | tee "$out/ab.txt"
python3 - "$out/ab.txt" <<'PY'
import re, sys
tok = {"this": [], "other": []}
for line in open(sys.argv[1]):
    m = re.match(r"RESULT (this|other)_r\d+ tok/s=([\d,]+)", line)
    if m: tok[m[1]].append(float(m[2].replace(",", "")))
a, b = (sum(v) / len(v) for v in (tok["this"], tok["other"]))
print(f"mean tok/s: this {a:,.0f}, other {b:,.0f}; this/other = {a / b:.4f}")
PY
