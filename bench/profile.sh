#!/usr/bin/env bash
# On one GPU: gpt2-124m bf16 B=32 T=1024 — ours with --profile.steps=3 (top CUDA kernels, trace in
# $OUT/prof), then the PyTorch peer eager and compiled in the same call. The baseline for the GPU
# speed work. source .device-deps/gpu-env.sh first.
set -uo pipefail
source bench/common.sh
[ -x build-gpu/bin/gpt2-train ] || bench_build || exit 1
[ -f "$out/tok/train.h5" ] || bench_data
build-gpu/bin/gpt2-train --config configs/gpt2-124m.ini --data.train="$out/tok/train.h5" --data.val=none \
  --train.micro_batch=32 --train.batch_tokens=32768 --train.max_steps=30 --train.warmup_steps=10 \
  --train.sample_tokens=0 --log.every=10 --log.metrics="$out/prof.jsonl" --checkpoint.resume=none \
  --profile.steps=3 --profile.dir="$out/prof" >"$out/prof.log" 2>&1 || tail -20 "$out/prof.log"
grep -A16 "trace of" "$out/prof.log" | sed 's/^\[[^]]*\] \[rank 0\/1\] \[info\] //'
bench_summary "gpt2-124m B=32 bf16 (steps with the profiler excluded from nothing)" "$out/prof.jsonl"
peer=.device-deps/torch_peer.py
python3 "$peer" --B 32 --steps 20 2>&1 | grep RESULT
python3 "$peer" --B 32 --steps 20 --compile 2>&1 | grep RESULT
gzip -f "$out/prof/trace_rank0.json" 2>/dev/null; ls -la "$out/prof"
