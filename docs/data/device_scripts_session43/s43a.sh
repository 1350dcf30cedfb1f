#!/usr/bin/env bash
# Session 43, one GPU (carry [".device"] after
#   mkdir -p .device && cp -r /usr/src/googletest .device/googletest
#   bash scripts/device_ab_base.sh make 7ae8ae9 base):
# the dgrad-down epilogue's operands (act, g | u) prefetched into L2 before its mainloop. The
# backward suites it touches, then mok's backward in this tree and in 7ae8ae9's, alternating
# base/new, BF16 and fp8_block beside each other in every run.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-540}
log=$OUT/s43a.log
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,power.limit,memory.total --format=csv,noheader
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
cmake --build build-gpu -j 16 --target mok test_moe_backward_gpu test_fp8_block_backward_gpu \
  test_mxfp8_backward_gpu test_nvfp4_backward_gpu test_emulated_ep_backward_gpu > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
(bash scripts/device_ab_base.sh build base > $OUT/base_build.txt 2>&1) &
base_pid=$!
T=build-gpu/tests
run fp8_block_backward 100 $T/test_fp8_block_backward_gpu
run moe_backward 150 $T/test_moe_backward_gpu
run mxfp8_backward 100 $T/test_mxfp8_backward_gpu
run nvfp4_backward 100 $T/test_nvfp4_backward_gpu
run emulated_ep_backward 100 $T/test_emulated_ep_backward_gpu
echo "tests $(el)s"
wait $base_pid; BASE=$(tail -1 $OUT/base_build.txt); echo "base build: $BASE $(el)s"
[ -x "$BASE" ] || { tail -5 $OUT/base_build.txt; BASE=""; }
bench() {  # NAME BINARY PRESET TOKENS [args]
  local name=$1 bin=$2 preset=$3 tokens=$4; shift 4
  [ $(el) -gt $(( limit - 40 )) ] && { echo "skip $name $preset"; return; }
  local f=$OUT/bench_${preset}_${tokens}_$name.txt
  timeout $(( limit - $(el) )) $bin bench --precision fp8_block --direction backward \
    --preset $preset --tokens $tokens --iterations 10 "$@" >> $f 2>&1
  echo "--- $name $preset $tokens rc=$? $(el)s"
  grep -E '^\| [a-z0-9-]+ \| [0-9]|does not fit|out of memory' $f | tail -2 | cut -c1-200
}
for round in 1 2; do
  for shape in "qwen3-30b 8192" "fine 4096" "dsv3 4096"; do
    [ -n "$BASE" ] && bench base $BASE $shape
    bench new build-gpu/mok $shape
  done
done
# The fp8_block backward with twice its dispatch CTAs (the forward doubles them; the backward not).
bench new_dispatch32 build-gpu/mok qwen3-30b 8192 --dispatch-ctas 32
bench new_dispatch48 build-gpu/mok fine 4096 --dispatch-ctas 48
echo "end $(el)s"
