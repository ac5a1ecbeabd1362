#!/usr/bin/env bash
# GPU suite (ctest gpu_deterministic): train.deterministic = true gives the same bits from run to
# run and across a kill and resume (Note [Deterministic mode] in src/train/trainer.cpp). gpt2-124m,
# bf16, fused kernels, GEMM tuning on, 24 steps on the fortunes corpus, a checkpoint every 8 steps:
#   - 1 rank ZeRO 0, 2 ranks ZeRO 1 and 3 ranks ZeRO 2 sharing the GPU (parallel.backend = mpi): two
#     fresh runs give bitwise equal losses and gradient norms at every step and equal checkpoint
#     shards (optim_r*.h5, byte for byte: masters, moments and generator states) at steps 8, 16, 24;
#   - 1 and 3 ranks: a run killed (SIGKILL) at the start of step 19 and resumed from step 16 gives
#     the uninterrupted run's losses and norms bitwise from step 16 on, and its step-24 shards.
#   - for the record (not checked): how many steps two fresh runs of the default mode share.
# Exits 77 (skipped) without a GPU.
#   deterministic_gpu.sh BIN_DIR OUT_DIR   (FORTUNES_DIR: the corpus, /usr/share/games/fortunes;
#   DETERMINISTIC_CASES: "NP:ZERO ..." runs, default "1:0 2:1 3:2"; RESUME_CASES likewise, "1:0 3:2")
set -euo pipefail
bin=$1 out=$2
source "$(dirname "$0")/fortunes_gpu_setup.sh"
fortunes_gpu_setup "$bin" "$out" 0
rm -rf "$out/runs" "$out/cache"
export GPT2_CACHE_DIR="$out/cache"  # empty: the first deterministic run tunes, the later ones read its table
mpi=(mpirun --oversubscribe --allow-run-as-root --bind-to none)

# train NAME NP ARGS...: 24 steps of 6 x 1024 tokens (accumulation 6, 3 or 2).
train() {
  local name=$1 np=$2
  shift 2
  "${mpi[@]}" -n "$np" "$bin/gpt2-train" --config configs/gpt2-124m.ini --precision.fp8=false --data.train="$out/data/train.h5" \
    --data.val=none --train.micro_batch=2 --train.seq_len=512 --train.batch_tokens=6144 --train.max_steps=24 \
    --train.warmup_steps=4 --train.sample_tokens=0 --train.seed=7 --parallel.backend=mpi \
    --checkpoint.dir="$out/runs/$name" --checkpoint.every=8 --log.every=1 --log.metrics="$out/runs/$name.jsonl" \
    --log.tensorboard=none "$@" >>"$out/runs/$name.log" 2>&1
}
mkdir -p "$out/runs"

# compare A B FROM: losses and norms of steps >= FROM bitwise, and the step-24 shards (and 8, 16 when
# FROM is 0) byte for byte. Prints one line; returns non-zero on a difference.
compare() {
  python3 - "$out/runs/$1" "$out/runs/$2" "$3" <<'PY'
import filecmp, glob, json, os, sys
a, b, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
def rows(run):
    out = {}
    for line in open(run + ".jsonl"):
        r = json.loads(line)
        if "loss" in r:
            out[r["step"]] = (r["loss"], r["grad_norm"])
    return out
ra, rb = rows(a), rows(b)
steps = [s for s in sorted(ra) if s >= start]
same = [s for s in steps if s in rb and ra[s] == rb[s]]
shards_same, shards = 0, 0
for step in ([8, 16, 24] if start == 0 else [24]):
    for f in sorted(glob.glob(f"{a}/step_{step:07d}/optim_r*.h5")):
        shards += 1
        shards_same += filecmp.cmp(f, f"{b}/step_{step:07d}/{os.path.basename(f)}", shallow=False)
ok = len(same) == len(steps) == 24 - start and shards > 0 and shards_same == shards
name = f"{os.path.basename(a)} vs {os.path.basename(b)}"
print(f"[ measured ] {name}: {len(same)}/{len(steps)} steps bitwise equal from step {start} "
      f"(last loss {ra[steps[-1]][0]!r} vs {rb.get(steps[-1], (None,))[0]!r}); shards {shards_same}/{shards} equal")
sys.exit(0 if ok else 1)
PY
}

fail=0
det=(--train.deterministic=true)
for spec in ${DETERMINISTIC_CASES:-1:0 2:1 3:2}; do
  np=${spec%:*} zero=${spec#*:}
  for run in a b; do train "det_np${np}_z${zero}_$run" "$np" "${det[@]}" --parallel.zero_stage="$zero"; done
  compare "det_np${np}_z${zero}_a" "det_np${np}_z${zero}_b" 0 || fail=1
done
for spec in ${RESUME_CASES:-1:0 3:2}; do
  np=${spec%:*} zero=${spec#*:}
  name="det_np${np}_z${zero}_resumed"
  GPT2_FAULT_AT=0:19:kill train "$name" "$np" "${det[@]}" --parallel.zero_stage="$zero" && {
    echo "the run meant to be killed at step 19 finished"
    fail=1
  }
  grep -q "step_0000016" "$out/runs/$name/latest" || { echo "$name: no step-16 checkpoint to resume from"; fail=1; }
  train "$name" "$np" "${det[@]}" --parallel.zero_stage="$zero" --checkpoint.resume=auto || fail=1
  compare "det_np${np}_z${zero}_a" "$name" 16 || fail=1
done
# The default mode, for the record: two fresh runs, each tuning its own GEMMs.
for run in a b; do GPT2_CACHE_DIR="$out/cache_default_$run" train "default_np1_$run" 1; done
compare default_np1_a default_np1_b 0 || true
[ "$fail" = 0 ] && echo "PASS" || echo "FAIL: a deterministic run differed (see the lines above and $out/runs/*.log)"
exit "$fail"
