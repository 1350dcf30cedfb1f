#!/usr/bin/env bash
# Session 22, call 3 (one H200): the emulated EP backward. Build; forward digests; the backward
# suites (single GPU and emulated EP) and the emulated EP forward suite; memcheck and racecheck of
# a two-rank group; mok bench --direction backward (the runner moved: no change expected).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
timeout 150 build-gpu/forward_digests > $OUT/digests_head.txt 2>&1; echo "digests rc=$? $(el)s"
if cmp -s docs/data/session20/digests_e7fbf6e.txt $OUT/digests_head.txt; then echo "DIGESTS IDENTICAL to e7fbf6e"; else echo "DIGESTS DIFFER"; fi
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-200} "$@" > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|ERROR SUMMARY|^\[       OK' /tmp/$n.log | tee -a $T; grep -B3 -A14 "Failure" /tmp/$n.log | head -60 | tee -a $T; cp /tmp/$n.log $OUT/; }
run_test ep_backward build-gpu/tests/test_emulated_ep_backward_gpu
run_test backward build-gpu/tests/test_moe_backward_gpu
run_test ep_forward build-gpu/tests/test_emulated_ep_gpu
MOK_WAIT_SECONDS=120 TL=200 run_test memcheck_ep_backward compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/test_emulated_ep_backward_gpu --gtest_filter='*TwoRanks*'
MOK_WAIT_SECONDS=120 TL=200 run_test racecheck_ep_backward compute-sanitizer --tool racecheck --error-exitcode 1 build-gpu/tests/test_emulated_ep_backward_gpu --gtest_filter='*TwoRanks*'
[ $(el) -lt 450 ] && { timeout 100 build-gpu/mok bench --direction backward --iterations 10 > $OUT/bench_backward.txt 2>&1; echo "bench rc=$? $(el)s"; grep "^| [dmqf]" $OUT/bench_backward.txt | head -5 | cut -d'|' -f2,3,5,8,13; }
