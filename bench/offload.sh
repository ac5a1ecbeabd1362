#!/usr/bin/env bash
# On one GPU: gpt2-1558m bf16, B=8 x T=1024, 8 micro-steps per optimizer step (65,536 tokens):
# peak GPU memory and tokens/s for bf16; + full activation checkpointing; + optimizer offload
# (fp32 and bf16 gradient buffers). Then the CPU AdamW's updates/s per thread.
# source .device-deps/gpu-env.sh first. SMOKE=1: 2 steps each.
set -uo pipefail
source bench/common.sh
[ -x build-gpu/bin/gpt2-train ] || bench_build || exit 1
[ -f "$out/tok/train.h5" ] || bench_data
steps=${STEPS:-$([ "${SMOKE:-0}" = 1 ] && echo 2 || echo 5)}
run() {  # NAME ARGS...
  local name="$1"; shift
  build-gpu/bin/gpt2-train --config configs/gpt2-1558m.ini --data.train="$out/tok/train.h5" --data.val=none \
    --train.micro_batch=8 --train.batch_tokens=65536 --train.max_steps=$steps --train.warmup_steps=2 \
    --train.sample_tokens=0 --log.every=1 --log.metrics="$out/xl_$name.jsonl" "$@" >"$out/xl_$name.log" 2>&1 \
    || tail -20 "$out/xl_$name.log"
  bench_summary "gpt2-1558m B=8 $name" "$out/xl_$name.jsonl"
  grep -h "optimizer state" "$out/xl_$name.log" | head -1
}
run bf16
run bf16_ckpt --memory.activation_checkpointing=full
run bf16_ckpt_offload --memory.activation_checkpointing=full --parallel.offload=optimizer
run bf16_ckpt_offload_bf16grads --memory.activation_checkpointing=full --parallel.offload=optimizer \
  --precision.reduce_dtype=bf16
n=$([ "${SMOKE:-0}" = 1 ] && echo 20000000 || echo 400000000)
[ "${CPU_BENCH:-1}" = 1 ] && build-gpu/bin/cpu_adamw_bench "$n" 1 4 8 "$(nproc)" 2>&1 | tail -12
