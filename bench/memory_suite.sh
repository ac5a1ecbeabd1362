#!/usr/bin/env bash
# Issue "memory" in one device call on nvidia-h200-x2: build, then GPU 0 runs the gpt2-1558m
# offload table and the gpt2-124m checkpointing cost while GPU 1 runs the fp32/bf16/fp16 curves;
# then both GPUs run ZeRO 0/1/2. source .device-deps/gpu-env.sh first. SMOKE=1: a few steps each.
set -uo pipefail
source bench/common.sh
bench_build || exit 1
bench_data
(CUDA_VISIBLE_DEVICES=1 bash bench/precision_curves.sh >"$out/suite_curves.txt" 2>&1) &
curves=$!
CUDA_VISIBLE_DEVICES=0 bash bench/offload.sh
CUDA_VISIBLE_DEVICES=0 bash bench/memory.sh
wait $curves
cat "$out/suite_curves.txt"
bash bench/zero.sh
