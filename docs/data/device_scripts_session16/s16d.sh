#!/usr/bin/env bash
# Session 16, call 4 (two H200s): the final device code (f1a3283 + two A maps): every GPU suite,
# compute-sanitizer memcheck and racecheck, then EP = 2 final vs base (f1a3283) two rounds.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
(bash scripts/device_ab_base.sh build base > /tmp/base_build.out 2>&1; echo "base build rc=$?") &
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
wait; echo "builds $(el)s"
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-240} env "$@" build-gpu/tests/$n > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' /tmp/$n.log | tee -a $T; grep -B3 -A12 "Failure" /tmp/$n.log | head -40 >> $T; }
timeout 30 build-gpu/mok run --preset tiny > /tmp/run.log 2>&1; echo "mok run rc=$? $(el)s" | tee -a $T; tail -1 /tmp/run.log | tee -a $T
run_test test_primitives_gpu
run_test test_schedule_gpu
run_test test_formats_gpu
run_test test_forward_gpu
run_test test_ep_nccl_gpu
timeout 100 bash scripts/ep_processes.sh 2 > /tmp/epp.log 2>&1; echo "ep_processes rc=$? $(el)s" | tee -a $T; grep -E "rank|PASSED|FAILED" /tmp/epp.log | tail -6 | tee -a $T
run_test test_emulated_ep_gpu
TL=180 run_test test_moe_forward_gpu
san() { local bin=$1 tool=$2 filter=$3 lim=$4; MOK_WAIT_SECONDS=120 timeout $lim compute-sanitizer --tool $tool --error-exitcode 1 build-gpu/tests/$bin --gtest_filter="$filter" > /tmp/san.log 2>&1; echo "$tool $filter rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|ERROR SUMMARY|RACECHECK SUMMARY|hazard' /tmp/san.log | head -5 | tee -a $T; }
san test_moe_forward_gpu memcheck 'MoeForwardGpu.EqualsTheStagedForwardBitForBitUnderEveryOption' 130
san test_moe_forward_gpu racecheck 'MoeForwardGpu.BitwiseIdenticalAcross20RunsWithInjectedDispatchDelays' 130
for r in 1 2; do for v in final base; do
  b=build-gpu/mok; [ $v = base ] && b=/tmp/base/b/mok
  [ $(el) -gt 480 ] && break 2
  echo "### $v round $r" >> $OUT/bench_ep2.log
  timeout 40 $b bench --ep 2 --preset all --iterations 20 >> $OUT/bench_ep2.log 2>&1; echo "ep2 $v$r rc=$? $(el)s"
done; done
awk '/^### /{h=$0; n=0} /^\| (dsv3|mok-default|qwen3-30b|fine) \|/{n++; if (n<=5) {m=split($0,a,"|"); print h, a[2], a[3], a[4]}}' $OUT/bench_ep2.log
