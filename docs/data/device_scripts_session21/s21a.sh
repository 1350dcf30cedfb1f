#!/usr/bin/env bash
# Session 21, call 1 (one H200): the first backward megakernel. Build, the backward suite, the
# forward suites (the engine's new program hooks) and the forward digests against session 20's.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
timeout 150 build-gpu/forward_digests > $OUT/digests_head.txt 2>&1; echo "digests rc=$? $(el)s"
if cmp -s docs/data/session20/digests_e7fbf6e.txt $OUT/digests_head.txt; then echo "DIGESTS IDENTICAL to e7fbf6e"; else echo "DIGESTS DIFFER"; diff docs/data/session20/digests_e7fbf6e.txt $OUT/digests_head.txt | head -10; fi
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-200} "$@" > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|^\[       OK|^\[  SKIPPED|ERROR SUMMARY' /tmp/$n.log | tee -a $T; grep -B3 -A14 "Failure\|error" /tmp/$n.log | head -80 >> $T; }
MOK_WAIT_SECONDS=10 TL=240 run_test backward build-gpu/tests/test_moe_backward_gpu
tail -c 6000 /tmp/backward.log
run_test forward build-gpu/tests/test_moe_forward_gpu
run_test emulated build-gpu/tests/test_emulated_ep_gpu
