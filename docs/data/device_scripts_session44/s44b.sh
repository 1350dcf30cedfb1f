#!/usr/bin/env bash
# Session 44, one GPU (carry [".device"]; run with the probe patch .device/probe.diff applied to
# the working tree, which never landed): where the dgrad-down epilogue's time goes. The patch reads
# MOK_PROBE into bits 8-10 of the backward's profile flags (bits 4-7 are the staged backward's
# kinds: the first version of this call shifted into them, ran the wrong kinds and hung): 1 = the epilogue's act and g | u loads replaced by
# constants, 2 = its dgu / act_scaled (and fp8_block's codes) stores dropped, 3 = both, 4 = no
# epilogue at all (only the publish). BF16 and fp8_block beside each other in every run. Without
# the stores the later tiles multiply stale operands (less power drawn): the epilogue's own timer
# (--breakdown 1) is the reading, not the total.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-300}
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,power.limit,memory.total --format=csv,noheader
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DMOK_TESTS=OFF -DCMAKE_CXX_COMPILER=/usr/bin/g++ \
  -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ > $OUT/configure.log 2>&1
cmake --build build-gpu -j 16 --target mok > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
probe() {  # PROBE PRESET TOKENS [ARGS]
  [ $(el) -gt $(( limit - 25 )) ] && { echo "skip $*"; return; }
  local f=$OUT/probe_$1.txt v=$1 preset=$2 tokens=$3
  shift 3
  echo "--- probe $v $preset $tokens $*" >> $f
  MOK_PROBE=$v timeout $(( limit - $(el) )) build-gpu/mok bench --precision fp8_block \
    --direction backward --preset $preset --tokens $tokens --iterations 10 "$@" > /tmp/p.txt 2>&1
  cat /tmp/p.txt >> $f
  printf 'probe %s ' $v; grep -E '^\| [a-z0-9-]+ \| [0-9]|^\| [a-z0-9-]+ T = ' /tmp/p.txt | cut -c1-200
}
for v in 0 1 2 3 4; do probe $v qwen3-30b 8192 --breakdown 1; done
for v in 0 4 0 4; do probe $v dsv3 4096; done
echo "end $(el)s"
