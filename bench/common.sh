# Sourced by the benchmark scripts: build into build-gpu, make random token files and random
# models, find a server's port, and summarise a metrics.jsonl into one RESULT line. bench_build
# needs .device-deps/gpu-env.sh sourced first.
out="${OUT:-/tmp/out}"; mkdir -p "$out"

bench_build() {
  local t0=$(date +%s)
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPT2_PYTHON="$(command -v python3)" \
    >"$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; return 1; }
  grep -E "gpt2-dist:|LibTorch" "$out/configure.log"
  cmake --build build-gpu -j "$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -40; return 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
}

# Random tokens in our token-file format, written by h5py (an independent writer).
bench_data() {
  python3 - "$out/tok" <<'PY'
import sys, os, h5py, numpy as np
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
for name, n in (("train", 20_000_000), ("val", 1_000_000)):
    with h5py.File(f"{d}/{name}.h5", "w") as f:
        f.create_dataset("tokens", data=np.random.default_rng(0).integers(0, 50257, n, dtype=np.uint16))
        f.attrs.update(format="gpt2-tokens", format_version=1, vocab_size=50257, eot_token=50256, tokenizer="gpt2")
PY
}

# bench_random_gpt2 PYTHON DIR "DIMS": a random GPT-2 as a Hugging Face directory (seed 0, vocab
# 50257, the GPT2Config keywords DIMS, e.g. "n_layer=12, n_head=12, n_embd=768"), made by transformers.
bench_random_gpt2() {
  "$1" - "$2" <<PY
import sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
GPT2LMHeadModel(GPT2Config(vocab_size=50257, $3)).save_pretrained(sys.argv[1])
PY
}

# serve_port LOG [PID]: the port gpt2-serve logs when it listens, or "" after 120 s (or once PID,
# the server, has exited).
serve_port() {
  local p
  for _ in $(seq 1200); do
    p=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$1" 2>/dev/null | grep -o '[0-9]*$' | head -1)
    [ -n "$p" ] && { echo "$p"; return; }
    [ -n "${2:-}" ] && ! kill -0 "$2" 2>/dev/null && return
    sleep 0.1
  done
}

# bench_as_hosts: $out/as_host.sh, which runs build-gpu/bin/gpt2-train as if each MPI rank were
# another host (NCCL_HOSTID), so several ranks share one GPU over NCCL's socket transport (Note
# [Ranks as hosts] in tests/parallel/gpu_parallel_test.cpp); exports the NCCL settings it needs.
bench_as_hosts() {
  printf '#!/usr/bin/env bash\nexport NCCL_HOSTID="bench-host-${OMPI_COMM_WORLD_RANK:-0}"\nexec %s "$@"\n' \
    "$PWD/build-gpu/bin/gpt2-train" >"$out/as_host.sh"
  chmod +x "$out/as_host.sh"
  export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo
  export NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4
}

# bench_summary NAME METRICS.jsonl: mean tokens/s and ms/step over logged steps after step 0.
bench_summary() {
  python3 - "$1" "$2" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(path) if '"loss"' in l]
last = [r for r in rows if r["step"] > 0]
tok = sum(r["tokens_per_sec"] for r in last) / len(last)
ms = sum(r["ms_per_step"] for r in last) / len(last)
print(f"RESULT ours {name} tok/s={tok:,.0f} ms/step={ms:.1f} peakGiB={rows[-1]['peak_mem_gib']:.2f} "
      f"MFU(989T)={100*rows[-1]['mfu']:.1f}% loss={rows[-1]['loss']:.3f}", flush=True)
PY
}

# bench_xl NAME ARGS...: gpt2-1558m bf16, B=8 x T=1024, 8 micro-steps per optimizer step (65,536
# tokens; $batch_tokens if set), $steps steps on $out/tok; its RESULT line and its optimizer-state
# line (device and host bytes). ARGS override the rest.
bench_xl() {
  local name="$1"; shift
  build-gpu/bin/gpt2-train --config configs/gpt2-1558m.ini --data.train="$out/tok/train.h5" --data.val=none \
    --train.micro_batch=8 --train.batch_tokens="${batch_tokens:-65536}" --train.max_steps="${steps:-5}" --train.warmup_steps=2 \
    --train.sample_tokens=0 --log.every=1 --log.metrics="$out/xl_$name.jsonl" "$@" >"$out/xl_$name.log" 2>&1 \
    || tail -20 "$out/xl_$name.log"
  bench_summary "gpt2-1558m B=8 $name" "$out/xl_$name.jsonl"
  grep -h "optimizer state" "$out/xl_$name.log" | head -1
}

# bench_text: $OUT/ttl-text/{train,val}.h5 (made once; $OUT itself, whatever a script calls $out):
# the Python docs and the fortunes ($CORPUS, default .device-deps/corpus from `bash
# bench/time_to_loss.sh --prepare`) through gpt2-data, 2% of the documents for val. The text of
# bench/time_to_loss.sh, int8_quality.sh and fp8_curves.sh. Uses $bin (default build-gpu/bin).
bench_text() {
  local base="${OUT:-/tmp/out}"
  [ -f "$base/ttl-text/val.h5" ] && return 0
  "${bin:-build-gpu/bin}/gpt2-data" "${CORPUS:-.device-deps/corpus}" --out "$base/ttl-text" --doc_separator % \
    --val_fraction 0.02 >"$base/text-data.log" 2>&1 || { tail -5 "$base/text-data.log"; return 1; }
  grep -h "tokens ->" "$base/text-data.log"
}
