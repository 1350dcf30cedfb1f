#!/usr/bin/env bash
# Session 28, call 3 (one H200): s28b's two failures mended (the automatic dispatch CTAs capped
# by a small grid's share; the fuzz draws no dispatch options on the gather path) or probed (the
# rebuilt emulated group, with its NaN count), then the sanitizer matrix: memcheck, racecheck,
# synccheck and initcheck on the forward and backward (tiny, EP = 1), an emulated EP group of two
# (forward and backward), the fp8_block forward, and, as time allows, one standard shape
# (qwen3-30b: the forward at T = 2048, the backward at T = 4096).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh || exit 1
echo "build $(el)s"
log=$OUT/s28c.log
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  local s=$(date +%s)
  timeout $limit "$@" > /tmp/run.txt 2>&1; local rc=$?
  echo "=== $name" >> $log; cat /tmp/run.txt >> $log
  printf '%-34s rc=%-3s %4ss %s\n' "$name" $rc $(( $(date +%s)-s )) \
    "$(grep -hoE 'ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ errors?, [0-9]+ warnings?\)|\[  PASSED  \] [0-9]+ tests?|\[  FAILED  \] [0-9]+ tests?' /tmp/run.txt | tr '\n' ' ')"
  [ $rc -ne 0 ] && grep -E "Failure|Expected|Which is|differs|exception|Invalid|Uninitialized|Race|Barrier" /tmp/run.txt | head -8
}
T=build-gpu/tests
run fuzz_200 240 $T/test_megakernel_fuzz_gpu
grep -h MegakernelFuzzGpu: /tmp/run.txt
run emulated_fwd_stops 90 $T/test_emulated_ep_gpu --gtest_filter='*Stopped*'
echo "tests $(el)s"
export MOK_WAIT_SECONDS=300
S="compute-sanitizer --error-exitcode 1 --tool"
for tool in memcheck racecheck synccheck initcheck; do
  run "$tool fwd tiny" 120 $S $tool $T/test_forward_gpu --gtest_filter='ForwardGpu/1.MatchesTheReferenceOnRandomAndOddRoutings'
  run "$tool bwd tiny" 120 $S $tool $T/test_moe_backward_gpu --gtest_filter='*SkewedRoutingZeroWeightsAndAnEmptyBatch'
  run "$tool emulated ep2 fwd+bwd" 150 $S $tool $T/test_emulated_ep_backward_gpu --gtest_filter='*TwoRanks*'
  run "$tool fp8_block fwd" 120 $S $tool $T/test_fp8_block_gpu --gtest_filter='*ForwardMatchesTheQuantizedReference'
  [ $(el) -gt 500 ] && break
done
for tool in memcheck racecheck synccheck initcheck; do
  [ $(el) -gt 480 ] && break
  run "$tool qwen3-30b fwd 2048" 100 $S $tool $T/test_forward_gpu --gtest_filter='ForwardGpu/1.StandardShapeAgreesWithTheCublasPipeline'
  [ $(el) -gt 480 ] && break
  run "$tool qwen3-30b bwd 4096" 100 $S $tool $T/test_backward_sampled_gpu --gtest_filter='*Qwen3_30b*'
done
echo "total $(el)s"
