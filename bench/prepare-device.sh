#!/usr/bin/env bash
# Run on the CPU machine, in the project's root, before a GPU-machine call: ../shared/device/prepare.sh
# (Boost.Program_options and gpu-env.sh into .device-deps/), plus what this project needs there
# beyond that: the nlohmann-json headers (Debian package, unpacked by gpu-env.sh with the others)
# and the PyTorch peer benchmark. Then carry [".device-deps"] and source .device-deps/gpu-env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ../shared/device/prepare.sh
if ! ls .device-deps/debs/nlohmann-json3-dev_*.deb >/dev/null 2>&1; then
  (cd .device-deps/debs && apt-get download -qq nlohmann-json3-dev)
fi
cp ../shared/bench/torch_peer.py .device-deps/torch_peer.py
ls .device-deps/debs
