#!/usr/bin/env bash
# Issue 40's learning check: precision.fp8 against bf16 from the same seed, on real text (the Python
# 3.11 docs' _sources and the fortunes: bench/time_to_loss.sh's corpus and split), for each size in
# SIZES (default "124m 350m"), STEPS (400) steps of 16,384 tokens (micro-batch 16), val every 25 steps
# over 64 windows. Prints both val curves, the largest relative gap (the bar: within 1% at every
# eval, no spike) and each run's tokens/s.
#   source .device-deps/gpu-env.sh && bash bench/fp8_curves.sh       (logs under $OUT/fp8-curves)
# Env: SIZES, STEPS, CORPUS (.device-deps/corpus, from bash bench/time_to_loss.sh --prepare), GPT2_BIN,
# FP8_HISTORY (the fp8 run's precision.fp8_amax_history: N >= 2, default 16, delayed scaling over N
# steps; 0 current scaling).
set -uo pipefail
source bench/common.sh
bin="${GPT2_BIN:-build-gpu/bin}" steps="${STEPS:-400}"
[ -x "$bin/gpt2-train" ] || bench_build || exit 1
work="$out/fp8-curves"; mkdir -p "$work"
bench_text || exit 1
data="$out/ttl-text"  # the same text and split as bench/time_to_loss.sh
for size in ${SIZES:-124m 350m}; do
  for run in bf16 fp8; do
    "$bin/gpt2-train" --config "configs/gpt2-$size.ini" --data.train="$data/train.h5" --data.val="$data/val.h5" \
      --train.micro_batch=16 --train.batch_tokens=16384 --train.max_steps="$steps" --train.warmup_steps=20 \
      --train.eval_every=25 --train.eval_steps=4 --train.sample_tokens=0 --train.sample_every=0 --log.every=25 \
      --precision.dtype=bf16 --precision.fp8="$([ $run = fp8 ] && echo true || echo false)" \
      --precision.fp8_amax_history="${FP8_HISTORY:-16}" \
      --log.metrics="$work/$size-$run.jsonl" --checkpoint.resume=none --checkpoint.every=0 \
      >"$work/$size-$run.log" 2>&1 || { echo "$size $run failed:"; tail -5 "$work/$size-$run.log"; }
  done
  python3 - "$work" "$size" <<'PY'
import json, sys
work, size = sys.argv[1], sys.argv[2]
rows = {r: [json.loads(l) for l in open(f"{work}/{size}-{r}.jsonl")] for r in ("bf16", "fp8")}
val = {r: {x["step"]: x["val_loss"] for x in rows[r] if "val_loss" in x} for r in rows}
tok = {r: [x["tokens_per_sec"] for x in rows[r] if "tokens_per_sec" in x and x["step"] > 0] for r in rows}
print(f"gpt2-{size} val loss | step | bf16 | fp8 | fp8/bf16 - 1")
worst = 0.0
for s in sorted(val["bf16"]):
    if s not in val["fp8"]: continue
    gap = val["fp8"][s] / val["bf16"][s] - 1
    worst = max(worst, abs(gap))
    print(f"  | {s:4d} | {val['bf16'][s]:.4f} | {val['fp8'][s]:.4f} | {100 * gap:+.2f}%")
mean = lambda xs: sum(xs) / max(1, len(xs))
print(f"RESULT gpt2-{size} fp8 vs bf16: largest val gap {100 * worst:.2f}% (bar 1%); tokens/s bf16 "
      f"{mean(tok['bf16']):,.0f}, fp8 {mean(tok['fp8']):,.0f} ({mean(tok['fp8']) / mean(tok['bf16']):.3f}x)")
PY
done
