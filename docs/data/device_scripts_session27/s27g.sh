#!/usr/bin/env bash
# Session 27, call 7 (one H200): fp8_block with twice the dispatch CTAs by default: its suite,
# the BF16 digests against e7fbf6e's, the emulated EP suite, and `mok bench --precision fp8_block`
# on every standard shape (the table of docs/benchmarks.md).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh || exit 1
echo "build $(el)s"
timeout 100 build-gpu/tests/test_fp8_block_gpu 2>&1 | tee $OUT/test_fp8_block_s27g.txt | grep -E "OK \]|FAILED|Failure|^\[ fp8" | head -20
timeout 100 build-gpu/forward_digests > $OUT/digests_s27g.txt 2>&1
diff -q $OUT/digests_s27g.txt docs/data/session20/digests_e7fbf6e.txt >/dev/null && echo "DIGESTS IDENTICAL to e7fbf6e ($(wc -l < $OUT/digests_s27g.txt) lines)" || echo "DIGESTS DIFFER"
timeout 150 build-gpu/mok bench --precision fp8_block --iterations 20 2>&1 | tee $OUT/bench_fp8_block_s27g.txt | grep "^|"
echo "bench $(el)s"
left=$(( 330 - $(el) )); [ $left -gt 30 ] && timeout $left build-gpu/tests/test_emulated_ep_gpu --gtest_brief=1 2>&1 | tail -2
echo "total $(el)s"
