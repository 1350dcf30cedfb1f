#!/usr/bin/env bash
# Session 24, call 1 (one H200): recomputing g | u in the backward. Build; the backward suites
# (keep and recompute, bitwise), the forward suite (contexts that keep nothing), memcheck and
# racecheck of the recomputing backward; then the remaining GPU suites while time is left.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
mkdir -p /tmp/logs; T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-200} "$@" > /tmp/logs/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED|ERROR SUMMARY|RACECHECK SUMMARY' /tmp/logs/$n.log | tee -a $T; grep -B3 -A14 "Failure" /tmp/logs/$n.log | head -40 | tee -a $T; }
first="test_moe_backward_gpu test_emulated_ep_backward_gpu test_ep_nccl_backward_gpu test_moe_forward_gpu"
for n in $first; do run_test $n build-gpu/tests/$n; done
export MOK_WAIT_SECONDS=60
TL=120 run_test memcheck_recompute compute-sanitizer --tool memcheck --report-api-errors no build-gpu/tests/test_moe_backward_gpu --gtest_filter='*GraphReplay*'
TL=150 run_test racecheck_recompute compute-sanitizer --tool racecheck build-gpu/tests/test_moe_backward_gpu --gtest_filter='*GraphReplay*'
unset MOK_WAIT_SECONDS
for t in build-gpu/tests/test_*_gpu; do n=$(basename $t); case " $first " in *" $n "*) continue;; esac; [ $(el) -lt 530 ] && run_test $n $t; done
echo "== tests"; cat $T | grep -v "^\[  PASSED" | head -50
tar czf $OUT/logs.tgz -C /tmp logs
