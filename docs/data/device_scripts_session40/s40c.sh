#!/usr/bin/env bash
# Session 40, one GPU, the last of the budget (carry [".device"] with googletest): s40a.sh's core
# only. The test targets the change needs, then the source quantizer, each precision's one-rank
# NCCL step, the fp8_block and mxfp8 forwards (dispatch from the source rows) and the mxfp8
# backward (with the new non-finite test).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-250}
log=$OUT/log.txt
source scripts/device_steps.sh
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
b=build-gpu/tests
t=(test_formats_gpu test_ep_nccl_backward_gpu test_fp8_block_gpu test_mxfp8_gpu test_mxfp8_backward_gpu)
cmake --build build-gpu -j 16 --target "${t[@]}" > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
run formats 40 $b/test_formats_gpu --gtest_filter=*SourceRows*
run ep_nccl_low_precision 60 $b/test_ep_nccl_backward_gpu --gtest_filter=*LowPrecision*
left() { echo $(( limit - 5 - $(el) )); }
run fp8_block $(left) $b/test_fp8_block_gpu
[ $(left) -gt 20 ] && run mxfp8 $(left) $b/test_mxfp8_gpu
[ $(left) -gt 20 ] && run mxfp8_backward $(left) $b/test_mxfp8_backward_gpu
echo "end $(el)s"
