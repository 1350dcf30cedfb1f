#!/usr/bin/env bash
# On the GPU machine: builds the Python module with the GPU layer into build-py/ (the system
# compiler, PyTorch's NCCL: device-notes.md); nanobind and pytest travel in .device/pylib. Then
#   PYTHONPATH=build-py/python:.device/pylib python3 -m pytest tests/python
# Prints only errors.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$root/.device/pylib"
nccl_root="$(bash "$root/scripts/nccl_root.sh")"
cmake -S "$root" -B "$root/build-py" ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DMOK_TESTS=OFF -DMOK_PYTHON=ON -DMOK_WERROR=ON \
  -DPython_EXECUTABLE="$(command -v python3)" -DCMAKE_CXX_COMPILER=/usr/bin/g++ \
  -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ >/tmp/mok-py-configure.log 2>&1 || {
  tail -30 /tmp/mok-py-configure.log
  exit 1
}
cmake --build "$root/build-py" -j 16 --target _mok >/tmp/mok-py-build.log 2>&1 || {
  grep -E "error" -A3 /tmp/mok-py-build.log | head -30
  exit 1
}
