#!/usr/bin/env bash
# Runs gpt2-train on this node through mpirun, one rank per GPU (or -np N; 1 on a machine without
# GPUs). Everything after the options goes to gpt2-train:
#   launch/train.sh --config configs/gpt2-124m.ini --data.train=... [--section.key=value ...]
#   launch/train.sh -np 2 --config configs/tiny.ini --train.device=cpu
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
np=""
if [ "${1:-}" = "-np" ] || [ "${1:-}" = "-n" ]; then np="$2"; shift 2; fi
if [ -z "$np" ]; then
  np=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  [ "${np:-0}" -ge 1 ] || np=1
fi
bin="${GPT2_BIN:-$root/build/bin/gpt2-train}"
[ -x "$bin" ] || { echo "train.sh: $bin not found; run launch/build.sh first" >&2; exit 2; }
mpi_flags=(-np "$np" --bind-to none)
[ "$(id -u)" -eq 0 ] && mpi_flags+=(--allow-run-as-root)
# More ranks than cores (CPU runs on small machines) is fine for mpirun with --oversubscribe.
[ "$np" -gt "$(nproc)" ] && mpi_flags+=(--oversubscribe)
# Pass NCCL and CUDA settings (including the NVLink-multicast switches) to every rank.
for v in $(env | grep -oE '^(NCCL|CUDA|TORCH|NVSHMEM|OMP|GPT2)_[A-Z_]*' || true); do mpi_flags+=(-x "$v"); done
mpi_flags+=(-x PATH)
[ -n "${LD_LIBRARY_PATH:-}" ] && mpi_flags+=(-x LD_LIBRARY_PATH)  # mpirun warns about an unset one
# One rank per core group: keep torch's intra-op threads from oversubscribing the node.
if [ -z "${OMP_NUM_THREADS:-}" ]; then
  threads=$(( $(nproc) / np )); [ "$threads" -ge 1 ] || threads=1
  mpi_flags+=(-x "OMP_NUM_THREADS=$threads")
fi
cd "$root"
exec mpirun "${mpi_flags[@]}" "$bin" "$@"
