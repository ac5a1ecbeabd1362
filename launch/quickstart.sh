#!/usr/bin/env bash
# The main job, from a fresh clone: install dependencies, build, tokenize the `fortunes` corpus into
# data/out/fortunes/{train,val}.h5, train with mpirun, sample from the checkpoint with
# gpt2-generate, and plot the curves to runs/NAME/metrics.png. With a GPU (nvidia-smi lists one and
# the build has CUDA) it trains configs/fortunes-124m.ini (GPT-2 124M, a few minutes) on one GPU;
# otherwise configs/tiny.ini on CPU (6 minutes on 2 cores with AVX-512, 20 on AVX2 only). Extra arguments go to
# gpt2-train (e.g. --train.max_steps=100).
# Environment: GPT2_QUICKSTART_CONFIG picks the config; GPT2_SKIP_INSTALL=1 skips
# launch/install-deps.sh (a machine that has the dependencies but no network); FORTUNES_DIR is the
# corpus (default /usr/share/games/fortunes); BUILD_DIR as for launch/build.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
[ "${GPT2_SKIP_INSTALL:-0}" = 1 ] || launch/install-deps.sh
launch/build.sh
bin="${BUILD_DIR:-$root/build}/bin"
export GPT2_BIN="$bin/gpt2-train"  # launch/train.sh runs it

if [ ! -f data/out/fortunes/train.h5 ]; then
  "$bin/gpt2-data" "${FORTUNES_DIR:-/usr/share/games/fortunes}" --doc_separator % --val_fraction 0.05 \
    --out data/out/fortunes
fi

config="${GPT2_QUICKSTART_CONFIG:-}"
if [ -z "$config" ]; then
  config=configs/tiny.ini
  if nvidia-smi -L 2>/dev/null | grep -q '^GPU' && grep -q 'gpt2-dist: CUDA=ON' "${BUILD_DIR:-$root/build}/configure.log"; then
    config=configs/fortunes-124m.ini
  fi
fi
# The run's directory is where its config puts metrics.jsonl (runs/NAME/).
run="$(sed -n 's/^metrics *= *\(.*\)\/metrics.jsonl *$/\1/p' "$config" | head -n 1)"
[ -n "$run" ] || { echo "quickstart: $config has no [log] metrics = DIR/metrics.jsonl" >&2; exit 2; }
echo "quickstart: training $config into $run"
rm -rf "$run"  # a fresh run each time (checkpoint.resume = auto would continue the last one)
start=$(date +%s)
launch/train.sh -np 1 --config "$config" "$@"
echo "quickstart: trained in $(( $(date +%s) - start )) s"
"$bin/gpt2-generate" "$run/checkpoints" --prompt "Q: What is the meaning of life?" --max_new_tokens 48 \
  --top_k 40 --temperature 0.8 --ignore_eot
if command -v jq >/dev/null && command -v gnuplot >/dev/null; then
  launch/plot.sh "$run/metrics.jsonl" "$run/metrics.png"
else
  echo "quickstart: no plot (launch/plot.sh needs jq and gnuplot; launch/install-deps.sh installs them)"
fi
echo "metrics: $run/metrics.jsonl, $run/metrics.png; tensorboard --logdir $run/tensorboard"
