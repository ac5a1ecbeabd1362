# Sourced by the GPU learning tests (fused_vs_unfused_124m.sh, deterministic_gpu.sh): skips (exit
# 77) without a CUDA device, checks the fortunes corpus and tokenizes it once into $out/data.
#   fortunes_gpu_setup BIN_DIR OUT_DIR VAL_FRACTION   (FORTUNES_DIR: the corpus, /usr/share/games/fortunes)
fortunes_gpu_setup() {
  local bin=$1 out=$2 val_fraction=$3 corpus=${FORTUNES_DIR:-/usr/share/games/fortunes}
  nvidia-smi -L >/dev/null 2>&1 || { echo "no CUDA device: skipped"; exit 77; }
  [ -d "$corpus" ] || { echo "FORTUNES_DIR = $corpus: no such directory (install the fortunes package)"; exit 1; }
  mkdir -p "$out"
  [ -f "$out/data/train.h5" ] || "$bin/gpt2-data" "$corpus" --doc_separator % --val_fraction "$val_fraction" \
    --out "$out/data" >"$out/data.log"
}
