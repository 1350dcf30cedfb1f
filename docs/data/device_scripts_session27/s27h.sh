#!/usr/bin/env bash
# Session 27, call 8 (one H200): fp8_block's mainloop in 128-column slices (one 64-register
# partial, two waits per k-block; setmaxnreg 40 / 232) against call 7's 64-column slices: the
# fp8_block suite and `mok bench --precision fp8_block` on every standard shape.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh || exit 1
echo "build $(el)s"
timeout 150 build-gpu/mok bench --precision fp8_block --iterations 20 2>&1 | tee $OUT/bench_fp8_block_s27h.txt | grep "^|"
echo "bench $(el)s"
timeout 100 build-gpu/tests/test_fp8_block_gpu 2>&1 | grep -E "OK \]|FAILED|Failure" | head -20
echo "total $(el)s"
