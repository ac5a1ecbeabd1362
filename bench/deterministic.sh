#!/usr/bin/env bash
# What train.deterministic costs and keeps, and 8-bit against fp32 moments, in one GPU call:
#  1. gpt2-124m B=32 and gpt2-1558m B=8 (T=1024, random tokens, STEPS steps), in the default mode and
#     with train.deterministic = true: tokens/s (steps >= 5) and the ratio; at 124m two fresh runs of
#     each mode, and how many steps' losses and gradient norms the two share bit for bit.
#  2. gpt2-124m on the fortunes corpus (FORTUNES_DIR), 300 steps of 8 x 1024 tokens, bf16, with fp32
#     and with 8-bit optimizer moments: the loss every 20 steps and the largest relative difference
#     after warmup (30 steps).
#  3. The deterministic check of the GPU suite on one rank (tests/train/deterministic_gpu.sh).
#   source .device-deps/gpu-env.sh && FORTUNES_DIR=... bash bench/deterministic.sh   (results under $OUT)
set -uo pipefail
source bench/common.sh
[ -x build-gpu/bin/gpt2-train ] || bench_build || exit 1
[ -f "$out/tok/train.h5" ] || bench_data
steps=${STEPS:-40}
export GPT2_CACHE_DIR="$out/gemm_cache"  # the deterministic runs' shared GEMM table starts empty
rm -rf "$GPT2_CACHE_DIR"

run() {  # NAME SIZE B ARGS...
  local name=$1 size=$2 B=$3; shift 3
  build-gpu/bin/gpt2-train --config "configs/gpt2-$size.ini" --precision.fp8=false --data.train="$out/tok/train.h5" --data.val=none \
    --train.micro_batch="$B" --train.batch_tokens=$((B * 1024)) --train.max_steps="$steps" --train.warmup_steps=5 \
    --train.sample_tokens=0 --log.every=1 --log.metrics="$out/$name.jsonl" --log.tensorboard=none \
    --checkpoint.resume=none --checkpoint.dir="$out/ck_$name" "$@" >"$out/$name.log" 2>&1 || tail -5 "$out/$name.log"
}
for spec in "124m 32 a b" "1558m 8 a"; do  # 1558m: one run of each mode (its start-up is long)
  read -r size B runs <<<"$spec"
  for r in $runs; do
    run "default_${size}_$r" "$size" "$B"
    run "det_${size}_$r" "$size" "$B" --train.deterministic=true
  done
done
python3 - "$out" <<'PY' | tee "$out/deterministic_table.txt"
import json, sys
out = sys.argv[1]
def rows(name):
    return {r["step"]: r for r in map(json.loads, open(f"{out}/{name}.jsonl")) if "loss" in r}
def tok(rs):
    xs = [r["tokens_per_sec"] for s, r in rs.items() if s >= 5]
    return sum(xs) / len(xs)
print("| size | mode | steps bitwise equal (loss, norm) | tokens/s (run a, b) | peak GiB |")
print("|---|---|---|---|---|")
speeds = {}
for size in ("124m", "1558m"):
    for mode in ("default", "det"):
        a = rows(f"{mode}_{size}_a")
        try:
            b = rows(f"{mode}_{size}_b")
            same = sum(1 for s in a if s in b and (a[s]["loss"], a[s]["grad_norm"]) == (b[s]["loss"], b[s]["grad_norm"]))
            shared, tb = f"{same}/{len(a)}", f", {tok(b):,.0f}"
        except FileNotFoundError:
            b, shared, tb = None, "(one run)", ""
        speeds[size, mode] = (tok(a) + tok(b)) / 2 if b else tok(a)
        print(f"| {size} | {'deterministic' if mode == 'det' else 'default'} | {shared} | {tok(a):,.0f}{tb} | "
              f"{a[max(a)]['peak_mem_gib']:.2f} |")
for size in ("124m", "1558m"):
    print(f"deterministic / default tokens/s at {size}: {speeds[size, 'det'] / speeds[size, 'default']:.4f}")
PY

# 2. 8-bit against fp32 moments on real text.
corpus=${FORTUNES_DIR:-/usr/share/games/fortunes}
[ -f "$out/fortunes/train.h5" ] || build-gpu/bin/gpt2-data "$corpus" --doc_separator % --val_fraction 0 --out "$out/fortunes" >"$out/fortunes.log" 2>&1
for mom in fp32 8bit; do
  build-gpu/bin/gpt2-train --config configs/gpt2-124m.ini --precision.fp8=false --data.train="$out/fortunes/train.h5" --data.val=none \
    --train.micro_batch=8 --train.batch_tokens=8192 --train.max_steps=300 --train.warmup_steps=30 --train.seed=1 \
    --train.sample_tokens=0 --log.every=20 --log.metrics="$out/moments_$mom.jsonl" --log.tensorboard=none \
    --checkpoint.resume=none --checkpoint.dir="$out/ck_moments_$mom" --memory.optimizer_moments=$mom \
    >"$out/moments_$mom.log" 2>&1 || tail -5 "$out/moments_$mom.log"
done
python3 - "$out" <<'PY' | tee "$out/moments_table.txt"
import json, sys
out = sys.argv[1]
def rows(m):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{out}/moments_{m}.jsonl")) if "loss" in r}
a, b = rows("fp32"), rows("8bit")
print("gpt2-124m bf16 on fortunes, loss every 20 steps: step fp32 8bit diff")
for s in sorted(a):
    print(f"{s:4d} {a[s]:.4f} {b[s]:.4f} {100 * (b[s] / a[s] - 1):+.2f}%")
worst = max(abs(b[s] / a[s] - 1) for s in a if s >= 30)
print(f"largest relative difference after warmup: {100 * worst:.2f}% (end: {100 * (b[max(a)] / a[max(a)] - 1):+.2f}%)")
PY

# 3. The GPU suite's deterministic check, one rank (two fresh runs, kill and resume).
DETERMINISTIC_CASES="1:0" RESUME_CASES="1:0" bash tests/train/deterministic_gpu.sh build-gpu/bin "$out/det_check" 2>&1 | tail -5
