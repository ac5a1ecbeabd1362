#!/usr/bin/env bash
# Issue 41's quality check: int8 weights on trained models, not random ones. For each size in SIZES
# (default "124m 350m"): gpt2-train on real text (the Python 3.11 docs' _sources and the fortunes,
# bench/time_to_loss.sh's corpus and split) with Muon + wsd (issue 42: the fastest to a low loss
# here) for STEPS (600, about 4 passes over the text; the val curve is printed, so a plateau shows)
# steps of 32,768 tokens, then gpt2-eval on the whole val file in bf16, --quant int8 (a scale a row)
# and --quant int8 --quant_group 128. Prints each loss and perplexity and int8's perplexity relative
# to bf16's (the target: within 1%).
#   source .device-deps/gpu-env.sh && bash bench/int8_quality.sh     (logs under $OUT/int8-quality)
# Env: SIZES, STEPS, CORPUS (.device-deps/corpus, from bash bench/time_to_loss.sh --prepare),
# GPT2_BIN (build-gpu/bin), DEVICE (cuda). SIZES=tiny (configs/tiny.ini, 128-token windows, 4,096
# tokens a step) is a CPU smoke run of the script: DEVICE=cpu SIZES=tiny STEPS=20 GPT2_BIN=build/bin.
set -uo pipefail
source bench/common.sh
bin="${GPT2_BIN:-build-gpu/bin}" device="${DEVICE:-cuda}" steps="${STEPS:-600}"
[ -x "$bin/gpt2-train" ] || bench_build || exit 1
work="$out/int8-quality"; mkdir -p "$work"
bench_text || exit 1
data="$out/ttl-text"  # the same text and split as bench/time_to_loss.sh
for size in ${SIZES:-124m 350m}; do
  t0=$SECONDS config="configs/gpt2-$size.ini" seq=1024 micro=32
  [ "$size" = tiny ] && config=configs/tiny.ini seq=128 micro=8
  "$bin/gpt2-train" --config "$config" --precision.fp8=false --data.train="$data/train.h5" --data.val="$data/val.h5" --train.seq_len=$seq \
    --train.micro_batch=$micro --train.batch_tokens=$((32 * seq)) --train.max_steps="$steps" --train.warmup_steps=20 \
    --train.lr_schedule=wsd --train.decay_frac=0.2 --train.eval_every=100 --train.eval_steps=2 --train.sample_tokens=0 \
    --train.sample_every=0 --optim.name=muon --log.every=50 --log.metrics="$work/train-$size.jsonl" \
    --checkpoint.dir="$work/ckpt-$size" --checkpoint.every="$steps" --checkpoint.resume=none --train.device="$device" \
    >"$work/train-$size.log" 2>&1 || { echo "train $size failed:"; tail -5 "$work/train-$size.log"; continue; }
  echo "== gpt2-$size: $steps steps of Muon + wsd ($((32 * seq)) tokens a step) in $((SECONDS - t0)) s; val loss every 100 steps:" \
    "$(python3 -c "import json,sys; print(' '.join(f\"{r['step']}:{r['val_loss']:.3f}\" for r in map(json.loads, open(sys.argv[1])) if 'val_loss' in r))" "$work/train-$size.jsonl")"
  for run in "bf16|" "int8|--quant int8" "int8-g128|--quant int8 --quant_group 128"; do
    name="${run%%|*}" args="${run#*|}"
    # shellcheck disable=SC2086
    "$bin/gpt2-eval" "$work/ckpt-$size" --data "$data/val.h5" --seq_len $seq --device "$device" --dtype bf16 $args \
      >"$work/eval-$size-$name.log" 2>&1 || { echo "eval $size $name failed:"; tail -3 "$work/eval-$size-$name.log"; continue; }
    echo "RESULT gpt2-$size $name $(grep -m1 "^loss" "$work/eval-$size-$name.log")"
  done | tee "$work/eval-$size.txt"
  python3 - "$work/eval-$size.txt" "$size" <<'PY'
import math, re, sys
rows = {l.split()[2]: float(re.search(r"loss ([0-9.]+)", l).group(1)) for l in open(sys.argv[1]) if l.startswith("RESULT")}
if "bf16" in rows:
    for name in ("int8", "int8-g128"):
        if name in rows:
            print(f"gpt2-{sys.argv[2]} {name}: perplexity {math.exp(rows[name]):.3f} against bf16's "
                  f"{math.exp(rows['bf16']):.3f}: {100 * (math.exp(rows[name] - rows['bf16']) - 1):+.2f}% (target within 1%)")
PY
done
