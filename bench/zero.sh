#!/usr/bin/env bash
# On a 2-GPU machine (nvidia-h200-x2): gpt2-124m bf16, B=32 x T=1024 per GPU, ZeRO stage 0, 1, 2,
# gradients reduced in fp32 and in bf16 (precision.reduce_dtype):
# tokens/s, peak GPU memory and optimizer state per rank. source .device-deps/gpu-env.sh first.
set -uo pipefail
source bench/common.sh
[ -x build-gpu/bin/gpt2-train ] || bench_build || exit 1
[ -f "$out/tok/train.h5" ] || bench_data
for z in 0 1 2; do for rd in fp32 bf16; do
  GPT2_BIN=build-gpu/bin/gpt2-train launch/train.sh -np 2 --config configs/gpt2-124m.ini --precision.fp8=false --data.train="$out/tok/train.h5" \
    --data.val=none --train.micro_batch=32 --train.batch_tokens=65536 --train.max_steps=$([ "${SMOKE:-0}" = 1 ] && echo 6 || echo 40) --train.warmup_steps=10 \
    --train.sample_tokens=0 --log.every=5 --parallel.zero_stage=$z --precision.reduce_dtype=$rd --log.metrics="$out/zero$z$rd.jsonl" >"$out/zero$z$rd.log" 2>&1 \
    || tail -20 "$out/zero$z$rd.log"
  bench_summary "gpus=2 zero=$z reduce=$rd" "$out/zero$z$rd.jsonl"
  grep -h "optimizer state" "$out/zero$z$rd.log" | head -1
done; done
