#!/usr/bin/env bash
# Session 37, one GPU (carry [".device"] after mkdir -p .device && cp -r /usr/src/googletest
# .device/googletest): at the session's final device code (48527b9's), nvfp4 and mxfp8 beside BF16
# on every standard shape for the README's table (the tests building beside it on the CPU), then
# every C++ GPU suite (ctest; the tests that need two or more GPUs skip themselves).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-560}
log=$OUT/s37c.log
source scripts/device_steps.sh
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
cmake --build build-gpu -j 16 --target mok > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build mok $(el)s"
(cmake --build build-gpu -j 12 > $OUT/build_all.log 2>&1; echo "build all rc=$?" > $OUT/build_all_rc.txt) &
build_pid=$!
for prec in nvfp4 mxfp8; do
  timeout $(( limit - 120 - $(el) )) build-gpu/mok bench --precision $prec --iterations 20 \
    > $OUT/bench_${prec}_all.txt 2>&1
  echo "--- $prec rc=$? $(el)s"
  grep '^|' $OUT/bench_${prec}_all.txt | grep -vE '^\|---'
done
wait $build_pid; cat $OUT/build_all_rc.txt; echo "build all $(el)s"
(cd build-gpu && timeout $(( limit - 10 - $(el) )) ctest -j1 --timeout 240 \
  > $OUT/ctest.log 2>&1; echo "ctest rc=$?")
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)|Not Run" $OUT/ctest.log | head -20
echo "end $(el)s"
