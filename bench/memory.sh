#!/usr/bin/env bash
# On one GPU: gpt2-124m bf16 B=32 T=1024 with activation checkpointing none / full / every_k=2:
# tokens/s and peak GPU memory. source .device-deps/gpu-env.sh first.
set -uo pipefail
source bench/common.sh
[ -x build-gpu/bin/gpt2-train ] || bench_build || exit 1
[ -f "$out/tok/train.h5" ] || bench_data
for ac in none full every_k=2; do
  build-gpu/bin/gpt2-train --config configs/gpt2-124m.ini --precision.fp8=false --data.train="$out/tok/train.h5" --data.val=none \
    --train.micro_batch=32 --train.batch_tokens=32768 --train.max_steps=$([ "${SMOKE:-0}" = 1 ] && echo 6 || echo 30) --train.warmup_steps=10 \
    --train.sample_tokens=0 --log.every=5 --memory.activation_checkpointing=$ac \
    --log.metrics="$out/ac_${ac/=/}.jsonl" >"$out/ac.log" 2>&1 || tail -20 "$out/ac.log"
  bench_summary "gpus=1 activation_checkpointing=$ac" "$out/ac_${ac/=/}.jsonl"
done
