#!/usr/bin/env bash
# Session 43, one GPU (carry [".device"] after `bash scripts/device_ab_base.sh make 7d806aa base`
# and `make 520a3c9 lag8` with 3dc1a26 checked out): the backward's tile-order lag from 4 (base),
# 8 and 16 (this tree) waves of CTAs. s43b's timelines: the fp8_block dgrad-gate/up producers wait
# 1.2 ms per CTA for their unit's dgrad-down tiles (BF16: 0.25), whose epilogue takes twice
# BF16's; a longer lag claims those tiles later. BF16 and fp8_block beside each other in every run.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-540}
log=$OUT/s43c.log
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,power.limit,memory.total --format=csv,noheader
(bash scripts/device_ab_base.sh build base > $OUT/base_build.txt 2>&1) &
(bash scripts/device_ab_base.sh build lag8 > $OUT/lag8_build.txt 2>&1) &
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1
cmake --build build-gpu -j 16 --target mok test_fp8_block_backward_gpu > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
wait
echo "builds $(el)s"
declare -A BIN=([base]=$(tail -1 $OUT/base_build.txt) [lag8]=$(tail -1 $OUT/lag8_build.txt) [lag16]=build-gpu/mok)
for v in base lag8 lag16; do [ -x "${BIN[$v]}" ] || { echo "no $v: ${BIN[$v]}"; exit 1; }; done
bench() {  # VARIANT PRESET TOKENS [ARGS]
  [ $(el) -gt $(( limit - 40 )) ] && { echo "skip $*"; return; }
  local f=$OUT/bench_$1.txt v=$1 preset=$2 tokens=$3
  shift 3
  echo "--- $v $preset $tokens $*" >> $f
  timeout $(( limit - $(el) )) ${BIN[$v]} bench --precision fp8_block --direction backward \
    --preset $preset --tokens $tokens --iterations 10 "$@" >> $f 2>&1
  set -- $v
  printf '%-6s ' $1; grep -E '^\| [a-z0-9-]+ \| [0-9]|does not fit|out of memory' $f | tail -1 | cut -c1-120
}
for round in 1 2; do
  for shape in "qwen3-30b 8192" "fine 4096" "dsv3 4096"; do
    for v in base lag8 lag16; do bench $v $shape; done
  done
done
# 128-wide tiles (half the accumulators beside the fp8_block dgrad-down epilogue's two passes).
bench base qwen3-30b 8192 --block-n 128
bench base dsv3 4096 --block-n 128
run fp8_block_backward 100 build-gpu/tests/test_fp8_block_backward_gpu
echo "end $(el)s"
