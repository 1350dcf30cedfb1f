#!/usr/bin/env bash
# Session 43, one GPU (carry [".device"] after `bash scripts/device_ab_base.sh make 6bc8cbb base`
# with the 32-wave lag committed on top): the lag from 32 waves against 16 (6bc8cbb)
# on qwen3-30b 8k and fine 4k, fp8_block and BF16, two alternating rounds.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-150}
source scripts/device_steps.sh
(bash scripts/device_ab_base.sh build base > $OUT/base_build.txt 2>&1) &
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_TESTS=OFF -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ > $OUT/configure.log 2>&1
cmake --build build-gpu -j 8 --target mok > $OUT/build.log 2>&1 || { grep -E "error|FAILED" -A3 $OUT/build.log | head; exit 1; }
wait
echo "builds $(el)s"
BASE=$(tail -1 $OUT/base_build.txt)
for round in 1 2; do
  for shape in "qwen3-30b 8192" "fine 4096"; do
    for b in "lag16 $BASE" "lag32 build-gpu/mok"; do
      set -- $b $shape
      [ $(el) -gt $(( limit - 15 )) ] && continue
      printf '%-6s ' $1
      timeout $(( limit - $(el) )) $2 bench --precision fp8_block --direction backward --preset $3 \
        --tokens $4 --iterations 10 2>&1 | grep -E '^\| [a-z0-9-]+ \| [0-9]' | cut -c1-110
    done
  done
done
echo "end $(el)s"
