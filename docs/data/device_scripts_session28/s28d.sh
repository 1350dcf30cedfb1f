#!/usr/bin/env bash
# Session 28, call 4 (one H200): the gather path's full barrier with one uniform arrival per
# producer thread (129 per stage), against synccheck's "barrier overflow" of s28c; the emulated
# stop test with every rank's weights (its healthy run read past one rank's weights); the forward
# digests against e7fbf6e's; the fuzz and the forward, emulated and backward suites.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh || exit 1
echo "build $(el)s"
log=$OUT/s28d.log
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  local s=$(date +%s)
  timeout $limit "$@" > /tmp/run.txt 2>&1; local rc=$?
  echo "=== $name" >> $log; cat /tmp/run.txt >> $log
  printf '%-34s rc=%-3s %4ss %s\n' "$name" $rc $(( $(date +%s)-s )) \
    "$(grep -hoE 'ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ errors?, [0-9]+ warnings?\)|\[  PASSED  \] [0-9]+ tests?|\[  FAILED  \] [0-9]+ tests?' /tmp/run.txt | tr '\n' ' ')"
  [ $rc -ne 0 ] && grep -E "Failure|Expected|Which is|differs|exception|Barrier|at void|by thread" /tmp/run.txt | head -8
}
T=build-gpu/tests
export MOK_WAIT_SECONDS=300
S="compute-sanitizer --error-exitcode 1 --tool"
run "synccheck fwd tiny" 120 $S synccheck $T/test_forward_gpu --gtest_filter='ForwardGpu/1.MatchesTheReferenceOnRandomAndOddRoutings'
run "synccheck bwd tiny" 120 $S synccheck $T/test_moe_backward_gpu --gtest_filter='*SkewedRoutingZeroWeightsAndAnEmptyBatch'
run "synccheck emulated ep2 fwd+bwd" 120 $S synccheck $T/test_emulated_ep_backward_gpu --gtest_filter='*TwoRanks*'
run "synccheck qwen3-30b fwd 2048" 100 $S synccheck $T/test_forward_gpu --gtest_filter='ForwardGpu/1.StandardShapeAgreesWithTheCublasPipeline'
run "synccheck qwen3-30b bwd 4096" 100 $S synccheck $T/test_backward_sampled_gpu --gtest_filter='*Qwen3_30b*'
unset MOK_WAIT_SECONDS
build-gpu/forward_digests > $OUT/digests_s28d.txt 2>&1
diff -q $OUT/digests_s28d.txt docs/data/session20/digests_e7fbf6e.txt >/dev/null && echo "DIGESTS IDENTICAL to e7fbf6e" || echo "DIGESTS DIFFER"
run emulated_fwd 120 $T/test_emulated_ep_gpu
run fuzz_200 200 $T/test_megakernel_fuzz_gpu
grep -h MegakernelFuzzGpu: /tmp/run.txt
run forward 120 $T/test_forward_gpu
run moe_forward 150 $T/test_moe_forward_gpu
run emulated_bwd 120 $T/test_emulated_ep_backward_gpu
echo "total $(el)s"
