#!/usr/bin/env bash
# Session 45, one GPU (carry [".device"] after `bash scripts/device_ab_base.sh make 129986d base`,
# `... make 75c799a loop` and `... make epilogue-pipe pipe` at e55290b): session 44 found the
# dgrad-down epilogue's time following its code size.
#   base  129986d  session 44's epilogues
#   loop  75c799a  the epilogues loop over their column chunks without unrolling them (one copy of
#                  the body, the chunk's accumulators picked by fragment_slice)
#   kept  e55290b  (this tree) fp8_block's codes from the BF16 dg | du kept in local memory, not
#                  formed again, and its block amax by max.u16x2 over the BF16 magnitudes
# The loop and pipe variants (branch epilogue-pipe: each chunk's loads issued a chunk ahead) were
# dropped from this call when device time ran short; loop's BF16 kernels equal kept's.
# Variants first, then the suites.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-330}
log=$OUT/s45a.log
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,power.limit,memory.total,clocks.max.sm --format=csv,noheader
(bash scripts/device_ab_base.sh build base > $OUT/base_build.txt 2>&1) &
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1
cmake --build build-gpu -j 16 --target mok test_moe_backward_gpu test_emulated_ep_backward_gpu \
  test_nvfp4_backward_gpu test_mxfp8_backward_gpu test_fp8_block_backward_gpu > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
wait
echo "builds $(el)s"
declare -A BIN=([base]=$(tail -1 $OUT/base_build.txt) [kept]=build-gpu/mok)
for v in base kept; do [ -x "${BIN[$v]}" ] || { echo "no $v: ${BIN[$v]}"; exit 1; }; done
bench() {  # VARIANT PRECISION PRESET TOKENS [ARGS]
  [ $(el) -gt $(( limit - 40 )) ] && { echo "skip $*"; return; }
  local f=$OUT/bench_$1.txt v=$1 precision=$2 preset=$3 tokens=$4
  shift 4
  echo "--- $v $precision $preset $tokens $*" >> $f
  timeout $(( limit - $(el) )) ${BIN[$v]} bench --precision $precision --direction backward \
    --preset $preset --tokens $tokens --iterations 10 "$@" > /tmp/b.txt 2>&1
  cat /tmp/b.txt >> $f
  printf '%-5s %-9s ' $v $precision
  grep -E '^\| [a-z0-9-]+ \| [0-9]|^\| [a-z0-9-]+ T = |does not fit|out of memory' /tmp/b.txt | cut -c1-160
}
round() { for shape in "dsv3 4096" "qwen3-30b 8192" "fine 4096"; do
  for v in kept base; do bench $v fp8_block $shape; done
done; }
round
T=build-gpu/tests
run moe_backward 60 $T/test_moe_backward_gpu
run fp8_block_backward 60 $T/test_fp8_block_backward_gpu
run emulated_ep_backward 40 $T/test_emulated_ep_backward_gpu
run mxfp8_backward 50 $T/test_mxfp8_backward_gpu
run nvfp4_backward 50 $T/test_nvfp4_backward_gpu
for v in base kept; do bench $v fp8_block qwen3-30b 8192 --breakdown 1; done
round
for p in mxfp8 nvfp4; do for v in base kept; do bench $v $p qwen3-30b 8192; done; done
echo "end $(el)s"
