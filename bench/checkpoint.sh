#!/usr/bin/env bash
# On one GPU: gpt2-1558m bf16 B=8 T=1024, a checkpoint every 3 steps (sync): how long each save
# stalls training, the checkpoint's size, and a resume from step 3 whose losses are compared with
# the straight run. source .device-deps/gpu-env.sh first. CKPT_DIR: where to write (~25 GB each).
set -uo pipefail
source bench/common.sh
[ -x build-gpu/bin/gpt2-train ] || bench_build || exit 1
[ -f "$out/tok/train.h5" ] || bench_data
dir="${CKPT_DIR:-/tmp/gpt2-ckpt-bench}"
rm -rf "$dir"
common=(--config configs/gpt2-1558m.ini --data.train="$out/tok/train.h5" --data.val=none --train.micro_batch=8
        --train.batch_tokens=8192 --train.max_steps=6 --train.warmup_steps=2 --train.sample_tokens=0 --log.every=1
        --checkpoint.dir="$dir" --checkpoint.keep=2)
build-gpu/bin/gpt2-train "${common[@]}" --checkpoint.every=3 --checkpoint.resume=none \
  --log.metrics="$out/ckpt_straight.jsonl" >"$out/ckpt_straight.log" 2>&1 || tail -20 "$out/ckpt_straight.log"
grep -h "checkpoint .* saved in" "$out/ckpt_straight.log"
du -sh "$dir"/step_0000003 && ls -la "$dir"/step_0000003
build-gpu/bin/gpt2-train "${common[@]}" --checkpoint.every=0 --checkpoint.resume="$dir/step_0000003" \
  --log.metrics="$out/ckpt_resumed.jsonl" >"$out/ckpt_resumed.log" 2>&1 || tail -20 "$out/ckpt_resumed.log"
grep -h "resumed from" "$out/ckpt_resumed.log"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
load = lambda n: {r["step"]: r["loss"] for r in map(json.loads, open(f"{out}/ckpt_{n}.jsonl")) if "loss" in r}
a, b = load("straight"), load("resumed")
for s in sorted(b):
    print(f"step {s}: straight {a[s]:.6f} resumed {b[s]:.6f} diff {b[s]-a[s]:+.2e}")
PY
rm -rf "$dir"
