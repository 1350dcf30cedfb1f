#!/usr/bin/env bash
# Session 17, call 1 (one H200): head (gate/up epilogue through smem + TMA stores, deferred act
# counter) vs base (07c888f): GPU suites on head, then EP = 1 --graph 1 three alternating rounds,
# then one --breakdown 1 each.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
(bash scripts/device_ab_base.sh build base > /tmp/base_build.out 2>&1; echo "base build rc=$?") &
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
wait; tail -n 2 /tmp/base_build.out; echo "builds $(el)s"
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-240} env "$@" build-gpu/tests/$n > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' /tmp/$n.log | tee -a $T; grep -B3 -A12 "Failure" /tmp/$n.log | head -40 >> $T; }
timeout 30 build-gpu/mok run --preset tiny > /tmp/run.log 2>&1; echo "mok run rc=$? $(el)s" | tee -a $T; tail -1 /tmp/run.log | tee -a $T
run_test test_primitives_gpu
run_test test_forward_gpu
run_test test_emulated_ep_gpu
TL=200 run_test test_moe_forward_gpu
bin() { case $1 in head) echo build-gpu/mok;; *) echo /tmp/$1/b/mok;; esac; }
for r in 1 2 3; do for v in head base; do
  echo "### $v graph round $r" >> $OUT/bench_graph.log
  timeout 60 $(bin $v) bench --preset all --iterations 20 --graph 1 >> $OUT/bench_graph.log 2>&1; echo "graph $v$r rc=$? $(el)s"
done; done
for v in head base; do
  [ $(el) -gt 500 ] && break
  echo "### $v breakdown" >> $OUT/bench_breakdown.log
  timeout 80 $(bin $v) bench --preset all --iterations 10 --graph 1 --breakdown 1 >> $OUT/bench_breakdown.log 2>&1; echo "breakdown $v rc=$? $(el)s"
done
awk '/^### /{h=$0; n=0} /^\| (dsv3|mok-default|qwen3-30b|fine) \|/{n++; if (n<=5) {m=split($0,a,"|"); print h, a[2], a[3], a[5]}}' $OUT/bench_graph.log
