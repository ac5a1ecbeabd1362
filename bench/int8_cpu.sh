#!/usr/bin/env bash
# Issue 41's CPU row: gpt2-generate at batch 1 on this machine's CPU, gpt2-124m's shape (random
# weights: speed does not depend on them), a 128-token prompt, 256 new tokens, greedy; fp32 and
# --quant int8 (src/kernels/int8_linear.h), each ROUNDS times, alternating. Prints each run's
# tokens/s (gpt2-generate's own line: prompt + generation wall time) and the ratio of the means.
#   bash bench/int8_cpu.sh            (GPT2_BIN: build/bin; ROUNDS: 3; THREADS: all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh  # bench_random_gpt2
bin="${GPT2_BIN:-build/bin}" rounds="${ROUNDS:-3}"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
PY="${PYTHON:-.venv/bin/python}"
bench_random_gpt2 "$PY" "$work/hf" "n_layer=12, n_head=12, n_embd=768"
"$bin/gpt2-ckpt" import-hf "$work/hf" --out "$work/model.h5" >/dev/null
prompt="$(seq 100 227 | tr '\n' ' ')"
echo "== gpt2-124m shape, batch 1, 128-token prompt, 256 new tokens, CPU: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
declare -A sum
for r in $(seq "$rounds"); do
  for quant in none int8; do
    line=$(OMP_NUM_THREADS="${THREADS:-$(nproc)}" "$bin/gpt2-generate" "$work/model.h5" --device cpu --ids --temperature 0 \
      --ignore_eot --max_new_tokens 256 --prompt "$prompt" --quant "$quant" 2>&1 >/dev/null | grep "tokens/s")
    tps=$(sed -E 's/.*: ([0-9.]+) tokens\/s.*/\1/' <<<"$line")
    echo "round $r quant $quant: $tps tokens/s"
    sum[$quant]=$(python3 -c "print(${sum[$quant]:-0} + $tps)")
  done
done
python3 -c "n=$rounds; a=${sum[none]}/n; b=${sum[int8]}/n; print(f'mean tokens/s: fp32 {a:.1f}, int8 {b:.1f}; int8/fp32 = {b/a:.2f}')"
