#!/usr/bin/env bash
# Session 18, call 4 (one H200): dispatch by bulk copies. GPU suites (primitives, megakernel,
# emulated EP, forward), then `mok bench --preset all --graph 1` with and without --dispatch-bulk,
# three alternating rounds; fewer dispatch CTAs with bulk copies; a breakdown of each for dsv3 8k
# and qwen3-30b.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-240} build-gpu/tests/$n "$@" > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' /tmp/$n.log | tee -a $T; grep -B3 -A12 "Failure" /tmp/$n.log | head -40 >> $T; }
timeout 30 build-gpu/mok run --preset tiny > /tmp/run.log 2>&1; echo "mok run rc=$? $(el)s" | tee -a $T; tail -1 /tmp/run.log | tee -a $T
run_test test_primitives_gpu
run_test test_forward_gpu
run_test test_emulated_ep_gpu
TL=200 run_test test_moe_forward_gpu
B=$OUT/bench_bulk.log
for r in 1 2 3; do for v in 0 1; do
  echo "### bulk $v round $r" >> $B
  timeout 60 build-gpu/mok bench --preset all --iterations 20 --graph 1 --dispatch-bulk $v >> $B 2>&1; echo "bulk $v round $r rc=$? $(el)s"
done; done
D=$OUT/bench_bulk_ctas.log
for s in "qwen3-30b 8192 8" "qwen3-30b 8192 12" "dsv3 8192 4" "dsv3 4096 4"; do
  set -- $s
  for v in 1 0; do
    echo "### $1 $2 dispatch CTAs $3 bulk $v" >> $D
    timeout 40 build-gpu/mok bench --preset $1 --tokens $2 --iterations 20 --graph 1 --dispatch-ctas $3 --dispatch-bulk $v >> $D 2>&1; echo "$1 $3 bulk $v rc=$? $(el)s"
  done
done
K=$OUT/bench_bulk_breakdown.log
for s in "dsv3 8192" "qwen3-30b 8192"; do
  set -- $s
  for v in 1 0; do
    [ $(el) -gt 540 ] && break
    echo "### $1 $2 bulk $v breakdown" >> $K
    timeout 60 build-gpu/mok bench --preset $1 --tokens $2 --iterations 10 --graph 1 --breakdown 1 --dispatch-bulk $v >> $K 2>&1; echo "breakdown $1 bulk $v rc=$? $(el)s"
  done
done
awk '/^### /{h=$0} /^\| (dsv3|mok-default|qwen3-30b|fine) \| [0-9]+ \| [0-9]+ \|/{m=split($0,a,"|"); print h, a[2], a[3], a[5]}' $B $D
grep -E "^###|dispatch copy\) \|" $K
