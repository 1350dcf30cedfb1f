#!/usr/bin/env bash
# Session 34, one GPU, the short form of s34a.sh for a call with little device time left (carry
# [".device"] after mkdir -p .device && cp -r /usr/src/googletest .device/googletest): builds only
# the nvfp4 suites, runs the backward's first, then the forward's (the NaN factor's bits).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
log=$OUT/s34d.log
source scripts/device_steps.sh
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
cmake --build build-gpu -j 16 --target test_nvfp4_backward_gpu test_nvfp4_gpu > $OUT/build.log 2>&1 \
  || { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
run nvfp4_backward 150 build-gpu/tests/test_nvfp4_backward_gpu
grep -F "[ nvfp4 backward ]" /tmp/run.txt | head -12
run nvfp4 60 build-gpu/tests/test_nvfp4_gpu
echo "end $(el)s"
