#!/usr/bin/env bash
# gpt2-serve against transformers on one GPU (issue #22): gpt2-124m shape (GPT2_SERVE_BENCH_SIZE=1558m:
# gpt2-1558m's) with random weights, bf16,
# prompts of 128 random ids, 128 new tokens each (ignore_eos), streamed; 1, 8, 32 and 128
# concurrent clients (bench/serve_load.py: generated tokens/s, p50/p99 time to first token).
#   ours      gpt2-serve --max_batch 128 (continuous batching) in up to three modes: "default" (slot
#             attention: each row reads only its own context; each prompt prefilled alone from a
#             CUDA graph: a request's logits are the same bits in any batch), "sdpa"
#             (--slot_attention off: attention over every row's whole context under a mask, still
#             bit for bit), and "fast" (--slot_attention off --attend_block 128 --prefill_batch 32:
#             attention over the longest active sequence rounded up, equal-length prompts prefilled
#             together; last-bit differences with the company)
#   peer      FastAPI + transformers generate, one request at a time (bench/serve_peer.py serve);
#             1, 8 and 32 clients, one request each (it serves them one by one)
#   batched   transformers' batched generate, no server (bench/serve_peer.py batched): B = 1..128
# Targets at 32 clients: >= 8K generated tokens/s, p50 TTFT < 50 ms.
#
# On the CPU machine first (network; the wheels are for Python 3.10 to 3.13):
#   bash bench/serve_bench.sh --prepare     # bench/prepare-device.sh + fastapi/uvicorn wheels
# On the GPU machine, carrying [".device-deps"]:
#   source .device-deps/gpu-env.sh && bash bench/serve_bench.sh
# Everything lands in $OUT: serve_results.jsonl (one JSON object per measurement), summary.txt,
# the server logs. A CPU smoke run (tiny model, a few requests, about a minute on 2 cores):
#   GPT2_SERVE_BENCH_CPU=1 OUT=/tmp/serve_bench bash bench/serve_bench.sh
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --prepare ]; then
  set -e
  py=python3; [ -x .venv/bin/python ] && py=.venv/bin/python
  mkdir -p .device-deps/wheels
  $py -m pip download -q fastapi uvicorn -d .device-deps/wheels
  for v in 3.10 3.11 3.12 3.13; do  # the GPU machine's Python may not be this one (pydantic-core is compiled)
    $py -m pip download -q fastapi uvicorn -d .device-deps/wheels --only-binary=:all: \
      --python-version "$v" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
  done
  du -sh .device-deps/wheels
  bash bench/prepare-device.sh  # Boost (Beast's headers come with libboost1.74-dev), nlohmann-json, gpu-env.sh
  exit 0
fi

source bench/common.sh  # $out, bench_random_gpt2, serve_port
cpu="${GPT2_SERVE_BENCH_CPU:-0}"
if [ "$cpu" = 1 ]; then
  py="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
  build="${BUILD_DIR:-build}"; device=cpu; dtype=fp32; max_batch=8
  sizes="n_layer=2, n_head=4, n_embd=64, n_positions=256"; clients=1,4; peer_clients=1,2; batches=1,4
  requests=2; prompt=16; new=16
else
  py="${PYTHON:-python3}"
  build="${BUILD_DIR:-build-gpu}"; device=cuda; dtype=bf16; max_batch=128
  sizes="n_layer=12, n_head=12, n_embd=768, n_positions=1024"; clients=1,8,32,128; peer_clients=1,8,32
  # GPT2_SERVE_BENCH_SIZE=1558m: the gpt2-1558m shape (the issue's second row)
  [ "${GPT2_SERVE_BENCH_SIZE:-124m}" = 1558m ] && sizes="n_layer=48, n_head=25, n_embd=1600, n_positions=1024"
  batches=1,8,32,128; requests=4; prompt=128; new=128
