#!/usr/bin/env bash
# Generation, Hugging Face interop and TensorBoard on the GPU machine, in one call:
#   source .device-deps/gpu-env.sh && bash bench/interop.sh
# - tests/python/test_hf_parity.py, test_hf_roundtrip.py, test_generate.py with GPT2_TEST_DEVICE=cuda:
#   HF logits vs ours on the GPU (fp32), our export loaded by transformers, greedy tokens vs
#   transformers' generate, and tokens/s of gpt2-generate vs transformers' generate (gpt2-124m shape);
# - a short gpt2-124m run on the GPU writing metrics.jsonl + TensorBoard events, read back with
#   TensorBoard's EventAccumulator (wheels in .whl/, installed to /tmp/site) and compared value by
#   value; then gpt2-generate samples from its checkpoint in bf16.
# Writes $OUT/interop/{metrics.jsonl, train.log, generate.log}.
set -uo pipefail
source bench/common.sh
bench_build || exit 1
export GPT2_BIN_DIR=build-gpu/bin GPT2_TEST_BIN_DIR=build-gpu/tests GPT2_SOURCE_DIR="$PWD" GPT2_TEST_DEVICE=cuda
mkdir -p "$out/interop"
python3 -c 'import transformers, safetensors; print("transformers", transformers.__version__, "safetensors", safetensors.__version__)'

echo "== test_hf_parity (cuda)"
python3 tests/python/test_hf_parity.py 2>&1 | grep -E "logits|^OK|FAIL|Error|^Ran" | tail -8
echo "== test_hf_roundtrip (cuda logits)"
python3 tests/python/test_hf_roundtrip.py 2>&1 | grep -E "^(ok|FAIL)|passed|FAILED" | cut -c1-220
echo "== test_generate (cuda)"
python3 tests/python/test_generate.py 2>&1 | grep -E "cuda|^OK|FAIL|Error|^Ran" | tail -8

echo "== gpt2-124m on the GPU with TensorBoard"
bench_data
run="$out/interop"
rm -rf runs/interop
build-gpu/bin/gpt2-train --config configs/gpt2-124m.ini --precision.fp8=false --data.train="$out/tok/train.h5" --data.val="$out/tok/val.h5" \
  --train.micro_batch=16 --train.batch_tokens=16384 --train.max_steps=60 --train.warmup_steps=10 \
  --train.eval_every=20 --train.eval_steps=4 --train.sample_tokens=32 --log.every=5 \
  --log.metrics="$run/metrics.jsonl" --log.tensorboard=runs/interop/tb --checkpoint.dir=runs/interop/ckpt \
  --checkpoint.every=60 >"$run/train.log" 2>&1
echo "gpt2-train rc=$? ($(grep -c '"loss"' "$run/metrics.jsonl") metric lines); $(grep -m1 'step 59/60' "$run/train.log" | cut -c1-200)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
PYTHONPATH=/tmp/site python3 - "$run/metrics.jsonl" runs/interop/tb <<'PY'
import json, math, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
import tensorboard
acc = EventAccumulator(sys.argv[2]); acc.Reload()
ev = {t: {e.step: e.value for e in acc.Scalars(t)} for t in acc.Tags()["scalars"]}
worst, n = 0.0, 0
for line in map(json.loads, open(sys.argv[1])):
    for k, v in line.items():
        if k in ("step", "tokens") or v is None: continue
        got = ev[k][line["step"]]
        worst = max(worst, abs(got - v) / max(abs(v), 1e-30)); n += 1
print(f"tensorboard {tensorboard.__version__} EventAccumulator: tags {sorted(ev)}; {n} values equal metrics.jsonl "
      f"within rel {worst:.1e} (7 printed digits / float32)")
print("loss by step:", {s: round(v, 4) for s, v in sorted(ev["loss"].items())})
print("val_loss by step:", {s: round(v, 4) for s, v in sorted(ev["val_loss"].items())})
PY
echo "== gpt2-generate from that checkpoint (bf16, cuda)"
build-gpu/bin/gpt2-generate runs/interop/ckpt --prompt "The meaning of life is" --prompt "Once upon a time" \
  --max_new_tokens 64 --device cuda >"$run/generate.log" 2>&1
echo "rc=$?"; grep -E "generated|gpt2-generate" "$run/generate.log" | cut -c1-240
