#!/usr/bin/env bash
# Session 31, second call: the fp8_block backward's dispatch CTAs (d_out is copied and quantized
# there, x copied: ~1.5x the bf16 backward's row work), automatic against twice as many, in
# alternating runs on dsv3 4k and qwen3-30b 8k (the BF16 column of each run is its own yardstick).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(el)s"
b() { build-gpu/mok bench --precision fp8_block --direction backward --iterations 10 "$@" 2>&1 | grep '^|' | tail -1; }
for round in 1 2; do
  echo "round $round $(el)s"
  b --preset dsv3 --tokens 4096
  b --preset dsv3 --tokens 4096 --dispatch-ctas 16
  b --preset qwen3-30b
  b --preset qwen3-30b --dispatch-ctas 32
done
