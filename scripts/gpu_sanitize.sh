#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu_build.sh: compute-sanitizer's memcheck, racecheck,
# synccheck and initcheck on the forward and backward megakernels (tiny, EP = 1), an emulated EP
# group of two (forward and backward), the fp8_block, nvfp4 and mxfp8 forwards and backwards, and
# one standard shape (qwen3-30b: the forward at T = 2048, the backward at T = 4096). Prints one line per run
# and a table of the error counts (docs/reliability.md records the last one). TOOLS="memcheck"
# narrows the tools, ONLY="<regex>" the targets by name (e.g. ONLY="mxfp8").
set -uo pipefail
export NCCL_NVLS_ENABLE=0 MOK_WAIT_SECONDS=300  # the kernels run ~100x slower under the tools
T=build-gpu/tests
targets=(
  "forward tiny|$T/test_forward_gpu|ForwardGpu/1.MatchesTheReferenceOnRandomAndOddRoutings"
  "backward tiny|$T/test_moe_backward_gpu|*SkewedRoutingZeroWeightsAndAnEmptyBatch"
  "emulated EP 2|$T/test_emulated_ep_backward_gpu|*TwoRanks*"
  "fp8_block forward|$T/test_fp8_block_gpu|*ForwardMatchesTheQuantizedReference"
  "nvfp4 forward|$T/test_nvfp4_gpu|*ForwardMatchesTheQuantizedReference"
  "mxfp8 forward|$T/test_mxfp8_gpu|*ForwardMatchesTheQuantizedReference"
  "fp8_block backward|$T/test_fp8_block_backward_gpu|*MatchesTheQuantizedReference"
  "nvfp4 backward|$T/test_nvfp4_backward_gpu|*MatchesTheQuantizedReference"
  "mxfp8 backward|$T/test_mxfp8_backward_gpu|*MatchesTheQuantizedReference"
  "qwen3-30b forward|$T/test_forward_gpu|ForwardGpu/1.StandardShapeAgreesWithTheCublasPipeline"
  "qwen3-30b backward|$T/test_backward_sampled_gpu|*Qwen3_30b*"
)
tools=(${TOOLS:-memcheck racecheck synccheck initcheck})
if [ -n "${ONLY:-}" ]; then
  kept=()
  for t in "${targets[@]}"; do [[ "${t%%|*}" =~ $ONLY ]] && kept+=("$t"); done
  targets=("${kept[@]}")
fi
status=0
declare -A cell
for tool in "${tools[@]}"; do
  for t in "${targets[@]}"; do
    IFS='|' read -r name binary filter <<<"$t"
    log="$(timeout "${LIMIT:-300}" compute-sanitizer --tool "$tool" --error-exitcode 1 "$binary" \
      --gtest_filter="$filter" 2>&1)"
    rc=$?
    summary="$(grep -oE 'ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards?' <<<"$log" |
      tail -1 | sed -E 's/.*SUMMARY: //')"
    [ "$rc" = 124 ] && summary="did not finish in ${LIMIT:-300} s"
    grep -q "\[  PASSED  \] 1 test" <<<"$log" || summary="${summary:-?}, test failed"
    [ "$rc" = 0 ] || status=1
    cell["$tool|$name"]="$summary"
    echo "$tool, $name: rc=$rc, $summary"
  done
done
printf '\n| |'; printf ' %s |' "${tools[@]}"; printf '\n|---|'; printf -- '---|%.0s' "${tools[@]}"; echo
for t in "${targets[@]}"; do
  IFS='|' read -r name _ <<<"$t"
  printf '| %s |' "$name"
  for tool in "${tools[@]}"; do printf ' %s |' "${cell[$tool|$name]}"; done
  echo
done
exit $status
