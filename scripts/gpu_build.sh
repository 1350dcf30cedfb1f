#!/usr/bin/env bash
# On the GPU machine: configure and build build-gpu/ with the system compiler (device-notes.md);
# GoogleTest sources travel in .device/googletest. Prints only errors.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
# NCCL: PyTorch's 2.28.9 (headers and library together), not the system's 2.28.3 (device-notes.md).
nccl_root="$(bash "$(dirname "$0")/nccl_root.sh")"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_WERROR=ON \
  -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" >/tmp/mok-configure.log 2>&1 || {
  tail -30 /tmp/mok-configure.log
  exit 1
}
cmake --build build-gpu -j 16 >/tmp/mok-build.log 2>&1 || {
  grep -E "error|FAILED" -A3 /tmp/mok-build.log | head -40
  exit 1
}
