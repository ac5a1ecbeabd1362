#!/usr/bin/env bash
# On one GPU: gpt2-124m trained 300 steps on the fortunes corpus (.bench-data/fortunes/: data/out/fortunes of launch/quickstart.sh,
# carried to the device) in fp32, bf16 and fp16; prints train/val loss side by side and the
# largest relative gap to fp32. source .device-deps/gpu-env.sh first. SMOKE=1: 20 steps.
set -uo pipefail
source bench/common.sh
[ -x build-gpu/bin/gpt2-train ] || bench_build || exit 1
steps=$([ "${SMOKE:-0}" = 1 ] && echo 20 || echo 300)
for p in fp32 bf16 fp16; do
  build-gpu/bin/gpt2-train --config configs/gpt2-124m.ini --precision.fp8=false --data.train=.bench-data/fortunes/train.h5 --data.val=.bench-data/fortunes/val.h5 \
    --train.micro_batch=16 --train.batch_tokens=16384 --train.max_steps=$steps --train.warmup_steps=30 \
    --train.eval_every=50 --train.eval_steps=4 --train.sample_tokens=0 --log.every=10 --precision.dtype=$p \
    --log.metrics="$out/curve_$p.jsonl" >"$out/curve_$p.log" 2>&1 || tail -20 "$out/curve_$p.log"
  bench_summary "gpt2-124m fortunes $p" "$out/curve_$p.jsonl"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
runs = {p: [json.loads(l) for l in open(f"{out}/curve_{p}.jsonl")] for p in ("fp32", "bf16", "fp16")}
def series(p, key): return {r["step"]: r[key] for r in runs[p] if key in r}
for key in ("loss", "val_loss"):
    ref = series("fp32", key)
    print(f"{key:>8} | step |   fp32 |   bf16 |   fp16 | bf16/fp32-1 | fp16/fp32-1")
    worst = {"bf16": 0.0, "fp16": 0.0}
    for s in sorted(ref):
        b, h = series("bf16", key).get(s), series("fp16", key).get(s)
        if b is None or h is None: continue
        rb, rh = b / ref[s] - 1, h / ref[s] - 1
        if s >= 20: worst["bf16"] = max(worst["bf16"], abs(rb)); worst["fp16"] = max(worst["fp16"], abs(rh))
        print(f"{'':>8} | {s:4d} | {ref[s]:.4f} | {b:.4f} | {h:.4f} | {100*rb:+6.2f}% | {100*rh:+6.2f}%")
    print(f"RESULT precision {key}: largest gap to fp32 from step 20 on: bf16 {100*worst['bf16']:.2f}%, fp16 {100*worst['fp16']:.2f}%")
PY
