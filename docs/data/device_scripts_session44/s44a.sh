#!/usr/bin/env bash
# Session 44, one GPU (carry [".device"] after `bash scripts/device_ab_base.sh make 7cb6bf8 base`
# and `make 2bc5838 chunk2` with b64ad9b checked out): the dgrad-down epilogues on 16-byte loads
# and stores (each lane's 8 consecutive columns gathered from its quad), one 32-column group per
# load batch (this tree) or two (chunk2), against the 4-byte accesses (base). The backward suites
# first (every epilogue variant: bf16 kept and recomputed, nvfp4, mxfp8, fp8_block, emulated EP).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-480}
log=$OUT/s44a.log
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,power.limit,memory.total --format=csv,noheader
(bash scripts/device_ab_base.sh build base > $OUT/base_build.txt 2>&1) &
(bash scripts/device_ab_base.sh build chunk2 > $OUT/chunk2_build.txt 2>&1) &
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1
cmake --build build-gpu -j 16 --target mok test_moe_backward_gpu test_emulated_ep_backward_gpu \
  test_nvfp4_backward_gpu test_mxfp8_backward_gpu test_fp8_block_backward_gpu \
  test_backward_sampled_gpu > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
T=build-gpu/tests
run moe_backward 60 $T/test_moe_backward_gpu
run fp8_block_backward 60 $T/test_fp8_block_backward_gpu
run emulated_ep_backward 40 $T/test_emulated_ep_backward_gpu
run nvfp4_backward 50 $T/test_nvfp4_backward_gpu
run mxfp8_backward 50 $T/test_mxfp8_backward_gpu
run backward_sampled 90 $T/test_backward_sampled_gpu
wait
echo "builds $(el)s"
declare -A BIN=([base]=$(tail -1 $OUT/base_build.txt) [chunk2]=$(tail -1 $OUT/chunk2_build.txt) [chunk1]=build-gpu/mok)
for v in base chunk2 chunk1; do [ -x "${BIN[$v]}" ] || { echo "no $v: ${BIN[$v]}"; exit 1; }; done
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
    for v in base chunk2 chunk1; do bench $v $shape; done
  done
done
echo "end $(el)s"
