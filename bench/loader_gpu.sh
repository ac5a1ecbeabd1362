#!/usr/bin/env bash
# On the GPU machine (carry .device-deps and .bench-data; source .device-deps/gpu-env.sh first):
#   bash bench/loader_gpu.sh   (after bench_build from bench/common.sh, or it builds)
# 1. The trainer's data wait as a fraction of step time, gpt2-124m bf16 B=32 T=1024 on one GPU
#    (data_wait_frac in metrics.jsonl: time the loop blocked on the prefetcher / wall time).
# 2. gpt2-data against tiktoken (installed there) on the same corpus (.bench-data/corpus.txt).
set -uo pipefail
source bench/common.sh
[ -x build-gpu/bin/gpt2-train ] || bench_build || exit 1
[ -f "$out/tok/train.h5" ] || bench_data
build-gpu/bin/gpt2-train --config configs/gpt2-124m.ini --precision.fp8=false --data.train="$out/tok/train.h5" --data.val=none \
  --train.micro_batch=32 --train.batch_tokens=32768 --train.max_steps=40 --train.warmup_steps=10 \
  --train.sample_tokens=0 --log.every=5 --log.metrics="$out/loader.jsonl" >"$out/loader.log" 2>&1 || tail -20 "$out/loader.log"
bench_summary "gpus=1 (loader)" "$out/loader.jsonl"
python3 - "$out/loader.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l and json.loads(l)["step"] > 0]
w = [r["data_wait_frac"] for r in rows]
print(f"RESULT data_wait_frac mean={sum(w)/len(w)*100:.3f}% max={max(w)*100:.3f}% over {len(w)} logging windows", flush=True)
PY
corpus=.bench-data/corpus.txt
if [ -f "$corpus" ]; then
  mb=$(python3 -c "import os; print(os.path.getsize('$corpus')/1e6)")
  t0=$(date +%s.%N)
  build-gpu/bin/gpt2-data "$corpus" --out "$out/ours" --val_fraction 0 >"$out/gpt2-data.log" 2>&1 || tail -5 "$out/gpt2-data.log"
  t1=$(date +%s.%N)
  echo "RESULT gpt2-data corpus=${mb}MB wall=$(python3 -c "print(f'{$t1-$t0:.2f}')")s ($(nproc) threads, process start and HDF5 write included)"
  python3 - "$corpus" data/tokenizer/gpt2 <<'PY'
import json, sys, time, tiktoken
text = open(sys.argv[1], encoding="utf-8").read()
d = sys.argv[2]
enc = json.load(open(f"{d}/encoder.json"))
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs = bs[:]; n = 0
for b in range(256):
    if b not in bs: bs.append(b); cs.append(256 + n); n += 1
dec = {chr(c): b for b, c in zip(bs, cs)}
ranks = {bytes(dec[ch] for ch in tok): i for tok, i in enc.items()}
e = tiktoken.Encoding("gpt2-local", pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
                      mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})
t0 = time.time(); ids = e.encode_ordinary(text); t1 = time.time()
import os
t2 = time.time(); e.encode_ordinary_batch(text.split("\n\n"), num_threads=os.cpu_count()); t3 = time.time()
mb = len(text.encode()) / 1e6
print(f"RESULT tiktoken corpus={mb:.1f}MB tokens={len(ids)} one-thread={mb/(t1-t0):.1f}MB/s batch({os.cpu_count()} threads)={mb/(t3-t2):.1f}MB/s", flush=True)
PY
fi
