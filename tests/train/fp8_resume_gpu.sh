#!/usr/bin/env bash
# GPU suite (ctest gpu_fp8_delayed): precision.fp8 with delayed scaling (precision.fp8_amax_history)
# on configs/tiny.ini's model, bf16, train.deterministic = true, 12 steps on the fortunes corpus, a
# checkpoint every 4 steps, histories of 8 steps:
#   - 1 rank, and 2 ranks under ZeRO 1 sharing the GPU (parallel.backend = mpi): a run resumed from
#     step 4, mid-history (4 of 8 steps recorded), gives the uninterrupted run's losses and gradient
#     norms bitwise from step 4 on, and its step-12 shards byte for byte;
#   - 2 ranks, rank 1's gradients of step 5 made non-finite (GPT2_FAULT_AT=1:5:inf): step 5 is
#     skipped on both ranks (its norm is not finite), every later loss is finite, and the step-8
#     checkpoint's histories hold only finite positive amaxes (the overflow entered as the step
#     before's);
#   - precision.fp8 = auto on this GPU is precision.fp8 = true: its 12 steps' losses and norms
#     bitwise those of the 1-rank run above.
# Exits 77 (skipped) without a GPU, or on a GPU without FP8 (gpt2-train refuses it by name).
#   fp8_resume_gpu.sh BIN_DIR OUT_DIR   (FORTUNES_DIR: the corpus, /usr/share/games/fortunes)
set -euo pipefail
bin=$1 out=$2
source "$(dirname "$0")/fortunes_gpu_setup.sh"
fortunes_gpu_setup "$bin" "$out" 0
rm -rf "$out/runs"
mkdir -p "$out/runs"
mpi=(mpirun --oversubscribe --allow-run-as-root --bind-to none)

# train NAME NP ARGS...: STEPS (12) steps of 2 x 8 x 128 tokens a rank, a checkpoint every EVERY (4)
# steps into $out/runs/NAME (an option given twice is refused, so these are not ARGS).
train() {
  local name=$1 np=$2
  shift 2
  "${mpi[@]}" -n "$np" "$bin/gpt2-train" --config configs/tiny.ini --data.train="$out/data/train.h5" \
    --data.val=none --train.device=cuda --precision.dtype=bf16 --precision.fp8="${FP8:-true}" --precision.fp8_amax_history=8 \
    --train.deterministic=true --train.micro_batch=8 --train.seq_len=128 --train.batch_tokens=$((2 * 8 * 128 * np)) \
    --train.max_steps="${STEPS:-12}" --train.warmup_steps=2 --train.sample_tokens=0 --train.seed=7 --parallel.backend=mpi \
    --checkpoint.dir="$out/runs/$name" --checkpoint.every="${EVERY:-4}" --log.every=1 --log.metrics="$out/runs/$name.jsonl" \
    --log.tensorboard=none "$@" >>"$out/runs/$name.log" 2>&1
}

if ! STEPS=1 EVERY=0 train probe 1; then
  if grep -q "precision.fp8 = true: needs a CUDA GPU with FP8" "$out/runs/probe.log"; then
    echo "no FP8 on this GPU: skipped"
    exit 77
  fi
  tail -20 "$out/runs/probe.log"
  exit 1
fi

status=0
for np in 1 2; do
  extra=()
  [ "$np" = 2 ] && extra=(--parallel.zero_stage=1)
  train "straight$np" "$np" "${extra[@]}"
  train "resumed$np" "$np" "${extra[@]}" --checkpoint.resume="$out/runs/straight$np/step_0000004"
  python3 - "$out/runs/straight$np" "$out/runs/resumed$np" <<'PY' || status=1
import filecmp, glob, json, os, sys
a, b = sys.argv[1], sys.argv[2]
def rows(run):
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in map(json.loads, open(run + ".jsonl")) if "loss" in r}
ra, rb = rows(a), rows(b)
steps = list(range(4, 12))
same = [s for s in steps if s in ra and s in rb and ra[s] == rb[s]]
shards = sorted(glob.glob(f"{a}/step_0000012/optim_r*.h5"))
shards_same = sum(filecmp.cmp(f, f"{b}/step_0000012/{os.path.basename(f)}", shallow=False) for f in shards)
ok = len(same) == len(steps) and shards and shards_same == len(shards)
print(f"[ measured ] fp8 delayed scaling, {os.path.basename(a)} vs {os.path.basename(b)}: {len(same)}/{len(steps)} "
      f"steps bitwise equal from step 4; step-12 shards {shards_same}/{len(shards)} equal")
sys.exit(0 if ok else 1)
PY
done

GPT2_FAULT_AT=1:5:inf EVERY=8 train overflow 2 --parallel.zero_stage=1 || status=1
python3 - "$out/runs/overflow.jsonl" "$out/runs/overflow/step_0000008/manifest.json" <<'PY' || status=1
import json, math, sys
rows = {r["step"]: r for r in map(json.loads, open(sys.argv[1])) if "loss" in r}
h = json.load(open(sys.argv[2]))["fp8_amax_history"]
L = h["shape"][-1]
# Column 0 restarts at 0 after each roll; the steps before must all be finite positive amaxes.
history_ok = all(v is not None and math.isfinite(v) and (i % L == 0 or v > 0) for i, v in enumerate(h["values"]))
finite = lambda v: v is not None and math.isfinite(v)  # the metrics write a non-finite value as null
skipped = not finite(rows[5]["grad_norm"])
later = all(finite(rows[s]["loss"]) and finite(rows[s]["grad_norm"]) for s in range(6, 12))
print(f"[ measured ] fp8 delayed scaling, rank 1's step 5 overflowed: step 5 norm {rows[5]['grad_norm']}, "
      f"steps 6-11 finite: {later}, step-8 histories finite and positive: {history_ok}")
sys.exit(0 if skipped and later and history_ok else 1)
PY
FP8=auto EVERY=0 train auto 1 || status=1
python3 - "$out/runs/straight1.jsonl" "$out/runs/auto.jsonl" <<'PY' || status=1
import json, sys
rows = lambda f: {r["step"]: (r["loss"], r["grad_norm"]) for r in map(json.loads, open(f)) if "loss" in r}
a, b = rows(sys.argv[1]), rows(sys.argv[2])
same = [s for s in range(12) if s in a and s in b and a[s] == b[s]]
print(f"[ measured ] precision.fp8 = auto against true: {len(same)}/12 steps bitwise equal")
sys.exit(0 if len(same) == 12 else 1)
PY
exit $status
