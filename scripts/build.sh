#!/usr/bin/env bash
# Configures and builds into build/ (CUDA sources for sm_90a when nvcc is found). Warnings are
# errors (as in CI) unless MOK_WERROR=OFF; run.sh and test.sh build with the same flags, so
# either after the other rebuilds nothing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
command -v nvcc >/dev/null 2>&1 || [ ! -x /usr/local/cuda/bin/nvcc ] || export PATH="/usr/local/cuda/bin:$PATH"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR="${MOK_WERROR:-ON}" -DMOK_PYTHON=OFF >/dev/null
cmake --build "$root/build" -j "$(nproc)"
