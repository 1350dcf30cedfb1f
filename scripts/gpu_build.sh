#!/usr/bin/env bash
# On the GPU machine: configure and build build-gpu/ with the system compiler (device-notes.md);
# GoogleTest sources travel in .device/googletest. Prints only errors.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_WERROR=ON \
  -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" >/tmp/mok-configure.log 2>&1 || {
  tail -30 /tmp/mok-configure.log
  exit 1
}
cmake --build build-gpu -j 16 >/tmp/mok-build.log 2>&1 || {
  grep -E "error|FAILED" -A3 /tmp/mok-build.log | head -40
  exit 1
}
