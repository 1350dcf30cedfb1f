#!/usr/bin/env bash
# Session 17, call 5 (one H200): 79014c2 (the row copy on the GEMM CTAs' idle producer warps,
# --producer-copy 1) against the same binary without it: forward and megakernel suites, then EP = 1
# --graph 1 three alternating rounds.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-240} env "$@" build-gpu/tests/$n > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' /tmp/$n.log | tee -a $T; grep -B3 -A12 "Failure" /tmp/$n.log | head -40 >> $T; }
timeout 30 build-gpu/mok run --preset tiny > /tmp/run.log 2>&1; echo "mok run rc=$? $(el)s" | tee -a $T; tail -1 /tmp/run.log | tee -a $T
run_test test_forward_gpu
TL=200 run_test test_moe_forward_gpu
for r in 1 2 3; do for v in 0 1; do
  [ $(el) -gt 480 ] && break 2
  echo "### producer-copy $v round $r" >> $OUT/bench.log
  timeout 60 build-gpu/mok bench --preset all --iterations 20 --graph 1 --producer-copy $v >> $OUT/bench.log 2>&1; echo "pc$v r$r rc=$? $(el)s"
done; done
awk '/^### /{h=$0; n=0} /^\| (dsv3|mok-default|qwen3-30b|fine) \|/{n++; if (n<=5) {m=split($0,a,"|"); print h, a[2], a[3], a[5], a[15]}}' $OUT/bench.log
