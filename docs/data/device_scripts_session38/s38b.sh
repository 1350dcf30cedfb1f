#!/usr/bin/env bash
# Session 38, one GPU (carry [".device"] after mkdir -p .device && cp -r /usr/src/googletest
# .device/googletest): every C++ GPU suite at the session's final device code (ctest; the tests
# that need two or more GPUs skip themselves), as far as the device time left allows.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-560}
source scripts/device_steps.sh
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
cmake --build build-gpu -j 16 > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
(cd build-gpu && timeout $(( limit - 10 - $(el) )) ctest -j1 --timeout 200 \
  > $OUT/ctest.log 2>&1; echo "ctest rc=$?")
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)|Not Run" $OUT/ctest.log | head -20
grep -cE "Test +#[0-9]+: .* Passed" $OUT/ctest.log | sed 's/^/passed: /'
tail -3 $OUT/ctest.log
echo "end $(el)s"
