#!/usr/bin/env bash
# Session 31, for the next device call (one H200): what session 31 landed unrun: the fp8_block
# training path (its GPU test, the fp8_block forward test's new context checks, the bf16 backward
# and forward suites as regressions), then `mok bench --precision fp8_block --direction backward`
# on the standard shapes (backward and step of both precisions, alternating rounds).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(el)s"
log=$OUT/s31a.log
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  local s=$(date +%s)
  timeout $limit "$@" > /tmp/run.txt 2>&1; local rc=$?
  echo "=== $name" >> $log; cat /tmp/run.txt >> $log
  printf '%-30s rc=%-3s %4ss %s\n' "$name" $rc $(( $(date +%s)-s )) \
    "$(grep -hoE '\[  PASSED  \] [0-9]+ tests?|\[  FAILED  \] [0-9]+ tests?' /tmp/run.txt | tr '\n' ' ')"
  [ $rc -ne 0 ] && grep -E "Failure|Expected|Which is|differs|exception|FAIL|error" /tmp/run.txt | head -8
}
T=build-gpu/tests
run fp8_backward 300 $T/test_fp8_block_backward_gpu
grep -F "[ fp8_block backward ]" /tmp/run.txt | head -20
run fp8_forward 150 $T/test_fp8_block_gpu
run moe_backward 200 $T/test_moe_backward_gpu
run emulated_bwd 120 $T/test_emulated_ep_backward_gpu
echo "before bench $(el)s"
timeout $(( 570 - $(el) )) build-gpu/mok bench --precision fp8_block --direction backward \
  --iterations 10 --json $OUT/bench_fp8_backward.json > $OUT/bench_fp8_backward.txt 2>&1
echo "bench rc=$? $(el)s"
tail -20 $OUT/bench_fp8_backward.txt
