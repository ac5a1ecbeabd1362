#!/usr/bin/env bash
# gpt2-serve's host cost per token at 1 client (issue 41: serve within 10% of gpt2-generate): one
# random model of SIZE through gpt2-generate (its ms per decode step) and through gpt2-serve with
# --max_batch MB (bench/serve_load.py: 1 client, 4 requests of a 128-token prompt and 256 new
# tokens; its mean time between tokens, and the server's own mean decode step from /metrics). Time
# between tokens minus the server's step is what the scheduler loop, the text and the events cost.
#   source .device-deps/gpu-env.sh && bash bench/serve_host_cost.sh            (GPU: 124m, MB 8)
#   DEVICE=cpu SIZE=tiny MB="1 8" GPT2_BIN=build/bin bash bench/serve_host_cost.sh   (CPU, a minute)
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/common.sh  # $out, bench_random_gpt2, serve_port
device="${DEVICE:-cuda}" bin="${GPT2_BIN:-build-gpu/bin}" rounds="${ROUNDS:-2}"
py="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
dtype=bf16; [ "$device" = cpu ] && dtype=fp32
case "${SIZE:-124m}" in
  tiny) dims="n_layer=2, n_head=2, n_embd=64" ;;
  124m) dims="n_layer=12, n_head=12, n_embd=768" ;;
  1558m) dims="n_layer=48, n_head=25, n_embd=1600" ;;
  *) echo "SIZE must be tiny, 124m or 1558m, got '$SIZE'"; exit 2 ;;
esac
[ -x "$bin/gpt2-serve" ] || { echo "no $bin/gpt2-serve: build first (GPT2_BIN)"; exit 1; }
model="$out/host-cost-${SIZE:-124m}"
[ -d "$model" ] || bench_random_gpt2 "$py" "$model" "n_positions=1024, $dims" || exit 1
prompt="$(seq 100 227 | tr '\n' ' ')"
metrics_step_ms() {  # the server's mean decode step, ms
  "$py" -c "
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
v = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith('#')}
print(f\"{1000 * v['gpt2_serve_decode_step_seconds_sum'] / v['gpt2_serve_decode_step_seconds_count']:.3f}\")" "$1"
}
echo "== ${SIZE:-124m}, $device $dtype, ${QUANT:-none} weights, 1 client, 128-token prompt, 256 new tokens"
for r in $(seq "$rounds"); do
  line=$("$bin/gpt2-generate" "$model" --device "$device" --dtype "$dtype" --quant "${QUANT:-none}" --ids --temperature 0 \
    --ignore_eot --max_new_tokens 256 --prompt "$prompt" 2>&1 >/dev/null | grep "tokens/s")
  echo "round $r gpt2-generate: $(sed -E 's/.*then ([0-9.]+) ms per step.*/\1/' <<<"$line") ms a decode step"
  for mb in ${MB:-8}; do
    log="$out/host-cost-serve-$mb.log"
    "$bin/gpt2-serve" "$model" --port 0 --device "$device" --dtype "$dtype" --quant "${QUANT:-none}" --max_batch "$mb" \
      >"$log" 2>&1 &
    server=$!
    port=$(serve_port "$log" $server)
    [ -n "$port" ] || { tail -5 "$log"; kill $server 2>/dev/null; exit 1; }
    itl=$("$py" bench/serve_load.py --port "$port" --clients 1 --requests 4 --prompt_tokens 128 --new_tokens 256 \
      --label serve | grep -o 'itl=[0-9.]*' | cut -d= -f2)
    step=$(metrics_step_ms "http://127.0.0.1:$port/metrics")
    echo "round $r gpt2-serve --max_batch $mb: $itl ms between tokens, its decode step $step ms" \
      "(outside the step: $("$py" -c "print(f'{$itl - $step:.3f}')") ms)"
    kill -TERM $server; wait $server 2>/dev/null
  done
done
