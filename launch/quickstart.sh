#!/usr/bin/env bash
# The main job, from a fresh clone: install dependencies, build, tokenize the `fortunes` corpus into
# data/out/fortunes/{train,val}.h5, train configs/tiny.ini on CPU with mpirun (a few minutes),
# and print a sample. Extra arguments go to gpt2-train (e.g. --train.max_steps=100).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
launch/install-deps.sh
launch/build.sh
if [ ! -f data/out/fortunes/train.h5 ]; then
  build/bin/gpt2-data /usr/share/games/fortunes --doc_separator % --val_fraction 0.05 --out data/out/fortunes
fi
rm -f runs/tiny/metrics.jsonl
launch/train.sh -np 1 --config configs/tiny.ini "$@"
echo "metrics: runs/tiny/metrics.jsonl"
