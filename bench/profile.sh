#!/usr/bin/env bash
# On one GPU, for each size in SIZES (default 124m; B = 32, 16, 16, 8 for 124m, 350m, 774m, 1558m
# as bench/speed.sh takes them), bf16 T=1024: ours with --profile.steps=3, then the kernel time per
# step by kind and the top 15 kernels (bench/trace_summary.py; traces in $OUT/prof_SIZE), and
# (PEERS=1, the default) the PyTorch peer eager and compiled in the same call. Where the speed
# issue's milliseconds are. source .device-deps/gpu-env.sh first.
#   SIZES="350m 774m 1558m" PEERS=0 bash bench/profile.sh
set -uo pipefail
source bench/common.sh
[ -x build-gpu/bin/gpt2-train ] || bench_build || exit 1
[ -f "$out/tok/train.h5" ] || bench_data
for size in ${SIZES:-124m}; do
  case $size in 124m) B=32 ;; 350m|774m) B=16 ;; *) B=8 ;; esac
  echo "== $size B=$B"
  build-gpu/bin/gpt2-train --config "configs/gpt2-$size.ini" --precision.fp8=false --data.train="$out/tok/train.h5" --data.val=none \
    --train.micro_batch="$B" --train.batch_tokens=$((B * 1024)) --train.max_steps=30 --train.warmup_steps=10 \
    --train.sample_tokens=0 --log.every=10 --log.metrics="$out/prof_$size.jsonl" --checkpoint.resume=none \
    --profile.steps=3 --profile.dir="$out/prof_$size" >"$out/prof_$size.log" 2>&1 || tail -20 "$out/prof_$size.log"
  bench_summary "gpt2-$size B=$B bf16 (3 steps under the profiler included)" "$out/prof_$size.jsonl"
  trace=$(ls "$out/prof_$size"/trace_rank0.json* 2>/dev/null | head -1)
  [ -n "$trace" ] && python3 bench/trace_summary.py "$trace" 3 15
  gzip -f "$out/prof_$size/trace_rank0.json" 2>/dev/null
  if [ "${PEERS:-1}" = 1 ]; then
    python3 .device-deps/torch_peer.py --size "${size^^}" --B "$B" --steps 20 2>&1 | grep RESULT
    python3 .device-deps/torch_peer.py --size "${size^^}" --B "$B" --steps 20 --compile 2>&1 | grep RESULT
  fi
done
