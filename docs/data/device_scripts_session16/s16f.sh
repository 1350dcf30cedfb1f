#!/usr/bin/env bash
# Session 16, call 6 (one H200): the review mends: primitives (thread_index_here) and forward suites.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
for n in test_primitives_gpu test_forward_gpu; do
  timeout 60 build-gpu/tests/$n > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $OUT/tests.log
  grep -E '^\[  PASSED|^\[  FAILED|Failure' -A3 /tmp/$n.log | tee -a $OUT/tests.log
done
timeout 30 build-gpu/mok run --preset tiny > /tmp/run.log 2>&1; echo "mok run rc=$? $(el)s" | tee -a $OUT/tests.log; tail -1 /tmp/run.log | tee -a $OUT/tests.log
