#!/usr/bin/env bash
# GPU suite (ctest gpu_fused_vs_unfused_124m): gpt2-124m trains 300 steps on real text (the
# `fortunes` corpus) with the fused kernels (src/kernels: cross-entropy, LayerNorm) and with
# LibTorch's ops; the two runs' losses (mean of the last 20 steps) and final val losses must agree
# within 1%. bf16, 8 x 1024 tokens a step (~3 epochs of the corpus). Exits 77 (skipped) without a GPU.
#   fused_vs_unfused_124m.sh BIN_DIR OUT_DIR   (FORTUNES_DIR: the corpus, /usr/share/games/fortunes)
set -euo pipefail
bin=$1 out=$2
source "$(dirname "$0")/fortunes_gpu_setup.sh"
fortunes_gpu_setup "$bin" "$out" 0.05
for kind in fused unfused; do
  "$bin/gpt2-train" --config configs/gpt2-124m.ini --precision.fp8=false --data.train="$out/data/train.h5" --data.val="$out/data/val.h5" \
    --train.micro_batch=8 --train.batch_tokens=8192 --train.max_steps=300 --train.warmup_steps=30 \
    --train.eval_every=100 --train.eval_steps=10 --train.sample_tokens=0 --train.seed=1 \
    --train.fused_kernels=$([ $kind = fused ] && echo true || echo false) \
    --log.every=1 --log.metrics="$out/$kind.jsonl" --log.tensorboard=none --checkpoint.resume=none \
    >"$out/$kind.log" 2>&1 || { tail -20 "$out/$kind.log"; exit 1; }
done
python3 - "$out/fused.jsonl" "$out/unfused.jsonl" <<'PY'
import json, sys
def summary(path):
    rows = [json.loads(l) for l in open(path)]
    train = [r["loss"] for r in rows if "loss" in r]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    return sum(train[-20:]) / 20, val[-1], train[0]
(f_loss, f_val, f_first), (u_loss, u_val, u_first) = summary(sys.argv[1]), summary(sys.argv[2])
d_loss, d_val = abs(f_loss - u_loss) / u_loss, abs(f_val - u_val) / u_val
print(f"[ measured ] gpt2-124m, 300 steps on fortunes: train loss {f_first:.3f} -> fused {f_loss:.4f} / unfused "
      f"{u_loss:.4f} (rel diff {d_loss:.2e}); val loss fused {f_val:.4f} / unfused {u_val:.4f} (rel diff {d_val:.2e})")
ok = d_loss <= 0.01 and d_val <= 0.01 and f_loss < f_first - 1.0
print("PASS" if ok else "FAIL: the fused kernels' losses differ by more than 1% (or the run did not learn)")
sys.exit(0 if ok else 1)
PY
