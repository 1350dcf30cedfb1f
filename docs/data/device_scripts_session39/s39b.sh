#!/usr/bin/env bash
# Session 39, one GPU (carry [".device"]; after s39a.sh on the same machine, or it builds again):
# `mok bench --precision P --direction D` on every standard shape (burst rates, 3 alternating
# rounds of 10): each precision beside mok's BF16 one, and both outputs' (forward) or d_x's
# (backward) distance from the exact layer (FP64, no rounding) on sampled rows.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-560}
log=$OUT/log.txt
source scripts/device_steps.sh
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
cmake --build build-gpu -j 16 --target mok > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
mok=build-gpu/mok
bench() {  # direction precision
  [ $(el) -gt $(( limit - 60 )) ] && return
  echo "--- $1 $2 $(el)s" | tee -a $log
  timeout $(( limit - 15 - $(el) )) $mok bench --precision $2 --direction $1 --iterations 10 >> $log 2>&1
  echo "rc=$?" >> $log
}
for job in ${JOBS:-backward:mxfp8 forward:mxfp8 backward:fp8_block backward:nvfp4 forward:nvfp4 forward:fp8_block}; do
  bench ${job%%:*} ${job##*:}
done
echo "end $(el)s"
grep -E "^\| |^---" $log | cut -c1-330
