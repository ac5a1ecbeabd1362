#!/usr/bin/env bash
# On the GPU machine (device tool; carry .device-deps, which also holds torch_peer.py):
#   source .device-deps/gpu-env.sh && bash bench/gpu_baseline.sh
# Builds, runs the unit tests, trains gpt2-124m in bf16 for 50 steps of B=32, T=1024 on one GPU,
# and runs the PyTorch peer (eager and torch.compile) with the same shapes in the same call.
# Prints one RESULT line each.
set -uo pipefail
source bench/common.sh
t0=$(date +%s)
bench_build || exit 1
bench_data
build-gpu/bin/gpt2-train --config configs/gpt2-124m.ini --precision.fp8=false --data.train="$out/tok/train.h5" --data.val=none \
  --train.micro_batch=32 --train.batch_tokens=32768 --train.max_steps="${STEPS:-50}" --train.warmup_steps=10 \
  --train.sample_tokens=0 --log.every=10 --log.metrics="$out/metrics.jsonl" 2>&1 | tee "$out/train.log"
bench_summary "size=124M B=32 T=1024 bf16" "$out/metrics.jsonl"
peer=.device-deps/torch_peer.py
python3 "$peer" --B 32 --steps 20 2>&1 | grep RESULT
python3 "$peer" --B 32 --steps 20 --compile 2>&1 | grep RESULT
# The same unit tests CI runs on CPU, here on the GPU machine's build.
(cd build-gpu && ctest -L unit -j 8 --timeout 300 2>&1 | tail -4)
echo "total: $(( $(date +%s) - t0 )) s"
