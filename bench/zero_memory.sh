#!/usr/bin/env bash
# Per-rank GPU memory of ZeRO 0, 1 and 2 with 2 and 4 ranks sharing one GPU, gpt2-124m (B=8) and
# gpt2-1558m (B=1), bf16, T=1024, 2 steps. The ranks pose as separate hosts to NCCL (Note [Ranks as
# hosts] in tests/parallel/gpu_parallel_test.cpp), so each reduces over NCCL's socket transport as
# across nodes; memory is each rank's own allocator's peak ("peak mem per rank" in the log), and the
# losses of the three stages are printed side by side. source .device-deps/gpu-env.sh first.
# Usage: bash bench/zero_memory.sh [124m|1558m ...]   (default both)
set -uo pipefail
source bench/common.sh
[ -x build-gpu/bin/gpt2-train ] || bench_build || exit 1
[ -f "$out/tok/train.h5" ] || bench_data
# Each rank names itself another host before NCCL starts (NCCL_HOSTID), then runs gpt2-train.
bench_as_hosts
wrapper="$out/as_host.sh"
for size in "${@:-124m 1558m}"; do
  micro=$([ "$size" = 124m ] && echo 8 || echo 1)
  for np in 2 4; do for z in 0 1 2; do
    name="$size-np$np-zero$z"
    GPT2_BIN="$wrapper" launch/train.sh -np "$np" --config "configs/gpt2-$size.ini" --precision.fp8=false --data.train="$out/tok/train.h5" \
      --data.val=none --train.micro_batch="$micro" --train.batch_tokens=$((np * micro * 1024)) --train.max_steps=2 \
      --train.warmup_steps=1 --train.sample_tokens=0 --log.every=1 --checkpoint.every=0 --parallel.backend=nccl \
      --parallel.zero_stage="$z" --log.metrics="$out/$name.jsonl" >"$out/$name.log" 2>&1 || { echo "$name failed:"; tail -5 "$out/$name.log"; continue; }
    peaks=$(grep -ho "peak mem per rank (GiB):.*" "$out/$name.log" | cut -d: -f2)
    grads=$(grep -ho "gradients [a-zA-Z0-9]* ([0-9.]* MiB on this rank)" "$out/$name.log" | head -1)
    state=$(grep -ho "optimizer state: [0-9.]* MiB on the device" "$out/$name.log" | head -1)
    losses=$(python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1]) if "\"loss\"" in l))' "$out/$name.jsonl")
    echo "RESULT $name peak_GiB_per_rank=[${peaks# }] $grads; $state; losses: $losses"
  done; done
done
