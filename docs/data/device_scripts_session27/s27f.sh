#!/usr/bin/env bash
# Session 27, call 6 (one H200): fp8_block's dispatch quantizer by rows (16 blocks in flight per
# half-warp, no integer division per block): its suite, then `mok bench --precision fp8_block
# --breakdown 1` on qwen3-30b 8k and dsv3 8k with the automatic dispatch CTAs and with twice as
# many, then every standard shape.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh || exit 1
echo "build $(el)s"
timeout 120 build-gpu/tests/test_fp8_block_gpu 2>&1 | tee $OUT/test_fp8_block_s27f.txt | grep -E "OK \]|FAILED|Failure" | head -20
for sh in "qwen3-30b 8192 16 32" "dsv3 8192 8 16"; do set -- $sh
  for n in $3 $4; do
    echo "== $1 $2 dispatch CTAs $n"
    timeout 100 build-gpu/mok bench --precision fp8_block --preset $1 --tokens $2 --iterations 10 --breakdown 1 --dispatch-ctas $n 2>&1 | grep "^| [a-z]" | grep -v "^| shape\|^| forward"
  done
done
echo "bench $(el)s"
timeout 200 build-gpu/mok bench --precision fp8_block --iterations 20 2>&1 | tee $OUT/bench_fp8_block_s27f.txt | tail -6
echo "total $(el)s"
