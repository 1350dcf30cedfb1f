#!/usr/bin/env bash
# Session 16, call 7 (one H200): the second review mends (graph-capture helper, a_box_rows).
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
for n in test_forward_gpu test_emulated_ep_gpu; do
  timeout 90 build-gpu/tests/$n > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $OUT/tests.log
  grep -E '^\[  PASSED|^\[  FAILED|Failure' -A3 /tmp/$n.log | tee -a $OUT/tests.log
done
timeout 30 build-gpu/mok run --preset tiny > /tmp/run.log 2>&1; echo "mok run rc=$? $(el)s" | tee -a $OUT/tests.log; tail -1 /tmp/run.log | tee -a $OUT/tests.log
timeout 40 build-gpu/mok bench --preset fine --iterations 20 --graph 1 > $OUT/bench_graph.log 2>&1; echo "bench graph rc=$? $(el)s" | tee -a $OUT/tests.log
timeout 60 build-gpu/mok bench --ep 2 --preset fine --iterations 10 > $OUT/bench_ep2.log 2>&1; echo "bench ep2 rc=$? $(el)s" | tee -a $OUT/tests.log
grep -E "^\| fine" $OUT/bench_graph.log $OUT/bench_ep2.log | cut -c1-150
