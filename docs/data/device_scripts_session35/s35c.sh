#!/usr/bin/env bash
# Session 35, one GPU (carry [".device"] as for s35a.sh): the nvfp4 and mxfp8 forwards beside BF16
# on every standard shape after the batched two-chunk widening and the faster quantizers (the
# table of docs/benchmarks.md), and the fixed nvfp4 backward refusal test.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
log=$OUT/s35c.log
source scripts/device_steps.sh
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
cmake --build build-gpu -j 16 --target test_nvfp4_backward_gpu mok > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
run nvfp4_backward_refusals 60 build-gpu/tests/test_nvfp4_backward_gpu --gtest_filter='*Refuses*'
for prec in nvfp4 mxfp8; do
  timeout $(( ${LIMIT:-400} - $(el) )) build-gpu/mok bench --precision $prec --iterations 20 \
    > $OUT/bench_${prec}_all.txt 2>&1
  echo "--- $prec rc=$? $(el)s"
  grep '^|' $OUT/bench_${prec}_all.txt | grep -vE '^\|---'
done
echo "end $(el)s"
