#!/usr/bin/env bash
# On one GPU: gpt2-1558m bf16, B=8 x T=1024 x 8 micro-steps (65,536 tokens per step): how long a
# checkpoint (~24 GB) stalls training, written synchronously and with checkpoint.async (the pause
# is then the snapshot to host memory; the files follow while steps go on). The run ends with a
# sync save. source .device-deps/gpu-env.sh first. CKPT_DIR: where to write.
set -uo pipefail
source bench/common.sh
[ -x build-gpu/bin/gpt2-train ] || bench_build || exit 1
[ -f "$out/tok/train.h5" ] || bench_data
dir="${CKPT_DIR:-/tmp/gpt2-ckpt-bench}"
common=(--config configs/gpt2-1558m.ini --data.train="$out/tok/train.h5" --data.val=none --train.micro_batch=8
        --train.batch_tokens=65536 --train.warmup_steps=2 --train.sample_tokens=0 --log.every=1
        --checkpoint.dir="$dir" --checkpoint.keep=1 --checkpoint.resume=none)
for mode in sync async; do
  rm -rf "$dir"
  if [ $mode = sync ]; then extra=(--train.max_steps=4 --checkpoint.every=2); else
    extra=(--train.max_steps=45 --checkpoint.every=20 --checkpoint.async=true); fi
  build-gpu/bin/gpt2-train "${common[@]}" "${extra[@]}" --log.metrics="$out/ckpt_$mode.jsonl" >"$out/ckpt_$mode.log" 2>&1 \
    || tail -20 "$out/ckpt_$mode.log"
  echo "== $mode"
  grep -hE "checkpoint .*(paused|complete)" "$out/ckpt_$mode.log" | sed 's/^\[[^]]*\] \[rank 0\/1\] \[info\] //'
  python3 - "$out/ckpt_$mode.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
print("ms/step by step:", " ".join(f"{r['step']}:{r['ms_per_step']:.0f}" for r in rows))
PY
done
du -sh "$dir"/step_* 2>/dev/null
rm -rf "$dir"
