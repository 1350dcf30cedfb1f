#!/usr/bin/env bash
# Session 16, call 1 (two H200s): HEAD (PDL + two A maps) vs pdl (PDL only) vs base (f1a3283):
# the GPU suites on HEAD, EP = 1 (GPU 0) two rounds + one breakdown each of head/base (GPU 1), EP = 2 two rounds.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
(bash scripts/device_ab_base.sh build base > /tmp/base_build.out 2>&1; echo "base build rc=$?") &
(bash scripts/device_ab_base.sh build pdl > /tmp/pdl_build.out 2>&1; echo "pdl build rc=$?") &
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
wait; tail -1 /tmp/base_build.out /tmp/pdl_build.out
echo "builds $(el)s"
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-240} env "$@" build-gpu/tests/$n > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED|^dependent launch' /tmp/$n.log | tee -a $T; grep -B3 -A12 "Failure" /tmp/$n.log | head -40 >> $T; }
bin() { case $1 in head) echo build-gpu/mok;; *) echo /tmp/$1/b/mok;; esac; }
# EP = 1 rounds on GPU 0 while GPU 1 runs one breakdown per variant (schedule time alone)
( for r in 1 2; do for v in head pdl base; do
  echo "### $v round $r" >> $OUT/bench_ep1.log
  CUDA_VISIBLE_DEVICES=0 timeout 60 $(bin $v) bench --preset all --iterations 20 >> $OUT/bench_ep1.log 2>&1; echo "ep1 $v$r rc=$? $(el)s"
done; done ) &
( for v in head base; do
  echo "### $v" >> $OUT/breakdown.log
  CUDA_VISIBLE_DEVICES=1 timeout 100 $(bin $v) bench --preset all --iterations 10 --breakdown 1 >> $OUT/breakdown.log 2>&1; echo "breakdown $v rc=$? $(el)s"
done ) &
wait
for r in 1 2; do for v in head pdl base; do
  echo "### $v round $r" >> $OUT/bench_ep2.log
  timeout 60 $(bin $v) bench --ep 2 --preset all --iterations 20 >> $OUT/bench_ep2.log 2>&1; echo "ep2 $v$r rc=$? $(el)s"
done; done
timeout 30 build-gpu/mok run --preset tiny > /tmp/run.log 2>&1; echo "mok run rc=$? $(el)s" | tee -a $T; tail -1 /tmp/run.log | tee -a $T
run_test test_primitives_gpu
run_test test_schedule_gpu
run_test test_forward_gpu
run_test test_ep_nccl_gpu
timeout 100 bash scripts/ep_processes.sh 2 > /tmp/epp.log 2>&1; echo "ep_processes rc=$? $(el)s" | tee -a $T; grep -E "rank|PASSED|FAILED" /tmp/epp.log | tail -6 | tee -a $T
run_test test_emulated_ep_gpu
TL=200 run_test test_moe_forward_gpu
awk '/^### /{h=$0; n=0} /^\| (dsv3|mok-default|qwen3-30b|fine) \|/{n++; if (n<=5) {m=split($0,a,"|"); print h, a[2], a[3], a[5]}}' $OUT/bench_ep1.log
awk '/^### /{h=$0; n=0} /^\| (dsv3|mok-default|qwen3-30b|fine) \|/{n++; if (n<=5) {m=split($0,a,"|"); print h, a[2], a[3], a[4]}}' $OUT/bench_ep2.log
grep -E "^### " -A0 $OUT/breakdown.log; grep -A8 "Where the time goes" $OUT/breakdown.log | grep -E "^\| (dsv3|mok|qwen|fine)" | cut -d"|" -f2,3,5,9
