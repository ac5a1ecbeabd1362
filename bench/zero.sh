#!/usr/bin/env bash
# On a 2-GPU machine (nvidia-h200-x2): gpt2-124m bf16, B=32 x T=1024 per GPU, ZeRO stage 0, 1, 2:
# tokens/s, peak GPU memory and optimizer state per rank. source .device-deps/gpu-env.sh first.
set -uo pipefail
source bench/common.sh
[ -x build-gpu/bin/gpt2-train ] || bench_build || exit 1
[ -f "$out/tok/train.h5" ] || bench_data
for z in 0 1 2; do
  GPT2_BIN=build-gpu/bin/gpt2-train launch/train.sh -np 2 --config configs/gpt2-124m.ini --data.train="$out/tok/train.h5" \
    --data.val=none --train.micro_batch=32 --train.batch_tokens=65536 --train.max_steps=40 --train.warmup_steps=10 \
    --train.sample_tokens=0 --log.every=5 --parallel.zero_stage=$z --log.metrics="$out/zero$z.jsonl" >"$out/zero$z.log" 2>&1 \
    || tail -20 "$out/zero$z.log"
  bench_summary "gpus=2 zero=$z" "$out/zero$z.jsonl"
  grep -h "optimizer state" "$out/zero$z.log" | head -1
done
