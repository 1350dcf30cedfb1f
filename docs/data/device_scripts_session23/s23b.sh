#!/usr/bin/env bash
# Session 23, call 2 (one H200): the staged breakdown, one process per GPU with one rank (the
# process path of EpForward and EpBackward: ncclCommInitRank, open_window, the teardown barrier),
# the suites call 1 left out, memcheck (NCCL's own probing API errors not reported) and racecheck
# of the one-rank NCCL backward.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-200} "$@" > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|ERROR SUMMARY|RACECHECK SUMMARY' /tmp/$n.log | tee -a $T; grep -B3 -A14 "Failure" /tmp/$n.log | head -40 | tee -a $T; }
run_test test_ep_nccl_backward_gpu build-gpu/tests/test_ep_nccl_backward_gpu
run_test test_moe_backward_gpu build-gpu/tests/test_moe_backward_gpu
bash scripts/ep_processes.sh 1 build-gpu/tests/test_ep_nccl_backward_gpu 2>&1 | tee -a $T; echo "processes backward rc=$? $(el)s" | tee -a $T
bash scripts/ep_processes.sh 1 2>&1 | tee -a $T; echo "processes forward rc=$? $(el)s" | tee -a $T
TL=150 run_test memcheck_ep_nccl_backward compute-sanitizer --tool memcheck --report-api-errors no build-gpu/tests/test_ep_nccl_backward_gpu --gtest_filter='*GraphReplay*:*Refused*'
TL=150 run_test racecheck_ep_nccl_backward compute-sanitizer --tool racecheck build-gpu/tests/test_ep_nccl_backward_gpu --gtest_filter='*GraphReplay*'
timeout 150 build-gpu/mok bench --direction backward --breakdown 1 --iterations 10 > $OUT/bench_backward_breakdown.txt 2>&1; echo "bench rc=$? $(el)s"
run_test test_backward_sampled_gpu build-gpu/tests/test_backward_sampled_gpu
[ $(el) -lt 450 ] && run_test test_moe_forward_gpu build-gpu/tests/test_moe_forward_gpu
cp $T $OUT/
echo "== tests"; grep -v "^\[  PASSED" $T | head -40
echo "== breakdown"; sed -n '/Breakdown/,$p' $OUT/bench_backward_breakdown.txt | cut -d'|' -f2-7
grep "^| [dmqf]" $OUT/bench_backward_breakdown.txt | head -5 | cut -d"|" -f2,3,5,14,15
