#!/usr/bin/env bash
# Session 28, call 2 (one H200): issue 33's new GPU tests (the megakernel fuzz against the staged
# paths, non-finite inputs forward and backward, the rebuilt group after a stopped rank, a stop
# before the combine), the forward digests against e7fbf6e's (the test hook added to the down
# epilogue changes no bit), then the sanitizer matrix: memcheck, racecheck, synccheck and
# initcheck on the forward and backward (tiny, EP = 1), an emulated EP group of two (forward and
# backward), the fp8_block forward, and one standard shape (qwen3-30b: forward T = 2048,
# backward T = 4096).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh || exit 1
echo "build $(el)s"
log=$OUT/s28b.log
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  local s=$(date +%s)
  timeout $limit "$@" > /tmp/run.txt 2>&1; local rc=$?
  cat /tmp/run.txt >> $log
  printf '%-44s rc=%-3s %4ss %s\n' "$name" $rc $(( $(date +%s)-s )) \
    "$(grep -hoE 'ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ errors?, [0-9]+ warnings?\)|\[  PASSED  \] [0-9]+ tests?|\[  FAILED  \] [0-9]+ tests?' /tmp/run.txt | tr '\n' ' ')"
  [ $rc -ne 0 ] && grep -E "Failure|Expected|Which is|error|Error" /tmp/run.txt | head -12
}
T=build-gpu/tests
run fuzz_200 200 $T/test_megakernel_fuzz_gpu
grep MegakernelFuzzGpu: /tmp/run.txt
run nonfinite 60 $T/test_moe_backward_gpu --gtest_filter='*NonFinite*'
run emulated_fwd_stops 90 $T/test_emulated_ep_gpu --gtest_filter='*Stopped*'
run emulated_bwd_stops 90 $T/test_emulated_ep_backward_gpu --gtest_filter='*Stopped*'
run moe_backward_all 200 $T/test_moe_backward_gpu
run backward_sampled_all 200 $T/test_backward_sampled_gpu
build-gpu/forward_digests > $OUT/digests_s28b.txt 2>&1
diff -q $OUT/digests_s28b.txt docs/data/session20/digests_e7fbf6e.txt >/dev/null && echo "DIGESTS IDENTICAL to e7fbf6e" || echo "DIGESTS DIFFER"
echo "tests $(el)s"
export MOK_WAIT_SECONDS=300
cs() { compute-sanitizer --tool $1 --error-exitcode 1 "${@:2}"; }
for tool in memcheck racecheck synccheck initcheck; do
  run "$tool fwd tiny" 150 cs $tool $T/test_forward_gpu --gtest_filter='ForwardGpu/1.MatchesTheReferenceOnRandomAndOddRoutings'
  run "$tool bwd tiny" 150 cs $tool $T/test_moe_backward_gpu --gtest_filter='*SkewedRoutingZeroWeightsAndAnEmptyBatch'
  run "$tool emulated ep2 fwd+bwd" 150 cs $tool $T/test_emulated_ep_backward_gpu --gtest_filter='*TwoRanks*'
  run "$tool fp8_block fwd" 150 cs $tool $T/test_fp8_block_gpu --gtest_filter='*ForwardMatchesTheQuantizedReference'
  echo "$tool tiny done $(el)s"
  [ $(el) -gt 520 ] && break
done
echo "total $(el)s"
