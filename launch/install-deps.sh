#!/usr/bin/env bash
# Installs what gpt2-dist needs to build and test on Debian 12 (idempotent; safe to re-run):
#   - Debian packages: compilers, CMake, Ninja, Open MPI, HDF5, Boost.Program_options, spdlog, nlohmann-json,
#     GoogleTest, the `fortunes` corpus the quickstart trains on, and clang + libFuzzer (the
#     fuzz_smoke test, tests/fuzz/run.sh), clang-format (the `format` test), jq + gnuplot for launch/plot.sh,
#     libonnx-dev + libprotobuf-dev (gpt2-ckpt export-onnx).
#   - .venv/ (project-local, git-ignored): torch==2.11.0 (LibTorch for CMake, the GPU machine's
#     version) and the Python references the tests compare against.
# Skips any step whose result is already there. Set GPT2_SKIP_APT=1 to leave the system alone.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

TORCH_VERSION=2.11.0
APT_PACKAGES=(build-essential cmake ninja-build pkg-config git
  libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools libboost-program-options-dev
  libspdlog-dev libfmt-dev nlohmann-json3-dev libboost-dev libgtest-dev libgmock-dev fortunes fortunes-min python3-venv
  clang libclang-rt-14-dev clang-format slurmctld slurmd slurm-client munge jq gnuplot-nox libonnx-dev libprotobuf-dev)
PY_PACKAGES=("torch==${TORCH_VERSION}" numpy transformers tiktoken h5py safetensors tensorboard openai onnx onnxruntime)

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

if [ "${GPT2_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "[install-deps] apt: ${missing[*]}"
    sudo_if_needed apt-get update -qq
    DEBIAN_FRONTEND=noninteractive sudo_if_needed apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

# Any python3 >= 3.10 with venv works; prefer the one on PATH.
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[install-deps] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
if ! .venv/bin/python - "${PY_PACKAGES[@]}" <<'PYEOF' 2>/dev/null
import sys, importlib.metadata as md
for spec in sys.argv[1:]:
    name, _, want = spec.partition("==")
    have = md.version(name)
    if want and have.split("+")[0] != want: sys.exit(1)
PYEOF
then
  echo "[install-deps] pip: ${PY_PACKAGES[*]}"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "${PY_PACKAGES[@]}"
fi

# LibTorch's CUDA must match the system nvcc's major version, or CUDA code would link against
# two runtimes. Warn (not fail): CPU builds and tests still work, the CUDA parts are skipped.
torch_cuda="$(.venv/bin/python -c 'import torch; print(torch.version.cuda or "")')"
nvcc_cuda="$(command -v nvcc >/dev/null && nvcc --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p' || true)"
echo "[install-deps] torch $(.venv/bin/python -c 'import torch; print(torch.__version__)') (CUDA ${torch_cuda:-none}), nvcc ${nvcc_cuda:-none}"
if [ -n "$torch_cuda" ] && [ -n "$nvcc_cuda" ] && [ "${torch_cuda%%.*}" != "${nvcc_cuda%%.*}" ]; then
  echo "[install-deps] warning: torch CUDA $torch_cuda and nvcc $nvcc_cuda differ in major version" >&2
fi
