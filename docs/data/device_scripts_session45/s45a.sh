#!/usr/bin/env bash
# Ran in session 46 (an H100, at dd11a7a: the levers restored; benchmarks.md, session 46).
# Session 45's epilogue levers, written but not run (no device machine could be started). They
# were reverted unrun (8bc537f); to run this, restore them first (`git revert 8bc537f`), then, at
# the restored tree, with carry [".device"]:
#   bash scripts/device_ab_base.sh make 129986d base
#   bash scripts/device_ab_base.sh make 60c482c both
#   LIMIT=400 bash docs/data/device_scripts_session45/s45a.sh
# Session 44 found the dgrad-down epilogue's time following its code size. Variants (benchmarks.md,
# "The dgrad-down epilogue levers, written and not run", has their instruction counts):
#   base  129986d  session 44's epilogues
#   both  60c482c  both dgrad-down epilogues loop over their column chunks without unrolling them
#                  (fragment_slice picks the chunk's accumulators, pointers advanced per chunk,
#                  loads a chunk ahead); fp8_block's codes from its BF16 dg | du kept in local
#                  memory, not formed again (the reference quantizes the BF16 values too), and its
#                  block amax by max.u16x2 over the BF16 magnitudes
#   fp8   cde9914  (the restored tree) both's fp8_block epilogue, the bf16 one unrolled as at base
# One round of the variants, the suites, then the rest.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-400}
log=$OUT/s45a.log
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,power.limit,memory.total,clocks.max.sm --format=csv,noheader
for v in base both; do
  (bash scripts/device_ab_base.sh build $v > $OUT/${v}_build.txt 2>&1) &
done
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1
cmake --build build-gpu -j 16 --target mok test_moe_backward_gpu test_emulated_ep_backward_gpu \
  test_nvfp4_backward_gpu test_mxfp8_backward_gpu test_fp8_block_backward_gpu > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
wait
echo "builds $(el)s"
declare -A BIN=([fp8]=build-gpu/mok)
for v in base both; do BIN[$v]=$(tail -1 $OUT/${v}_build.txt); done
for v in base both fp8; do [ -x "${BIN[$v]}" ] || { echo "no $v: ${BIN[$v]}"; exit 1; }; done
round() { for shape in "dsv3 4096" "qwen3-30b 8192" "fine 4096"; do
  for v in fp8 both base; do bench_backward $v fp8_block $shape; done
done; }
round
T=build-gpu/tests
run moe_backward 60 $T/test_moe_backward_gpu
run fp8_block_backward 60 $T/test_fp8_block_backward_gpu
run emulated_ep_backward 40 $T/test_emulated_ep_backward_gpu
run mxfp8_backward 50 $T/test_mxfp8_backward_gpu
run nvfp4_backward 50 $T/test_nvfp4_backward_gpu
for v in base both fp8; do bench_backward $v fp8_block qwen3-30b 8192 --breakdown 1; done
round
for p in mxfp8 nvfp4; do for v in base both; do bench_backward $v $p qwen3-30b 8192; done; done
echo "end $(el)s"
