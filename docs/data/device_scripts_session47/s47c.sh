#!/usr/bin/env bash
# Session 47, call C: d_out quantized once on its source rank in the fp8_block and mxfp8
# backwards (the dispatch copies codes and scales, or decodes MX rows, instead of quantizing each
# routed row: top_k times fewer quantizations). Here first: bash scripts/device_ab_base.sh make
# BASE base (BASE: the commit before the lever); one GPU, carry [".device"], LIMIT=560.
#   (1) the suites it touches: fp8_block, mxfp8 backward, emulated EP backward (every precision),
#       the one-rank NCCL groups' backward, the BF16 backward;
#   (2) A/B against base: `mok bench --precision P --direction backward --iterations 10`
#       (mok's BF16 backward beside it), two alternating rounds, then one wait profile each.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-560}
log=$OUT/s47c.log
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,power.limit,memory.total --format=csv,noheader
(bash scripts/device_ab_base.sh build base > $OUT/base_build.txt 2>&1) &
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1
cmake --build build-gpu -j 16 --target mok test_moe_backward_gpu test_emulated_ep_backward_gpu \
  test_mxfp8_backward_gpu test_fp8_block_backward_gpu test_ep_nccl_backward_gpu \
  test_fp8_block_gpu test_mxfp8_gpu > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
wait
echo "builds $(el)s"
declare -A BIN=([head]=build-gpu/mok [base]=$(tail -1 $OUT/base_build.txt))
for v in base head; do [ -x "${BIN[$v]}" ] || { echo "no $v: ${BIN[$v]}"; exit 1; }; done
T=build-gpu/tests
run fp8_block_backward 90 $T/test_fp8_block_backward_gpu
run mxfp8_backward 90 $T/test_mxfp8_backward_gpu
run emulated_ep_backward 90 $T/test_emulated_ep_backward_gpu
run ep_nccl_backward 90 $T/test_ep_nccl_backward_gpu
run fp8_block_forward 60 $T/test_fp8_block_gpu
run mxfp8_forward 60 $T/test_mxfp8_gpu
round() { for shape in "qwen3-30b 8192" "fine 4096" "dsv3 4096"; do
  for v in head base; do bench_backward $v fp8_block $shape; done
done
for v in head base; do bench_backward $v mxfp8 qwen3-30b 8192; done; }
round
round
for v in head base; do bench_backward $v fp8_block qwen3-30b 8192 --breakdown 1; done
run moe_backward 90 $T/test_moe_backward_gpu
echo "end $(el)s"
