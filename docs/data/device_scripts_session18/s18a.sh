#!/usr/bin/env bash
# Session 18, call 1 (one H200): the stage probes (the megakernel without its GEMM loads, without
# its MMAs, without both) on every standard shape: default routing and row path, balanced routing,
# the other row path; the new test first.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-240} build-gpu/tests/$n "$@" > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' /tmp/$n.log | tee -a $T; grep -B3 -A12 "Failure" /tmp/$n.log | head -40 >> $T; }
timeout 30 build-gpu/mok run --preset tiny > /tmp/run.log 2>&1; echo "mok run rc=$? $(el)s" | tee -a $T; tail -1 /tmp/run.log | tee -a $T
run_test test_moe_forward_gpu --gtest_filter='*StageProbes*:*Rejects*:*Profile*'
run_test test_forward_gpu
B=$OUT/bench_probes.log
echo "### default" >> $B
timeout 150 build-gpu/mok bench --preset all --iterations 20 --graph 1 --stage-probes 1 >> $B 2>&1; echo "default rc=$? $(el)s"
echo "### balanced" >> $B
timeout 150 build-gpu/mok bench --preset all --iterations 20 --graph 1 --stage-probes 1 --routing balanced >> $B 2>&1; echo "balanced rc=$? $(el)s"
for s in "dsv3 8192 gather" "qwen3-30b 8192 gather" "fine 4096 copy" "dsv3 4096 gather"; do
  set -- $s
  [ $(el) -gt 480 ] && break
  echo "### $1 $2 row path $3" >> $B
  timeout 60 build-gpu/mok bench --preset $1 --tokens $2 --iterations 20 --graph 1 --stage-probes 1 --row-path $3 >> $B 2>&1; echo "$1 $3 rc=$? $(el)s"
done
grep -E "^###|^\| (dsv3|mok-default|qwen3-30b|fine) \| [0-9]+ \| [0-9.]+ \(" $B
