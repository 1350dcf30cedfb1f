#!/usr/bin/env bash
# Session 27, call 4 (one H200): fp8_block with its scales loaded a k-block ahead and the vectorised weight quantizer: its suite, the BF16 forward's
# output digests against e7fbf6e's (the engine and program changes must move no BF16 bit),
# `mok run --precision fp8_block`, `mok bench --precision fp8_block` on the standard shapes, then
# the BF16 forward suites.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
bash scripts/gpu_build.sh || exit 1
echo "build: $(( $(date +%s) - t0 )) s"
mkdir -p $OUT
timeout 240 build-gpu/tests/test_fp8_block_gpu 2>&1 | tee $OUT/test_fp8_block_s27d.txt | grep -E "^\[ fp8|OK \]|FAILED|Failure|error|Expected|Which is|first at|differ|scale of|row [0-9]" | head -40
echo "fp8 suite: $(( $(date +%s) - t0 )) s"
timeout 120 build-gpu/forward_digests > $OUT/digests_s27d.txt 2>&1
if diff -q $OUT/digests_s27d.txt docs/data/session20/digests_e7fbf6e.txt >/dev/null; then echo "DIGESTS IDENTICAL to e7fbf6e ($(wc -l < $OUT/digests_s27d.txt) lines)"; else echo "DIGESTS DIFFER"; diff $OUT/digests_s27d.txt docs/data/session20/digests_e7fbf6e.txt | head -10; fi
timeout 60 build-gpu/mok run --preset tiny --precision fp8_block 2>&1 | grep -E "GPU|passed|FAIL" | head
timeout 200 build-gpu/mok bench --precision fp8_block --iterations 10 2>&1 | tee $OUT/bench_fp8_block_s27d.txt | tail -8
echo "bench: $(( $(date +%s) - t0 )) s"
echo "total: $(( $(date +%s) - t0 )) s"
