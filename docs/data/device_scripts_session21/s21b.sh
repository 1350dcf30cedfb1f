#!/usr/bin/env bash
# Session 21, call 2 (one H200): the backward's first measurements. Build; the backward suite and
# memcheck of it; mok bench --direction backward on every standard shape; PyTorch's autograd
# backward of the same pipeline; the forward bench for the forward/backward ratio.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-200} "$@" > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|^\[       OK|^\[  SKIPPED|ERROR SUMMARY' /tmp/$n.log | tee -a $T; grep -B3 -A14 "Failure" /tmp/$n.log | head -60 >> $T; }
run_test backward build-gpu/tests/test_moe_backward_gpu
timeout 200 build-gpu/mok bench --direction backward --iterations 20 > $OUT/bench_backward.txt 2>&1; echo "bench backward rc=$? $(el)s"
cat $OUT/bench_backward.txt
timeout 200 python3 bench/torch_moe_forward.py --direction backward --iterations 10 > $OUT/torch_backward.txt 2>&1; echo "torch backward rc=$? $(el)s"
cat $OUT/torch_backward.txt | tail -8
MOK_WAIT_SECONDS=120 TL=240 run_test memcheck_backward compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/test_moe_backward_gpu --gtest_filter='*Skewed*:*Refuses*'
