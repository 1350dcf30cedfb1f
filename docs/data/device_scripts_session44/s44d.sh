#!/usr/bin/env bash
# Session 44, one GPU, the last ~220 s of device time (carry [".device"] after
# `bash scripts/device_ab_base.sh make HEAD~1 lag16` at the lag commit): the backward's tile-order
# lag from 32 waves of CTAs (this tree) against 16 (session 43's s43e, unrun then). A host-only
# change, so the baseline is this build with the patch reversed and mok relinked.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-130}
log=$OUT/s44d.log
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,power.limit,memory.total --format=csv,noheader
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1
cmake --build build-gpu -j 16 --target mok test_moe_backward_gpu test_fp8_block_backward_gpu \
  > $OUT/build.log 2>&1 || { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
cp build-gpu/mok /tmp/mok_lag32
git apply -R --whitespace=nowarn .device/lag16.diff &&
  cmake --build build-gpu -j 16 --target mok >> $OUT/build.log 2>&1 && cp build-gpu/mok /tmp/mok_lag16
git apply --whitespace=nowarn .device/lag16.diff
echo "builds $(el)s"
bench() {  # VARIANT PRESET TOKENS
  [ $(el) -gt $(( limit - 15 )) ] && { echo "skip $*"; return; }
  timeout $(( limit - $(el) )) /tmp/mok_$1 bench --precision fp8_block --direction backward \
    --preset $2 --tokens $3 --iterations 10 > /tmp/b.txt 2>&1
  echo "--- $*" >> $OUT/bench.txt; cat /tmp/b.txt >> $OUT/bench.txt
  printf '%-5s ' $1; grep -E '^\| [a-z0-9-]+ \| [0-9]' /tmp/b.txt | cut -c1-120
}
for v in lag32 lag16; do bench $v fine 4096; done
for v in lag32 lag16; do bench $v qwen3-30b 8192; done
T=build-gpu/tests
run moe_backward 30 $T/test_moe_backward_gpu
run fp8_block_backward 30 $T/test_fp8_block_backward_gpu
for v in lag16 lag32; do bench $v fine 4096; done
for v in lag16 lag32; do bench $v qwen3-30b 8192; done
echo "end $(el)s"
