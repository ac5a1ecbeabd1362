#!/usr/bin/env bash
# KV-cache decoding on the GPU against full recomputation: gpt2-124m trained 60 steps on a token
# cycle (a fixed random permutation of 2,000 ids, repeated: each id has one successor, so greedy
# decoding walks the cycle instead of repeating one id), then greedy decoding of 4 ragged prompts x
# 64 tokens with the cache and with --no_kv_cache. fp32: the new ids must be equal (exit 1
# otherwise); bf16: how many agree is printed (rounding differs between the two paths' shapes).
# This is the end-to-end check (a trained checkpoint, the gpt2-generate CLI); the library-level one,
# every step's logits on a random model in fp32 and bf16, is ModelGpuDecode in tests/model/gpu_test.cpp
# (ctest -L gpu).
#   source .device-deps/gpu-env.sh && bash bench/gpu_decode_check.sh
set -uo pipefail
source bench/common.sh
[ -x build-gpu/bin/gpt2-train ] || bench_build || exit 1
python3 - "$out/cycle.h5" <<'PY'
import sys, h5py, numpy as np
cycle = np.random.default_rng(0).permutation(50000)[:2000].astype(np.uint16)
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("tokens", data=np.tile(cycle, 2000))
    f.attrs.update(format="gpt2-tokens", format_version=1, vocab_size=50257, eot_token=50256, tokenizer="gpt2")
PY
build-gpu/bin/gpt2-train --config configs/gpt2-124m.ini --precision.fp8=false --data.train="$out/cycle.h5" --data.val=none --train.lr=1e-3 \
  --train.micro_batch=8 --train.batch_tokens=8192 --train.max_steps=60 --train.warmup_steps=5 --train.sample_tokens=0 \
  --log.metrics=none --checkpoint.dir="$out/decode_ckpt" --checkpoint.every=60 --checkpoint.resume=none \
  >"$out/decode_train.log" 2>&1 || { tail -5 "$out/decode_train.log"; exit 1; }
gen() {  # gen DTYPE [--no_kv_cache]: one line of ids per prompt
  build-gpu/bin/gpt2-generate "$out/decode_ckpt" --device cuda --dtype "$@" --ids --temperature 0 --max_new_tokens 64 \
    --ignore_eot --prompt "50256" --prompt "464 3290 318" --prompt "15496 11 995 0 314 716 257 3303 2746" \
    --prompt "$(python3 -c "import numpy as np; print(*np.random.default_rng(0).permutation(50000)[:2000][500:540])")" \
    2>"$out/gen_err.log"
}
status=0
for dtype in fp32 bf16; do
  gen "$dtype" >"$out/gen_$dtype.kv" || { cat "$out/gen_err.log"; exit 1; }
  gen "$dtype" --no_kv_cache >"$out/gen_$dtype.full" || { cat "$out/gen_err.log"; exit 1; }
  python3 - "$dtype" "$out/gen_$dtype.kv" "$out/gen_$dtype.full" <<'PY' || status=1
import re, sys
def samples(path):  # the ids each prompt got, prompt included, from "=== sample i ===" blocks
    return [b.split() for b in re.split(r"=== sample \d+ ===\n", open(path).read())[1:]]
dtype, a, b = sys.argv[1], samples(sys.argv[2]), samples(sys.argv[3])
new = [(ra[-64:], rb[-64:]) for ra, rb in zip(a, b)]
same = sum(x == y for ra, rb in new for x, y in zip(ra, rb))
kinds = len({x for _, rb in new for x in rb})
print(f"decode {dtype}: KV cache vs full recompute: {same}/{64 * len(b)} new ids equal over {len(b)} prompts "
      f"({kinds} distinct ids); first prompt's continuation: {' '.join(new[0][1][:12])} ...")
if kinds < 8: print("the model repeats a few ids: the check would prove little (train it longer)")
sys.exit(1 if dtype == "fp32" and (same != 64 * len(b) or len(a) != len(b) or len(b) != 4 or kinds < 8) else 0)
PY
done
exit $status
