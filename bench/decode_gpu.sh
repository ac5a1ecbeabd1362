#!/usr/bin/env bash
# Issue 41's table: gpt2-generate at batch 1 on the GPU, bf16 weights against --quant int8, for each
# size in SIZES (default "124m 1558m"; random weights from bench/muon_peer.py: speed does not depend
# on them), a 128-token prompt, 256 new tokens, greedy, ROUNDS (2) runs each, alternating, and bf16
# with --cuda_graphs false (what the CUDA graphs of serve::generate_one save), and bf16 and int8 with
# --fused_decode false (the blocks' ops: what Note [Fused decode step] saves), and with
# --one_kernel_decode true (the fused step as one cooperative kernel, against five a block). Prints each
# run's tokens/s (gpt2-generate's own line: prefill + decode wall time), its ms per decode step after
# the first (the first captures the CUDA graphs; its ms is the first_ms field), the weights it holds
# on the GPU, and per size the means and int8/bf16 ratios.
#   source .device-deps/gpu-env.sh && bash bench/decode_gpu.sh     (logs under $OUT)
# VARIANTS (names from the list below) runs part of them, e.g. VARIANTS="bf16 int8".
# A CPU smoke run of the script itself: DEVICE=cpu SIZES=124m ROUNDS=1 NEW_TOKENS=8 GPT2_BIN=build/bin
set -uo pipefail
source bench/common.sh
bin="${GPT2_BIN:-build-gpu/bin}" device="${DEVICE:-cuda}" new="${NEW_TOKENS:-256}"
[ -x "$bin/gpt2-generate" ] || bench_build || exit 1
prompt="$(seq 100 227 | tr '\n' ' ')"
for size in ${SIZES:-124m 1558m}; do
  case $size in
    124m) dims="--n_layer 12 --n_head 12 --n_embd 768" ;;
    350m) dims="--n_layer 24 --n_head 16 --n_embd 1024" ;;
    774m) dims="--n_layer 36 --n_head 20 --n_embd 1280" ;;
    1558m) dims="--n_layer 48 --n_head 25 --n_embd 1600" ;;
  esac
  model="$out/decode-$size"
  [ -f "$model/model.safetensors" ] || python3 bench/muon_peer.py $dims --init_out "$model" --metrics "" --device "$device" \
    >"$out/decode-$size-init.log" 2>&1 || { tail -5 "$out/decode-$size-init.log"; continue; }
  echo "== gpt2-$size, batch 1, 128-token prompt, $new new tokens, bf16, $device ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
  for r in $(seq "${ROUNDS:-2}"); do
    for variant in "bf16|--quant none" "int8|--quant int8" "bf16-no-graphs|--quant none --cuda_graphs false" \
      "bf16-one-kernel|--quant none --one_kernel_decode true" "int8-one-kernel|--quant int8 --one_kernel_decode true" \
      "bf16-blocks-ops|--quant none --fused_decode false" "int8-blocks-ops|--quant int8 --fused_decode false"; do
      name="${variant%%|*}" args="${variant#*|}" log="$out/decode-$size-${variant%%|*}-$r.log"
      [ -n "${VARIANTS:-}" ] && [[ " $VARIANTS " != *" $name "* ]] && continue
      # shellcheck disable=SC2086
      "$bin/gpt2-generate" "$model" --device "$device" --dtype bf16 $args --ids --temperature 0 --ignore_eot \
        --max_new_tokens "$new" --prompt "$prompt" >/dev/null 2>"$log" || { tail -3 "$log"; continue; }
      python3 - "$size" "$name" "$log" <<'PY'
import re, sys
size, name, text = sys.argv[1], sys.argv[2], open(sys.argv[3]).read()
tps, step, first = re.search(r"([0-9.]+) tokens/s .*then ([0-9.]+) ms per step.*which took ([0-9.]+) ms", text).groups()
mib = re.search(r"weights ([0-9.]+) MiB", text).group(1)
print(f"RESULT decode {size} {name} tok/s={tps} ms/token={step} first_ms={first} weights_MiB={mib}")
PY
    done
  done | tee "$out/decode-$size.txt"
  python3 - "$out/decode-$size.txt" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.startswith("RESULT")]
by = {}
for r in rows:
    by.setdefault(r[3], []).append({k: float(v) for k, v in (f.split("=") for f in r[4:])})
mean = lambda q, k: sum(d[k] for d in by[q]) / len(by[q])
for q in by:  # decode tok/s: the steps after the first alone (no prefill, no graph capture)
    print(f"mean {q}: {mean(q, 'tok/s'):.0f} tok/s end to end, {mean(q, 'ms/token'):.3f} ms a step after the first "
          f"= {1000 / mean(q, 'ms/token'):.0f} decode tok/s, weights {mean(q, 'weights_MiB'):.0f} MiB")
if "bf16" in by and "int8" in by:
    print(f"int8/bf16: weights {mean('int8', 'weights_MiB') / mean('bf16', 'weights_MiB'):.2f}x, "
          f"decode tok/s {mean('bf16', 'ms/token') / mean('int8', 'ms/token'):.2f}x")
PY
done
