#!/usr/bin/env bash
# Issue "memory" in one device call: build, then the gpt2-1558m offload table and the gpt2-124m
# checkpointing cost on GPU 0 and the fp32/bf16/fp16 curves (on GPU 1 at the same time when there
# are two GPUs, else after), then ZeRO 0/1/2 on two GPUs when there are two.
# source .device-deps/gpu-env.sh first. SMOKE=1: a few steps each.
set -uo pipefail
source bench/common.sh
bench_build || exit 1
bench_data
gpus=$(nvidia-smi -L | wc -l)
if [ "$gpus" -ge 2 ]; then
  (CUDA_VISIBLE_DEVICES=1 bash bench/precision_curves.sh >"$out/suite_curves.txt" 2>&1) &
  curves=$!
fi
CUDA_VISIBLE_DEVICES=0 bash bench/offload.sh
CUDA_VISIBLE_DEVICES=0 bash bench/memory.sh
if [ "$gpus" -ge 2 ]; then
  wait $curves
  cat "$out/suite_curves.txt"
  bash bench/zero.sh
else
  CUDA_VISIBLE_DEVICES=0 bash bench/precision_curves.sh
  echo "ZeRO 0/1/2 on two GPUs: skipped, this machine has $gpus GPU"
fi
