#!/usr/bin/env bash
# 8-bit AdamW moments (memory.optimizer_moments) on one GPU. PART=table (default all):
#   gpt2-1558m bf16, B=8 x T=1024, 65,536 tokens a step: peak GiB and tokens/s with fp32 and 8-bit
#   moments; full recomputation + 8-bit moments without offload (fits a 24 GB card?); offload with
#   fp32 and 8-bit moments (pinned host bytes from the optimizer-state line).
# PART=speed: fp32 and 8-bit moments alternately, ROUNDS (2) times each, at 8 micro-steps a step
#   and at one (8,192 tokens a step, bench/speed.sh's setting, where the update is a larger share).
# PART=convergence: gpt2-124m, 1000 steps of 2,048 tokens on the fortunes corpus (~3 epochs), the
#   val loss every 100 steps with fp32 and with 8-bit moments.
# source .device-deps/gpu-env.sh first; FORTUNES_DIR for the corpus. SMOKE=1: a few steps each.
set -uo pipefail
source bench/common.sh
[ -x build-gpu/bin/gpt2-train ] || bench_build || exit 1
part=${PART:-all}
steps=${STEPS:-$([ "${SMOKE:-0}" = 1 ] && echo 2 || echo 5)}

if [ "$part" = all ] || [ "$part" = table ]; then
  [ -f "$out/tok/train.h5" ] || bench_data
  bench_xl fp32_moments
  bench_xl 8bit_moments --memory.optimizer_moments=8bit
  bench_xl ckpt_8bit_bf16grads --memory.optimizer_moments=8bit --memory.activation_checkpointing=full \
    --precision.reduce_dtype=bf16
  bench_xl ckpt_offload_fp32_moments --memory.activation_checkpointing=full --parallel.offload=optimizer \
    --precision.reduce_dtype=bf16
  bench_xl ckpt_offload_8bit_moments --memory.activation_checkpointing=full --parallel.offload=optimizer \
    --precision.reduce_dtype=bf16 --memory.optimizer_moments=8bit
fi

if [ "$part" = speed ]; then
  [ -f "$out/tok/train.h5" ] || bench_data
  for round in $(seq "${ROUNDS:-2}"); do
    bench_xl "fp32_moments_$round"
    bench_xl "8bit_moments_$round" --memory.optimizer_moments=8bit
  done
  for round in $(seq "${ROUNDS:-2}"); do
    steps=20 batch_tokens=8192 bench_xl "fp32_moments_1micro_$round"
    steps=20 batch_tokens=8192 bench_xl "8bit_moments_1micro_$round" --memory.optimizer_moments=8bit
  done
fi

if [ "$part" = all ] || [ "$part" = convergence ]; then
  data="$out/fortunes"
  [ -f "$data/train.h5" ] || build-gpu/bin/gpt2-data "${FORTUNES_DIR:-/usr/share/games/fortunes}" --doc_separator % \
    --val_fraction 0.05 --out "$data" >"$out/fortunes_data.log" 2>&1 || { tail -5 "$out/fortunes_data.log"; exit 1; }
  conv_steps=$([ "${SMOKE:-0}" = 1 ] && echo 20 || echo 1000)
  for moments in fp32 8bit; do
    build-gpu/bin/gpt2-train --config configs/fortunes-124m.ini --data.train="$data/train.h5" \
      --data.val="$data/val.h5" --train.micro_batch=8 --train.batch_tokens=2048 --train.max_steps="$conv_steps" \
      --train.eval_every=100 --train.eval_steps=16 --train.sample_tokens=0 --checkpoint.every=0 \
      --memory.optimizer_moments=$moments --log.every=100 --log.metrics="$out/conv_$moments.jsonl" \
      >"$out/conv_$moments.log" 2>&1 || tail -20 "$out/conv_$moments.log"
  done
  python3 - "$out/conv_fp32.jsonl" "$out/conv_8bit.jsonl" <<'PY'
import json, sys
curves = [{r["step"]: r["val_loss"] for r in map(json.loads, open(p)) if "val_loss" in r} for p in sys.argv[1:]]
print("CONVERGENCE gpt2-124m fortunes, val loss:  step  fp32-moments  8bit-moments  rel.diff")
for s in sorted(set(curves[0]) & set(curves[1])):
    a, b = curves[0][s], curves[1][s]
    print(f"CONVERGENCE {s:5d}  {a:.4f}  {b:.4f}  {100 * (b - a) / a:+.2f}%")
PY
fi