fi
# Overrides (a short run): GPT2_SERVE_BENCH_PEERS=0 skips both transformers peers;
# GPT2_SERVE_BENCH_PEER_CLIENTS and GPT2_SERVE_BENCH_BATCHES replace their lists; GPT2_SERVE_BENCH_MODES
# picks ours (default "default sdpa fast"; "small" adds --max_batch 8 at 1 client: the fused decode step).
# GPT2_SERVE_BENCH_QUANT=int8 serves int8 weights (--quant int8); GPT2_SERVE_BENCH_NEW sets the new
# tokens a request (256: bench/decode_gpu.sh's count, for the 1-client row against gpt2-generate).
peer_clients=${GPT2_SERVE_BENCH_PEER_CLIENTS:-$peer_clients}; batches=${GPT2_SERVE_BENCH_BATCHES:-$batches}
new=${GPT2_SERVE_BENCH_NEW:-$new}
quant=(); [ -n "${GPT2_SERVE_BENCH_QUANT:-}" ] && quant=(--quant "$GPT2_SERVE_BENCH_QUANT")
peers=${GPT2_SERVE_BENCH_PEERS:-1}
results="$out/serve_results.jsonl"; : >"$results"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }

# --- build gpt2-serve (only that target) ---
if [ ! -x "$build/bin/gpt2-serve" ] || [ "$cpu" != 1 ]; then
  if [ ! -f "$build/build.ninja" ] && [ ! -f "$build/Makefile" ]; then
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPT2_PYTHON="$(command -v "$py")" \
      >"$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
  fi
  cmake --build "$build" -j "$(nproc)" --target gpt2-serve >"$out/build.log" 2>&1 \
    || { grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; }
