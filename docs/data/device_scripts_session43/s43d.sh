#!/usr/bin/env bash
# Session 43, one GPU (carry [".device"] after `bash scripts/device_ab_base.sh make 7d806aa base`):
# the sixteen-wave lag (this tree) on the backward suites it reorders, and the BF16 backward on
# dsv3 8k against four waves (7d806aa), which s43c did not time.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-240}
log=$OUT/s43d.log
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,power.limit,memory.total --format=csv,noheader
(bash scripts/device_ab_base.sh build base > $OUT/base_build.txt 2>&1) &
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1
cmake --build build-gpu -j 16 --target mok test_moe_backward_gpu test_emulated_ep_backward_gpu \
  test_nvfp4_backward_gpu test_mxfp8_backward_gpu > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
T=build-gpu/tests
run moe_backward 60 $T/test_moe_backward_gpu
run emulated_ep_backward 40 $T/test_emulated_ep_backward_gpu
run nvfp4_backward 50 $T/test_nvfp4_backward_gpu
run mxfp8_backward 50 $T/test_mxfp8_backward_gpu
wait
BASE=$(tail -1 $OUT/base_build.txt); echo "base build: $BASE $(el)s"
for b in "base $BASE" "lag16 build-gpu/mok"; do
  set -- $b
  [ -x "${2:-}" ] || continue
  [ $(el) -gt $(( limit - 30 )) ] && { echo "skip $1"; continue; }
  timeout $(( limit - 5 - $(el) )) $2 bench --direction backward --preset dsv3 --tokens 8192 \
    --iterations 5 > $OUT/bench_$1.txt 2>&1
  printf '%-6s rc=%s ' $1 $?; grep -E '^\| dsv3' $OUT/bench_$1.txt | head -1 | cut -c1-160
done
echo "end $(el)s"
