#!/usr/bin/env bash
# The main job, from a fresh clone: install dependencies, build, tokenize the `fortunes` corpus into
# data/out/fortunes/{train,val}.h5, train configs/tiny.ini on CPU with mpirun (a few minutes; it
# checkpoints to runs/tiny/checkpoints), sample from the checkpoint with gpt2-generate, and plot the
# curves to runs/tiny/metrics.png. Extra arguments go to gpt2-train (e.g. --train.max_steps=100).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
launch/install-deps.sh
launch/build.sh
if [ ! -f data/out/fortunes/train.h5 ]; then
  build/bin/gpt2-data /usr/share/games/fortunes --doc_separator % --val_fraction 0.05 --out data/out/fortunes
fi
rm -rf runs/tiny  # a fresh run each time (checkpoint.resume = auto would continue the last one)
launch/train.sh -np 1 --config configs/tiny.ini "$@"
build/bin/gpt2-generate runs/tiny/checkpoints --prompt "Q: What is the meaning of life?" --max_new_tokens 48
launch/plot.sh runs/tiny/metrics.jsonl runs/tiny/metrics.png
echo "metrics: runs/tiny/metrics.jsonl, runs/tiny/metrics.png; tensorboard --logdir runs/tiny/tensorboard"
