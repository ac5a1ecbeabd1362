#!/usr/bin/env bash
# KV-cache decoding on the GPU against full recomputation: gpt2-124m trained 20 steps on random
# tokens (so its logits are not flat), then greedy decoding of 4 ragged prompts x 64 tokens with the
# cache and with --no_kv_cache. fp32: the ids must be equal (exit 1 otherwise); bf16: how many agree
# is printed (rounding differs between the two paths' shapes).
#   source .device-deps/gpu-env.sh && bash bench/gpu_decode_check.sh
set -uo pipefail
source bench/common.sh
[ -x build-gpu/bin/gpt2-train ] || bench_build || exit 1
[ -f "$out/tok/train.h5" ] || bench_data
build-gpu/bin/gpt2-train --config configs/gpt2-124m.ini --data.train="$out/tok/train.h5" --data.val=none \
  --train.micro_batch=8 --train.batch_tokens=8192 --train.max_steps=20 --train.warmup_steps=2 --train.sample_tokens=0 \
  --log.metrics=none --checkpoint.dir="$out/decode_ckpt" --checkpoint.every=20 --checkpoint.resume=none \
  >"$out/decode_train.log" 2>&1 || { tail -5 "$out/decode_train.log"; exit 1; }
gen() {  # gen DTYPE [--no_kv_cache]: one line of ids per prompt
  build-gpu/bin/gpt2-generate "$out/decode_ckpt" --device cuda --dtype "$@" --ids --temperature 0 --max_new_tokens 64 \
    --ignore_eot --prompt "50256" --prompt "464 3290 318" --prompt "15496 11 995 0 314 716 257 3303 2746" \
    --prompt "$(seq -s ' ' 100 140)" 2>"$out/gen_err.log"
}
status=0
for dtype in fp32 bf16; do
  gen "$dtype" >"$out/gen_$dtype.kv" || { cat "$out/gen_err.log"; exit 1; }
  gen "$dtype" --no_kv_cache >"$out/gen_$dtype.full" || { cat "$out/gen_err.log"; exit 1; }
  python3 - "$dtype" "$out/gen_$dtype.kv" "$out/gen_$dtype.full" <<'PY' || status=1
import sys
dtype, a, b = sys.argv[1], [l.split() for l in open(sys.argv[2])], [l.split() for l in open(sys.argv[3])]
same = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb)); total = sum(len(r) for r in b)
print(f"decode {dtype}: KV cache vs full recompute: {same}/{total} ids equal over {len(b)} prompts")
sys.exit(1 if dtype == "fp32" and (same != total or len(a) != len(b)) else 0)
PY
done
exit $status
