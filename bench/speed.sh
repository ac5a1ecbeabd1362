#!/usr/bin/env bash
# GPU speed, one call: build, then for each size in SIZES (default "124m 350m 774m 1558m";
# B = 32, 16, 16, 8) ours with the size's config vs the PyTorch peer eager and torch.compile'd,
# same shapes, same call; about 520 s on an H200 once built, inside the device tool's 600 s per call. Extra
# rows and steps, each opt-in: CHECKS=1 runs the kernel checks first (tests/kernels on the GPU, also
# in tests/run_gpu_suite.sh), UNFUSED=1 adds ours with LibTorch's ops, UNTUNED=1 ours with ATen's
# GEMMs (train.gemm_tuning off), KEEP_GELU=1 at 1558m ours with memory.recompute_gelu off, MUON=1 ours
# with optim.name = muon at each size and, at 124m, AdamW and Muon on 3 ranks sharing the GPU under
# ZeRO 1 (ranks posing as hosts, bench_as_hosts; issue 42's step-cost rows); with MUON_BATCH_TOKENS=N
# also AdamW and Muon at N tokens an optimizer step, by accumulating micro-batches (Newton-Schulz is
# paid once a step, so its share falls with the batch: 524288 is GPT-2's 0.5M tokens, 16 micro-batches
# at 124m and 64 at 1558m; 6 steps each, the mean of the last three). PEERS=0 leaves out the
# PyTorch peers (rows that compare ours with ours need none). FP8=1 adds ours with precision.fp8 at
# each size (issue 40), with delayed scaling (the default, 16 steps) and with current, and, with the peers, torchao's
# float8 training + torch.compile for each recipe in FP8_PEERS (default "tensorwise", empty: none; the wheel from
# .device-deps/wheels, see torch_peer.py's header); FP8_CURRENT=0 leaves out current scaling, and BF16=0
# ours in bf16, for a call that only needs FP8 against its peers. EAGER=0 leaves out the eager peer. Then a profile
# of ours for 124m (top kernels; with FP8=1 also of the FP8 run; PROFILE=0 leaves it out); and the
# 2-GPU scaling of ours when the machine has two GPUs. Prints a table at the end.
#   source .device-deps/gpu-env.sh && SIZES=124m bash bench/speed.sh
set -uo pipefail
source bench/common.sh
[ -x build-gpu/bin/gpt2-train ] || bench_build || exit 1
[ -f "$out/tok/train.h5" ] || bench_data
table="$out/speed_table.txt"
: >"$table"
row() { printf "| %-44s | %10s | %9s | %8s | %6s |\n" "$@" >>"$table"; }
row "run" "tokens/s" "ms/step" "peak GiB" "MFU"
row "---" "---" "---" "---" "---"

if [ "${CHECKS:-0}" = 1 ]; then
  echo "== kernel checks (GPU)"
  ./build-gpu/tests/gpt2_kernel_tests >"$out/kernel_tests.log" 2>&1; grep -E "^\[ *(OK|FAILED|SKIPPED|PASSED) |Failure|Expected|Which is|rel_error" "$out/kernel_tests.log" | head -40
fi

# ours NAME SIZE B STEPS ARGS...: a run of gpt2-train, summarised into the table (the mean of the
# logged steps from FROM_STEP on; ACCUM micro-batches a step).
ours() {
  local name=$1 size=$2 B=$3 steps=$4 t0=$SECONDS; shift 4
  local bf16=(--precision.fp8=false)  # the configs may say auto: a row is bf16 unless its ARGS ask for FP8
  [[ " $* " == *" --precision.fp8="* ]] && bf16=()
  build-gpu/bin/gpt2-train --config "configs/gpt2-$size.ini" "${bf16[@]}" --data.train="$out/tok/train.h5" --data.val=none \
    --train.micro_batch="$B" --train.batch_tokens=$((B * 1024 * ${ACCUM:-1})) --train.max_steps="$steps" --train.warmup_steps=5 \
    --train.sample_tokens=0 --log.every="${LOG_EVERY:-5}" --log.metrics="$out/$name.jsonl" --checkpoint.resume=none "$@" \
    >"$out/$name.log" 2>&1 || { tail -5 "$out/$name.log"; return; }
  python3 - "$name" "$out/$name.jsonl" "${FROM_STEP:-10}" >>"$table" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[2]) if '"loss"' in l]
