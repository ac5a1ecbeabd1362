#!/usr/bin/env bash
# On a 2-GPU machine (device kind nvidia-h200-x2; carry .device-deps, which also holds torch_peer.py):
#   source .device-deps/gpu-env.sh && bash bench/scaling.sh
# gpt2-124m bf16, B=32 x T=1024 per GPU: one GPU, then two GPUs with a bucket_mb sweep, then the
# PyTorch peer (torch.compile) on one and two GPUs, all in one call. Scaling = tok/s(2) / (2 tok/s(1)).
set -uo pipefail
source bench/common.sh
steps="${STEPS:-40}"
bench_build || exit 1
bench_data
common=(--config configs/gpt2-124m.ini --precision.fp8=false --data.train="$out/tok/train.h5" --data.val=none --train.micro_batch=32
        --train.max_steps="$steps" --train.warmup_steps=10 --train.sample_tokens=0 --log.every=5)
GPT2_BIN=build-gpu/bin/gpt2-train launch/train.sh -np 1 "${common[@]}" --train.batch_tokens=32768 \
  --log.metrics="$out/m1.jsonl" >"$out/train1.log" 2>&1 || tail -20 "$out/train1.log"
bench_summary "gpus=1" "$out/m1.jsonl"
for mb in 1 5 25 100; do
  GPT2_BIN=build-gpu/bin/gpt2-train launch/train.sh -np 2 "${common[@]}" --train.batch_tokens=65536 \
    --parallel.bucket_mb=$mb --log.metrics="$out/m2_$mb.jsonl" >"$out/train2_$mb.log" 2>&1 || tail -20 "$out/train2_$mb.log"
  bench_summary "gpus=2 bucket_mb=$mb" "$out/m2_$mb.jsonl"
done
grep -h "gradient buckets" "$out"/train2_*.log | head -4
peer=.device-deps/torch_peer.py
python3 "$peer" --B 32 --steps 20 --compile 2>&1 | grep RESULT
python3 -m torch.distributed.run --standalone --nproc_per_node 2 "$peer" --B 32 --steps 20 --compile 2>&1 | grep RESULT