fi
stamp "gpt2-serve built"
[ "$cpu" = 1 ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# --- fastapi + uvicorn for the peer (carried wheels; no network there) ---
if ! "$py" -c "import fastapi, uvicorn" 2>/dev/null; then
  "$py" -m pip install -q --no-index --find-links .device-deps/wheels fastapi uvicorn >"$out/pip.log" 2>&1 \
    || { tail -5 "$out/pip.log"; echo "no fastapi/uvicorn: run bench/serve_bench.sh --prepare and carry .device-deps"; }
fi

# --- a random GPT-2 of the measured shape, as a Hugging Face directory both servers read ---
model="${GPT2_SERVE_BENCH_MODEL:-/tmp/serve_bench_model}"  # not under $OUT: 500 MB that need not come back
bench_random_gpt2 "$py" "$model" "$sizes" || exit 1
stamp "model written"

# http_get URL: the body, or a failure (Python's urllib: the GPU machine may lack curl).
http_get() { "$py" -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())" "$1" 2>/dev/null; }

# --- ours: the defaults (exact batch invariance), then the masked attention, then the fast mode ---
build_abs="$(cd "$build" && pwd)"
port=""
for mode in ${GPT2_SERVE_BENCH_MODES:-default sdpa fast}; do
  label=gpt2-serve; flags=(); mb=$max_batch mode_clients=$clients
  if [ "$mode" = sdpa ]; then label=gpt2-serve-sdpa; flags=(--slot_attention off); fi
  if [ "$mode" = fast ]; then label=gpt2-serve-fast; flags=(--slot_attention off --attend_block 128 --prefill_batch 32); fi
  # "small": --max_batch 8 at 1 client, where every decode step takes the fused step (Note [Fused decode step])
  if [ "$mode" = small ]; then label=gpt2-serve-max-batch-8; mb=8 mode_clients=1; fi
  "$build_abs/bin/gpt2-serve" "$model" --port 0 --device "$device" --dtype "$dtype" --max_batch "$mb" \
    --max_queue 1024 "${flags[@]}" "${quant[@]}" --model_name gpt2-bench >"$out/$label.log" 2>&1 &
  server=$!
  port=$(serve_port "$out/$label.log" $server)
  if [ -z "$port" ]; then tail -20 "$out/$label.log"; kill $server 2>/dev/null; exit 1; fi
  stamp "$label on port $port"
  "$py" bench/serve_load.py --port "$port" --clients "$mode_clients" --requests "$requests" --prompt_tokens "$prompt" \
    --new_tokens "$new" --label "$label" --json "$results" | tee "$out/$label.txt"
  http_get "http://127.0.0.1:$port/metrics" >"$out/$label-metrics.txt" || true
  kill -TERM $server; wait $server; echo "$label exit status after SIGTERM: $?"
  stamp "$label done"
done

# --- peer: FastAPI + transformers generate, one request at a time ---
if [ "$peers" = 1 ]; then
peer_port=$(( port + 1 ))
"$py" bench/serve_peer.py serve --model "$model" --device "$device" --dtype "$dtype" --port "$peer_port" \
  --name peer >"$out/peer.log" 2>&1 &
peer=$!
for _ in $(seq 1200); do
  http_get "http://127.0.0.1:$peer_port/v1/models" >/dev/null && break
  kill -0 $peer 2>/dev/null || break
  sleep 0.1
done
if http_get "http://127.0.0.1:$peer_port/v1/models" >/dev/null; then
  "$py" bench/serve_load.py --port "$peer_port" --clients 1 --requests 1 --warmup 1 --prompt_tokens "$prompt" \
    --new_tokens "$new" --label warmup >/dev/null
  "$py" bench/serve_load.py --port "$peer_port" --clients "$peer_clients" --requests 1 --warmup 0 \
    --prompt_tokens "$prompt" --new_tokens "$new" --label fastapi-transformers --json "$results" | tee "$out/peer.txt"
else
  echo "peer did not start:"; tail -5 "$out/peer.log"
fi
kill $peer 2>/dev/null; wait $peer 2>/dev/null
stamp "peer done"

# --- transformers' batched generate (no server) ---
"$py" bench/serve_peer.py batched --model "$model" --device "$device" --dtype "$dtype" --batches "$batches" \
  --prompt_tokens "$prompt" --new_tokens "$new" --json "$results" | tee "$out/batched.txt"
stamp "batched done"
fi

# --- summary ---
"$py" - "$results" "$device" "$dtype" "$sizes" <<'PY' | tee "$out/summary.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"GPT-2 {sys.argv[4]} (random weights), {sys.argv[2]} {sys.argv[3]}: generated tokens/s (p50 / p99 TTFT ms)")
modes = [("gpt2-serve", "gpt2-serve"), ("gpt2-serve-sdpa", "sdpa (slot attention off)"),
         ("gpt2-serve-fast", "fast (attend 128, prefill 32)"), ("gpt2-serve-max-batch-8", "small (--max_batch 8)")]
print(f"{'clients':>8} | " + " | ".join(f"{title:>30}" for _, title in modes) +
      f" | {'FastAPI + transformers':>26} | {'transformers batched':>20}")
def cell(r):
    return f"{r['tokens_per_s']:>9,.0f} ({r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f})" if r else "-"
def find(label, c):
    return next((r for r in rows if r["label"] == label and r.get("clients") == c), None)
for c in sorted({r.get("clients", r.get("batch")) for r in rows}):
    batch = next((r for r in rows if r["label"] == "transformers-batched" and r["batch"] == c), None)
    batched = f"{batch['tokens_per_s']:,.0f}" if batch else "-"
    print(f"{c:>8} | " + " | ".join(f"{cell(find(label, c)):>30}" for label, _ in modes) +
          f" | {cell(find('fastapi-transformers', c)):>26} | {batched:>20}")
for label, _ in modes:
    r = find(label, 1)
    if r:
        print(f"{label} at 1 client: {r['itl_mean_ms']:.3f} ms between tokens ({1000 / r['itl_mean_ms']:,.0f} tokens/s)")
    r = find(label, 32)
    if r:
        ok = r["tokens_per_s"] >= 8000 and r["ttft_p50_ms"] < 50
        print(f"{label}: targets at 32 clients (>= 8000 tokens/s, p50 TTFT < 50 ms): {'met' if ok else 'NOT met'}")
PY
stamp "all done"