last = [r for r in rows if r["step"] >= int(sys.argv[3])] or rows[1:]
tok = sum(r["tokens_per_sec"] for r in last) / len(last); ms = sum(r["ms_per_step"] for r in last) / len(last)
print(f"| {'ours ' + sys.argv[1]:<44} | {tok:10,.0f} | {ms:9.1f} | {rows[-1]['peak_mem_gib']:8.2f} | {100*rows[-1]['mfu']:5.1f}% |")
PY
  echo "$(tail -1 "$table") ($((SECONDS - t0)) s; ${SECONDS} s into the call)"
}
peer() {
  local name=$1 t0=$SECONDS; shift
  local line
  line=$(python3 .device-deps/torch_peer.py "$@" 2>&1 | grep RESULT)
  echo "$line ($((SECONDS - t0)) s; ${SECONDS} s into the call)"
  python3 - "$name" "$line" >>"$table" <<'PY'
import re, sys
name, line = sys.argv[1], sys.argv[2]
num = lambda k: (re.search(re.escape(k) + r"=([0-9.,]+)", line) or [None, "nan"])[1].replace(",", "")
print(f"| {name:<44} | {float(num('tok/s')):10,.0f} | {float(num('ms/step')):9.1f} | {float(num('peakGiB')):8.2f} | {num('MFU(989T)')}% |")
PY
}

sizes=${SIZES:-124m 350m 774m 1558m}
torchao_site=/tmp/torchao-site
if [ "${FP8:-0}" = 1 ] && [ "${PEERS:-1}" = 1 ] && ! [ -d "$torchao_site/torchao" ]; then
  pip install --quiet --no-deps --target "$torchao_site" .device-deps/wheels/torchao*.whl \
    || echo "torchao's wheel did not install: bash -c 'pip download --no-deps torchao -d .device-deps/wheels' here first"
fi
for size in $sizes; do
  case $size in 124m) B=32 ;; 350m|774m) B=16 ;; *) B=8 ;; esac
  S=${size^^}
  echo "== $size B=$B T=1024 bf16"
  [ "${BF16:-1}" = 1 ] && ours "${size}" "$size" "$B" 30
  [ "${UNFUSED:-0}" = 1 ] && ours "${size}_unfused" "$size" "$B" 30 --train.fused_kernels=false
  [ "${UNTUNED:-0}" = 1 ] && ours "${size}_untuned_gemms" "$size" "$B" 30 --train.gemm_tuning=false
  [ "$size" = 1558m ] && [ "${KEEP_GELU:-0}" = 1 ] && ours "${size}_keep_gelu_output" "$size" "$B" 30 --memory.recompute_gelu=false
  [ "${MUON:-0}" = 1 ] && ours "${size}_muon" "$size" "$B" 30 --optim.name=muon
  [ "${FP8:-0}" = 1 ] && [ "${FP8_CURRENT:-1}" = 1 ] && ours "${size}_fp8_current" "$size" "$B" 30 --precision.fp8=true --precision.fp8_amax_history=0
  [ "${FP8:-0}" = 1 ] && ours "${size}_fp8" "$size" "$B" 30 --precision.fp8=true
  if [ "${MUON:-0}" = 1 ] && [ -n "${MUON_BATCH_TOKENS:-}" ]; then
    accum=$((MUON_BATCH_TOKENS / (B * 1024)))
    for opt in adamw muon; do
      ACCUM=$accum LOG_EVERY=1 FROM_STEP=3 ours "${size}_${opt}_${accum}_micro_batches" "$size" "$B" 6 --optim.name=$opt
    done
  fi
  if [ "${PEERS:-1}" = 1 ]; then
    [ "${EAGER:-1}" = 1 ] && peer "torch eager $size" --size "$S" --B "$B" --steps 20
    peer "torch.compile $size" --size "$S" --B "$B" --steps 20 --compile
    if [ "${FP8:-0}" = 1 ]; then
      for recipe in ${FP8_PEERS-tensorwise}; do
        PYTHONPATH=$torchao_site peer "torchao float8 $recipe + compile $size" --size "$S" --B "$B" --steps 20 --compile \
          --float8 "$recipe"
      done
    fi
  fi
