#!/usr/bin/env bash
# Session 35, one GPU (carry [".device"] as for s35a.sh): the branchless E2M1 encoder and the
# mxfp8 quantizers' hardware conversion: the GPU quantizers' bits (test_formats_gpu), the nvfp4
# suite, and the weight quantizers' times (`mok bench`'s column).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
log=$OUT/s35d.log
source scripts/device_steps.sh
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
cmake --build build-gpu -j 16 --target test_formats_gpu test_nvfp4_gpu mok > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
run formats 60 build-gpu/tests/test_formats_gpu
run nvfp4 100 build-gpu/tests/test_nvfp4_gpu
for prec in nvfp4 mxfp8; do
  for preset in qwen3-30b dsv3; do
    timeout 60 build-gpu/mok bench --precision $prec --preset $preset --iterations 10 2>&1 |
      grep '^|' | grep -vE '^\|---|^\| shape'
  done
done
echo "end $(el)s"
