#!/usr/bin/env bash
# On this machine's CPUs: gpt2-124m fp32, 2 steps of B=1 x T=64 a rank, ZeRO 0/1/2 on 2 and 4 ranks
# (MPI backend): each rank's peak resident memory (GNU time's max RSS), the gradient and optimizer
# memory the log states, and the losses. The CPU stand-in for bench/zero_memory.sh's GPU table.
# Usage: bash bench/zero_memory_cpu.sh TOKENS.h5   (e.g. the quickstart's data/out/fortunes/train.h5)
set -uo pipefail
tokens="${1:?usage: bench/zero_memory_cpu.sh TOKENS.h5}"
out="${OUT:-/tmp/out}"; mkdir -p "$out"
bin="${GPT2_BIN:-build/bin/gpt2-train}"
root=(); [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
for np in 2 4; do for z in 0 1 2; do
  name="cpu-124m-np$np-zero$z"
  mpiexec "${root[@]}" --oversubscribe -np "$np" bash -c '/usr/bin/time -f "rank $OMPI_COMM_WORLD_RANK maxrss_kib %M" "$@" 2>&1' _ \
    "$bin" --config configs/gpt2-124m.ini --train.device=cpu --precision.dtype=fp32 --data.train="$tokens" --data.val=none \
    --train.micro_batch=1 --train.seq_len=64 --train.batch_tokens=$((np * 64)) --train.max_steps=2 --train.warmup_steps=1 \
    --train.sample_tokens=0 --log.every=1 --log.metrics=none --checkpoint.every=0 --parallel.zero_stage="$z" \
    >"$out/$name.log" 2>&1
  rc=$?
  rss=$(grep -o 'rank [0-9]* maxrss_kib [0-9]*' "$out/$name.log" | sort -k2n | awk '{printf "%.2f ", $4 / 1048576}')
  grads=$(grep -o 'gradients Float ([0-9.]* MiB on this rank)' "$out/$name.log" | head -1 | grep -o '[0-9.]* MiB')
  state=$(grep -o 'optimizer state: [0-9.]* MiB' "$out/$name.log" | head -1 | grep -o '[0-9.]* MiB')
  losses=$(grep -oE 'step [0-9]+/[0-9]+ \| loss [0-9.]+' "$out/$name.log" | awk '{print $NF}' | tr '\n' ' ')
  echo "RESULT $name rc=$rc max_rss_GiB_by_rank=[${rss% }] gradients=$grads optimizer_state=$state losses=[${losses% }]"
done; done
