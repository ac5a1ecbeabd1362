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
bench_xl bf16
bench_xl bf16_ckpt --memory.activation_checkpointing=full
bench_xl bf16_ckpt_offload --memory.activation_checkpointing=full --parallel.offload=optimizer
bench_xl bf16_ckpt_offload_bf16grads --memory.activation_checkpointing=full --parallel.offload=optimizer \
  --precision.reduce_dtype=bf16
n=$([ "${SMOKE:-0}" = 1 ] && echo 20000000 || echo 400000000)
[ "${CPU_BENCH:-1}" = 1 ] && build-gpu/bin/cpu_adamw_bench "$n" 1 4 8 "$(nproc)" 2>&1 | tail -12