done

if [ "${MUON:-0}" = 1 ] && [[ " $sizes " == *" 124m "* ]]; then
  bench_as_hosts
  for opt in adamw muon; do  # 3 ranks on the GPU, ZeRO 1, B=32 each
    GPT2_BIN="$out/as_host.sh" launch/train.sh -np 3 --config configs/gpt2-124m.ini --precision.fp8=false --data.train="$out/tok/train.h5" \
      --data.val=none --train.micro_batch=32 --train.batch_tokens=98304 --train.max_steps=30 --train.warmup_steps=5 \
      --train.sample_tokens=0 --log.every=5 --log.metrics="$out/np3_zero1_$opt.jsonl" --checkpoint.resume=none \
      --parallel.zero_stage=1 --parallel.backend=nccl --optim.name=$opt >"$out/np3_zero1_$opt.log" 2>&1 \
      || tail -5 "$out/np3_zero1_$opt.log"
    bench_summary "124m 3 ranks ZeRO 1 $opt" "$out/np3_zero1_$opt.jsonl" | tee -a "$table"
  done
fi

if [[ " $sizes " == *" 124m "* ]] && [ "${PROFILE:-1}" = 1 ]; then
  echo "== profile of ours, 124m (fused loss)"
  build-gpu/bin/gpt2-train --config configs/gpt2-124m.ini --precision.fp8=false --data.train="$out/tok/train.h5" --data.val=none \
    --train.micro_batch=32 --train.batch_tokens=32768 --train.max_steps=12 --train.sample_tokens=0 --log.every=5 \
    --log.metrics=none --checkpoint.resume=none --profile.steps=3 --profile.dir="$out/prof" >"$out/prof.log" 2>&1
  grep -A16 "trace of" "$out/prof.log" | sed 's/^\[[^]]*\] \[rank 0\/1\] \[info\] //'
  gzip -f "$out/prof/trace_rank0.json" 2>/dev/null
  if [ "${FP8:-0}" = 1 ]; then
    echo "== profile of ours, 124m, precision.fp8 with delayed scaling (16 steps)"
    build-gpu/bin/gpt2-train --config configs/gpt2-124m.ini --data.train="$out/tok/train.h5" --data.val=none \
      --train.micro_batch=32 --train.batch_tokens=32768 --train.max_steps=12 --train.sample_tokens=0 --log.every=5 \
      --log.metrics=none --checkpoint.resume=none --precision.fp8=true \
      --profile.steps=3 --profile.dir="$out/prof_fp8" >"$out/prof_fp8.log" 2>&1
    grep -A24 "trace of" "$out/prof_fp8.log" | sed 's/^\[[^]]*\] \[rank 0\/1\] \[info\] //'
    gzip -f "$out/prof_fp8/trace_rank0.json" 2>/dev/null
  fi
fi

gpus=$(nvidia-smi -L | wc -l)
if [ "$gpus" -ge 2 ]; then
  echo "== 2 GPUs, 124m B=32 per GPU"
  GPT2_BIN=build-gpu/bin/gpt2-train launch/train.sh -np 2 --config configs/gpt2-124m.ini --precision.fp8=false --data.train="$out/tok/train.h5" \
    --data.val=none --train.micro_batch=32 --train.batch_tokens=65536 --train.max_steps=30 --train.warmup_steps=5 \
    --train.sample_tokens=0 --log.every=5 --log.metrics="$out/two_gpu.jsonl" --checkpoint.resume=none >"$out/two_gpu.log" 2>&1
  bench_summary "2 GPUs 124m" "$out/two_gpu.jsonl"
else
  echo "2-GPU scaling: not run ($gpus GPU on this machine)" | tee -a "$table"
fi
echo "== table"
cat "$table"
