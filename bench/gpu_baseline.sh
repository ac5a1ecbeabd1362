#!/usr/bin/env bash
# On the GPU machine (device tool; carry .device-deps, which also holds torch_peer.py):
#   source .device-deps/gpu-env.sh && bash bench/gpu_baseline.sh
# Builds, trains gpt2-124m in bf16 for 50 steps of B=32, T=1024 on one GPU, and runs the PyTorch
# peer (eager and torch.compile) with the same shapes in the same call. Prints one RESULT line each.
set -uo pipefail
out="${OUT:-/tmp/out}"; mkdir -p "$out"
steps="${STEPS:-50}"
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPT2_PYTHON=$(command -v python3) >"$out/configure.log" 2>&1 \
  || { tail -40 "$out/configure.log"; exit 1; }
grep -E "gpt2-dist:|LibTorch" "$out/configure.log"
cmake --build build-gpu -j "$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# Random tokens, written with h5py in our token-file format (an independent writer).
python3 - "$out/tok" <<'PY'
import sys, os, h5py, numpy as np
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
for name, n in (("train", 20_000_000), ("val", 1_000_000)):
    with h5py.File(f"{d}/{name}.h5", "w") as f:
        f.create_dataset("tokens", data=np.random.default_rng(0).integers(0, 50257, n, dtype=np.uint16))
        f.attrs.update(format="gpt2-tokens", format_version=1, vocab_size=50257, eot_token=50256, tokenizer="gpt2")
PY

build-gpu/bin/gpt2-train --config configs/gpt2-124m.ini --data.train="$out/tok/train.h5" --data.val=none \
  --train.micro_batch=32 --train.batch_tokens=32768 --train.max_steps="$steps" --train.warmup_steps=10 \
  --train.sample_tokens=0 --log.every=10 --log.metrics="$out/metrics.jsonl" 2>&1 | tee "$out/train.log"
python3 - "$out/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
last = [r for r in rows if r["step"] > 0]
tok = sum(r["tokens_per_sec"] for r in last) / len(last)
ms = sum(r["ms_per_step"] for r in last) / len(last)
print(f"RESULT ours size=124M B=32 T=1024 bf16 tok/s={tok:,.0f} ms/step={ms:.1f} peakGiB={rows[-1]['peak_mem_gib']:.2f} "
      f"MFU(989T)={100*rows[-1]['mfu']:.1f}% loss={rows[-1]['loss']:.3f}")
PY
peer=.device-deps/torch_peer.py
python3 "$peer" --B 32 --steps 20 2>&1 | grep RESULT
python3 "$peer" --B 32 --steps 20 --compile 2>&1 | grep RESULT
# The same unit tests CI runs on CPU, here on the GPU machine's build.
(cd build-gpu && ctest -L unit -j 8 --timeout 300 2>&1 | tail -4)
echo "total: $(( $(date +%s) - t0 )) s"
